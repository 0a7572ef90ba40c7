#include "optim/optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "kernels/cuda/reduce.h"
#include "runtime/cuda_device.h"

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

float global_norm(Device d, const float* x, int64_t n) {
  if (d == Device::kCPU) return global_norm(x, n);
  Result<double> sq = cuda::sum_of_squares(x, n);
  if (!sq.ok()) {
    std::fprintf(stderr, "tessera: CUDA error in the gradient norm: %s\n", sq.status().message().c_str());
    std::abort();
  }
  return static_cast<float>(std::sqrt(*sq));
}

AdamW::AdamW(const GPT& model) : m_(model.params().clone_layout()), v_(model.params().clone_layout()) {}

float AdamW::step(GPT& model, const OptimizerConfig& c, float lr) {
  Arena& grads = model.grads();
  // Alignment gaps and vocab padding rows are zero, so the flat norm is the
  // norm over the real gradients.
  float norm = global_norm(grads.device(), reinterpret_cast<const float*>(grads.base()),
                           static_cast<int64_t>(grads.bytes() / 4));
  apply(model, c, lr, norm);
  return norm;
}

void AdamW::apply(GPT& model, const OptimizerConfig& c, float lr, float norm) {
  float scale = 1.0f;
  if (c.grad_clip > 0.0f) scale = std::min(1.0f, c.grad_clip / (norm + 1e-6f));  // as torch clip_grad_norm_
  t_++;
  const OpsTable& ops = ops_for(model.backend());
  ParamPtrs p = model.param_ptrs(), g = model.grad_ptrs();
  for (int id = 0; id < kNumParams; id++) {
    AdamWParams hp{lr, c.beta1, c.beta2, c.eps, GPT::decays(id) ? c.weight_decay : 0.0f, t_, scale};
    int64_t n = model.params().tensor(id).numel();
    ops.adamw_update(p[id], g[id], m_.tensor(id).f32(), v_.tensor(id).f32(), n, hp);
  }
}

}  // namespace tessera
