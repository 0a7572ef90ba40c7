// Causal attention without the (T,T) matrices: FlashAttention-2's schedule
// in fp32 on CUDA cores. B batch, T time, C channels, NH heads, hs = C/NH
// head size (1..kFlashMaxHeadSize); inp (B,T,3C) holds q, k, v; lse, d
// (B,NH,T).
//
// Tiles of kTile = 32 queries x 32 keys. A block (8 warps) owns one tile of
// rows of one (b, h); each warp owns 4 of its rows, and within a warp a lane
// owns one column of the 32-wide tile for the dot products, then head
// dimensions d = lane + 32 i (i < 4) for the accumulations, the other
// operand's entries passed round with __shfl_sync.
//
//   forward: a block per query tile walks the key tiles up to the diagonal
//     with an online softmax (running max m, sum l, output rescaled by
//     exp(m_old - m_new)); it writes out and lse = m + log l per row.
//   backward: D = rowsum(dout * out) first (one warp per row), then two
//     kernels that recompute P = exp(scale q.k - lse) tile by tile:
//     one per key tile (dK, dV: walks the query tiles from the diagonal
//     down), one per query tile (dQ: walks the key tiles up to the
//     diagonal). Splitting dQ from dK/dV costs one more recomputation of the
//     scores than FlashAttention-2's atomicAdd into dQ, but every output
//     element has one owner thread: no atomics, results are deterministic.
//
// Shared memory holds four tiles at most (66 KB at hs = 128, opted into with
// cudaFuncAttributeMaxDynamicSharedMemorySize; sm_80 and newer allow it).
// Tiles whose rows a lane reads one per lane use an odd row stride
// (hs | 1), so the 32 lanes hit 32 different banks.
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

