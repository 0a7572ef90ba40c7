// cuBLASLt, opened on first use instead of linked: libcublasLt's static
// initialisers take about 0.3 s and 200 MB of memory at every start of a
// process that links it (measured: `tessera --version`, 0.38 s and 227 MB
// with it, docs/performance.md), which every CPU-only run, test and rank
// paid. The CUDA matmul reaches cuBLASLt through this table; the library is
// opened by soname (libcublasLt.so.<major> of the headers built against,
// found through the binary's RUNPATH or LD_LIBRARY_PATH), then by the path
// CMake found at configure time.
#pragma once

#include <cublasLt.h>

#include "core/status.h"

namespace tessera::cuda {

struct CublasLtApi {
  decltype(&cublasLtCreate) Create = nullptr;
  decltype(&cublasLtMatmulDescCreate) MatmulDescCreate = nullptr;
  decltype(&cublasLtMatmulDescDestroy) MatmulDescDestroy = nullptr;
  decltype(&cublasLtMatmulDescSetAttribute) MatmulDescSetAttribute = nullptr;
  decltype(&cublasLtMatrixLayoutCreate) MatrixLayoutCreate = nullptr;
  decltype(&cublasLtMatrixLayoutDestroy) MatrixLayoutDestroy = nullptr;
  decltype(&cublasLtMatmulPreferenceCreate) MatmulPreferenceCreate = nullptr;
  decltype(&cublasLtMatmulPreferenceDestroy) MatmulPreferenceDestroy = nullptr;
  decltype(&cublasLtMatmulPreferenceSetAttribute) MatmulPreferenceSetAttribute = nullptr;
  decltype(&cublasLtMatmulAlgoGetHeuristic) MatmulAlgoGetHeuristic = nullptr;
  decltype(&cublasLtMatmul) Matmul = nullptr;
};

// The table, loaded once (thread-safe); Unavailable naming the library and
// dlopen's or dlsym's reason when it cannot be.
Result<const CublasLtApi*> cublaslt();

}  // namespace tessera::cuda
