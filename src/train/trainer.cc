#include "train/trainer.h"

#include <cerrno>
#include <chrono>
#include <cstring>
#include <cmath>
#include <filesystem>
#include <memory>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "data/loader.h"
#include "kernels/cpu/ops.h"
#include "nn/gpt2_weights.h"
#include "train/evaluate.h"
#include "train/flops.h"

namespace tessera {

namespace {

using Clock = std::chrono::steady_clock;

// Matmul peak of this machine for MFU, from one short square gemm.
double quick_peak_gflops(MatmulPrecision prec) {
  const int n = 1536;
  std::vector<float> a(n * n, 0.5f), b(n * n, 0.25f), c(n * n);
  double best = 0.0;
  for (int i = 0; i < 3; i++) {
    auto t0 = Clock::now();
    cpu::matmul_forward(c.data(), a.data(), b.data(), nullptr, n, n, n, prec);
    double s = std::chrono::duration<double>(Clock::now() - t0).count();
    best = std::max(best, 2.0 * n * n * n / s / 1e9);
  }
  return best;
}

// Token ids outside the model's vocabulary almost always mean the shards were
// prepared with another tokenizer; say so.
Status with_vocab_hint(const Status& st, const std::string& data) {
  if (st.ok()) return st;
  if (st.message().find("outside the vocabulary") == std::string::npos) return st.With(data);
  return Status::InvalidArgument(
      fmt::format("{}: {} (does model.vocab match the tokenizer that prepared it?)", data, st.message()));
}

class MetricsLog {
 public:
  Status open(const std::string& path) {
    if (path.empty()) return Status::OK();
    if (auto dir = std::filesystem::path(path).parent_path(); !dir.empty()) std::filesystem::create_directories(dir);
    f_ = std::fopen(path.c_str(), "w");
    if (!f_) return Status::IOError(fmt::format("{}: cannot open for writing: {}", path, std::strerror(errno)));
    return Status::OK();
  }
  void write(const nlohmann::json& j) {
    if (!f_) return;
    std::fprintf(f_, "%s\n", j.dump().c_str());
    std::fflush(f_);
  }
  ~MetricsLog() {
    if (f_) std::fclose(f_);
  }

 private:
  std::FILE* f_ = nullptr;
};

}  // namespace

Result<TrainSummary> run_training(const TrainConfig& c, std::FILE* out) {
  std::unique_ptr<GPT> model;
  if (!c.init_from.empty()) {
    ASSIGN_OR_RETURN(model, load_gpt2(c.init_from, nullptr));
    if (c.seq > model->config().context)
      return Status::InvalidArgument(
          fmt::format("train.seq ({}) exceeds the context ({}) of {}", c.seq, model->config().context, c.init_from));
  } else {
    model = std::make_unique<GPT>(c.model);
    model->init_weights(static_cast<uint64_t>(c.seed));
  }
  const MatmulPrecision prec = c.dtype == "bf16" ? MatmulPrecision::kBF16 : MatmulPrecision::kF32;
  model->set_precision(prec);
  const GPTConfig& mc = model->config();

  ASSIGN_OR_RETURN(data::TokenLoader train, data::TokenLoader::open(c.train_data, c.seq, c.seed));
  std::vector<uint16_t> val_tokens;
  if (!c.val_data.empty()) {
    ASSIGN_OR_RETURN(data::TokenLoader val, data::TokenLoader::open(c.val_data, c.seq, c.seed));
    val_tokens = val.all_tokens();
  }
  MetricsLog metrics;
  RETURN_IF_ERROR(metrics.open(c.metrics));

  const int B = c.micro_batch, T = c.seq;
  const int64_t rows_per_step = int64_t{B} * c.grad_accum;
  const double tokens_per_step = static_cast<double>(rows_per_step) * T;
  const double peak = quick_peak_gflops(prec);
  std::fprintf(out, "model: %s, %.2fM parameters, %s; data: %lld train tokens in %zu shard(s)\n", mc.str().c_str(),
               mc.num_parameters() / 1e6, c.dtype.c_str(), static_cast<long long>(train.tokens()),
               train.files().size());
  std::fprintf(out, "batch: %d x %d tokens x %d micro-steps = %.0f tokens/step; matmul peak %.0f GFLOP/s\n", B, T,
               c.grad_accum, tokens_per_step, peak);

  TrainSummary summary;
  auto run_eval = [&](int step) -> Status {
    if (val_tokens.empty()) return Status::OK();
    auto r = evaluate(*model, val_tokens, B, T, c.eval_batches);
    if (!r.ok()) return with_vocab_hint(r.status(), c.val_data);
    if (!summary.has_val) summary.first_val_loss = r->loss;
    summary.has_val = true;
    summary.last_val_loss = r->loss;
    std::fprintf(out, "step %5d | val loss %.4f (%lld tokens)\n", step, r->loss, static_cast<long long>(r->tokens));
    metrics.write({{"step", step}, {"val_loss", r->loss}});
    return Status::OK();
  };
  RETURN_IF_ERROR(run_eval(0));

  AdamW opt(*model);
  std::vector<int> inputs(int64_t{B} * T), targets(int64_t{B} * T);
  for (int step = 0; step < c.steps; step++) {
    auto t0 = Clock::now();
    model->zero_grad();
    double loss = 0.0;
    for (int micro = 0; micro < c.grad_accum; micro++) {
      train.fill(step, rows_per_step, int64_t{micro} * B, B, inputs.data(), targets.data());
      RETURN_IF_ERROR(with_vocab_hint(model->check_batch(inputs.data(), targets.data(), B, T), c.train_data));
      loss += model->forward(inputs.data(), targets.data(), B, T) / c.grad_accum;
      model->backward(1.0f / c.grad_accum);
    }
    if (!std::isfinite(loss))
      return Status::Internal(fmt::format("loss became {} at step {}; lower train.lr or check the data", loss, step));
    float lr = lr_at(c.opt, step);
    float norm = opt.step(*model, c.opt, lr);
    double step_s = std::chrono::duration<double>(Clock::now() - t0).count();
    double tps = tokens_per_step / step_s;
    double mfu = flops_per_token(mc, T) * tokens_per_step / step_s / (peak * 1e9);
    summary.last_train_loss = loss;
    std::fprintf(out, "step %5d/%d | loss %.4f | lr %.2e | norm %.3f | %.0f ms | %.0f tok/s | mfu %.2f\n", step + 1,
                 c.steps, loss, lr, norm, step_s * 1e3, tps, mfu);
    std::fflush(out);
    metrics.write({{"step", step + 1},
                   {"loss", loss},
                   {"lr", lr},
                   {"grad_norm", norm},
                   {"step_ms", step_s * 1e3},
                   {"tokens_per_s", tps},
                   {"mfu", mfu}});
    bool last = step + 1 == c.steps;
    if (last || (c.eval_every > 0 && (step + 1) % c.eval_every == 0)) RETURN_IF_ERROR(run_eval(step + 1));
  }

  std::filesystem::create_directories(c.checkpoint_dir);
  summary.weights_path = (std::filesystem::path(c.checkpoint_dir) / "model.safetensors").string();
  RETURN_IF_ERROR(save_hf(*model, summary.weights_path));
  std::fprintf(out, "saved %s (+ config.json)\n", summary.weights_path.c_str());
  return summary;
}

}  // namespace tessera
