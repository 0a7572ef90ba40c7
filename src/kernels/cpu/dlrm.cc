// Fast CPU recommendation (DLRM) ops; the contract is ops.inc's, the oracle
// kernels/ref/dlrm.cc. Letters as in ops.inc (B samples, D dimension, F
// features, P pairs, L ids, U distinct ids).
//
// Embedding bags are bound by memory: each id reads one table row of D
// floats, prefetched a few bags ahead. Samples are threaded; within a bag rows are added in id order, so
// forward results equal the reference's bitwise. The sparse backward sorts
// the positions by id (stable, so duplicates keep their order of appearance
// and sum in the reference's order), then threads over the distinct rows; it
// allocates its scratch (2 L ints) per call.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "kernels/cpu/dlrm_width.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/vec_math.h"

namespace tessera::cpu {

namespace {
constexpr int64_t kParallelMin = 32768;  // floats touched; below this, no fork
// Rows of bags this far ahead are prefetched: a row of a large table is a
// cache (and TLB) miss, and one bag's few rows alone leave the core waiting
// on memory latency instead of streaming (docs/performance.md, DLRM).
constexpr int kPrefetchBags = 8;

inline void prefetch_row(const float* row, int D) {
  for (int d = 0; d < D; d += 16) __builtin_prefetch(row + d, 0, 0);  // one 64-byte line per 16 floats
}
}  // namespace

void embedding_bag_forward(float* out, int64_t ldo, const float* table, const int* ids, const int* offsets, int B,
                           int D, Pooling pooling) {
  const int64_t work = static_cast<int64_t>(offsets[B]) * D;
#pragma omp parallel for schedule(static) if (work > kParallelMin)
  for (int b = 0; b < B; b++) {
    if (b + kPrefetchBags < B)
      for (int p = offsets[b + kPrefetchBags]; p < offsets[b + kPrefetchBags + 1]; p++)
        prefetch_row(table + static_cast<int64_t>(ids[p]) * D, D);
    float* o = out + b * ldo;
    std::fill(o, o + D, 0.0f);
    for (int p = offsets[b]; p < offsets[b + 1]; p++) {
      const float* row = table + static_cast<int64_t>(ids[p]) * D;
#pragma omp simd
      for (int d = 0; d < D; d++) o[d] += row[d];
    }
    const int n = offsets[b + 1] - offsets[b];
    if (pooling == Pooling::kMean && n > 0) {
      const float fn = static_cast<float>(n);
#pragma omp simd
      for (int d = 0; d < D; d++) o[d] /= fn;
    }
  }
}

int embedding_bag_backward(int* rows, float* drows, const float* dout, int64_t ldd, const int* ids,
                           const int* offsets, int B, int D, Pooling pooling) {
  const int L = offsets[B];
  std::vector<int> order(L), bag(L);
  for (int b = 0; b < B; b++)
    for (int p = offsets[b]; p < offsets[b + 1]; p++) bag[p] = b;
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [ids](int a, int b) { return ids[a] < ids[b]; });
  // starts[u]: the first index into order of distinct row u.
  std::vector<int> starts;
  starts.reserve(L + 1);
  for (int k = 0; k < L; k++)
    if (k == 0 || ids[order[k]] != ids[order[k - 1]]) starts.push_back(k);
  const int U = static_cast<int>(starts.size());
  starts.push_back(L);
#pragma omp parallel for schedule(static) if (static_cast<int64_t>(L) * D > kParallelMin)
  for (int u = 0; u < U; u++) {
    float* g = drows + static_cast<int64_t>(u) * D;
    std::fill(g, g + D, 0.0f);
    rows[u] = ids[order[starts[u]]];
    for (int k = starts[u]; k < starts[u + 1]; k++) {
      const int b = bag[order[k]];
      const int n = offsets[b + 1] - offsets[b];
      const float scale = pooling == Pooling::kMean ? 1.0f / static_cast<float>(n) : 1.0f;
      const float* src = dout + b * ldd;
#pragma omp simd
      for (int d = 0; d < D; d++) g[d] += src[d] * scale;
    }
  }
  return U;
}

