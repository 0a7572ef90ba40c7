// sum_of_squares (reduce.h): the global gradient norm's reduction. Each of a
// fixed number of blocks sums a grid-stride share in double and writes one
// partial; the host adds the partials in block order. The grid never depends
// on timing, so the result is the same bits on every run (no atomics).
#include <mutex>
#include <vector>

#include "core/status.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/reduce.h"

namespace tessera::cuda {

namespace {

constexpr int kBlocks = 512;
constexpr int kThreads = 256;

__global__ void sum_of_squares_kernel(double* partials, const float* x, int64_t n) {
  __shared__ double shared[kThreads];
  double acc = 0.0;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const double v = x[i];
    acc += v * v;
  }
  shared[threadIdx.x] = acc;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) shared[threadIdx.x] += shared[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) partials[blockIdx.x] = shared[0];
}

// kBlocks doubles per device, allocated on first use and never freed (as the
// cuBLASLt contexts in matmul.cu: no CUDA teardown from static destructors).
struct Partials {
  std::mutex mu;
  double* device = nullptr;
  std::vector<double> host = std::vector<double>(kBlocks);
};

Partials& partials_for(int device) {
  static std::mutex mu;
  static std::vector<Partials*> all;
  std::lock_guard<std::mutex> lock(mu);
  if (static_cast<int>(all.size()) <= device) all.resize(device + 1, nullptr);
  if (!all[device]) all[device] = new Partials();
  return *all[device];
}

}  // namespace

Result<double> sum_of_squares(const float* x, int64_t n) {
  if (n <= 0) return 0.0;
  int device = 0;
  TRY_CUDA(cudaGetDevice(&device));
  Partials& p = partials_for(device);
  std::lock_guard<std::mutex> lock(p.mu);  // the buffer is shared by the device's callers
  if (!p.device) TRY_CUDA(cudaMalloc(&p.device, sizeof(double) * kBlocks));
  sum_of_squares_kernel<<<kBlocks, kThreads>>>(p.device, x, n);
  TRY_CUDA(cudaGetLastError());
  TRY_CUDA(cudaMemcpy(p.host.data(), p.device, sizeof(double) * kBlocks, cudaMemcpyDeviceToHost));
  double sum = 0.0;
  for (double v : p.host) sum += v;
  return sum;
}

}  // namespace tessera::cuda
