// LayerNorm over the last dimension. N rows (B*T), C channels; eps 1e-5.
// Row statistics use one warp per row (warp-shuffle reductions); the
// parameter gradients reduce over rows per column in a fixed order, so the
// whole op is deterministic.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

namespace tessera::cuda {

namespace {

constexpr int kRowsPerBlock = 8;  // warps per block in the per-row kernels

// One warp per row. Two passes over the row (mean, then the variance of
// x - mean), as the oracle, rather than E[x^2] - mean^2, which cancels.
__global__ void layernorm_forward_kernel(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                                         const float* bias, int N, int C) {
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  if (row >= N) return;  // whole warp: row is the same for all its lanes
  const float* x = inp + static_cast<int64_t>(row) * C;
  float sum = 0.0f;
  for (int c = lane; c < C; c += kWarpSize) sum += x[c];
  const float m = warp_sum(sum) / C;
  float sq = 0.0f;
  for (int c = lane; c < C; c += kWarpSize) {
    const float d = x[c] - m;
    sq += d * d;
  }
  const float s = 1.0f / sqrtf(warp_sum(sq) / C + 1e-5f);
  float* y = out + static_cast<int64_t>(row) * C;
  for (int c = lane; c < C; c += kWarpSize) y[c] = s * (x[c] - m) * weight[c] + bias[c];
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = s;
  }
}

// dinp: one warp per row; the two row reductions of the oracle.
__global__ void layernorm_backward_dinp_kernel(float* dinp, const float* dout, const float* inp, const float* weight,
                                               const float* mean, const float* rstd, int N, int C) {
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  if (row >= N) return;
  const float* dy = dout + static_cast<int64_t>(row) * C;
  const float* x = inp + static_cast<int64_t>(row) * C;
  float* dx = dinp + static_cast<int64_t>(row) * C;
  const float m = mean[row], s = rstd[row];
  float dnorm_sum = 0.0f, dnorm_norm_sum = 0.0f;
  for (int c = lane; c < C; c += kWarpSize) {
    const float norm = (x[c] - m) * s;
    const float dnorm = weight[c] * dy[c];
    dnorm_sum += dnorm;
    dnorm_norm_sum += dnorm * norm;
  }
  const float dnorm_mean = warp_sum(dnorm_sum) / C;
  const float dnorm_norm_mean = warp_sum(dnorm_norm_sum) / C;
  for (int c = lane; c < C; c += kWarpSize) {
    const float norm = (x[c] - m) * s;
    const float dnorm = weight[c] * dy[c];
    dx[c] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s;
  }
}

// dweight, dbias: block (32, kRows); threadIdx.x picks the column (coalesced
// loads), threadIdx.y strides over rows; partial sums meet in shared memory.
constexpr int kRows = 8;
__global__ void layernorm_backward_params_kernel(float* dweight, float* dbias, const float* dout, const float* inp,
                                                 const float* mean, const float* rstd, int N, int C) {
  __shared__ float part_w[kRows][kWarpSize];
  __shared__ float part_b[kRows][kWarpSize];
  const int c = blockIdx.x * kWarpSize + threadIdx.x;
  float acc_w = 0.0f, acc_b = 0.0f;
  if (c < C) {
    for (int r = threadIdx.y; r < N; r += kRows) {
      const int64_t i = static_cast<int64_t>(r) * C + c;
      const float norm = (inp[i] - mean[r]) * rstd[r];
      acc_b += dout[i];
      acc_w += norm * dout[i];
    }
  }
  part_w[threadIdx.y][threadIdx.x] = acc_w;
  part_b[threadIdx.y][threadIdx.x] = acc_b;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    for (int k = 1; k < kRows; k++) {
      acc_w += part_w[k][threadIdx.x];
      acc_b += part_b[k][threadIdx.x];
    }
    dweight[c] += acc_w;
    dbias[c] += acc_b;
  }
}

}  // namespace

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int N, int C) {
  if (N == 0 || C == 0) return;
  layernorm_forward_kernel<<<ceil_div(N, kRowsPerBlock), kRowsPerBlock * kWarpSize>>>(out, mean, rstd, inp, weight,
                                                                                     bias, N, C);
  CHECK_CUDA_LAUNCH();
}

void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const float* weight, const float* mean, const float* rstd, int N, int C) {
  if (N == 0 || C == 0) return;
  layernorm_backward_dinp_kernel<<<ceil_div(N, kRowsPerBlock), kRowsPerBlock * kWarpSize>>>(dinp, dout, inp, weight,
                                                                                           mean, rstd, N, C);
  CHECK_CUDA_LAUNCH();
  layernorm_backward_params_kernel<<<ceil_div(C, kWarpSize), dim3(kWarpSize, kRows)>>>(dweight, dbias, dout, inp,
                                                                                      mean, rstd, N, C);
  CHECK_CUDA_LAUNCH();
}

}  // namespace tessera::cuda
