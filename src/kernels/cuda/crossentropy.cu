// Fused softmax + cross-entropy. N rows, V real columns of Vp (padded).
// Forward: one block per row, two passes over the row's logits (max and
// sum of exp, then probabilities); only a few scalars per row are kept, never
// a second row-sized buffer. Backward: elementwise over the real columns.
// The chunked classifier's pair (crossentropy_lse_*) keeps no probabilities
// at all: forward saves each row's log-sum-exp, backward turns the
// (recomputed) logits into dlogits in place.
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

// As crossentropy_forward_kernel, keeping lse (N) instead of probs.
__global__ void crossentropy_lse_forward_kernel(float* losses, float* lse, const float* logits, const int* targets,
                                                int V, int Vp) {
  __shared__ float shared[kWarpSize];
  const int row = blockIdx.x;
  const float* x = logits + static_cast<int64_t>(row) * Vp;

  float maxval = -INFINITY;
  for (int j = threadIdx.x; j < V; j += blockDim.x) maxval = fmaxf(maxval, x[j]);
  maxval = block_max(maxval, shared);

  float sum = 0.0f;
  for (int j = threadIdx.x; j < V; j += blockDim.x) sum += expf(x[j] - maxval);
  sum = block_sum(sum, shared);

  if (threadIdx.x == 0) {
    const float log_sum = logf(sum);
    losses[row] = log_sum - (x[targets[row]] - maxval);
    lse[row] = maxval + log_sum;
  }
}

// One thread per (row, column), padding included: each element is read and
// then written by the same thread, so the update in place is safe.
__global__ void crossentropy_lse_backward_kernel(float* x, const float* lse, const int* targets, float dloss, int N,
                                                 int V, int Vp) {
  const int64_t n = static_cast<int64_t>(N) * Vp;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int row = static_cast<int>(i / Vp);
    const int j = static_cast<int>(i % Vp);
    float g = 0.0f;
    if (j < V) {
      const float indicator = j == targets[row] ? 1.0f : 0.0f;
      g = (expf(x[i] - lse[row]) - indicator) * dloss;
    }
    x[i] = g;
  }
}

}  // namespace

void crossentropy_lse_forward(float* losses, float* lse, const float* logits, const int* targets, int N, int V,
                              int Vp) {
  if (N == 0) return;
  crossentropy_lse_forward_kernel<<<N, kBlock>>>(losses, lse, logits, targets, V, Vp);
  CHECK_CUDA_LAUNCH();
}

void crossentropy_lse_backward(float* logits, const float* lse, const int* targets, float dloss, int N, int V,
                               int Vp) {
  const int64_t n = static_cast<int64_t>(N) * Vp;
  if (n == 0) return;
  crossentropy_lse_backward_kernel<<<grid_for(n, 256), 256>>>(logits, lse, targets, dloss, N, V, Vp);
  CHECK_CUDA_LAUNCH();
}

void crossentropy_softmax_forward(float* losses, float* probs, const float* logits, const int* targets, int N,
                                  int V, int Vp) {
  if (N == 0) return;
  crossentropy_forward_kernel<<<N, kBlock>>>(losses, probs, logits, targets, V, Vp);
  CHECK_CUDA_LAUNCH();
}

void crossentropy_softmax_backward(float* dlogits, const float* probs, const int* targets, float dloss, int N,
                                   int V, int Vp) {
  const int64_t n = static_cast<int64_t>(N) * V;
  if (n == 0) return;
  crossentropy_backward_kernel<<<grid_for(n, 256), 256>>>(dlogits, probs, targets, dloss, N, V, Vp);
  CHECK_CUDA_LAUNCH();
}

}  // namespace tessera::cuda
