#include "train/memory_plan.h"

#include <algorithm>
#include <string>

#include <fmt/format.h>

namespace tessera {

std::string MemoryPlan::str() const {
  return fmt::format("params {:.1f} GB, grads {:.1f} GB, optimizer {:.1f} GB, activations at least {:.1f} GB, "
                     "checkpoint staging {:.1f} GB",
                     params / 1e9, grads / 1e9, optimizer / 1e9, activations / 1e9, staging / 1e9);
}

MemoryPlan plan_training_memory(const GPTConfig& c, const ModelShard& shard, int B, int T, int slots, int dp, int zero,
                                bool checkpoints) {
  MemoryPlan m;
  // The layout only sums sizes: nothing is allocated.
  m.params = static_cast<double>(param_layout(c, shard).bytes());
  m.grads = m.params;
  m.optimizer = 2.0 * m.params / (zero == 1 ? std::max(dp, 1) : 1);
  m.staging = checkpoints ? m.params + m.optimizer : 0.0;
  // Per layer and token, saved for backward: ln1, residual, ln2, residual
  // (C each) and, split over tp, qkv, the attention output and its
  // projection's input, fc (SwiGLU: gate and up) and its activation: from
  // the shape layer, 3C + C + C + 4C + 4C for GPT-2.
  const double C = c.channels, tp = std::max(shard.tp, 1);
  const int layers = shard.layers(c);
  const double split = static_cast<double>(c.qkv_dim()) + 2.0 * c.q_dim() + c.fc_rows() + c.ffn();
  const double per_token = layers * (4.0 * C + split / tp) + C;
  m.activations = static_cast<double>(std::max(slots, 1)) * B * static_cast<double>(T) * per_token * sizeof(float);
  return m;
}

}  // namespace tessera
