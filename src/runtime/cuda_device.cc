// The CUDA device API (device.h) over the CUDA runtime. Host C++ only,
// compiled by the C++ compiler into tessera_cuda.
#include "runtime/cuda_device.h"

#include <fmt/format.h>

#include "runtime/cuda_check.h"

#ifndef TESSERA_CUDA_ARCH_LIST
#define TESSERA_CUDA_ARCH_LIST ""
#endif

namespace tessera::cuda {

bool compiled() { return true; }

std::string runtime_version() {
  // CUDART_VERSION is 1000 * major + 10 * minor; the runtime is linked
  // statically, so this is also the runtime in use.
  return fmt::format("{}.{}", CUDART_VERSION / 1000, (CUDART_VERSION % 1000) / 10);
}

std::string compiled_architectures() { return TESSERA_CUDA_ARCH_LIST; }

Result<int> query_device_count() {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    cudaGetLastError();  // do not leave the error for the next call to find
    // The runtime says "insufficient" also when there is no driver at all.
    const char* hint = err == cudaErrorInsufficientDriver ? " (no NVIDIA driver, or one older than the runtime)" : "";
    return Status::Unavailable(std::string("cudaGetDeviceCount: ") + cudaGetErrorString(err) + hint);
  }
  return n;
}

int device_count() {
  Result<int> n = query_device_count();
  return n.ok() ? *n : 0;
}

Status set_device(int device) {
  const cudaError_t err = cudaSetDevice(device);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return Status::Unavailable(fmt::format("cudaSetDevice({}): {}", device, cudaGetErrorString(err)));
  }
  return Status::OK();
}

std::string device_summary(int device) {
  cudaDeviceProp prop{};
  const cudaError_t err = cudaGetDeviceProperties(&prop, device);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return fmt::format("device {}: {}", device, cudaGetErrorString(err));
  }
  return fmt::format("{}, {} SMs, {:.1f} GiB, compute {}.{}", prop.name, prop.multiProcessorCount,
                     static_cast<double>(prop.totalGlobalMem) / (1024.0 * 1024.0 * 1024.0), prop.major, prop.minor);
}

Result<std::string> pci_bus_id(int device) {
  char id[32] = {};
  const cudaError_t err = cudaDeviceGetPCIBusId(id, sizeof(id), device);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return Status::Unavailable(fmt::format("cudaDeviceGetPCIBusId({}): {}", device, cudaGetErrorString(err)));
  }
  return std::string(id);
}

Result<MemoryInfo> memory_info() {
  MemoryInfo m;
  TRY_CUDA(cudaMemGetInfo(&m.free_bytes, &m.total_bytes));
  return m;
}

Result<int> select_device(int local_rank, size_t min_free_bytes) {
  if (local_rank < 0) return Status::InvalidArgument(fmt::format("local rank {} < 0", local_rank));
  const Result<int> count = query_device_count();
  if (!count.ok()) return Status::Unavailable("no CUDA device: " + count.status().message());
  if (count.value() == 0) return Status::Unavailable("no CUDA device: the driver reports 0 devices");
  const int device = local_rank % count.value();
  RETURN_IF_ERROR(set_device(device));
  // The first runtime call on a device creates its context: a broken
  // driver or a device in exclusive use by another process shows up here.
  Result<MemoryInfo> mem = memory_info();
  if (!mem.ok()) return mem.status().With(fmt::format("cuda:{}", device));
  if (mem->free_bytes < min_free_bytes) {
    cudaDeviceProp prop{};
    const bool named = cudaGetDeviceProperties(&prop, device) == cudaSuccess;
    cudaGetLastError();
    constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
    return Status::Unavailable(fmt::format("cuda:{}{} has {:.1f} GiB free of {:.1f} GiB; {:.1f} GiB needed", device,
                                           named ? fmt::format(" ({})", prop.name) : "", mem->free_bytes / kGiB,
                                           mem->total_bytes / kGiB, min_free_bytes / kGiB));
  }
  return device;
}

Result<void*> device_malloc(size_t bytes) {
  void* ptr = nullptr;
  const cudaError_t err = cudaMalloc(&ptr, bytes);
  if (err != cudaSuccess) {
    cudaGetLastError();
    std::string msg = fmt::format("cudaMalloc({} bytes): {}", bytes, cudaGetErrorString(err));
    // Out of device memory is a bounded resource (a smaller model, batch or
    // cache may fit); anything else is the device failing.
    if (err == cudaErrorMemoryAllocation) return Status::ResourceExhausted(std::move(msg));
    return Status::Unavailable(std::move(msg));
  }
  return ptr;
}

Status device_free(void* ptr) {
  if (ptr == nullptr) return Status::OK();
  TRY_CUDA(cudaFree(ptr));
  return Status::OK();
}

Status memcpy_h2d(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return Status::OK();
  TRY_CUDA(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
  return Status::OK();
}

Status memcpy_d2h(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return Status::OK();
  TRY_CUDA(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
  return Status::OK();
}

Status memcpy_d2d(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return Status::OK();
  TRY_CUDA(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice));
  return Status::OK();
}

Status memset_zero(void* ptr, size_t bytes) {
  if (bytes == 0) return Status::OK();
  TRY_CUDA(cudaMemset(ptr, 0, bytes));
  return Status::OK();
}

Status synchronize() {
  TRY_CUDA(cudaDeviceSynchronize());
  return Status::OK();
}

}  // namespace tessera::cuda
