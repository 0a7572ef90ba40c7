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
#include <numeric>
#include <vector>

#include "kernels/cpu/ops.h"

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

void interaction_forward(float* out, const float* feat, int B, int F, int D) {
  const int P = F * (F - 1) / 2;
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
#pragma omp simd reduction(+ : dot)
        for (int d = 0; d < D; d++) dot += xi[d] * xj[d];
        o[k++] = dot;
      }
  }
}

void interaction_backward(float* dfeat, const float* dout, const float* feat, int B, int F, int D) {
  const int P = F * (F - 1) / 2;
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
