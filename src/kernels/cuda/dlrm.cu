// Recommendation (DLRM) ops on CUDA: ops.inc's contract, the oracle
// kernels/ref/dlrm.cc; and the sparse optimizers of optim/sparse.h on device
// rows. Letters as in ops.inc (B samples, D dimension, F features, P pairs,
// L ids, U distinct ids).
//
// Where the reference's order of float operations can be kept, it is, with
// explicitly rounded multiplies and adds (__fmul_rn, __fadd_rn: nvcc would
// otherwise fuse them into FMAs, which the host build, without -march, does
// not): the embedding bag forward and backward, the interaction forward and
// backward, ReLU and sparse SGD are meant to equal the reference bitwise.
// Row-wise Adagrad's mean square is a warp reduction (another order); BCE
// works in double as the reference does, with CUDA's exp and log1p.
//
// The sparse backward is sort-based, as FBGEMM's: (id, position) pairs
// sorted by id with CUB's radix sort (stable, so one id's positions stay in
// order of appearance), the heads of equal-id runs flagged and compacted
// (cub::DeviceSelect), then one block per distinct id sums its positions'
// gradient rows in that order: no atomics, the same bits on every run.
#include <algorithm>

#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_select.cuh>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

namespace tessera::cuda {

namespace {

constexpr int kBlock = 256;
// Ids are in [0, 2^31): the radix sort needs the low 31 bits of the key.
constexpr int kIdBits = 31;
// An interaction block stages its sample's (F,D) features in shared memory
// when they fit in this many bytes (the default limit without opting in).
constexpr int kStageBytes = 48 * 1024;

#define TESSERA_GRID_STRIDE(i, n)                                                        \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)

// Threads per block for a loop over `width` columns: whole warps, at most kBlock.
int block_for_width(int width) {
  const int threads = std::max(1, (width + kWarpSize - 1) / kWarpSize) * kWarpSize;
  return std::min(threads, kBlock);
}

// ---- embedding bag ---------------------------------------------------------

// One thread per output element (b, d): a warp reads consecutive d of one
// row (coalesced for D >= 32). Rows are added in the bag's order, from 0.
__global__ void embedding_bag_forward_kernel(float* out, int64_t ldo, const float* table, const int* ids,
                                             const int* offsets, int B, int D, bool mean) {
  TESSERA_GRID_STRIDE(i, static_cast<int64_t>(B) * D) {
    const int64_t b = i / D;
    const int d = static_cast<int>(i % D);
    const int begin = offsets[b], end = offsets[b + 1];
    float acc = 0.0f;
    for (int p = begin; p < end; p++) acc = __fadd_rn(acc, table[static_cast<int64_t>(ids[p]) * D + d]);
    if (mean && end > begin) acc = __fdiv_rn(acc, static_cast<float>(end - begin));
    out[b * ldo + d] = acc;
  }
}

__global__ void iota_kernel(int* out, int n) {
  TESSERA_GRID_STRIDE(i, n) { out[i] = static_cast<int>(i); }
}

// flags[k] = 1 where sorted[k] starts a run of equal ids.
__global__ void run_heads_kernel(char* flags, const unsigned* sorted, int n) {
  TESSERA_GRID_STRIDE(k, n) { flags[k] = k == 0 || sorted[k] != sorted[k - 1]; }
}

// The bag of position p in [0, L): the last b with offsets[b] <= p. Empty
// bags share their offset with the next bag, so the search passes them.
__device__ __forceinline__ int bag_of(const int* offsets, int B, int p) {
  int lo = 0, hi = B;  // offsets[lo] <= p < offsets[hi]
  while (hi - lo > 1) {
    const int mid = lo + (hi - lo) / 2;
    if (offsets[mid] <= p)
      lo = mid;
    else
      hi = mid;
  }
  return lo;
}

// One block per distinct id u (grid-stride up to the device-side count):
// rows[u] = its id, drows[u] = the sum of its positions' dout rows (scaled
// by 1/n for mean pooling), in order of appearance, as the reference sums.
__global__ void segment_sum_kernel(int* rows, float* drows, const float* dout, int64_t ldd, const int* offsets,
                                   int B, int D, bool mean, const unsigned* sorted_ids, const int* sorted_pos,
                                   const int* heads, const int* num_runs, int L) {
  const int U = *num_runs;
  for (int u = blockIdx.x; u < U; u += gridDim.x) {
    const int begin = heads[u], end = u + 1 < U ? heads[u + 1] : L;
    if (threadIdx.x == 0) rows[u] = static_cast<int>(sorted_ids[begin]);
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
      float acc = 0.0f;
      for (int k = begin; k < end; k++) {
        const int b = bag_of(offsets, B, sorted_pos[k]);
        const float scale = mean ? __fdiv_rn(1.0f, static_cast<float>(offsets[b + 1] - offsets[b])) : 1.0f;
        acc = __fadd_rn(acc, __fmul_rn(dout[static_cast<int64_t>(b) * ldd + d], scale));
      }
      drows[static_cast<int64_t>(u) * D + d] = acc;
    }
  }
}

// Carves aligned pieces out of one allocation.
struct Carver {
  char* base;
  size_t used = 0;
  template <typename T>
  T* take(size_t n) {
    T* p = reinterpret_cast<T*>(base + used);
    used += (n * sizeof(T) + 255) / 256 * 256;
    return p;
  }
};

// ---- interaction -----------------------------------------------------------

// Pair q in [0, P) of the order i = 1..F-1, j = 0..i-1: q = i(i-1)/2 + j.
__device__ __forceinline__ void pair_of(int q, int* i, int* j) {
  int r = static_cast<int>((1.0 + sqrt(1.0 + 8.0 * q)) / 2.0);
  while (r * (r - 1) / 2 > q) r--;
  while ((r + 1) * r / 2 <= q) r++;
  *i = r;
  *j = q - r * (r - 1) / 2;
}

// One block per sample (grid-stride); threads over its D + P outputs. With
// kStaged the sample's features are first copied to shared memory.
template <bool kStaged>
__global__ void interaction_forward_kernel(float* out, const float* feat, int B, int F, int D) {
  extern __shared__ float staged[];
  const int P = F * (F - 1) / 2;
  for (int64_t b = blockIdx.x; b < B; b += gridDim.x) {
    const float* x = feat + b * F * D;
    if (kStaged) {
      __syncthreads();  // the previous sample's readers are done
      for (int k = threadIdx.x; k < F * D; k += blockDim.x) staged[k] = x[k];
      __syncthreads();
      x = staged;
    }
    float* o = out + b * (D + P);
    for (int k = threadIdx.x; k < D + P; k += blockDim.x) {
      if (k < D) {
        o[k] = x[k];
        continue;
      }
      int i, j;
      pair_of(k - D, &i, &j);
      float dot = 0.0f;
      for (int d = 0; d < D; d++) dot = __fadd_rn(dot, __fmul_rn(x[i * D + d], x[j * D + d]));
      o[k] = dot;
    }
  }
}

// One thread per element (b, t, d) of dfeat: its terms in the reference's
// order (dout's dense part for t = 0, then the pairs (t, j) for j < t, then
// the pairs (i, t) for i > t), added onto the value already there.
__global__ void interaction_backward_kernel(float* dfeat, const float* dout, const float* feat, int B, int F, int D) {
  const int P = F * (F - 1) / 2;
  const int FD = F * D;
  TESSERA_GRID_STRIDE(idx, static_cast<int64_t>(B) * FD) {
    const int64_t b = idx / FD;
    const int t = static_cast<int>(idx % FD) / D, d = static_cast<int>(idx % FD) % D;
    const float* x = feat + b * FD;
    const float* g = dout + b * (D + P);
    float acc = dfeat[idx];
    if (t == 0) acc = __fadd_rn(acc, g[d]);
    const float* g_t = g + D + t * (t - 1) / 2;  // pairs (t, j), j < t
    for (int j = 0; j < t; j++) acc = __fadd_rn(acc, __fmul_rn(g_t[j], x[j * D + d]));
    for (int i = t + 1; i < F; i++) acc = __fadd_rn(acc, __fmul_rn(g[D + i * (i - 1) / 2 + t], x[i * D + d]));
    dfeat[idx] = acc;
  }
}

// ---- elementwise -------------------------------------------------------------

__global__ void relu_forward_kernel(float* out, const float* inp, int64_t n) {
  TESSERA_GRID_STRIDE(i, n) { out[i] = inp[i] > 0.0f ? inp[i] : 0.0f; }
}

__global__ void relu_backward_kernel(float* dinp, const float* inp, const float* dout, int64_t n) {
  TESSERA_GRID_STRIDE(i, n) {
    if (inp[i] > 0.0f) dinp[i] = __fadd_rn(dinp[i], dout[i]);
  }
}

__global__ void bce_logits_forward_kernel(float* losses, const float* logits, const float* labels, int N) {
  TESSERA_GRID_STRIDE(i, N) {
    const double x = logits[i], y = labels[i];
    losses[i] = static_cast<float>(__dadd_rn(__dsub_rn(fmax(x, 0.0), __dmul_rn(x, y)), log1p(exp(-fabs(x)))));
  }
}

__global__ void bce_logits_backward_kernel(float* dlogits, const float* logits, const float* labels, float dloss,
                                           int N) {
  TESSERA_GRID_STRIDE(i, N) {
    const double s = 1.0 / (1.0 + exp(-static_cast<double>(logits[i])));
    dlogits[i] = __fadd_rn(dlogits[i], static_cast<float>(__dmul_rn(s - labels[i], dloss)));
  }
}

// ---- sparse optimizers ---------------------------------------------------------

// One warp per touched row: the mean square by a warp reduction, then the
// row update. Rows are distinct (the caller's precondition), so no two warps
// write the same row or accumulator.
__global__ void rowwise_adagrad_kernel(float* table, float* state, const int* rows, const float* grads, int U, int D,
                                       float lr, float eps) {
  const int lane = threadIdx.x % kWarpSize;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / kWarpSize);
  for (int64_t u = static_cast<int64_t>(blockIdx.x) * (blockDim.x / kWarpSize) + threadIdx.x / kWarpSize; u < U;
       u += warps) {  // uniform across the warp: warp_sum's full mask holds
    const float* g = grads + u * D;
    float sq = 0.0f;
    for (int d = lane; d < D; d += kWarpSize) sq = __fadd_rn(sq, __fmul_rn(g[d], g[d]));
    sq = warp_sum(sq);
    const int r = rows[u];
    const float s = __fadd_rn(state[r], __fdiv_rn(sq, static_cast<float>(D)));
    __syncwarp();  // every lane has read state[r]
    if (lane == 0) state[r] = s;
    const float mult = __fdiv_rn(lr, __fadd_rn(__fsqrt_rn(s), eps));
    float* w = table + static_cast<int64_t>(r) * D;
    for (int d = lane; d < D; d += kWarpSize) w[d] = __fsub_rn(w[d], __fmul_rn(mult, g[d]));
  }
}