// The dot interaction, for D a multiple of 16 (DLRM's 16..128), one sample at
// a time, W floats to a vector: W = 16 (one zmm) where AVX-512 is there, W =
// 8 (one ymm) elsewhere (the functions are compiled per ISA level,
// vec_math.h, and take the width the caller picks: GCC 12 lowers 16-float
// vectors and their two-source shuffles on AVX2 to element moves through
// the stack, and the interaction of the 500M preset took 104 ms a step on a
// Zen 2 instead of about 4 ms on AVX-512; docs/performance.md). Forward: Z =
// X X^T from a transposed copy XT (D, Fp) of the sample (W x W tiles
// transposed in registers), rows of Z in blocks of kZRows (fewer in the
// last), each block's columns (only those left of its last row) one or two
// vectors: per d, one or two loads of XT[d] and kZRows broadcasts of
// X[i][d] feed up to 2 kZRows independent accumulators. Backward: dX += S X
// with S (F, F) the pair gradients placed at (i, j) and (j, i): rows of dX
// in blocks of 4, kBwdVecs vectors at a time, X[j] loaded once for 4 rows.
// The loops they replace did one pair at a time (a horizontal sum per dot,
// two read-modify-writes of D floats per pair in backward) and ran at 8% of
// the GEMM peak (docs/performance.md, DLRM).
//
// Both keep the reference's order of summation, whatever W: every Z[i][j]
// sums d = 0..D-1 from 0, and every dX[i] starts from its old value (plus
// dout's first D for i = 0) and adds S[i][j] X[j] for j ascending, skipping
// j = i: the reference's pair order as one row sees it. The only difference
// is that GCC contracts a multiply and add into an FMA (C++'s default
// -ffp-contract=fast) in the AVX2 and AVX-512 clones, one rounding fewer per
// term; the baseline clone, like the reference, has no FMA.
namespace {

template <int W>
struct Vec;  // W floats, and W lane indices of two vectors (0..2W-1)
template <>
struct Vec<8> {
  typedef float F __attribute__((vector_size(32)));
  typedef int I __attribute__((vector_size(32)));
};
template <>
struct Vec<16> {
  typedef float F __attribute__((vector_size(64)));
  typedef int I __attribute__((vector_size(64)));
};

// Tiles per width: accumulators within the registers (16 zmm of 32 on
// AVX-512, 8 ymm of 16 on AVX2).
template <int W>
constexpr int kZRows = W == 16 ? 8 : 4;  // rows of Z per block (forward; fewer in the last)
constexpr int kRows = 4;                 // rows of dX per block (backward)
template <int W>
constexpr int kBwdVecs = W == 16 ? 4 : 2;  // vectors of a dX row per block (backward)

// Z's rows xr[0..R) against columns c..c+W*NV of XT (D, Fp): z (R, 2W).
template <int W, int R, int NV>
__attribute__((always_inline)) inline void gram_block(float* z, const float* const* xr, const float* xt, int Fp,
                                                      int D) {
  using V = typename Vec<W>::F;
  V acc[R][NV];
  for (int r = 0; r < R; r++)
    for (int h = 0; h < NV; h++) acc[r][h] = V{};
  for (int d = 0; d < D; d++) {
    V t[NV];
    for (int h = 0; h < NV; h++) std::memcpy(&t[h], xt + static_cast<int64_t>(d) * Fp + W * h, sizeof(V));
    for (int r = 0; r < R; r++) {
      const float s = xr[r][d];
      for (int h = 0; h < NV; h++) acc[r][h] += s * t[h];
    }
  }
  for (int r = 0; r < R; r++)
    for (int h = 0; h < NV; h++) std::memcpy(z + r * 2 * W + W * h, &acc[r][h], sizeof(V));
}

// One step of a W x W transpose held in m[0..W): swaps element (r, c) with
// (r^S, c^S) where bit S of r and c differ; the steps S = 1, 2, 4 (, 8) swap
// every (r, c) with (c, r). Each row costs one two-source permute.
template <int W, int S>
__attribute__((always_inline)) inline void transpose_step(typename Vec<W>::F* m) {
  using V = typename Vec<W>::F;
  typename Vec<W>::I lo, hi;  // lo: row r (bit S clear) takes a[k] or b[k-S]; hi: row r+S takes a[k+S] or b[k]
  for (int k = 0; k < W; k++) {
    lo[k] = (k & S) ? W + k - S : k;
    hi[k] = (k & S) ? W + k : k + S;
  }
  for (int r = 0; r < W; r++)
    if (!(r & S)) {
      const V a = m[r], b = m[r + S];
      m[r] = __builtin_shuffle(a, b, lo);
      m[r + S] = __builtin_shuffle(a, b, hi);
    }
}

// xt (D, Fp) = the transpose of x (F, D), in W x W tiles; rows of a tile
// past F repeat row F-1 (its columns of xt are never read back).
template <int W>
__attribute__((always_inline)) inline void transpose_sample(float* xt, const float* x, int F, int D, int Fp) {
  using V = typename Vec<W>::F;
  for (int i0 = 0; i0 < F; i0 += W)
    for (int d0 = 0; d0 < D; d0 += W) {
      V m[W];
      for (int r = 0; r < W; r++) std::memcpy(&m[r], x + std::min(i0 + r, F - 1) * D + d0, sizeof(V));
      transpose_step<W, 1>(m);
      transpose_step<W, 2>(m);
      transpose_step<W, 4>(m);
      if constexpr (W == 16) transpose_step<W, 8>(m);
      for (int c = 0; c < W; c++) std::memcpy(xt + static_cast<int64_t>(d0 + c) * Fp + i0, &m[c], sizeof(V));
    }
}

// out (D+P) of one sample x (F, D); xt: scratch (D, Fp), Fp a multiple of
// 16 at least F.
template <int W>
__attribute__((always_inline)) inline void forward_sample(float* o, const float* x, float* xt, int F, int D,
                                                          int Fp) {
  constexpr int ZR = kZRows<W>;
  std::copy(x, x + D, o);
  transpose_sample<W>(xt, x, F, D, Fp);
  float z[ZR * 2 * W];
  for (int i0 = 1; i0 < F; i0 += ZR) {
    const int rows = std::min(ZR, F - i0);
    const int ncol = i0 + rows - 1;  // the block's last row pairs with columns 0..ncol-1
    const float* xr[ZR];
    for (int r = 0; r < ZR; r++) xr[r] = x + std::min(i0 + r, F - 1) * D;  // rows past F: computed, dropped
    for (int c = 0; c < ncol; c += 2 * W) {
      const int nv = ncol - c > W ? 2 : 1;
      // The last block may hold few rows: a narrower one skips the dropped.
      if (rows > ZR / 2)
        nv == 2 ? gram_block<W, ZR, 2>(z, xr, xt + c, Fp, D) : gram_block<W, ZR, 1>(z, xr, xt + c, Fp, D);
      else if (rows > ZR / 4)
        nv == 2 ? gram_block<W, ZR / 2, 2>(z, xr, xt + c, Fp, D) : gram_block<W, ZR / 2, 1>(z, xr, xt + c, Fp, D);
      else
        nv == 2 ? gram_block<W, ZR / 4, 2>(z, xr, xt + c, Fp, D) : gram_block<W, ZR / 4, 1>(z, xr, xt + c, Fp, D);
      for (int r = 0; r < rows; r++) {
        const int i = i0 + r;
        float* zi = o + D + i * (i - 1) / 2;  // pair (i, j) at D + i(i-1)/2 + j
        for (int j = c; j < std::min(c + W * nv, i); j++) zi[j] = z[r * 2 * W + j - c];
      }
    }
  }
}

// wide: W = 16, else 8 (the caller's pick: AVX-512 or not).
TESSERA_CPU_CLONES void interaction_forward_sample(float* o, const float* x, float* xt, int F, int D, int Fp,
                                                   bool wide) {
  if (wide)
    forward_sample<16>(o, x, xt, F, D, Fp);
  else
    forward_sample<8>(o, x, xt, F, D, Fp);
}

// Rows ri[0..3] of dx (F, D), columns d0..d0+W*NV, += their part of S X
// (+ dout's first D for row 0 when i0 = 0); s (F, F).
template <int W, int NV>
__attribute__((always_inline)) inline void sx_block(float* dx, const float* g, const float* x, const float* s,
                                                    const int* ri, int rows, int i0, int d0, int F, int D) {
  using V = typename Vec<W>::F;
  V acc[kRows][NV];
  for (int r = 0; r < kRows; r++)
    for (int h = 0; h < NV; h++) std::memcpy(&acc[r][h], dx + ri[r] * D + d0 + W * h, sizeof(V));
  if (i0 == 0)
    for (int h = 0; h < NV; h++) {
      V g0;
      std::memcpy(&g0, g + d0 + W * h, sizeof(V));
      acc[0][h] += g0;
    }
  const float* s_r[kRows];
  for (int r = 0; r < kRows; r++) s_r[r] = s + ri[r] * F;
  // j < i0: every row of the block pairs with j.
  for (int j = 0; j < i0; j++) {
    V xj[NV];
    for (int h = 0; h < NV; h++) std::memcpy(&xj[h], x + j * D + d0 + W * h, sizeof(V));
    for (int r = 0; r < kRows; r++) {
      const float sj = s_r[r][j];
      for (int h = 0; h < NV; h++) acc[r][h] += sj * xj[h];
    }
  }
  // j in the block: every row but j's own.
  for (int jj = 0; jj < kRows; jj++) {
    if (i0 + jj >= F) break;
    V xj[NV];
    for (int h = 0; h < NV; h++) std::memcpy(&xj[h], x + (i0 + jj) * D + d0 + W * h, sizeof(V));
    for (int r = 0; r < kRows; r++) {
      if (r == jj) continue;
      const float sj = s_r[r][i0 + jj];
      for (int h = 0; h < NV; h++) acc[r][h] += sj * xj[h];
    }
  }
  for (int j = i0 + kRows; j < F; j++) {
    V xj[NV];
    for (int h = 0; h < NV; h++) std::memcpy(&xj[h], x + j * D + d0 + W * h, sizeof(V));
    for (int r = 0; r < kRows; r++) {
      const float sj = s_r[r][j];
      for (int h = 0; h < NV; h++) acc[r][h] += sj * xj[h];
    }
  }
  for (int r = 0; r < rows; r++)
    for (int h = 0; h < NV; h++) std::memcpy(dx + (i0 + r) * D + d0 + W * h, &acc[r][h], sizeof(V));
}

// dx (F, D) += the gradient of one sample from g (D+P); s: scratch (F, F).
template <int W>
__attribute__((always_inline)) inline void backward_sample(float* dx, const float* g, const float* x, float* s, int F,
                                                           int D) {
  constexpr int NV = kBwdVecs<W>;
  int k = D;
  for (int i = 1; i < F; i++)
    for (int j = 0; j < i; j++) s[i * F + j] = s[j * F + i] = g[k++];
  for (int i0 = 0; i0 < F; i0 += kRows) {
    const int rows = std::min(kRows, F - i0);
    int ri[kRows];
    for (int r = 0; r < kRows; r++) ri[r] = std::min(i0 + r, F - 1);  // rows past F: computed, dropped
    int d0 = 0;
    for (; d0 + NV * W <= D; d0 += NV * W) sx_block<W, NV>(dx, g, x, s, ri, rows, i0, d0, F, D);
    for (; d0 < D; d0 += W) sx_block<W, 1>(dx, g, x, s, ri, rows, i0, d0, F, D);
  }
}

TESSERA_CPU_CLONES void interaction_backward_sample(float* dx, const float* g, const float* x, float* s, int F,
                                                    int D, bool wide) {
  if (wide)
    backward_sample<16>(dx, g, x, s, F, D);
  else
    backward_sample<8>(dx, g, x, s, F, D);
}

// The vector width the interaction takes: 16 floats under AVX-512F, else 8
// (cpu_features applies the DNNL_MAX_CPU_ISA cap, so AVX2 hosts' width is
// tested on AVX-512 ones too).
bool wide_vectors() { return fp32_isa() == Fp32Isa::kAvx512; }

}  // namespace

