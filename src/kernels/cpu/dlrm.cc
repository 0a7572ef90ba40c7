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
// a time, 16 floats to a vector (one zmm under AVX-512; the functions are
// compiled per ISA level, vec_math.h). Forward: Z = X X^T from a transposed
// copy XT (D, Fp) of the sample (16x16 tiles transposed in registers), rows
// of Z in blocks of 8 (fewer in the last), each block's columns (only those
// left of its last row) one or two vectors: per d, one or two loads of XT[d]
// and 8 broadcasts of X[i][d] feed 8 or 16 independent accumulators.
// Backward: dX += S X with S (F, F) the pair gradients placed at (i, j) and
// (j, i): rows of dX in blocks of 4, 64 floats at a time (16 accumulators),
// X[j] loaded once for 4 rows. The loops they replace did one pair at a time
// (a horizontal sum per dot, two read-modify-writes of D floats per pair in
// backward) and ran at 8% of the GEMM peak (docs/performance.md, DLRM).
//
// Both keep the reference's order of summation: every Z[i][j] sums d =
// 0..D-1 from 0, and every dX[i] starts from its old value (plus dout's
// first D for i = 0) and adds S[i][j] X[j] for j ascending, skipping j = i:
// the reference's pair order as one row sees it. The only difference is that
// GCC contracts a multiply and add into an FMA (C++'s default
// -ffp-contract=fast) in the AVX2 and AVX-512 clones, one rounding fewer per
// term; the baseline clone, like the reference, has no FMA.
namespace {

typedef float v16 __attribute__((vector_size(64)));  // 16 floats
typedef int v16i __attribute__((vector_size(64)));   // lane indices of two v16s (0..31)

constexpr int kZRows = 8;  // rows of Z per block (forward; fewer in the last)
constexpr int kRows = 4;   // rows of dX per block (backward)

// Z's rows xr[0..R) against columns c..c+16*NV of XT (D, Fp): z (R, 32).
template <int R, int NV>
__attribute__((always_inline)) inline void gram_block(float* z, const float* const* xr, const float* xt, int Fp,
                                                      int D) {
  v16 acc[R][NV];
  for (int r = 0; r < R; r++)
    for (int h = 0; h < NV; h++) acc[r][h] = v16{};
  for (int d = 0; d < D; d++) {
    v16 t[NV];
    for (int h = 0; h < NV; h++) std::memcpy(&t[h], xt + static_cast<int64_t>(d) * Fp + 16 * h, sizeof(v16));
    for (int r = 0; r < R; r++) {
      const float s = xr[r][d];
      for (int h = 0; h < NV; h++) acc[r][h] += s * t[h];
    }
  }
  for (int r = 0; r < R; r++)
    for (int h = 0; h < NV; h++) std::memcpy(z + r * 32 + 16 * h, &acc[r][h], sizeof(v16));
}

// One step of a 16x16 transpose held in m[0..16): swaps element (r, c) with
// (r^S, c^S) where bit S of r and c differ; the four steps S = 1, 2, 4, 8
// swap every (r, c) with (c, r). Each row costs one two-source permute.
template <int S>
__attribute__((always_inline)) inline void transpose_step(v16* m) {
  v16i lo, hi;  // lo: row r (bit S clear) takes a[k] or b[k-S]; hi: row r+S takes a[k+S] or b[k]
  for (int k = 0; k < 16; k++) {
    lo[k] = (k & S) ? 16 + k - S : k;
    hi[k] = (k & S) ? 16 + k : k + S;
  }
  for (int r = 0; r < 16; r++)
    if (!(r & S)) {
      const v16 a = m[r], b = m[r + S];
      m[r] = __builtin_shuffle(a, b, lo);
      m[r + S] = __builtin_shuffle(a, b, hi);
    }
}

// xt (D, Fp) = the transpose of x (F, D), in 16x16 tiles; rows of a tile
// past F repeat row F-1 (its columns of xt are never read back).
__attribute__((always_inline)) inline void transpose_sample(float* xt, const float* x, int F, int D, int Fp) {
  for (int i0 = 0; i0 < F; i0 += 16)
    for (int d0 = 0; d0 < D; d0 += 16) {
      v16 m[16];
      for (int r = 0; r < 16; r++) std::memcpy(&m[r], x + std::min(i0 + r, F - 1) * D + d0, sizeof(v16));
      transpose_step<1>(m);
      transpose_step<2>(m);
      transpose_step<4>(m);
      transpose_step<8>(m);
      for (int c = 0; c < 16; c++) std::memcpy(xt + static_cast<int64_t>(d0 + c) * Fp + i0, &m[c], sizeof(v16));
    }
}

// out (D+P) of one sample x (F, D); xt: scratch (D, Fp) whose columns F..Fp
// are zero.
TESSERA_CPU_CLONES void interaction_forward_sample(float* o, const float* x, float* xt, int F, int D, int Fp) {
  std::copy(x, x + D, o);
  transpose_sample(xt, x, F, D, Fp);
  float z[kZRows * 32];
  for (int i0 = 1; i0 < F; i0 += kZRows) {
    const int rows = std::min(kZRows, F - i0);
    const int ncol = i0 + rows - 1;  // the block's last row pairs with columns 0..ncol-1
    const float* xr[kZRows];
    for (int r = 0; r < kZRows; r++) xr[r] = x + std::min(i0 + r, F - 1) * D;  // rows past F: computed, dropped
    for (int c = 0; c < ncol; c += 32) {
      const int nv = ncol - c > 16 ? 2 : 1;
      // The last block may hold few rows: a narrower one skips the dropped.
      if (rows > 4)
        nv == 2 ? gram_block<8, 2>(z, xr, xt + c, Fp, D) : gram_block<8, 1>(z, xr, xt + c, Fp, D);
      else if (rows > 2)
        nv == 2 ? gram_block<4, 2>(z, xr, xt + c, Fp, D) : gram_block<4, 1>(z, xr, xt + c, Fp, D);
      else
        nv == 2 ? gram_block<2, 2>(z, xr, xt + c, Fp, D) : gram_block<2, 1>(z, xr, xt + c, Fp, D);
      for (int r = 0; r < rows; r++) {
        const int i = i0 + r;
        float* zi = o + D + i * (i - 1) / 2;  // pair (i, j) at D + i(i-1)/2 + j
        for (int j = c; j < std::min(c + 16 * nv, i); j++) zi[j] = z[r * 32 + j - c];
      }
    }
  }
}

// Rows ri[0..3] of dx (F, D), columns d0..d0+16*NV, += their part of S X
// (+ dout's first D for row 0 when i0 = 0); s (F, F).
template <int NV>
__attribute__((always_inline)) inline void sx_block(float* dx, const float* g, const float* x, const float* s,
                                                    const int* ri, int rows, int i0, int d0, int F, int D) {
  v16 acc[kRows][NV];
  for (int r = 0; r < kRows; r++)
    for (int h = 0; h < NV; h++) std::memcpy(&acc[r][h], dx + ri[r] * D + d0 + 16 * h, sizeof(v16));
  if (i0 == 0)
    for (int h = 0; h < NV; h++) {
      v16 g0;
      std::memcpy(&g0, g + d0 + 16 * h, sizeof(v16));
      acc[0][h] += g0;
    }
  const float* s_r[kRows];
  for (int r = 0; r < kRows; r++) s_r[r] = s + ri[r] * F;
  // j < i0: every row of the block pairs with j.
  for (int j = 0; j < i0; j++) {
    v16 xj[NV];
    for (int h = 0; h < NV; h++) std::memcpy(&xj[h], x + j * D + d0 + 16 * h, sizeof(v16));
    for (int r = 0; r < kRows; r++) {
      const float sj = s_r[r][j];
      for (int h = 0; h < NV; h++) acc[r][h] += sj * xj[h];
    }
  }
  // j in the block: every row but j's own.
  for (int jj = 0; jj < kRows; jj++) {
    if (i0 + jj >= F) break;
    v16 xj[NV];
    for (int h = 0; h < NV; h++) std::memcpy(&xj[h], x + (i0 + jj) * D + d0 + 16 * h, sizeof(v16));
    for (int r = 0; r < kRows; r++) {
      if (r == jj) continue;
      const float sj = s_r[r][i0 + jj];
      for (int h = 0; h < NV; h++) acc[r][h] += sj * xj[h];
    }
  }
  for (int j = i0 + kRows; j < F; j++) {
    v16 xj[NV];
    for (int h = 0; h < NV; h++) std::memcpy(&xj[h], x + j * D + d0 + 16 * h, sizeof(v16));
    for (int r = 0; r < kRows; r++) {
      const float sj = s_r[r][j];
      for (int h = 0; h < NV; h++) acc[r][h] += sj * xj[h];
    }
  }
  for (int r = 0; r < rows; r++)
    for (int h = 0; h < NV; h++) std::memcpy(dx + (i0 + r) * D + d0 + 16 * h, &acc[r][h], sizeof(v16));
}

// dx (F, D) += the gradient of one sample from g (D+P); s: scratch (F, F).
TESSERA_CPU_CLONES void interaction_backward_sample(float* dx, const float* g, const float* x, float* s, int F,
                                                    int D) {
  int k = D;
  for (int i = 1; i < F; i++)
    for (int j = 0; j < i; j++) s[i * F + j] = s[j * F + i] = g[k++];
  for (int i0 = 0; i0 < F; i0 += kRows) {
    const int rows = std::min(kRows, F - i0);
    int ri[kRows];
    for (int r = 0; r < kRows; r++) ri[r] = std::min(i0 + r, F - 1);  // rows past F: computed, dropped
    int d0 = 0;
    for (; d0 + 64 <= D; d0 += 64) sx_block<4>(dx, g, x, s, ri, rows, i0, d0, F, D);
    for (; d0 < D; d0 += 16) sx_block<1>(dx, g, x, s, ri, rows, i0, d0, F, D);
  }
}

}  // namespace

void interaction_forward(float* out, const float* feat, int B, int F, int D) {
  const int P = F * (F - 1) / 2;
  if (D % 16 == 0) {
    const int Fp = (F + 15) / 16 * 16;
#pragma omp parallel if (static_cast<int64_t>(B) * P * D > kParallelMin)
    {
      std::vector<float> xt(static_cast<size_t>(D) * Fp, 0.0f);
#pragma omp for schedule(static)
      for (int b = 0; b < B; b++)
        interaction_forward_sample(out + static_cast<int64_t>(b) * (D + P), feat + static_cast<int64_t>(b) * F * D,
                                   xt.data(), F, D, Fp);
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
  const int P = F * (F - 1) / 2;
  if (D % 16 == 0) {
#pragma omp parallel if (static_cast<int64_t>(B) * P * D > kParallelMin)
    {
      std::vector<float> s(static_cast<size_t>(F) * F, 0.0f);
#pragma omp for schedule(static)
      for (int b = 0; b < B; b++)
        interaction_backward_sample(dfeat + static_cast<int64_t>(b) * F * D, dout + static_cast<int64_t>(b) * (D + P),
                                    feat + static_cast<int64_t>(b) * F * D, s.data(), F, D);
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