__global__ void sparse_sgd_kernel(float* table, const int* rows, const float* grads, int D, float lr, int64_t n) {
  TESSERA_GRID_STRIDE(i, n) {
    const int64_t u = i / D;
    const int d = static_cast<int>(i % D);
    float* w = table + static_cast<int64_t>(rows[u]) * D + d;
    *w = __fsub_rn(*w, __fmul_rn(lr, grads[i]));
  }
}

#undef TESSERA_GRID_STRIDE

}  // namespace

void embedding_bag_forward(float* out, int64_t ldo, const float* table, const int* ids, const int* offsets, int B,
                           int D, Pooling pooling) {
  const int64_t n = static_cast<int64_t>(B) * D;
  if (n <= 0) return;
  embedding_bag_forward_kernel<<<grid_for(n, kBlock), kBlock>>>(out, ldo, table, ids, offsets, B, D,
                                                                pooling == Pooling::kMean);
  CHECK_CUDA_LAUNCH();
}

// Synchronous: it reads L = offsets[B] and returns U, each a blocking copy
// of one int, so its work (and everything queued before it) has run when it
// returns. Its scratch (4 L ints, L flags and CUB's temporary storage) is
// allocated and freed per call, stream-ordered on the default stream.
int embedding_bag_backward(int* rows, float* drows, const float* dout, int64_t ldd, const int* ids,
                           const int* offsets, int B, int D, Pooling pooling) {
  if (B <= 0) return 0;
  int L = 0;
  CHECK_CUDA(cudaMemcpy(&L, offsets + B, sizeof(int), cudaMemcpyDeviceToHost));
  if (L <= 0) return 0;
  const cudaStream_t stream = 0;
  const unsigned* keys = reinterpret_cast<const unsigned*>(ids);  // ids >= 0: the same order as unsigned
  size_t sort_bytes = 0, select_bytes = 0;
  CHECK_CUDA(cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, keys, static_cast<unsigned*>(nullptr),
                                             static_cast<const int*>(nullptr), static_cast<int*>(nullptr), L, 0,
                                             kIdBits, stream));
  CHECK_CUDA(cub::DeviceSelect::Flagged(nullptr, select_bytes, static_cast<const int*>(nullptr),
                                        static_cast<const char*>(nullptr), static_cast<int*>(nullptr),
                                        static_cast<int*>(nullptr), L, stream));
  const size_t temp_bytes = sort_bytes > select_bytes ? sort_bytes : select_bytes;
  const size_t total = 5 * (static_cast<size_t>(L) * sizeof(int) + 256) + 256 + temp_bytes + 256;
  void* base = nullptr;
  CHECK_CUDA(cudaMallocAsync(&base, total, stream));
  Carver c{static_cast<char*>(base)};
  int* positions = c.take<int>(L);
  unsigned* sorted_ids = c.take<unsigned>(L);
  int* sorted_pos = c.take<int>(L);
  int* heads = c.take<int>(L);
  char* flags = c.take<char>(L);
  int* num_runs = c.take<int>(1);
  void* temp = c.take<char>(temp_bytes);

  iota_kernel<<<grid_for(L, kBlock), kBlock>>>(positions, L);
  CHECK_CUDA_LAUNCH();
  size_t bytes = sort_bytes;
  CHECK_CUDA(
      cub::DeviceRadixSort::SortPairs(temp, bytes, keys, sorted_ids, positions, sorted_pos, L, 0, kIdBits, stream));
  run_heads_kernel<<<grid_for(L, kBlock), kBlock>>>(flags, sorted_ids, L);
  CHECK_CUDA_LAUNCH();
  bytes = select_bytes;
  CHECK_CUDA(cub::DeviceSelect::Flagged(temp, bytes, positions, flags, heads, num_runs, L, stream));
  const int threads = block_for_width(D);
  segment_sum_kernel<<<grid_for(L, 1), threads>>>(rows, drows, dout, ldd, offsets, B, D,
                                                  pooling == Pooling::kMean, sorted_ids, sorted_pos, heads,
                                                  num_runs, L);
  CHECK_CUDA_LAUNCH();
  int U = 0;
  CHECK_CUDA(cudaMemcpy(&U, num_runs, sizeof(int), cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaFreeAsync(base, stream));
  return U;
}

