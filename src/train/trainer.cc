#include "train/trainer.h"

#include <cerrno>
#include <chrono>
#include <cstring>
#include <cmath>
#include <cstdlib>
#include <thread>
#include <filesystem>
#include <memory>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "data/loader.h"
#include "dist/mesh.h"
#include "parallel/data_parallel.h"
#include "kernels/cpu/matmul_peak.h"
#include "nn/gpt2_weights.h"
#include "train/evaluate.h"
#include "train/flops.h"

namespace tessera {

namespace {

using Clock = std::chrono::steady_clock;

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

// Test hook for fault handling (tests/cli/dp_faults.sh): TESSERA_FAULT is
// "stall@RANK:STEP" (that rank sleeps for an hour before the step's
// backward) or "exit@RANK:STEP" (it exits at once with status 3).
void maybe_inject_fault(int rank, int step) {
  const char* f = std::getenv("TESSERA_FAULT");
  if (!f) return;
  char kind[16] = {};
  int fr = -1, fs = -1;
  if (std::sscanf(f, "%15[a-z]@%d:%d", kind, &fr, &fs) != 3 || fr != rank || fs != step) return;
  if (std::strcmp(kind, "stall") == 0) std::this_thread::sleep_for(std::chrono::hours(1));
  if (std::strcmp(kind, "exit") == 0) std::_Exit(3);
}

}  // namespace

Result<TrainSummary> run_training(const TrainConfig& c, dist::Communicator& world, std::FILE* out) {
  const int rank = world.rank();
  if (c.dp * c.tp * c.pp != world.size())
    return Status::InvalidArgument(fmt::format(
        "parallel.dp x tp x pp = {} x {} x {} = {} but {} rank(s) are running; launch with "
        "`tessera launch -n {} -- train ...` or set parallel.dp",
        c.dp, c.tp, c.pp, c.dp * c.tp * c.pp, world.size(), c.dp * c.tp * c.pp));
  ASSIGN_OR_RETURN(std::unique_ptr<dist::Mesh> mesh, dist::Mesh::create(world, {c.dp, c.tp, c.pp}));
  dist::Communicator& dp = mesh->dp();
  if (rank != 0) out = nullptr;  // rank 0 speaks for the job
  auto say = [&](auto&&... args) {
    if (out) std::fprintf(out, args...);
  };

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
  DataParallel ddp(*model, dp, {static_cast<int64_t>(c.bucket_mb * (1 << 20)), c.zero});
  RETURN_IF_ERROR(ddp.sync_parameters());

  ASSIGN_OR_RETURN(data::TokenLoader train, data::TokenLoader::open(c.train_data, c.seq, c.seed));
  std::vector<uint16_t> val_tokens;
  if (!c.val_data.empty()) {
    ASSIGN_OR_RETURN(data::TokenLoader val, data::TokenLoader::open(c.val_data, c.seq, c.seed));
    val_tokens = val.all_tokens();
  }
  MetricsLog metrics;
  if (rank == 0) RETURN_IF_ERROR(metrics.open(c.metrics));

  const int B = c.micro_batch, T = c.seq;
  // The global batch of a step: rows [0, B*GA*dp); rank r's micro-step m
  // takes rows [(r*GA + m)*B, +B), so the step's sequences do not depend on
  // the split between ranks and micro-steps.
  const int64_t rows_per_step = int64_t{B} * c.grad_accum * dp.size();
  const double tokens_per_step = static_cast<double>(rows_per_step) * T;
  const double peak = cpu::measure_matmul_gflops(1536, prec, 3);
  say("model: %s, %.2fM parameters, %s; data: %lld train tokens in %zu shard(s)\n", mc.str().c_str(),
      mc.num_parameters() / 1e6, c.dtype.c_str(), static_cast<long long>(train.tokens()), train.files().size());
  say("batch: %d x %d tokens x %d micro-steps x %d dp ranks = %.0f tokens/step; matmul peak %.0f GFLOP/s/rank\n", B,
      T, c.grad_accum, dp.size(), tokens_per_step, peak);
  if (dp.size() > 1)
    say("data parallel: %d ranks, %s, %d gradient bucket(s), optimizer state %.1f MB per rank\n", dp.size(),
        c.zero ? "ZeRO-1" : "all-reduce", ddp.buckets(), ddp.optimizer_state_bytes() / 1e6);

  TrainSummary summary;
  // Validation batches are dealt round-robin to the dp ranks and the sums
  // all-reduced, so every rank gets the same mean.
  auto run_eval = [&](int step) -> Status {
    if (val_tokens.empty()) return Status::OK();
    const int64_t BT = int64_t{B} * T;
    const int64_t available = val_tokens.size() > 0 ? (static_cast<int64_t>(val_tokens.size()) - 1) / BT : 0;
    if (available == 0)
      return Status::InvalidArgument(fmt::format("{}: {} tokens are fewer than one batch needs ({})", c.val_data,
                                                 val_tokens.size(), BT + 1));
    const int64_t batches = std::min<int64_t>(available, c.eval_batches);
    double sums[2] = {0.0, 0.0};  // loss sum, batches
    for (int64_t k = dp.rank(); k < batches; k += dp.size()) {
      auto r = evaluate(*model, std::span<const uint16_t>(val_tokens).subspan(k * BT, BT + 1), B, T, 1);
      if (!r.ok()) return with_vocab_hint(r.status(), c.val_data);
      sums[0] += r->loss;
      sums[1] += 1;
    }
    RETURN_IF_ERROR(dp.all_reduce(sums, sums, 2, dist::ElemType::kF64));
    const double loss = sums[0] / sums[1];
    if (!summary.has_val) summary.first_val_loss = loss;
    summary.has_val = true;
    summary.last_val_loss = loss;
    say("step %5d | val loss %.4f (%lld tokens)\n", step, loss, static_cast<long long>(batches * BT));
    metrics.write({{"step", step}, {"val_loss", loss}});
    return Status::OK();
  };
  RETURN_IF_ERROR(run_eval(0));

  std::vector<int> inputs(int64_t{B} * T), targets(int64_t{B} * T);
  for (int step = 0; step < c.steps; step++) {
    auto t0 = Clock::now();
    model->zero_grad();
    double loss = 0.0;
    for (int micro = 0; micro < c.grad_accum; micro++) {
      const int64_t row0 = (int64_t{dp.rank()} * c.grad_accum + micro) * B;
      train.fill(step, rows_per_step, row0, B, inputs.data(), targets.data());
      RETURN_IF_ERROR(with_vocab_hint(model->check_batch(inputs.data(), targets.data(), B, T), c.train_data));
      loss += model->forward(inputs.data(), targets.data(), B, T) / c.grad_accum;
      maybe_inject_fault(rank, step);
      ddp.begin_backward(micro == c.grad_accum - 1);
      model->backward(1.0f / c.grad_accum);
    }
    RETURN_IF_ERROR(ddp.finish_gradients());
    const float lr = lr_at(c.opt, step);
    ASSIGN_OR_RETURN(float norm, ddp.optimizer_step(c.opt, lr));
    // The step's loss is the mean over all ranks' tokens.
    double loss_sum = loss;
    auto tl = Clock::now();
    RETURN_IF_ERROR(dp.all_reduce(&loss_sum, &loss_sum, 1, dist::ElemType::kF64));
    loss = loss_sum / dp.size();
    const double comm_s = ddp.comm_seconds() + std::chrono::duration<double>(Clock::now() - tl).count();
    if (!std::isfinite(loss))
      return Status::Internal(fmt::format("loss became {} at step {}; lower train.lr or check the data", loss, step));
    const double step_s = std::chrono::duration<double>(Clock::now() - t0).count();
    const double tps = tokens_per_step / step_s;
    const double mfu = flops_per_token(mc, T) * tokens_per_step / step_s / (peak * 1e9 * dp.size());
    summary.last_train_loss = loss;
    say("step %5d/%d | loss %.4f | lr %.2e | norm %.3f | %.0f ms (comm %.0f) | %.0f tok/s | mfu %.2f\n", step + 1,
        c.steps, loss, lr, norm, step_s * 1e3, comm_s * 1e3, tps, mfu);
    if (out) std::fflush(out);
    metrics.write({{"step", step + 1},
                   {"loss", loss},
                   {"lr", lr},
                   {"grad_norm", norm},
                   {"step_ms", step_s * 1e3},
                   {"comm_ms", comm_s * 1e3},
                   {"compute_ms", (step_s - comm_s) * 1e3},
                   {"tokens_per_s", tps},
                   {"mfu", mfu}});
    const bool last = step + 1 == c.steps;
    if (last || (c.eval_every > 0 && (step + 1) % c.eval_every == 0)) RETURN_IF_ERROR(run_eval(step + 1));
  }
  RETURN_IF_ERROR(ddp.check_parameters_identical());

  summary.weights_path = (std::filesystem::path(c.checkpoint_dir) / "model.safetensors").string();
  if (rank == 0) {
    std::filesystem::create_directories(c.checkpoint_dir);
    RETURN_IF_ERROR(save_hf(*model, summary.weights_path));
    say("saved %s (+ config.json)\n", summary.weights_path.c_str());
  }
  return summary;
}

}  // namespace tessera
