#include "parallel/cuda/dp_device.h"

#include <cuda_runtime.h>

#include "kernels/cuda/common.cuh"

namespace tessera::dp_cuda {

namespace {

// Elementwise, grid-stride: the same float multiply the CPU unpack does
// (src[i] * scale), so a bucket's averages match it bit for bit.
__global__ void scaled_copy_kernel(float* dst, const float* src, int64_t n, float scale) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    dst[i] = src[i] * scale;
}

}  // namespace

Status copy_async(float* dst, const float* src, int64_t n) {
  if (n <= 0) return Status::OK();
  // Stream 0 is the legacy default stream: the model's kernels run there.
  TRY_CUDA(cudaMemcpyAsync(dst, src, static_cast<size_t>(n) * sizeof(float), cudaMemcpyDeviceToDevice,
                                       cudaStreamLegacy));
  return Status::OK();
}

Status scaled_copy_async(float* dst, const float* src, int64_t n, float scale) {
  if (n <= 0) return Status::OK();
  constexpr int kBlock = 256;
  scaled_copy_kernel<<<cuda::grid_for(n, kBlock), kBlock, 0, cudaStreamLegacy>>>(dst, src, n, scale);
  TRY_CUDA(cudaGetLastError());
  return Status::OK();
}

}  // namespace tessera::dp_cuda
