#include "perf/train_bench.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <random>
#include <vector>

#include <fmt/format.h>

#include "optim/optimizer.h"
#include "parallel/data_parallel.h"
#include "tensor/device_memory.h"
#include "perf/flops.h"

namespace tessera::perf {

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// A fixed pseudo-random batch of n input and target token ids in [0, vocab).
void random_batch(int vocab, int n, std::vector<int>* inputs, std::vector<int>* targets) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> tok(0, vocab - 1);
  inputs->resize(n);
  targets->resize(n);
  for (int i = 0; i < n; i++) {
    (*inputs)[i] = tok(rng);
    (*targets)[i] = tok(rng);
  }
}

}  // namespace

Result<TrainBenchResult> run_train_bench(const TrainBenchConfig& c, std::FILE* progress) {
  RETURN_IF_ERROR(backend_available(c.backend));
  const Device device = device_of(c.backend);
  Result<std::unique_ptr<GPT>> made = GPT::create(c.model, c.backend);
  if (!made.ok()) return made.status();
  GPT& model = **made;
  model.set_precision(c.prec);
  RETURN_IF_ERROR(model.init_weights(1234));
  Result<AdamW> opt = AdamW::create(gpt_param_space(model), gpt_adamw_kernel(model));
  if (!opt.ok()) return opt.status();
  OptimizerConfig oc;
  oc.steps = c.warmup + c.steps;
  const int BT = c.batch * c.seq;
  std::vector<int> inputs, targets;
  random_batch(c.model.vocab, BT, &inputs, &targets);
  if (device == Device::kCUDA) RETURN_IF_ERROR(model.try_reserve_activations(c.batch, c.seq, 1));
  RETURN_IF_ERROR(synchronize(device));

  TrainBenchResult r;
  std::vector<double> step_s;
  for (int s = 0; s < c.warmup + c.steps; s++) {
    op_times().reset();
    const auto t0 = Clock::now();
    // The forward ends with the loss copied back.
    Result<float> loss = model.try_forward(inputs.data(), targets.data(), c.batch, c.seq);
    if (!loss.ok()) return loss.status();
    r.last_loss = *loss;
    const double t_fwd = seconds_since(t0);
    RETURN_IF_ERROR(model.zero_grad());
    RETURN_IF_ERROR(model.backward_stage(0, 1.0f));
    RETURN_IF_ERROR(synchronize(device));
    const double t_bwd = seconds_since(t0) - t_fwd;
    if (Result<float> norm = opt->try_step(oc, lr_at(oc, s)); !norm.ok()) return norm.status();
    RETURN_IF_ERROR(synchronize(device));
    const double total = seconds_since(t0);
    if (progress) std::fprintf(progress, "step %d: loss %.4f, %.1f ms\n", s, r.last_loss, total * 1e3);
    if (!std::isfinite(r.last_loss))
      return Status::Internal(fmt::format("loss became {} at step {}", r.last_loss, s));
    if (s < c.warmup) continue;
    step_s.push_back(total);
    r.forward_s += t_fwd / c.steps;
    r.backward_s += t_bwd / c.steps;
    r.optimizer_s += (total - t_fwd - t_bwd) / c.steps;
    for (size_t k = 0; k < r.ops.seconds.size(); k++) r.ops.seconds[k] += op_times().seconds[k] / c.steps;
  }
  std::sort(step_s.begin(), step_s.end());
  r.step_s = step_s[step_s.size() / 2];
  r.tokens_per_step = BT;
  r.flops_per_step = flops_per_token(c.model, c.seq) * BT;
  return r;
}

}  // namespace tessera::perf