namespace tessera::cuda {

namespace {

constexpr int kTile = 32;  // queries per block tile and keys per key tile: one per lane
constexpr int kWarps = 8;
constexpr int kThreads = kWarps * kWarpSize;
constexpr int kRowsPerWarp = kTile / kWarps;            // 4
constexpr int kDims = kFlashMaxHeadSize / kWarpSize;    // head dims per lane: d = lane + 32 i
static_assert(kRowsPerWarp * kWarps == kTile, "a warp owns whole rows");
static_assert(kDims * kWarpSize == kFlashMaxHeadSize, "head size cap is a multiple of the warp");
constexpr unsigned kFull = 0xffffffffu;

// Row t of part (0 q, 1 k, 2 v) of head h in inp (B,T,3C).
__device__ __forceinline__ const float* qkv_row(const float* inp, int b, int t, int part, int h, int T, int C,
                                                int hs) {
  return inp + (static_cast<int64_t>(b) * T + t) * 3 * C + static_cast<int64_t>(part) * C +
         static_cast<int64_t>(h) * hs;
}

// Row t of head h in a (B,T,C) tensor (out, dout).
__device__ __forceinline__ int64_t btc_at(int b, int t, int h, int T, int C, int hs) {
  return (static_cast<int64_t>(b) * T + t) * C + static_cast<int64_t>(h) * hs;
}

// Rows [t0, t0 + kTile) of part `part` of head h into dst (row stride ld),
// zeros for rows at or past T. The whole block cooperates.
__device__ void load_qkv_tile(float* dst, int ld, const float* inp, int part, int b, int h, int t0, int T, int C,
                              int hs) {
  for (int i = threadIdx.x; i < kTile * hs; i += blockDim.x) {
    const int r = i / hs, d = i % hs;
    const int t = t0 + r;
    dst[r * ld + d] = t < T ? qkv_row(inp, b, t, part, h, T, C, hs)[d] : 0.0f;
  }
}

// The same for head h of a (B,T,C) tensor.
__device__ void load_btc_tile(float* dst, int ld, const float* x, int b, int h, int t0, int T, int C, int hs) {
  for (int i = threadIdx.x; i < kTile * hs; i += blockDim.x) {
    const int r = i / hs, d = i % hs;
    const int t = t0 + r;
    dst[r * ld + d] = t < T ? x[btc_at(b, t, h, T, C, hs) + d] : 0.0f;
  }
}

// The block's (b*NH + h) and tile index. Blocks are numbered so that the
// first B*NH of them take the tiles with the most work (heaviest_first: the
// last query tile; otherwise the first key tile), which the scheduler
// starts first.
struct BlockTile {
  int b, h, bh, tile;
};
__device__ __forceinline__ BlockTile block_tile(int NH, int BH, int tiles, bool last_tile_heaviest) {
  BlockTile bt;
  bt.bh = static_cast<int>(blockIdx.x % BH);
  const int rank = static_cast<int>(blockIdx.x / BH);
  bt.tile = last_tile_heaviest ? tiles - 1 - rank : rank;
  bt.b = bt.bh / NH;
  bt.h = bt.bh % NH;
  return bt;
}

__global__ void __launch_bounds__(kThreads)
    flash_forward_kernel(float* out, float* lse, const float* inp, int B, int T, int C, int NH, float scale) {
  extern __shared__ float smem[];
  const int hs = C / NH, ld = hs | 1;
  const int tiles = (T + kTile - 1) / kTile;
  const BlockTile bt = block_tile(NH, B * NH, tiles, /*last_tile_heaviest=*/true);
  const int q0 = bt.tile * kTile;
  float* qs = smem;               // (kTile, hs): read by row, broadcast to the warp
  float* ks = qs + kTile * hs;    // (kTile, ld): lane j reads row j
  float* vs = ks + kTile * ld;    // (kTile, hs): lane reads column d
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int r0 = warp * kRowsPerWarp;

  load_qkv_tile(qs, hs, inp, 0, bt.b, bt.h, q0, T, C, hs);
  float m[kRowsPerWarp], l[kRowsPerWarp], o[kRowsPerWarp][kDims];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; r++) {
    m[r] = -INFINITY;
    l[r] = 0.0f;
#pragma unroll
    for (int i = 0; i < kDims; i++) o[r][i] = 0.0f;
  }
  // Causal: the tile's last query sees keys up to its own tile.
  for (int kt = 0; kt <= bt.tile; kt++) {
    const int k0 = kt * kTile;
    __syncthreads();  // the previous tile's readers are done
    load_qkv_tile(ks, ld, inp, 1, bt.b, bt.h, k0, T, C, hs);
    load_qkv_tile(vs, hs, inp, 2, bt.b, bt.h, k0, T, C, hs);
    __syncthreads();
    const int key = k0 + lane;
    float s[kRowsPerWarp];
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; r++) s[r] = 0.0f;
    for (int d = 0; d < hs; d++) {
      const float k = ks[lane * ld + d];
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; r++) s[r] += qs[(r0 + r) * hs + d] * k;
    }
    float p[kRowsPerWarp];
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; r++) {
      const int query = q0 + r0 + r;
      const bool valid = key <= query && query < T;  // so key < T too
      const float x = valid ? s[r] * scale : -INFINITY;
      const float m_new = fmaxf(m[r], warp_max(x));
      // m_new stays -inf only on a padding row (query >= T) with no valid
      // key: keep its sums at 0 instead of exp(-inf - -inf) = NaN.
      const float corr = m_new == -INFINITY ? 1.0f : expf(m[r] - m_new);
      p[r] = valid ? expf(x - m_new) : 0.0f;
      l[r] = l[r] * corr + warp_sum(p[r]);
      m[r] = m_new;
#pragma unroll
      for (int i = 0; i < kDims; i++) o[r][i] *= corr;
    }
    for (int j = 0; j < kTile; j++) {
      float v[kDims];
#pragma unroll
      for (int i = 0; i < kDims; i++) {
        const int d = lane + i * kWarpSize;
        v[i] = d < hs ? vs[j * hs + d] : 0.0f;
      }
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; r++) {
        const float pj = __shfl_sync(kFull, p[r], j);
#pragma unroll
        for (int i = 0; i < kDims; i++) o[r][i] += pj * v[i];
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; r++) {
    const int query = q0 + r0 + r;
    if (query >= T) continue;
    const float inv = 1.0f / l[r];  // l >= 1: the row's max term is exp(0)
    float* o_row = out + btc_at(bt.b, query, bt.h, T, C, hs);
#pragma unroll
    for (int i = 0; i < kDims; i++) {
      const int d = lane + i * kWarpSize;
      if (d < hs) o_row[d] = o[r][i] * inv;
    }
    if (lane == 0) lse[static_cast<int64_t>(bt.bh) * T + query] = m[r] + logf(l[r]);
  }
}

