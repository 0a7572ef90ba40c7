// Fast CPU kernels: the same operator set as kernels/ref with the same
// signatures. Matmuls go through oneDNN (fp32, or bf16 inputs with fp32
// accumulation); elementwise kernels are vectorised and threaded with OpenMP.
// Thread safety: calls may run concurrently from different threads only if
// they touch different buffers; the oneDNN primitive cache is locked.
#pragma once

#include <cstdint>

#include "kernels/precision.h"

namespace tessera::cpu {
#include "kernels/ops.inc"
}  // namespace tessera::cpu
