#include <cmath>

#include "kernels/ref/ops.h"

namespace tessera::ref {

void adamw_update(float* params, const float* grads, float* m, float* v, int64_t n, const AdamWParams& hp) {
  const float bc1 = 1.0f - std::pow(hp.beta1, static_cast<float>(hp.t));
  const float bc2 = 1.0f - std::pow(hp.beta2, static_cast<float>(hp.t));
  for (int64_t i = 0; i < n; i++) {
    float g = grads[i] * hp.grad_scale;
    m[i] = hp.beta1 * m[i] + (1.0f - hp.beta1) * g;
    v[i] = hp.beta2 * v[i] + (1.0f - hp.beta2) * g * g;
    float mhat = m[i] / bc1;
    float vhat = v[i] / bc2;
    params[i] -= hp.lr * (mhat / (std::sqrt(vhat) + hp.eps) + hp.weight_decay * params[i]);
  }
}

}  // namespace tessera::ref
