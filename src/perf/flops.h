// Model FLOPs for MFU (docs/performance.md states the formula):
//   per token = 6 * parameters + 6 * L * C * T
// 6 per parameter is forward (2) plus backward (4) of every matmul; the second
// term is causal attention (QK^T and AV, forward and backward, half the
// T x T scores), as llm.c counts it. MFU = flops_per_step / step_time / peak.
#pragma once

#include <cstdint>

#include "nn/gpt.h"

namespace tessera {

// The MFU denominator on a GPU that is not in the datasheet table
// (perf/machine.h: gpu_datasheet_peak_tflops): NVIDIA's H100/H200 SXM dense
// (no sparsity) bf16 tensor-core peak, TFLOP/s. fp32 runs are measured
// against the bf16 peak too.
constexpr double kCudaPeakTflops = 989.0;

inline double flops_per_token(const GPTConfig& c, int T) {
  return 6.0 * static_cast<double>(c.num_parameters()) + 6.0 * c.layers * c.channels * static_cast<double>(T);
}

}  // namespace tessera
