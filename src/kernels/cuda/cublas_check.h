// cuBLASLt return codes, in the two channels of runtime/cuda_check.h:
//   CUBLAS_CHECK(expr): a failure inside a kernel call aborts (file:line).
//   CUBLAS_RETURN_IF_ERROR(expr): returns Status::Unavailable("<call>: <status>").
#pragma once

#include <cublasLt.h>

#include "runtime/cuda_check.h"

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

}  // namespace tessera::cuda

#define CUBLAS_CHECK(expr)                                                                          \
  do {                                                                                              \
    const cublasStatus_t _cublas_st = (expr);                                                       \
    if (_cublas_st != CUBLAS_STATUS_SUCCESS)                                                        \
      ::tessera::cuda::cuda_abort(__FILE__, __LINE__, #expr, ::tessera::cuda::cublas_status_name(_cublas_st)); \
  } while (0)

#define CUBLAS_RETURN_IF_ERROR(expr)                                                                \
  do {                                                                                              \
    const cublasStatus_t _cublas_st = (expr);                                                       \
    if (_cublas_st != CUBLAS_STATUS_SUCCESS)                                                        \
      return ::tessera::Status::Unavailable(std::string(#expr) + ": " +                             \
                                            ::tessera::cuda::cublas_status_name(_cublas_st));       \
  } while (0)
