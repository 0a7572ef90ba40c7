// Symmetric int8 codes of a vector of floats, the activation side of the
// INT8 and int4 matmuls: scale = max|x| / 127 (1 when all are zero), code =
// round(x / scale) (halves away from zero) clamped to [-127, 127]. The same
// bits as the oracle's plain loop (kernels/ref, q4::quantize_activations):
// the division is IEEE's, the rounding exact (trunc, then the fraction
// compared with 0.5), the maximum order-free. A NaN becomes code 0 (a NaN
// input, or inf / inf when an input is infinite), as the scalar conversion
// does on x86.
#pragma once

#include <cstdint>

namespace tessera::cpu {

// Writes n codes, returns the scale. AVX2 where the CPU has it, else the
// plain loop.
float quantize_symmetric(const float* x, int n, int8_t* codes);
// The plain loop: the oracle's operations, for CPUs without AVX2 and tests.
float quantize_symmetric_scalar(const float* x, int n, int8_t* codes);

}  // namespace tessera::cpu
