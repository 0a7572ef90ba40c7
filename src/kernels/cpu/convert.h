// Helpers shared by the CPU kernels: fp32 -> bf16 conversion into growable
// scratch, and column sums.
#pragma once

#include <cstdint>
#include <vector>

#include "tensor/dtype.h"

namespace tessera::cpu {

// Rounds n floats to bf16 into buf (grown if needed); returns buf.data().
const bf16* to_bf16(const float* x, int64_t n, std::vector<bf16>& buf);
// x (rows, cols) row-major -> bf16 (cols, rows) row-major.
const bf16* to_bf16_transposed(const float* x, int64_t rows, int64_t cols, std::vector<bf16>& buf);
// dbias (OC) += column sums of dout (N, OC).
void bias_backward(float* dbias, const float* dout, int N, int OC);

}  // namespace tessera::cpu
