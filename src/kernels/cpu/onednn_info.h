// What oneDNN, the CPU matmul backend, reports about itself. Here rather
// than in core/cpu_features.h so that only the CPU kernels link oneDNN.
#pragma once

#include <string>

namespace tessera {

// The ISA oneDNN dispatches to, e.g. "avx512_core_bf16".
std::string onednn_isa();
// "3.0.0".
std::string onednn_version();

}  // namespace tessera
