// AdamW with decoupled weight decay (2-D weights only), global-norm gradient
// clipping, and the learning-rate schedule (linear warmup, cosine decay).
#pragma once

#include <cstdint>

#include "nn/gpt.h"
#include "tensor/arena.h"

namespace tessera {

struct OptimizerConfig {
  float lr = 6e-4f;      // peak learning rate
  float min_lr = 6e-5f;  // floor of the cosine decay
  int warmup = 0;        // steps of linear warmup
  int steps = 1;         // total steps (the cosine ends here)
  float weight_decay = 0.1f;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float grad_clip = 1.0f;  // max global grad norm; <= 0 disables clipping
};

// Learning rate of 0-based step s: lr * (s+1)/warmup during warmup, then
// min_lr + (lr - min_lr) * (1 + cos(pi * progress)) / 2.
float lr_at(const OptimizerConfig& c, int step);

// sqrt(sum x^2) over n floats, accumulated in double, threaded.
float global_norm(const float* x, int64_t n);
// The same over n floats on device d: the function above on the CPU; on
// CUDA a deterministic device reduction (cuda::sum_of_squares), whose
// failure (a dead device) aborts with the CUDA error.
float global_norm(Device d, const float* x, int64_t n);

// Optimizer state: first and second moments, laid out like the parameters
// and on the model's device (m(), v() hold device memory for a CUDA model).
// Owns its arenas; bound to one model's layout.
class AdamW {
 public:
  explicit AdamW(const GPT& model);

  // One update from the model's gradients at learning rate lr. Clips to
  // grad_clip by scaling (never touching the stored gradients) and returns the
  // pre-clip global norm.
  float step(GPT& model, const OptimizerConfig& c, float lr);
  // The same update with the global norm computed by the caller (over a
  // sharded model's ranks).
  void apply(GPT& model, const OptimizerConfig& c, float lr, float norm);

  int t() const { return t_; }
  void set_t(int t) { t_ = t; }
  Arena& m() { return m_; }
  Arena& v() { return v_; }

 private:
  Arena m_, v_;
  int t_ = 0;
};

}  // namespace tessera
