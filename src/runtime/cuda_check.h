// CUDA runtime return codes in the one macro family (core/try.h), for the
// CUDA code of src/runtime and the layers above (it needs the CUDA headers):
//   TRY_CUDA(expr): return Status::Unavailable("<expr>: <error string>")
//     from a function returning Status or Result<T>: a failed copy, a dead
//     device (ResourceExhausted for out of memory).
//   CHECK_CUDA(expr), CHECK_CUDA_LAUNCH(): abort with file:line, the call and
//     the error string, where a failure is a bug or nothing can be returned
//     (inside a void kernel call).
// cuBLASLt's codes: kernels/cuda/cublas_check.h.
#pragma once

#include <string>

#include <cuda_runtime_api.h>

#include "core/try.h"

namespace tessera::cuda {

// OK for cudaSuccess; ResourceExhausted("<call>: out of memory") for
// cudaErrorMemoryAllocation; else Unavailable("<call>: <error string>").
// Clears a non-sticky error so that later calls do not report it again.
inline Status cuda_status(cudaError_t err, const char* call) {
  if (err == cudaSuccess) return Status::OK();
  cudaGetLastError();
  std::string msg = std::string(call) + ": " + cudaGetErrorString(err);
  if (err == cudaErrorMemoryAllocation) return Status::ResourceExhausted(std::move(msg));
  return Status::Unavailable(std::move(msg));
}

}  // namespace tessera::cuda

#define TRY_CUDA(expr) RETURN_IF_ERROR(::tessera::cuda::cuda_status((expr), #expr))
#define CHECK_CUDA(expr) CHECK_OK(::tessera::cuda::cuda_status((expr), #expr))
// A kernel launch reports bad configurations only through cudaGetLastError.
#define CHECK_CUDA_LAUNCH() CHECK_CUDA(cudaGetLastError())
