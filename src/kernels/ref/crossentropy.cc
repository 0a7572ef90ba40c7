#include <cmath>

#include "kernels/ref/ops.h"

namespace tessera::ref {

void crossentropy_softmax_forward(float* losses, float* probs, const float* logits, const int* targets, int N,
                                  int V, int Vp) {
  for (int i = 0; i < N; i++) {
    const float* x = logits + static_cast<int64_t>(i) * Vp;
    float* p = probs + static_cast<int64_t>(i) * Vp;
    float maxval = -INFINITY;
    for (int j = 0; j < V; j++)
      if (x[j] > maxval) maxval = x[j];
    double sum = 0.0;
    for (int j = 0; j < V; j++) {
      p[j] = std::exp(x[j] - maxval);
      sum += p[j];
    }
    for (int j = 0; j < V; j++) p[j] = static_cast<float>(p[j] / sum);
    for (int j = V; j < Vp; j++) p[j] = 0.0f;
    // -log p[target], computed from the log-sum-exp so it stays finite when
    // p[target] underflows.
    losses[i] = static_cast<float>(std::log(sum) - (x[targets[i]] - maxval));
  }
}

void crossentropy_softmax_backward(float* dlogits, const float* probs, const int* targets, float dloss, int N,
                                   int V, int Vp) {
  for (int i = 0; i < N; i++) {
    float* dx = dlogits + static_cast<int64_t>(i) * Vp;
    const float* p = probs + static_cast<int64_t>(i) * Vp;
    for (int j = 0; j < V; j++) {
      float indicator = (j == targets[i]) ? 1.0f : 0.0f;
      dx[j] += (p[j] - indicator) * dloss;
    }
  }
}

}  // namespace tessera::ref
