// The GPU checks (perf/gpu_checks.h) with the CUDA runtime. Each figure is
// the best (bandwidths, GEMM) or the mean (latencies) of a few runs, timed on
// the host around a device synchronize.
#include <cuda_runtime.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

#include <fmt/format.h>

#include "kernels/cuda/ops.h"
#include "perf/gpu_checks.h"
#include "perf/profile.h"

namespace tessera::perf {

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

Status cuda_status(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return Status::OK();
  return Status::Unavailable(fmt::format("{}: {}", what, cudaGetErrorString(e)));
}
#define PERF_CUDA(call) RETURN_IF_ERROR(cuda_status((call), #call))

// "550.54.15" from the kernel module's banner; "" when not readable.
std::string nvidia_driver_version() {
  std::ifstream f("/proc/driver/nvidia/version");
  std::string line;
  if (!std::getline(f, line)) return "";
  std::istringstream in(line);
  std::string word;
  while (in >> word)
    if (!word.empty() && std::isdigit(static_cast<unsigned char>(word[0])) && word.find('.') != std::string::npos)
      return word;
  return "";
}

// Device memory freed on scope exit.
struct DeviceBuffer {
  void* p = nullptr;
  ~DeviceBuffer() {
    if (p) cudaFree(p);
  }
};
struct PinnedBuffer {
  void* p = nullptr;
  ~PinnedBuffer() {
    if (p) cudaFreeHost(p);
  }
};

// Best GB/s of `reps` copies of `bytes` (counted `factor` times: 2 for a
// device-to-device copy, which reads and writes).
Result<double> copy_gb_per_s(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, int reps,
                             double factor = 1.0) {
  PERF_CUDA(cudaMemcpy(dst, src, bytes, kind));
  double best = 0;
  for (int i = 0; i < reps; i++) {
    const auto t0 = Clock::now();
    PERF_CUDA(cudaMemcpy(dst, src, bytes, kind));
    PERF_CUDA(cudaDeviceSynchronize());
    best = std::max(best, factor * bytes / seconds_since(t0) / 1e9);
  }
  return best;
}

}  // namespace

std::optional<DeviceInfo> probe_gpu() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    cudaGetLastError();
    return std::nullopt;
  }
  int dev = 0;
  cudaGetDevice(&dev);
  cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, dev) != cudaSuccess) return std::nullopt;
  DeviceInfo d;
  d.name = prop.name;
  d.memory_bytes = static_cast<int64_t>(prop.totalGlobalMem);
  int driver_api = 0, runtime = 0;
  cudaDriverGetVersion(&driver_api);
  cudaRuntimeGetVersion(&runtime);
  d.driver = nvidia_driver_version();
  if (d.driver.empty()) d.driver = fmt::format("CUDA driver API {}.{}", driver_api / 1000, driver_api % 1000 / 10);
  d.cuda = fmt::format("{}.{}", runtime / 1000, runtime % 1000 / 10);
  return d;
}