// One warp per row (b,h,t): d = sum over the head's dims of dout * out.
__global__ void flash_backward_dsum_kernel(float* dsum, const float* dout, const float* out, int B, int T, int C,
                                           int NH) {
  const int hs = C / NH;
  const int64_t rows = static_cast<int64_t>(B) * NH * T;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / kWarpSize) + threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  if (row >= rows) return;  // whole warp
  const int t = static_cast<int>(row % T);
  const int bh = static_cast<int>(row / T);
  const int64_t at = btc_at(bh / NH, t, bh % NH, T, C, hs);
  float acc = 0.0f;
  for (int d = lane; d < hs; d += kWarpSize) acc += dout[at + d] * out[at + d];
  acc = warp_sum(acc);
  if (lane == 0) dsum[row] = acc;
}

// dK, dV for one key tile: walks the query tiles from the diagonal to T.
// Warp rows are keys; lanes are queries (scores), then head dims.
__global__ void __launch_bounds__(kThreads)
    flash_backward_dkdv_kernel(float* dinp, const float* dout, const float* inp, const float* lse,
                               const float* dsum, int B, int T, int C, int NH, float scale) {
  extern __shared__ float smem[];
  const int hs = C / NH, ld = hs | 1;
  const int tiles = (T + kTile - 1) / kTile;
  const BlockTile bt = block_tile(NH, B * NH, tiles, /*last_tile_heaviest=*/false);
  const int k0 = bt.tile * kTile;
  float* ks = smem;                 // (kTile, hs): broadcast by row
  float* vs = ks + kTile * hs;      // (kTile, hs)
  float* qs = vs + kTile * hs;      // (kTile, ld): lane i reads row i, then columns
  float* dos = qs + kTile * ld;     // (kTile, ld)
  float* lses = dos + kTile * ld;   // (kTile)
  float* dsums = lses + kTile;      // (kTile)
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int r0 = warp * kRowsPerWarp;

  load_qkv_tile(ks, hs, inp, 1, bt.b, bt.h, k0, T, C, hs);
  load_qkv_tile(vs, hs, inp, 2, bt.b, bt.h, k0, T, C, hs);
  float dk[kRowsPerWarp][kDims], dv[kRowsPerWarp][kDims];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; r++)
#pragma unroll
    for (int i = 0; i < kDims; i++) dk[r][i] = dv[r][i] = 0.0f;

  for (int qt = bt.tile; qt < tiles; qt++) {
    const int q0 = qt * kTile;
    __syncthreads();  // the previous tile's readers are done (and ks, vs are loaded)
    load_qkv_tile(qs, ld, inp, 0, bt.b, bt.h, q0, T, C, hs);
    load_btc_tile(dos, ld, dout, bt.b, bt.h, q0, T, C, hs);
    if (threadIdx.x < kTile) {
      const int t = q0 + threadIdx.x;
      const int64_t at = static_cast<int64_t>(bt.bh) * T + t;
      lses[threadIdx.x] = t < T ? lse[at] : 0.0f;
      dsums[threadIdx.x] = t < T ? dsum[at] : 0.0f;
    }
    __syncthreads();
    const int query = q0 + lane;
    float s[kRowsPerWarp], dp[kRowsPerWarp];
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; r++) s[r] = dp[r] = 0.0f;
    for (int d = 0; d < hs; d++) {
      const float q = qs[lane * ld + d], g = dos[lane * ld + d];
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; r++) {
        s[r] += q * ks[(r0 + r) * hs + d];
        dp[r] += g * vs[(r0 + r) * hs + d];
      }
    }
    float p[kRowsPerWarp], ds[kRowsPerWarp];
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; r++) {
      const int key = k0 + r0 + r;
      const bool valid = key <= query && query < T;
      p[r] = valid ? expf(s[r] * scale - lses[lane]) : 0.0f;
      ds[r] = p[r] * (dp[r] - dsums[lane]);
    }
    for (int i = 0; i < kTile; i++) {
      float q[kDims], g[kDims];
#pragma unroll
      for (int c = 0; c < kDims; c++) {
        const int d = lane + c * kWarpSize;
        q[c] = d < hs ? qs[i * ld + d] : 0.0f;
        g[c] = d < hs ? dos[i * ld + d] : 0.0f;
      }
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; r++) {
        const float pi = __shfl_sync(kFull, p[r], i), dsi = __shfl_sync(kFull, ds[r], i);
#pragma unroll
        for (int c = 0; c < kDims; c++) {
          dv[r][c] += pi * g[c];
          dk[r][c] += dsi * q[c];
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; r++) {
    const int key = k0 + r0 + r;
    if (key >= T) continue;
    float* dk_row = dinp + (qkv_row(inp, bt.b, key, 1, bt.h, T, C, hs) - inp);
    float* dv_row = dinp + (qkv_row(inp, bt.b, key, 2, bt.h, T, C, hs) - inp);
#pragma unroll
    for (int c = 0; c < kDims; c++) {
      const int d = lane + c * kWarpSize;
      if (d < hs) {
        dk_row[d] += dk[r][c] * scale;
        dv_row[d] += dv[r][c];
      }
    }
  }
}

