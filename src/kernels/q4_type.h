// The 4-bit weight types (kernels/q4.h has their layouts), apart so that
// ops.inc can name them in every backend, CUDA's included.
#pragma once

#include <cstdint>

namespace tessera::q4 {

// kQ4_0x16, kQ4_Kx16: Q4_0's and Q4_K's blocks of 16 rows interleaved, the
// CPU kernel's layouts of those matrices (kernels/q4.h, pack_x16); never in
// a file.
enum class Type : uint8_t { kQ4_0, kQ4_K, kQ4_0x16, kQ4_Kx16 };

}  // namespace tessera::q4
