// The one macro family for CUDA runtime return codes, internal to the CUDA
// code of src/runtime and the layers above (it needs the CUDA headers);
// cuBLASLt's are in kernels/cuda/cublas_check.h. Two channels, as
// everywhere in tessera:
//   CUDA_CHECK(expr): a failure is a bug or a dead device
//     inside a kernel call (void functions): print file:line, the call and
//     the error string, then abort.
//   CUDA_RETURN_IF_ERROR(expr): return
//     Status::Unavailable("<call>: <error string>") from a function returning
//     Status or Result<T> (the includer must include core/status.h).
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>

#include <cuda_runtime_api.h>

namespace tessera::cuda {

[[noreturn]] inline void cuda_abort(const char* file, int line, const char* call, const char* what) {
  std::fprintf(stderr, "%s:%d: CUDA error in %s: %s\n", file, line, call, what);
  std::abort();
}

}  // namespace tessera::cuda

#define CUDA_CHECK(expr)                                                                            \
  do {                                                                                              \
    const cudaError_t _cuda_err = (expr);                                                           \
    if (_cuda_err != cudaSuccess)                                                                   \
      ::tessera::cuda::cuda_abort(__FILE__, __LINE__, #expr, cudaGetErrorString(_cuda_err));        \
  } while (0)

// A kernel launch reports bad configurations only through cudaGetLastError.
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())

#define CUDA_RETURN_IF_ERROR(expr)                                                                  \
  do {                                                                                              \
    const cudaError_t _cuda_err = (expr);                                                           \
    if (_cuda_err != cudaSuccess) {                                                                 \
      cudaGetLastError(); /* clear a non-sticky error so later calls do not report it */       \
      return ::tessera::Status::Unavailable(std::string(#expr) + ": " + cudaGetErrorString(_cuda_err)); \
    }                                                                                               \
  } while (0)
