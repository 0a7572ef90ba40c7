// The CUDA device runtime: devices, device memory, copies. Plain C++ (no
// CUDA headers), so every layer above src/runtime, the CLI and the tests
// include it whether or not the CUDA backend is compiled in. Without it
// (TESSERA_HAVE_CUDA undefined) every call reports "CUDA support not compiled
// in" (runtime/no_cuda.cc). Kernels live above, in src/kernels/cuda. Errors are values: a Status
// whose message names the call and the CUDA error string, e.g.
// "cudaSetDevice(0): no CUDA-capable device is detected".
// Thread safety: as the CUDA runtime (the current device is per thread).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/status.h"

namespace tessera::cuda {

// True when the CUDA backend is compiled into this binary.
bool compiled();
// "13.0": the CUDA runtime the backend was built against; "" if not compiled.
std::string runtime_version();
// "sm_80 sm_90 compute_90": the code the kernels carry; "" if not compiled.
std::string compiled_architectures();

// Number of usable devices: 0, never throwing, with no driver or no device.
int device_count();
// As device_count(), but says why there is none (driver missing, too old, ...).
Result<int> query_device_count();
// Makes `device` current for the calling thread.
Status set_device(int device);
// "NVIDIA H100 80GB HBM3, 132 SMs, 79.1 GiB, compute 9.0", or the error.
std::string device_summary(int device);
// "0000:3b:00.0": the device's PCI bus id (how NVML finds the same device,
// whatever CUDA_VISIBLE_DEVICES renumbered).
Result<std::string> pci_bus_id(int device);

// Memory of the current device, bytes (cudaMemGetInfo).
struct MemoryInfo {
  size_t free_bytes = 0;
  size_t total_bytes = 0;
};
Result<MemoryInfo> memory_info();

// One rank per GPU: makes device local_rank % device_count() current for the
// calling thread and checks that it has at least min_free_bytes free.
// Returns the device. Each failure is one line, e.g.
//   "no CUDA device: cudaGetDeviceCount: no CUDA-capable device is detected"
//   "cuda:1 (NVIDIA H200) has 3.2 GiB free of 139.8 GiB; 8.0 GiB needed"
//   "cudaSetDevice(1): ..."  (driver failures as the runtime words them)
Result<int> select_device(int local_rank, size_t min_free_bytes = 0);

// Device memory on the current device. device_free(nullptr) is a no-op.
// device_malloc: ResourceExhausted when the device is out of memory.
Result<void*> device_malloc(size_t bytes);
Status device_free(void* ptr);
Status memcpy_h2d(void* dst, const void* src, size_t bytes);
Status memcpy_d2h(void* dst, const void* src, size_t bytes);
// Device to device on the current device, queued in order with the kernels.
Status memcpy_d2d(void* dst, const void* src, size_t bytes);
Status memset_zero(void* ptr, size_t bytes);
// Waits for all queued work on the current device; reports the first
// asynchronous kernel error, if any.
Status synchronize();

}  // namespace tessera::cuda
