// The CUDA device API: plain C++ (no CUDA headers), so tessera_core, the CLI
// and the tests include it whether or not the CUDA backend is compiled in.
// Without it (TESSERA_HAVE_CUDA undefined) every call reports "CUDA support
// not compiled in" (kernels/cuda/no_cuda.cc). Errors are values: a Status
// whose message names the call and the CUDA error string, e.g.
// "cudaSetDevice(0): no CUDA-capable device is detected".
// Thread safety: as the CUDA runtime (the current device is per thread).
#pragma once

#include <cstddef>
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

// Device memory on the current device. device_free(nullptr) is a no-op.
Result<void*> device_malloc(size_t bytes);
Status device_free(void* ptr);
Status memcpy_h2d(void* dst, const void* src, size_t bytes);
Status memcpy_d2h(void* dst, const void* src, size_t bytes);
Status memset_zero(void* ptr, size_t bytes);
// Waits for all queued work on the current device; reports the first
// asynchronous kernel error, if any.
Status synchronize();

}  // namespace tessera::cuda