void interaction_forward(float* out, const float* feat, int B, int F, int D) {
  interaction_forward_width(out, feat, B, F, D, wide_vectors());
}

void interaction_forward_width(float* out, const float* feat, int B, int F, int D, bool wide) {
  const int P = F * (F - 1) / 2;
  if (D % 16 == 0) {
    const int Fp = (F + 15) / 16 * 16;
#pragma omp parallel if (static_cast<int64_t>(B) * P * D > kParallelMin)
    {
      std::vector<float> xt(static_cast<size_t>(D) * Fp, 0.0f);
#pragma omp for schedule(static)
      for (int b = 0; b < B; b++)
        interaction_forward_sample(out + static_cast<int64_t>(b) * (D + P), feat + static_cast<int64_t>(b) * F * D,
                                   xt.data(), F, D, Fp, wide);
    }
    return;
  }
#pragma omp parallel for schedule(static) if (static_cast<int64_t>(B) * P * D > kParallelMin)
  for (int b = 0; b < B; b++) {
    const float* x = feat + static_cast<int64_t>(b) * F * D;
    float* o = out + static_cast<int64_t>(b) * (D + P);
    std::copy(x, x + D, o);
    int k = D;
    for (int i = 1; i < F; i++)
      for (int j = 0; j < i; j++) {
        const float* xi = x + i * D;
        const float* xj = x + j * D;
        float dot = 0.0f;
        for (int d = 0; d < D; d++) dot += xi[d] * xj[d];
        o[k++] = dot;
      }
  }
}

