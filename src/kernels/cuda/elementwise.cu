// GELU (tanh approximation) and residual add over n elements, grid-stride.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

namespace tessera::cuda {

namespace {

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi)
constexpr int kBlock = 256;

#define TESSERA_GRID_STRIDE(i, n)                                                     \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)

__global__ void gelu_forward_kernel(float* out, const float* inp, int64_t n) {
  TESSERA_GRID_STRIDE(i, n) {
    const float x = inp[i];
    const float cube = 0.044715f * x * x * x;
    out[i] = 0.5f * x * (1.0f + tanhf(kGeluScale * (x + cube)));
  }
}

__global__ void gelu_backward_kernel(float* dinp, const float* inp, const float* dout, int64_t n) {
  TESSERA_GRID_STRIDE(i, n) {
    const float x = inp[i];
    const float cube = 0.044715f * x * x * x;
    const float tanh_out = tanhf(kGeluScale * (x + cube));
    const float sech2 = 1.0f - tanh_out * tanh_out;
    const float local_grad =
        0.5f * (1.0f + tanh_out) + x * 0.5f * sech2 * kGeluScale * (1.0f + 3.0f * 0.044715f * x * x);
    dinp[i] += local_grad * dout[i];
  }
}

__global__ void residual_forward_kernel(float* out, const float* inp1, const float* inp2, int64_t n) {
  TESSERA_GRID_STRIDE(i, n) { out[i] = inp1[i] + inp2[i]; }
}

__global__ void residual_backward_kernel(float* dinp1, float* dinp2, const float* dout, int64_t n) {
  TESSERA_GRID_STRIDE(i, n) {
    const float d = dout[i];
    dinp1[i] += d;
    dinp2[i] += d;
  }
}

#undef TESSERA_GRID_STRIDE

}  // namespace

void gelu_forward(float* out, const float* inp, int64_t n) {
  if (n <= 0) return;
  gelu_forward_kernel<<<grid_for(n, kBlock), kBlock>>>(out, inp, n);
  CHECK_CUDA_LAUNCH();
}

void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t n) {
  if (n <= 0) return;
  gelu_backward_kernel<<<grid_for(n, kBlock), kBlock>>>(dinp, inp, dout, n);
  CHECK_CUDA_LAUNCH();
}

void residual_forward(float* out, const float* inp1, const float* inp2, int64_t n) {
  if (n <= 0) return;
  residual_forward_kernel<<<grid_for(n, kBlock), kBlock>>>(out, inp1, inp2, n);
  CHECK_CUDA_LAUNCH();
}

void residual_backward(float* dinp1, float* dinp2, const float* dout, int64_t n) {
  if (n <= 0) return;
  residual_backward_kernel<<<grid_for(n, kBlock), kBlock>>>(dinp1, dinp2, dout, n);
  CHECK_CUDA_LAUNCH();
}

}  // namespace tessera::cuda
