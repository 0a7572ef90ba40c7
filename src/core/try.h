// The one macro family for return codes of the libraries Tessera calls
// (CUDA, cuBLASLt, NCCL, MPI, ...), feeding the two error channels:
//
//   RETURN_IF_ERROR(status_expr)  (core/status.h) the world failed (out of
//                          memory, a dead device or peer, a failed copy, a
//                          missing backend): return the Status from a
//                          function returning Status or Result<T>, up to the
//                          caller that can act on it.
//   CHECK_OK(status_expr)  a failure is a bug (or happens where nothing can
//                          be returned, inside a kernel launch): print
//                          file:line, the expression and the message; abort.
//   value_or_abort(result) the value of a Result<T>, or print its error and
//                          abort: tests/aborting.h's conveniences over a
//                          create() (library code returns the error).
//
// Each library has one function turning its return code into a Status
// that names the call ("cudaMalloc(&p, n): out of memory"), and two macros
// built on the pair above, TRY_<LIB> (returns) and CHECK_<LIB> (aborts), in
// a header next to its code (they need the library's headers; core/ does
// not include them):
//   runtime/cuda_check.h          TRY_CUDA, CHECK_CUDA, CHECK_CUDA_LAUNCH (cuda_status)
//   kernels/cuda/cublas_check.h   TRY_CUBLAS, CHECK_CUBLAS                (cublas_status)
//   comm/mpi/mpi_communicator.cc  TRY_MPI(fn, args...), mpi_status(...)
// NCCL's codes need the communicator's state to interpret (ncclInProgress,
// asynchronous errors): comm/nccl/nccl_communicator.cc's settle() turns them
// into a Status; its CUDA calls use TRY_CUDA.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <utility>

#include "core/status.h"

namespace tessera::detail {

[[noreturn]] inline void check_ok_failed(const char* file, int line, const char* expr, const Status& st) {
  std::fprintf(stderr, "%s:%d: CHECK_OK failed: %s: %s\n", file, line, expr, st.ToString().c_str());
  std::abort();
}

}  // namespace tessera::detail

namespace tessera {

// Prints "tessera: <message>" and aborts on an error.
template <typename T>
T value_or_abort(Result<T> r) {
  if (!r.ok()) {
    std::fprintf(stderr, "tessera: %s\n", r.status().ToString().c_str());
    std::abort();
  }
  return std::move(r).value();
}

}  // namespace tessera

#define CHECK_OK(status_expr)                                                              \
  do {                                                                                     \
    const ::tessera::Status _check_st = (status_expr);                                     \
    if (!_check_st.ok()) ::tessera::detail::check_ok_failed(__FILE__, __LINE__, #status_expr, _check_st); \
  } while (0)
