// Fused softmax + cross-entropy. N rows, V real columns of Vp (padded).
// Forward: one block per row, two passes over the row's logits (max and
// sum of exp, then probabilities); only a few scalars per row are kept, never
// a second row-sized buffer. Backward: elementwise over the real columns.
#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

namespace tessera::cuda {

namespace {

constexpr int kBlock = 512;

__global__ void crossentropy_forward_kernel(float* losses, float* probs, const float* logits, const int* targets,
                                            int V, int Vp) {
  __shared__ float shared[kWarpSize];
  const int row = blockIdx.x;
  const float* x = logits + static_cast<int64_t>(row) * Vp;
  float* p = probs + static_cast<int64_t>(row) * Vp;

  float maxval = -INFINITY;
  for (int j = threadIdx.x; j < V; j += blockDim.x) maxval = fmaxf(maxval, x[j]);
  maxval = block_max(maxval, shared);

  float sum = 0.0f;
  for (int j = threadIdx.x; j < V; j += blockDim.x) sum += expf(x[j] - maxval);
  sum = block_sum(sum, shared);

  const float inv_sum = 1.0f / sum;
  for (int j = threadIdx.x; j < Vp; j += blockDim.x) p[j] = j < V ? expf(x[j] - maxval) * inv_sum : 0.0f;
  // -log p[target] from the log-sum-exp, finite even when p[target]
  // underflows to 0.
  if (threadIdx.x == 0) losses[row] = logf(sum) - (x[targets[row]] - maxval);
}

// One thread per (row, real column); padding columns are never touched.
__global__ void crossentropy_backward_kernel(float* dlogits, const float* probs, const int* targets, float dloss,
                                             int N, int V, int Vp) {
  const int64_t n = static_cast<int64_t>(N) * V;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int row = static_cast<int>(i / V);
    const int j = static_cast<int>(i % V);
    const int64_t k = static_cast<int64_t>(row) * Vp + j;
    const float indicator = j == targets[row] ? 1.0f : 0.0f;
    dlogits[k] += (probs[k] - indicator) * dloss;
  }
}

}  // namespace

void crossentropy_softmax_forward(float* losses, float* probs, const float* logits, const int* targets, int N,
                                  int V, int Vp) {
  if (N == 0) return;
  crossentropy_forward_kernel<<<N, kBlock>>>(losses, probs, logits, targets, V, Vp);
  CUDA_CHECK_LAUNCH();
}

void crossentropy_softmax_backward(float* dlogits, const float* probs, const int* targets, float dloss, int N,
                                   int V, int Vp) {
  const int64_t n = static_cast<int64_t>(N) * V;
  if (n == 0) return;
  crossentropy_backward_kernel<<<grid_for(n, 256), 256>>>(dlogits, probs, targets, dloss, N, V, Vp);
  CUDA_CHECK_LAUNCH();
}

}  // namespace tessera::cuda
