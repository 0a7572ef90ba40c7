#include "optim/optimizer.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"
#include "kernels/cuda/reduce.h"

namespace tessera {

float lr_at(const OptimizerConfig& c, int step) {
  if (step < c.warmup) return c.lr * static_cast<float>(step + 1) / static_cast<float>(c.warmup);
  int decay_steps = c.steps - c.warmup;
  if (decay_steps <= 0) return c.lr;
  float ratio = std::min(1.0f, static_cast<float>(step - c.warmup) / static_cast<float>(decay_steps));
  float coeff = 0.5f * (1.0f + std::cos(static_cast<float>(M_PI) * ratio));
  return c.min_lr + coeff * (c.lr - c.min_lr);
}

float global_norm(const float* x, int64_t n) {
  double sum = 0.0;
#pragma omp parallel for simd reduction(+ : sum) schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; i++) sum += static_cast<double>(x[i]) * x[i];
  return static_cast<float>(std::sqrt(sum));
}

Result<float> try_global_norm(Device d, const float* x, int64_t n) {
  if (d == Device::kCPU) return global_norm(x, n);
  Result<double> sq = cuda::sum_of_squares(x, n);
  if (!sq.ok()) return sq.status().With("the gradient norm");
  return static_cast<float>(std::sqrt(*sq));
}

float clip_scale(const OptimizerConfig& c, float norm) {
  if (c.grad_clip <= 0.0f) return 1.0f;
  return std::min(1.0f, c.grad_clip / (norm + 1e-6f));
}

AdamW::AdamW(Uninitialised, ParamSpace space, AdamWKernel kernel, int64_t lo, int64_t hi, int64_t capacity)
    : space_(std::move(space)), kernel_(kernel), lo_(lo), hi_(hi), capacity_(capacity) {
  CHECK(0 <= lo && lo <= hi && hi <= space_.count && hi - lo <= capacity);
  for (const ParamGroup& g : space_.groups) {
    CHECK(g.params.size() == g.grads.size());
    CHECK(g.grads.data() == space_.grads + space_.offset(g));
  }
}

Status AdamW::init() {
  moments_.reserve("m", DType::kF32, Shape{std::max<int64_t>(capacity_, 1)});
  moments_.reserve("v", DType::kF32, Shape{std::max<int64_t>(capacity_, 1)});
  moments_.set_device(space_.device);
  return moments_.try_allocate().With("the AdamW moments");  // zeroed
}

Result<AdamW> AdamW::create(ParamSpace space, AdamWKernel kernel) {
  const int64_t n = space.count;
  return create(std::move(space), kernel, 0, n, n);
}

Result<AdamW> AdamW::create(ParamSpace space, AdamWKernel kernel, int64_t lo, int64_t hi, int64_t capacity) {
  AdamW a(Uninitialised{}, std::move(space), kernel, lo, hi, capacity);
  RETURN_IF_ERROR(a.init());
  return a;
}

Result<float> AdamW::try_step(const OptimizerConfig& c, float lr) {
  CHECK(lo_ == 0 && hi_ == space_.count);
  // Gaps between groups are zero, so the flat norm is the groups' norm.
  ASSIGN_OR_RETURN(const float norm, try_global_norm(space_.device, space_.grads, space_.count));
  apply(c, lr, norm);
  return norm;
}

void AdamW::apply(const OptimizerConfig& c, float lr, float norm) {
  const float scale = clip_scale(c, norm);
  t_++;
  float* m = this->m();
  float* v = this->v();
  for (const ParamGroup& g : space_.groups) {
    const int64_t begin = space_.offset(g), end = begin + static_cast<int64_t>(g.params.size());
    const int64_t a = std::max(begin, lo_), b = std::min(end, hi_);
    if (a >= b) continue;
    AdamWParams hp{lr, c.beta1, c.beta2, c.eps, g.decay ? c.weight_decay : 0.0f, t_, scale};
    kernel_(space_.params + a, space_.grads + a, m + (a - lo_), v + (a - lo_), b - a, hp);
  }
}

double AdamW::owned_sum_of_squares() const {
  CHECK(space_.device == Device::kCPU);
  double sq = 0.0;
  for (const ParamGroup& g : space_.groups) {
    if (!g.counts_in_norm) continue;
    const int64_t begin = space_.offset(g), end = begin + static_cast<int64_t>(g.grads.size());
    const int64_t a = std::max(begin, lo_), b = std::min(end, hi_);
    for (int64_t i = a; i < b; i++) sq += static_cast<double>(space_.grads[i]) * space_.grads[i];
  }
  return sq;
}

}  // namespace tessera
