// Token + position embedding. B batch, T time, C channels, V vocabulary.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

namespace tessera::cuda {

namespace {

// One thread per output element of out (B,T,C).
__global__ void encoder_forward_kernel(float* out, const int* inp, const float* wte, const float* wpe, int T, int C,
                                       int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t bt = i / C;
    const int c = static_cast<int>(i % C);
    const int t = static_cast<int>(bt % T);
    out[i] = wte[static_cast<int64_t>(inp[bt]) * C + c] + (wpe ? wpe[static_cast<int64_t>(t) * C + c] : 0.0f);
  }
}

// dwpe (T,C): one thread per (t, c) sums over b in a fixed order, so dwpe is
// deterministic and needs no atomics.
__global__ void encoder_backward_wpe_kernel(float* dwpe, const float* dout, int B, int T, int C) {
  const int64_t n = static_cast<int64_t>(T) * C;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float acc = 0.0f;
    for (int b = 0; b < B; b++) acc += dout[static_cast<int64_t>(b) * n + i];
    dwpe[i] += acc;
  }
}

// dwte (V,C): positions that share a token id hit the same row, so each
// element adds with atomicAdd. The sum is exact up to fp32 rounding but its
// order (and so the last bits) varies between runs.
__global__ void encoder_backward_wte_kernel(float* dwte, const float* dout, const int* inp, int C, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t bt = i / C;
    const int c = static_cast<int>(i % C);
    atomicAdd(&dwte[static_cast<int64_t>(inp[bt]) * C + c], dout[i]);
  }
}

constexpr int kBlock = 256;

}  // namespace

void encoder_forward(float* out, const int* inp, const float* wte, const float* wpe, int B, int T, int C) {
  const int64_t n = static_cast<int64_t>(B) * T * C;
  if (n == 0) return;
  encoder_forward_kernel<<<grid_for(n, kBlock), kBlock>>>(out, inp, wte, wpe, T, C, n);
  CHECK_CUDA_LAUNCH();
}

void encoder_backward(float* dwte, float* dwpe, const float* dout, const int* inp, int B, int T, int C) {
  const int64_t n = static_cast<int64_t>(B) * T * C;
  if (n == 0) return;
  if (dwpe) {  // null: no learned positions
    encoder_backward_wpe_kernel<<<grid_for(static_cast<int64_t>(T) * C, kBlock), kBlock>>>(dwpe, dout, B, T, C);
    CHECK_CUDA_LAUNCH();
  }
  encoder_backward_wte_kernel<<<grid_for(n, kBlock), kBlock>>>(dwte, dout, inp, C, n);
  CHECK_CUDA_LAUNCH();
}

}  // namespace tessera::cuda
