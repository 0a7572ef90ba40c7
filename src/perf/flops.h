// Model FLOPs for MFU (docs/performance.md states the formula), from the
// shape layer (model/decoder.h: DecoderConfig::flops_per_token):
//   per token = 6 * parameters + 6 * L * (NH * hs) * T
// 6 per parameter is forward (2) plus backward (4) of every matmul (an
// untied model's input embedding, a lookup, is left out); the second term is
// causal attention (QK^T and AV, forward and backward, half the T x T
// scores), as llm.c counts it; NH * hs is C for GPT-2. MFU =
// flops_per_step / step_time / peak.
#pragma once

#include <cstdint>

#include "nn/gpt.h"

namespace tessera {

// The MFU denominator on a GPU that is not in the datasheet table
// (perf/machine.h: gpu_datasheet_peak_tflops): NVIDIA's H100/H200 SXM dense
// (no sparsity) bf16 tensor-core peak, TFLOP/s. fp32 runs are measured
// against the bf16 peak too.
constexpr double kCudaPeakTflops = 989.0;

inline double flops_per_token(const GPTConfig& c, int T) { return c.flops_per_token(T); }

}  // namespace tessera
