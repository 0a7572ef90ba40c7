// The row kernels of the plain attention kernel sets (attention.cu and the
// grouped-query set in llama.cu): the causal softmax of a (B,NH,T,T)
// buffer's rows and its backward, one warp per row; static: each .cu has
// its own copy (no relocatable device code). nvcc only.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/cuda/common.cuh"

namespace tessera::cuda {

// One warp per row (b,h,t): att = softmax over t2 <= t of preatt, 0 above.
static __global__ void causal_softmax_kernel(float* att, const float* preatt, int rows, int T) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / kWarpSize) + threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  if (row >= rows) return;  // whole warp
  const int t = static_cast<int>(row % T);
  const float* pre = preatt + row * T;
  float* a = att + row * T;
  float maxval = -INFINITY;
  for (int t2 = lane; t2 <= t; t2 += kWarpSize) maxval = fmaxf(maxval, pre[t2]);
  maxval = warp_max(maxval);
  float sum = 0.0f;
  for (int t2 = lane; t2 <= t; t2 += kWarpSize) sum += expf(pre[t2] - maxval);
  sum = warp_sum(sum);
  const float inv = 1.0f / sum;
  for (int t2 = lane; t2 < T; t2 += kWarpSize) a[t2] = t2 <= t ? expf(pre[t2] - maxval) * inv : 0.0f;
}

// One warp per row: dpreatt[t2] += att[t2] * (datt[t2] - sum_i att[i] datt[i]),
// t2 <= t, with datt as accumulated (including what the caller left in it).
static __global__ void softmax_backward_kernel(float* dpreatt, const float* datt, const float* att, int rows, int T) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / kWarpSize) + threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  if (row >= rows) return;  // whole warp
  const int t = static_cast<int>(row % T);
  const float* a = att + row * T;
  const float* da = datt + row * T;
  float dot = 0.0f;
  for (int t2 = lane; t2 <= t; t2 += kWarpSize) dot += a[t2] * da[t2];
  dot = warp_sum(dot);
  for (int t2 = lane; t2 <= t; t2 += kWarpSize) dpreatt[row * T + t2] += a[t2] * (da[t2] - dot);
}

}  // namespace tessera::cuda
