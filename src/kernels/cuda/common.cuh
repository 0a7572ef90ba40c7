// Helpers shared by the CUDA kernels (nvcc only): launch sizes and warp and
// block reductions. Reductions use __shfl_xor_sync over full warps, so every
// lane of a warp must reach them (kernels keep idle lanes alive and mask
// their loads instead of returning early).
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "kernels/cuda/cublas_check.h"

namespace tessera::cuda {

constexpr int kWarpSize = 32;

inline unsigned ceil_div(int64_t n, int64_t d) { return static_cast<unsigned>((n + d - 1) / d); }

// Grid size for a grid-stride loop over n elements: enough blocks to fill the
// GPU, never more than the elements need, and within gridDim.x's limit.
inline unsigned grid_for(int64_t n, int block) {
  const int64_t blocks = (n + block - 1) / block;
  return static_cast<unsigned>(blocks < 65535 * 8 ? blocks : 65535 * 8);
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int off = kWarpSize / 2; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
  for (int off = kWarpSize / 2; off > 0; off /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}

// Sum over the whole block (blockDim.x a multiple of 32, at most 1024); every
// thread gets the result. `shared` holds 32 floats; it is reused, so the
// leading __syncthreads protects a previous call's readers.
__device__ __forceinline__ float block_sum(float v, float* shared) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int warps = blockDim.x / kWarpSize;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < warps ? shared[lane] : 0.0f;
  return warp_sum(v);
}

__device__ __forceinline__ float block_max(float v, float* shared) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int warps = blockDim.x / kWarpSize;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < warps ? shared[lane] : -INFINITY;
  return warp_max(v);
}

}  // namespace tessera::cuda