void interaction_forward(float* out, const float* feat, int B, int F, int D) {
  if (B <= 0 || D <= 0 || F <= 0) return;
  const int P = F * (F - 1) / 2;
  const int threads = block_for_width(D + P);
  const unsigned grid = grid_for(B, 1);
  const size_t stage = static_cast<size_t>(F) * D * sizeof(float);
  if (stage <= static_cast<size_t>(kStageBytes))
    interaction_forward_kernel<true><<<grid, threads, stage>>>(out, feat, B, F, D);
  else
    interaction_forward_kernel<false><<<grid, threads>>>(out, feat, B, F, D);
  CHECK_CUDA_LAUNCH();
}

void interaction_backward(float* dfeat, const float* dout, const float* feat, int B, int F, int D) {
  const int64_t n = static_cast<int64_t>(B) * F * D;
  if (n <= 0) return;
  interaction_backward_kernel<<<grid_for(n, kBlock), kBlock>>>(dfeat, dout, feat, B, F, D);
  CHECK_CUDA_LAUNCH();
}

void relu_forward(float* out, const float* inp, int64_t n) {
  if (n <= 0) return;
  relu_forward_kernel<<<grid_for(n, kBlock), kBlock>>>(out, inp, n);
  CHECK_CUDA_LAUNCH();
}

