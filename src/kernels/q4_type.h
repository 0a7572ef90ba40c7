// The 4-bit weight types (kernels/q4.h has their layouts), apart so that
// ops.inc can name them in every backend, CUDA's included.
#pragma once

#include <cstdint>

namespace tessera::q4 {

enum class Type : uint8_t { kQ4_0, kQ4_K };

}  // namespace tessera::q4
