// The matmul peak of this machine, measured through cpu::matmul_forward (the
// path training uses), for MFU: `tessera bench gemm` and the trainer's MFU
// both use it.
#pragma once

#include "kernels/precision.h"

namespace tessera::cpu {

// Best GFLOP/s of out (n,n) = a (n,n) @ b (n,n)^T over `iters` timed runs,
// after one untimed run that builds the primitive.
double measure_matmul_gflops(int n, MatmulPrecision prec, int iters);

}  // namespace tessera::cpu
