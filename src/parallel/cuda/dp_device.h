// Device-side helpers of data parallelism (parallel/data_parallel.cc) for a
// model on a CUDA device: packing gradient slices into a bucket and
// unpacking the reduced bucket with the 1/dp scale. Plain C++ (no CUDA
// headers); compiled into the CUDA backend (dp_device.cu), so callers use it
// only under TESSERA_HAVE_CUDA.
//
// Every call queues its work on the compute stream (the legacy default
// stream, where the model's kernels run) of the current device and returns
// without waiting. Pointers are device pointers. A launch or copy failure is
// returned as Status::Unavailable naming the call and the CUDA error string.
#pragma once

#include <cstdint>

#include "core/status.h"

namespace tessera::dp_cuda {

// dst[0, n) = src[0, n) (device to device, ordered with the kernels).
Status copy_async(float* dst, const float* src, int64_t n);
// dst[i] = src[i] * scale for i in [0, n); dst == src is allowed (in place).
Status scaled_copy_async(float* dst, const float* src, int64_t n, float scale);

}  // namespace tessera::dp_cuda
