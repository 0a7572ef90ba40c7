// Fused softmax + cross-entropy over the vocabulary. N rows (B*T), V real
// columns, Vp padded columns (a multiple of 128).
//
// Rows are independent and threaded. Within a row the forward makes three
// passes (max; exp and sum; scale), but a row of logits plus its row of
// probabilities (2 x 196 KiB for GPT-2) stays in L2, so memory sees one read
// of logits and one write of probs. The row loop is compiled for AVX-512,
// AVX2 and baseline x86-64 (target_clones, chosen at load time) around an exp
// that vectorises; libm's expf would keep the loop scalar.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/cpu/ops.h"
#include "kernels/cpu/vec_math.h"


namespace tessera::cpu {

namespace {

constexpr int64_t kParallelMin = 32768;  // elements; below this, no fork


// One row: p (Vp) = softmax(x[0:V]) with zero padding; returns
// -log p[target] in the log-sum-exp form log(sum) - (x[target] - max), which
// stays finite when p[target] underflows. The sum is kept in double, as in
// the reference: V terms of up to 1 each.
TESSERA_CPU_CLONES float crossentropy_row(float* p, const float* x, int target, int V, int Vp) {
  float maxval = -INFINITY;
#pragma omp simd reduction(max : maxval)
  for (int j = 0; j < V; j++) maxval = x[j] > maxval ? x[j] : maxval;
  double sum = 0.0;
#pragma omp simd reduction(+ : sum)
  for (int j = 0; j < V; j++) {
    const float e = exp_approx(x[j] - maxval);
    p[j] = e;
    sum += e;
  }
  const float inv_sum = static_cast<float>(1.0 / sum);
#pragma omp simd
  for (int j = 0; j < V; j++) p[j] *= inv_sum;
  for (int j = V; j < Vp; j++) p[j] = 0.0f;
  return static_cast<float>(std::log(sum) - (x[target] - maxval));
}

TESSERA_CPU_CLONES void crossentropy_backward_row(float* dx, const float* p, int target, float dloss, int V) {
#pragma omp simd
  for (int j = 0; j < V; j++) {
    const float indicator = j == target ? 1.0f : 0.0f;
    dx[j] += (p[j] - indicator) * dloss;
  }
}

}  // namespace

void crossentropy_softmax_forward(float* losses, float* probs, const float* logits, const int* targets, int N,
                                  int V, int Vp) {
#pragma omp parallel for schedule(static) if (static_cast<int64_t>(N) * V > kParallelMin)
  for (int i = 0; i < N; i++) {
    const int64_t row = static_cast<int64_t>(i) * Vp;
    losses[i] = crossentropy_row(probs + row, logits + row, targets[i], V, Vp);
  }
}

void crossentropy_softmax_backward(float* dlogits, const float* probs, const int* targets, float dloss, int N,
                                   int V, int Vp) {
#pragma omp parallel for schedule(static) if (static_cast<int64_t>(N) * V > kParallelMin)
  for (int i = 0; i < N; i++) {
    const int64_t row = static_cast<int64_t>(i) * Vp;
    crossentropy_backward_row(dlogits + row, probs + row, targets[i], dloss, V);
  }
}

}  // namespace tessera::cpu
