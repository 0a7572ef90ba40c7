// CUDA kernels: the same operator set as kernels/ref and kernels/cpu with the
// same signatures (ops.inc). Every pointer is a DEVICE pointer to fp32 (or
// int) storage on the current device (device.h: set_device). Kernels run on
// the legacy default stream, in call order; a call returns once its work is
// queued, so read results after synchronize() or a blocking memcpy_d2h.
// MatmulPrecision::kBF16 rounds the matmul inputs to bf16 and accumulates in
// fp32 (cuBLASLt, CUBLAS_COMPUTE_32F); kF32 is plain fp32 (no TF32).
// Errors inside a kernel call (launch failure, cuBLASLt error) are bugs or a
// dead device: they abort with file:line and the CUDA error string.
// Thread safety: as kernels/cpu; the per-device cuBLASLt context is locked.
#pragma once

#include <cstdint>

#include "kernels/precision.h"

namespace tessera::cuda {
#include "kernels/ops.inc"
}  // namespace tessera::cuda
