#include "optim/sparse.h"

#include <cmath>

namespace tessera {

namespace {
constexpr int64_t kParallelMin = 32768;  // floats; below this, no fork
}  // namespace

void rowwise_adagrad_update(float* table, float* state, const int* rows, const float* grads, int U, int D,
                            const RowwiseAdagradParams& hp) {
#pragma omp parallel for schedule(static) if (static_cast<int64_t>(U) * D > kParallelMin)
  for (int u = 0; u < U; u++) {
    const float* g = grads + static_cast<int64_t>(u) * D;
    float* w = table + static_cast<int64_t>(rows[u]) * D;
    float sq = 0.0f;
    for (int d = 0; d < D; d++) sq += g[d] * g[d];
    state[rows[u]] += sq / static_cast<float>(D);
    const float mult = hp.lr / (std::sqrt(state[rows[u]]) + hp.eps);
#pragma omp simd
    for (int d = 0; d < D; d++) w[d] -= mult * g[d];
  }
}

void sparse_sgd_update(float* table, const int* rows, const float* grads, int U, int D, float lr) {
#pragma omp parallel for schedule(static) if (static_cast<int64_t>(U) * D > kParallelMin)
  for (int u = 0; u < U; u++) {
    const float* g = grads + static_cast<int64_t>(u) * D;
    float* w = table + static_cast<int64_t>(rows[u]) * D;
#pragma omp simd
    for (int d = 0; d < D; d++) w[d] -= lr * g[d];
  }
}

}  // namespace tessera
