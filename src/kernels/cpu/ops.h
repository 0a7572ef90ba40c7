// Fast CPU kernels: the same operator set as kernels/ref with the same
// signatures. Matmuls go through oneDNN (fp32, or bf16 inputs with fp32
// accumulation); elementwise kernels are vectorised and threaded with OpenMP.
// Thread safety: calls may run concurrently from any threads as long as no
// two write the same buffer (the matmul keeps its mutable oneDNN state per
// thread and its shared primitive cache locked and bounded: matmul.h).
#pragma once

#include <cstdint>

#include "kernels/precision.h"
#include "kernels/q4_type.h"

namespace tessera::cpu {
#include "kernels/ops.inc"
}  // namespace tessera::cpu
