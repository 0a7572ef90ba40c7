// AdamW, fused: one pass reads grads, m, v, params and writes m, v, params.
#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

namespace tessera::cuda {

namespace {

// bc1, bc2: the bias corrections 1 - beta^t, computed once on the host (as
// the oracle does, in float).
__global__ void adamw_kernel(float* params, const float* grads, float* m, float* v, int64_t n, float lr, float beta1,
                             float beta2, float eps, float weight_decay, float grad_scale, float bc1, float bc2) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float g = grads[i] * grad_scale;
    const float mi = beta1 * m[i] + (1.0f - beta1) * g;
    const float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    const float mhat = mi / bc1;
    const float vhat = vi / bc2;
    const float p = params[i];
    params[i] = p - lr * (mhat / (sqrtf(vhat) + eps) + weight_decay * p);
  }
}

constexpr int kBlock = 256;

}  // namespace

void adamw_update(float* params, const float* grads, float* m, float* v, int64_t n, const AdamWParams& hp) {
  if (n <= 0) return;
  const float bc1 = 1.0f - std::pow(hp.beta1, static_cast<float>(hp.t));
  const float bc2 = 1.0f - std::pow(hp.beta2, static_cast<float>(hp.t));
  adamw_kernel<<<grid_for(n, kBlock), kBlock>>>(params, grads, m, v, n, hp.lr, hp.beta1, hp.beta2, hp.eps,
                                                hp.weight_decay, hp.grad_scale, bc1, bc2);
  CHECK_CUDA_LAUNCH();
}

}  // namespace tessera::cuda
