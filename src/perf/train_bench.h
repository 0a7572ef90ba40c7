// Training-step throughput on random tokens, for `tessera bench train`: one
// loop for every backend (CPU with its per-op times, CUDA with a device
// synchronize at each phase boundary, since kernels run asynchronously).
// Builds its own model and optimizer; the caller prints.
#pragma once

#include <cstdio>

#include "core/status.h"
#include "kernels/precision.h"
#include "nn/gpt.h"
#include "obs/op_timer.h"

namespace tessera::perf {

struct TrainBenchConfig {
  GPTConfig model;  // context already set (>= seq)
  int batch = 8, seq = 256, steps = 5, warmup = 1;
  MatmulPrecision prec = MatmulPrecision::kF32;
  Backend backend = Backend::kCPUProfiled;  // kCPUProfiled or kCUDA
};

struct TrainBenchResult {
  double step_s = 0;                       // median of the timed steps
  double forward_s = 0, backward_s = 0, optimizer_s = 0;  // means of the timed steps
  OpTimes ops;       // per-op seconds, means of the timed steps (CPU; zero on CUDA)
  float last_loss = 0;
  double flops_per_step = 0;  // perf/flops.h's count
  int64_t tokens_per_step = 0;
};

// Runs warmup + steps optimizer steps; one "step N: loss L, T ms" line per
// step on `progress` (null: quiet). Errors: a non-finite loss, a CUDA error.
Result<TrainBenchResult> run_train_bench(const TrainBenchConfig& c, std::FILE* progress);

}  // namespace tessera::perf
