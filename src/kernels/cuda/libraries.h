// The libraries the CUDA backend opens at run time rather than links
// (kernels/cuda/cublaslt_api.h says why). Plain C++, declared in every
// build: without the CUDA backend the answer is "not compiled in"
// (kernels/cuda/no_cuda.cc).
#pragma once

#include "core/status.h"

namespace tessera::cuda {

// OK when cuBLASLt is loaded (it is, after this returns OK); else one line
// naming the library and why it could not be opened.
Status cublaslt_available();

}  // namespace tessera::cuda
