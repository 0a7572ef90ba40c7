// Reference kernels: plain loops, single-threaded, written to be obviously
// right. They are the oracle for src/kernels/cpu and never run on hot paths.
#pragma once

#include <cstdint>

#include "kernels/precision.h"
#include "kernels/q4_type.h"

namespace tessera::ref {
#include "kernels/ops.inc"
}  // namespace tessera::ref