// dQ for one query tile: walks the key tiles up to the diagonal. Warp rows
// are queries; lanes are keys (scores), then head dims.
__global__ void __launch_bounds__(kThreads)
    flash_backward_dq_kernel(float* dinp, const float* dout, const float* inp, const float* lse, const float* dsum,
                             int B, int T, int C, int NH, float scale) {
  extern __shared__ float smem[];
  const int hs = C / NH, ld = hs | 1;
  const int tiles = (T + kTile - 1) / kTile;
  const BlockTile bt = block_tile(NH, B * NH, tiles, /*last_tile_heaviest=*/true);
  const int q0 = bt.tile * kTile;
  float* qs = smem;              // (kTile, hs): broadcast by row
  float* dos = qs + kTile * hs;  // (kTile, hs)
  float* ks = dos + kTile * hs;  // (kTile, ld): lane j reads row j, then columns
  float* vs = ks + kTile * ld;   // (kTile, ld)
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int r0 = warp * kRowsPerWarp;

  load_qkv_tile(qs, hs, inp, 0, bt.b, bt.h, q0, T, C, hs);
  load_btc_tile(dos, hs, dout, bt.b, bt.h, q0, T, C, hs);
  float row_lse[kRowsPerWarp], row_dsum[kRowsPerWarp], dq[kRowsPerWarp][kDims];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; r++) {
    const int t = q0 + r0 + r;
    const int64_t at = static_cast<int64_t>(bt.bh) * T + t;
    row_lse[r] = t < T ? lse[at] : 0.0f;
    row_dsum[r] = t < T ? dsum[at] : 0.0f;
#pragma unroll
    for (int i = 0; i < kDims; i++) dq[r][i] = 0.0f;
  }
  for (int kt = 0; kt <= bt.tile; kt++) {
    const int k0 = kt * kTile;
    __syncthreads();  // the previous tile's readers are done (and qs, dos are loaded)
    load_qkv_tile(ks, ld, inp, 1, bt.b, bt.h, k0, T, C, hs);
    load_qkv_tile(vs, ld, inp, 2, bt.b, bt.h, k0, T, C, hs);
    __syncthreads();
    const int key = k0 + lane;
    float s[kRowsPerWarp], dp[kRowsPerWarp];
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; r++) s[r] = dp[r] = 0.0f;
    for (int d = 0; d < hs; d++) {
      const float k = ks[lane * ld + d], v = vs[lane * ld + d];
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; r++) {
        s[r] += qs[(r0 + r) * hs + d] * k;
        dp[r] += dos[(r0 + r) * hs + d] * v;
      }
    }
    float ds[kRowsPerWarp];
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; r++) {
      const int query = q0 + r0 + r;
      const bool valid = key <= query && query < T;
      const float p = valid ? expf(s[r] * scale - row_lse[r]) : 0.0f;
      ds[r] = p * (dp[r] - row_dsum[r]);
    }
    for (int j = 0; j < kTile; j++) {
      float k[kDims];
#pragma unroll
      for (int c = 0; c < kDims; c++) {
        const int d = lane + c * kWarpSize;
        k[c] = d < hs ? ks[j * ld + d] : 0.0f;
      }
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; r++) {
        const float dsj = __shfl_sync(kFull, ds[r], j);
#pragma unroll
        for (int c = 0; c < kDims; c++) dq[r][c] += dsj * k[c];
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; r++) {
    const int query = q0 + r0 + r;
    if (query >= T) continue;
    float* dq_row = dinp + (qkv_row(inp, bt.b, query, 0, bt.h, T, C, hs) - inp);
#pragma unroll
    for (int c = 0; c < kDims; c++) {
      const int d = lane + c * kWarpSize;
      if (d < hs) dq_row[d] += dq[r][c] * scale;
    }
  }
}

