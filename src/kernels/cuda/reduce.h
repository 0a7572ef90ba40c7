// Reductions on the device that the host waits for. Plain C++ (no CUDA
// headers), declared whether or not the CUDA backend is compiled in: without
// it (TESSERA_HAVE_CUDA undefined) each call reports "CUDA support not
// compiled in" (kernels/cuda/no_cuda.cc).
#pragma once

#include <cstdint>

#include "core/status.h"

namespace tessera::cuda {

// sum x[i]^2 over n device floats, accumulated in double in a fixed order
// (deterministic: the same bits on every run and every rank), copied back to
// the host; blocks until the kernels queued before it have run.
Result<double> sum_of_squares(const float* x, int64_t n);

}  // namespace tessera::cuda
