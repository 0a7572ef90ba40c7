// The INT8 tier's self-check: before a model runs its matmuls in int8, the
// CPU kernel is compared with the plain-loop oracle (kernels/ref) on inputs
// built to saturate 16-bit pair sums (every code +-127), at the row counts
// that select each kernel. A CPU, a oneDNN build or a forced kernel that
// computes different products is refused here, in one line, so that a
// server never answers with wrong text (issue #27, docs/formats/int8.md).
#pragma once

#include "core/status.h"

namespace tessera {

// OK when every output equals the oracle's bit for bit; otherwise an
// Internal error naming the kernel, how many outputs differ and the worst.
Status check_int8_matmul();

}  // namespace tessera
