// The memory a training rank needs, computed from the pure layouts before
// anything is allocated, and the memory the machine has (issue #18 item 1:
// jobs nobody could run were OOM-killed instead of refused).
//
// The activation figure is a lower bound (the tensors every layer saves for
// backward, without attention's kernel-dependent buffers or the logits), so
// a job refused by it cannot fit; one that passes may still be refused later
// by an allocation, as a Status.
#pragma once

#include <cstdint>
#include <string>

#include "core/status.h"
#include "nn/gpt.h"

namespace tessera {

struct MemoryPlan {
  double params = 0, grads = 0, optimizer = 0, activations = 0, staging = 0;  // bytes
  double total() const { return params + grads + optimizer + activations + staging; }
  // "params 0.5 GB, grads ..., total 3.6 GB"
  std::string str() const;
};

// One rank holding `shard` of model c: micro-batch B x T tokens, `slots`
// micro-batches of activations in flight, AdamW moments over 1/dp of the
// parameters with ZeRO-1 (zero = 1), a checkpoint staging buffer when
// checkpoints is true (dp rank 0 stores the parameters too: counted, as the
// largest rank).
MemoryPlan plan_training_memory(const GPTConfig& c, const ModelShard& shard, int B, int T, int slots, int dp, int zero,
                                bool checkpoints);

// The host's side of the comparison is obs::host_memory_limit()
// (obs/process.h), shared with tessera serve.

}  // namespace tessera
