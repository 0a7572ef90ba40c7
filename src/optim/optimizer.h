// AdamW with decoupled weight decay over parameter groups, global-norm
// gradient clipping, and the learning-rate schedule (linear warmup, cosine
// decay). Knows nothing of the model: it sees a flat parameter space (one
// buffer of parameters, one of gradients, as a model's arenas) and the groups
// (tensors) inside it. ZeRO-1's sharding over ranks is in optim/zero.h.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/status.h"
#include "kernels/precision.h"
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
// failure (a dead device) is returned naming the CUDA error.
Result<float> try_global_norm(Device d, const float* x, int64_t n);

// The factor gradients are scaled by so that their global norm is at most
// c.grad_clip (1 when clipping is off or not needed), as torch's
// clip_grad_norm_.
float clip_scale(const OptimizerConfig& c, float norm);

// The fused update kernel of a backend (kernels/ops.inc's adamw_update:
// cpu::, ref:: or cuda::, or a timed thunk of one).
using AdamWKernel = void (*)(float* params, const float* grads, float* m, float* v, int64_t n,
                             const AdamWParams& hp);

// One tensor of the parameter space.
struct ParamGroup {
  std::span<float> params;  // inside ParamSpace::params
  std::span<float> grads;   // the same floats of ParamSpace::grads
  bool decay = false;           // weight decay applies (2-D weights)
  bool counts_in_norm = true;   // its gradient is part of this rank's share of the global norm
};

// A flat space of `count` floats: parameters and their gradients, on one
// device. Groups are disjoint and in increasing address order; gradient
// floats outside every group (alignment gaps, padding) are zero, so norms
// over flat ranges are norms over the groups.
struct ParamSpace {
  float* params = nullptr;  // (count)
  float* grads = nullptr;   // (count)
  int64_t count = 0;
  Device device = Device::kCPU;
  std::vector<ParamGroup> groups;
  // Float index of a group's first element in the space.
  int64_t offset(const ParamGroup& g) const { return g.params.data() - params; }
};

// AdamW state for floats [lo, hi) of a parameter space: the first and second
// moments, `capacity` floats each (>= hi - lo), zeroed, on the space's device
// (device memory for a CUDA space). Owns its arena; the space's buffers must
// outlive it. Not thread-safe.
class AdamW {
 public:
  // The whole space, or [lo, hi) of it (0 <= lo <= hi <= count, hi - lo <=
  // capacity; CHECKed). Out of host or device memory for the moments is the
  // arena's error.
  static Result<AdamW> create(ParamSpace space, AdamWKernel kernel);
  static Result<AdamW> create(ParamSpace space, AdamWKernel kernel, int64_t lo, int64_t hi, int64_t capacity);

  // One update of the whole space at learning rate lr: the global norm over
  // the flat gradients, clipping by scaling (never touching the stored
  // gradients), the update. Returns the pre-clip global norm; a device
  // error in the norm is returned before anything is updated.
  Result<float> try_step(const OptimizerConfig& c, float lr);
  // The update of [lo, hi) with the global norm computed by the caller
  // (over a sharded model's or ZeRO's ranks). Advances t.
  void apply(const OptimizerConfig& c, float lr, float norm);
  // Sum of squares, in double and in address order, of the gradients in
  // [lo, hi) of the groups that count in the norm. Host memory only.
  double owned_sum_of_squares() const;

  int t() const { return t_; }
  void set_t(int t) { t_ = t; }
  // m[i - lo] and v[i - lo] hold the moments of space float i.
  float* m() const { return moments_.tensor(0).f32(); }
  float* v() const { return moments_.tensor(1).f32(); }
  int64_t lo() const { return lo_; }
  int64_t hi() const { return hi_; }
  int64_t state_bytes() const { return 2 * capacity_ * static_cast<int64_t>(sizeof(float)); }
  const ParamSpace& space() const { return space_; }

 private:
  // create()'s one code path: the constructor checks the range, init()
  // allocates the moments.
  struct Uninitialised {};
  AdamW(Uninitialised, ParamSpace space, AdamWKernel kernel, int64_t lo, int64_t hi, int64_t capacity);
  Status init();

  ParamSpace space_;
  AdamWKernel kernel_;
  int64_t lo_, hi_, capacity_;
  Arena moments_;  // m (tensor 0), v (tensor 1)
  int t_ = 0;
};

}  // namespace tessera
