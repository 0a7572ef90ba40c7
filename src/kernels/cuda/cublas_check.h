// cuBLASLt return codes in the one macro family (core/try.h):
//   TRY_CUBLAS(expr): returns Status::Unavailable("<call>: <status name>").
//   CHECK_CUBLAS(expr): aborts with file:line (inside a void kernel call).
#pragma once

#include <string>

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

// OK for CUBLAS_STATUS_SUCCESS, else Unavailable("<call>: <status name>").
namespace tessera::cuda {
inline Status cublas_status(cublasStatus_t st, const char* call) {
  if (st == CUBLAS_STATUS_SUCCESS) return Status::OK();
  return Status::Unavailable(std::string(call) + ": " + cublas_status_name(st));
}
}  // namespace tessera::cuda

#define TRY_CUBLAS(expr) RETURN_IF_ERROR(::tessera::cuda::cublas_status((expr), #expr))
#define CHECK_CUBLAS(expr) CHECK_OK(::tessera::cuda::cublas_status((expr), #expr))
