// The one macro family for CUDA runtime and cuBLASLt return codes, internal
// to src/kernels/cuda (it needs the CUDA headers). Two channels, as
// everywhere in tessera:
//   CUDA_CHECK(expr), CUBLAS_CHECK(expr): a failure is a bug or a dead device
//     inside a kernel call (void functions): print file:line, the call and
//     the error string, then abort.
//   CUDA_RETURN_IF_ERROR(expr), CUBLAS_RETURN_IF_ERROR(expr): return
//     Status::Unavailable("<call>: <error string>") from a function returning
//     Status or Result<T> (the includer must include core/status.h).
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>

#include <cublasLt.h>
#include <cuda_runtime_api.h>

namespace tessera::cuda {

inline const char* cublas_status_name(cublasStatus_t st) {
  switch (st) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
    default: return "CUBLAS_STATUS_<unknown>";
  }
}

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

#define CUBLAS_CHECK(expr)                                                                          \
  do {                                                                                              \
    const cublasStatus_t _cublas_st = (expr);                                                       \
    if (_cublas_st != CUBLAS_STATUS_SUCCESS)                                                        \
      ::tessera::cuda::cuda_abort(__FILE__, __LINE__, #expr, ::tessera::cuda::cublas_status_name(_cublas_st)); \
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

#define CUBLAS_RETURN_IF_ERROR(expr)                                                                \
  do {                                                                                              \
    const cublasStatus_t _cublas_st = (expr);                                                       \
    if (_cublas_st != CUBLAS_STATUS_SUCCESS)                                                        \
      return ::tessera::Status::Unavailable(std::string(#expr) + ": " +                             \
                                            ::tessera::cuda::cublas_status_name(_cublas_st));       \
  } while (0)