void interaction_backward(float* dfeat, const float* dout, const float* feat, int B, int F, int D) {
  interaction_backward_width(dfeat, dout, feat, B, F, D, wide_vectors());
}

void interaction_backward_width(float* dfeat, const float* dout, const float* feat, int B, int F, int D, bool wide) {
  const int P = F * (F - 1) / 2;
  if (D % 16 == 0) {
#pragma omp parallel if (static_cast<int64_t>(B) * P * D > kParallelMin)
    {
      std::vector<float> s(static_cast<size_t>(F) * F, 0.0f);
#pragma omp for schedule(static)
      for (int b = 0; b < B; b++)
        interaction_backward_sample(dfeat + static_cast<int64_t>(b) * F * D, dout + static_cast<int64_t>(b) * (D + P),
                                    feat + static_cast<int64_t>(b) * F * D, s.data(), F, D, wide);
    }
    return;
  }
#pragma omp parallel for schedule(static) if (static_cast<int64_t>(B) * P * D > kParallelMin)
  for (int b = 0; b < B; b++) {
    const float* x = feat + static_cast<int64_t>(b) * F * D;
    float* dx = dfeat + static_cast<int64_t>(b) * F * D;
    const float* g = dout + static_cast<int64_t>(b) * (D + P);
    for (int d = 0; d < D; d++) dx[d] += g[d];
    int k = D;
    for (int i = 1; i < F; i++)
      for (int j = 0; j < i; j++) {
        const float gk = g[k++];
        float* dxi = dx + i * D;
        float* dxj = dx + j * D;
        const float* xi = x + i * D;
        const float* xj = x + j * D;
#pragma omp simd
        for (int d = 0; d < D; d++) {
          dxi[d] += gk * xj[d];
          dxj[d] += gk * xi[d];
        }
      }
  }
}

void relu_forward(float* out, const float* inp, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n > kParallelMin)
  for (int64_t i = 0; i < n; i++) out[i] = inp[i] > 0.0f ? inp[i] : 0.0f;
}

void relu_backward(float* dinp, const float* inp, const float* dout, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n > kParallelMin)
  for (int64_t i = 0; i < n; i++) dinp[i] += inp[i] > 0.0f ? dout[i] : 0.0f;
}

void bce_logits_forward(float* losses, const float* logits, const float* labels, int N) {
  for (int i = 0; i < N; i++) {
    const float x = logits[i], y = labels[i];
    losses[i] = std::max(x, 0.0f) - x * y + std::log1p(std::exp(-std::fabs(x)));
  }
}

void bce_logits_backward(float* dlogits, const float* logits, const float* labels, float dloss, int N) {
  for (int i = 0; i < N; i++) {
    const float s = 1.0f / (1.0f + std::exp(-logits[i]));
    dlogits[i] += (s - labels[i]) * dloss;
  }
}

}  // namespace tessera::cpu