[[noreturn]] void bad_shape(const char* what, int B, int T, int C, int NH) {
  std::fprintf(stderr, "tessera: flash attention: %s (B=%d T=%d C=%d NH=%d)\n", what, B, T, C, NH);
  std::abort();
}

// Blocks for one kernel: a tile of T per (b, h); aborts on shapes the
// kernels do not take (callers check attention_impl() first).
unsigned flash_grid(int B, int T, int C, int NH) {
  if (NH <= 0 || C % NH != 0) bad_shape("C must be a positive multiple of NH", B, T, C, NH);
  if (C / NH > kFlashMaxHeadSize) bad_shape("head size above kFlashMaxHeadSize", B, T, C, NH);
  const int64_t blocks = static_cast<int64_t>(B) * NH * ((T + kTile - 1) / kTile);
  if (blocks > INT_MAX) bad_shape("too many blocks", B, T, C, NH);
  return static_cast<unsigned>(blocks);
}

// Dynamic shared memory above the default 48 KB needs an opt-in per kernel
// (and device: the attribute is set on the current one at each launch).
template <typename Kernel>
void allow_shared(Kernel kernel, size_t bytes) {
  if (bytes > 48 * 1024)
    CHECK_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

}  // namespace

void flash_attention_forward(float* out, float* lse, const float* inp, int B, int T, int C, int NH) {
  if (B == 0 || T == 0 || C == 0) return;
  const unsigned grid = flash_grid(B, T, C, NH);
  const int hs = C / NH, ld = hs | 1;
  const size_t smem = sizeof(float) * static_cast<size_t>(kTile) * (2 * hs + ld);
  allow_shared(flash_forward_kernel, smem);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  flash_forward_kernel<<<grid, kThreads, smem>>>(out, lse, inp, B, T, C, NH, scale);
  CHECK_CUDA_LAUNCH();
}

void flash_attention_backward(float* dinp, float* dsum, const float* dout, const float* inp, const float* out,
                              const float* lse, int B, int T, int C, int NH) {
  if (B == 0 || T == 0 || C == 0) return;
  const unsigned grid = flash_grid(B, T, C, NH);
  const int hs = C / NH, ld = hs | 1;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const int64_t rows = static_cast<int64_t>(B) * NH * T;
  const int warps_per_block = kThreads / kWarpSize;
  flash_backward_dsum_kernel<<<ceil_div(rows, warps_per_block), kThreads>>>(dsum, dout, out, B, T, C, NH);
  CHECK_CUDA_LAUNCH();
  // Both kernels: two tiles of stride hs, two of stride ld (+ lse and dsum
  // for one tile of queries in dK/dV).
  const size_t smem = sizeof(float) * (static_cast<size_t>(kTile) * (2 * hs + 2 * ld) + 2 * kTile);
  allow_shared(flash_backward_dkdv_kernel, smem);
  allow_shared(flash_backward_dq_kernel, smem);
  // The two kernels write disjoint parts of dinp (k and v; q).
  flash_backward_dkdv_kernel<<<grid, kThreads, smem>>>(dinp, dout, inp, lse, dsum, B, T, C, NH, scale);
  CHECK_CUDA_LAUNCH();
  flash_backward_dq_kernel<<<grid, kThreads, smem>>>(dinp, dout, inp, lse, dsum, B, T, C, NH, scale);
  CHECK_CUDA_LAUNCH();
}

}  // namespace tessera::cuda