void relu_backward(float* dinp, const float* inp, const float* dout, int64_t n) {
  if (n <= 0) return;
  relu_backward_kernel<<<grid_for(n, kBlock), kBlock>>>(dinp, inp, dout, n);
  CHECK_CUDA_LAUNCH();
}

void bce_logits_forward(float* losses, const float* logits, const float* labels, int N) {
  if (N <= 0) return;
  bce_logits_forward_kernel<<<grid_for(N, kBlock), kBlock>>>(losses, logits, labels, N);
  CHECK_CUDA_LAUNCH();
}

void bce_logits_backward(float* dlogits, const float* logits, const float* labels, float dloss, int N) {
  if (N <= 0) return;
  bce_logits_backward_kernel<<<grid_for(N, kBlock), kBlock>>>(dlogits, logits, labels, dloss, N);
  CHECK_CUDA_LAUNCH();
}

void rowwise_adagrad_update(float* table, float* state, const int* rows, const float* grads, int U, int D,
                            const RowwiseAdagradParams& hp) {
  if (U <= 0 || D <= 0) return;
  constexpr int kWarpsPerBlock = kBlock / kWarpSize;
  rowwise_adagrad_kernel<<<grid_for(U, kWarpsPerBlock), kBlock>>>(table, state, rows, grads, U, D, hp.lr, hp.eps);
  CHECK_CUDA_LAUNCH();
}

void sparse_sgd_update(float* table, const int* rows, const float* grads, int U, int D, float lr) {
  const int64_t n = static_cast<int64_t>(U) * D;
  if (n <= 0) return;
  sparse_sgd_kernel<<<grid_for(n, kBlock), kBlock>>>(table, rows, grads, D, lr, n);
  CHECK_CUDA_LAUNCH();
}

}  // namespace tessera::cuda