Status run_gpu_checks(bool quick, std::vector<Figure>* out) {
  int n = 0;
  PERF_CUDA(cudaGetDeviceCount(&n));
  if (n == 0) return Status::Unavailable("no CUDA device");
  auto add = [&](const char* name, double v, const char* unit, Better b) { out->push_back({name, v, unit, b}); };

  // Launch latency: one tiny Tessera kernel launched and waited for, the
  // round trip a step pays per synchronised launch; mean of many.
  {
    DeviceBuffer buf;
    PERF_CUDA(cudaMalloc(&buf.p, 256));
    PERF_CUDA(cudaMemset(buf.p, 0, 256));
    float* f = static_cast<float*>(buf.p);
    for (int i = 0; i < 100; i++) cuda::gelu_forward(f, f + 16, 16);
    PERF_CUDA(cudaDeviceSynchronize());
    const int iters = quick ? 1000 : 5000;
    const auto t0 = Clock::now();
    for (int i = 0; i < iters; i++) {
      cuda::gelu_forward(f, f + 16, 16);
      PERF_CUDA(cudaDeviceSynchronize());
    }
    add("gpu.launch_latency_us", seconds_since(t0) / iters * 1e6, "us", Better::kLower);
  }

  // Host <-> device: pinned and pageable host memory (the PCIe check).
  {
    const size_t bytes = static_cast<size_t>(quick ? 64 : 256) << 20;
    const int reps = quick ? 3 : 5;
    DeviceBuffer dev;
    PinnedBuffer pinned;
    PERF_CUDA(cudaMalloc(&dev.p, bytes));
    PERF_CUDA(cudaMallocHost(&pinned.p, bytes));
    std::memset(pinned.p, 1, bytes);
    std::vector<char> pageable(bytes, 1);
    ASSIGN_OR_RETURN(double h2d_pinned, copy_gb_per_s(dev.p, pinned.p, bytes, cudaMemcpyHostToDevice, reps));
    ASSIGN_OR_RETURN(double h2d_pageable, copy_gb_per_s(dev.p, pageable.data(), bytes, cudaMemcpyHostToDevice, reps));
    ASSIGN_OR_RETURN(double d2h_pinned, copy_gb_per_s(pinned.p, dev.p, bytes, cudaMemcpyDeviceToHost, reps));
    ASSIGN_OR_RETURN(double d2h_pageable, copy_gb_per_s(pageable.data(), dev.p, bytes, cudaMemcpyDeviceToHost, reps));
    add("gpu.h2d.pinned", h2d_pinned, "GB/s", Better::kHigher);
    add("gpu.h2d.pageable", h2d_pageable, "GB/s", Better::kHigher);
    add("gpu.d2h.pinned", d2h_pinned, "GB/s", Better::kHigher);
    add("gpu.d2h.pageable", d2h_pageable, "GB/s", Better::kHigher);
  }

  // Device memory bandwidth: a device-to-device copy reads and writes every
  // byte (counted twice).
  {
    const size_t bytes = static_cast<size_t>(quick ? 512 : 2048) << 20;
    DeviceBuffer a, b;
    PERF_CUDA(cudaMalloc(&a.p, bytes));
    PERF_CUDA(cudaMalloc(&b.p, bytes));
    PERF_CUDA(cudaMemset(a.p, 0, bytes));
    ASSIGN_OR_RETURN(double bw, copy_gb_per_s(b.p, a.p, bytes, cudaMemcpyDeviceToDevice, quick ? 5 : 10, 2.0));
    add("gpu.mem.bandwidth", bw, "GB/s", Better::kHigher);
  }

  // GEMM bf16 through cuda::matmul_forward (the training path: fp32 inputs
  // rounded to bf16 inside, O(n^2) next to the O(n^3) product).
  {
    const int dim = quick ? 4096 : 8192;
    const size_t elems = size_t{1} * dim * dim;
    DeviceBuffer a, w, o;
    PERF_CUDA(cudaMalloc(&a.p, elems * sizeof(float)));
    PERF_CUDA(cudaMalloc(&w.p, elems * sizeof(float)));
    PERF_CUDA(cudaMalloc(&o.p, elems * sizeof(float)));
    PERF_CUDA(cudaMemset(a.p, 0, elems * sizeof(float)));
    PERF_CUDA(cudaMemset(w.p, 0, elems * sizeof(float)));
    auto* af = static_cast<float*>(a.p);
    auto* wf = static_cast<float*>(w.p);
    auto* of = static_cast<float*>(o.p);
    cuda::matmul_forward(of, af, wf, nullptr, dim, dim, dim, MatmulPrecision::kBF16);
    PERF_CUDA(cudaDeviceSynchronize());
    double best = 0;
    const int reps = quick ? 5 : 20;
    for (int i = 0; i < reps; i++) {
      const auto t0 = Clock::now();
      for (int k = 0; k < 4; k++) cuda::matmul_forward(of, af, wf, nullptr, dim, dim, dim, MatmulPrecision::kBF16);
      PERF_CUDA(cudaDeviceSynchronize());
      best = std::max(best, 4 * 2.0 * dim * double(dim) * dim / seconds_since(t0) / 1e9);
    }
    add("gpu.gemm.bf16.peak", best, "GFLOP/s", Better::kHigher);
  }

  // Allocation latency: cudaMalloc + cudaFree of 64 MiB, mean.
  {
    const int iters = quick ? 50 : 200;
    const auto t0 = Clock::now();
    for (int i = 0; i < iters; i++) {
      void* p = nullptr;
      PERF_CUDA(cudaMalloc(&p, size_t{64} << 20));
      PERF_CUDA(cudaFree(p));
    }
    add("gpu.alloc_us", seconds_since(t0) / iters * 1e6, "us", Better::kLower);
  }
  return Status::OK();
}

}  // namespace tessera::perf
