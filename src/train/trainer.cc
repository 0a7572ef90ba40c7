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
#include "comm/mpi/local_device.h"
#include "comm/mesh.h"
#include "comm/nccl/nccl_factory.h"
#include "ckpt/checkpointer.h"
#include "parallel/data_parallel.h"
#include "parallel/model_parallel.h"
#include "parallel/pipeline.h"
#include "kernels/cpu/matmul_peak.h"
#include "runtime/cuda_device.h"
#include "nn/gpt2_weights.h"
#include "train/checkpointing.h"
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

Result<TrainSummary> run_training(const TrainConfig& c, comm::Communicator& world, std::FILE* out) {
  const int rank = world.rank();
  if (c.dp * c.tp * c.pp != world.size())
    return Status::InvalidArgument(fmt::format(
        "parallel.dp x tp x pp = {} x {} x {} = {} but {} rank(s) are running; launch with "
        "`tessera launch -n {} -- train ...` or set parallel.dp",
        c.dp, c.tp, c.pp, c.dp * c.tp * c.pp, world.size(), c.dp * c.tp * c.pp));
  ASSIGN_OR_RETURN(std::unique_ptr<comm::Mesh> mesh, comm::Mesh::create(world, {c.dp, c.tp, c.pp}));
  comm::Communicator& dp = mesh->dp();
  const comm::MeshCoord coord = mesh->coord();
  if (rank != 0) out = nullptr;  // rank 0 speaks for the job
  auto say = [&](auto&&... args) {
    if (out) std::fprintf(out, args...);
  };

  // train.device = "cuda": one GPU per rank, data parallelism (and ZeRO-1)
  // over an NCCL communicator for the dp axis. Tensor parallelism has host
  // loops (nn/vocab_parallel.cc) and the pipeline's messages read host
  // memory, so tp and pp stay on the CPU.
  const bool on_cuda = c.device == "cuda";
  const Backend backend = on_cuda ? Backend::kCUDA : Backend::kCPU;
  std::unique_ptr<comm::Communicator> nccl_dp;  // the dp axis on the GPUs (dp > 1)
  if (on_cuda) {
    if (c.tp > 1 || c.pp > 1)
      return Status::InvalidArgument(fmt::format(
          "train.device = \"cuda\" supports data parallelism only: parallel.tp = {} and parallel.pp = {} must be 1 "
          "(tensor and pipeline parallelism on CUDA are not supported yet; use train.device = \"cpu\")",
          c.tp, c.pp));
    // Every rank needs its GPU; the ranks agree on each stage before going
    // on (select_local_device may itself be collective), so one rank's
    // failure is every rank's error, not a wait for it.
    auto agree = [&](const Status& mine) -> Status {
      int32_t ok = mine.ok() ? 1 : 0;
      RETURN_IF_ERROR(world.all_reduce(&ok, &ok, 1, comm::ElemType::kI32, comm::ReduceOp::kMin));
      RETURN_IF_ERROR(mine);
      if (!ok) return Status::Unavailable("another rank has no usable CUDA device (see its error)");
      return Status::OK();
    };
    RETURN_IF_ERROR(agree(backend_available(Backend::kCUDA)));
    Result<int> device = comm::select_local_device();
    RETURN_IF_ERROR(agree(device.ok() ? Status::OK() : device.status()));
    say("device: cuda:%d (%s)%s\n", *device, cuda::device_summary(*device).c_str(),
        world.size() > 1 ? " on rank 0, one GPU per rank" : "");
    if (c.dp > 1) {
      comm::CommOptions o;
      o.timeout = std::chrono::milliseconds(static_cast<int64_t>(c.timeout_s * 1000));
      ASSIGN_OR_RETURN(nccl_dp, comm::make_nccl_communicator(dp, "dp-nccl", o));
    }
  }

  // The whole model's shape, then this rank's shard of it.
  std::unique_ptr<GPT> whole;
  GPTConfig mc = c.model;
  if (!c.init_from.empty()) {
    ASSIGN_OR_RETURN(whole, load_gpt2(c.init_from, nullptr, c.tp == 1 && c.pp == 1 ? backend : Backend::kCPU));
    mc = whole->config();
    if (c.seq > mc.context)
      return Status::InvalidArgument(
          fmt::format("train.seq ({}) exceeds the context ({}) of {}", c.seq, mc.context, c.init_from));
  }
  ASSIGN_OR_RETURN(std::vector<int> wanted_stages, parse_stage_counts(c.stages));
  ASSIGN_OR_RETURN(std::vector<int> stage_layers, stage_layer_counts(mc.layers, c.pp, wanted_stages));
  const ModelShard shard = shard_for(mesh->shape(), coord, stage_layers);
  RETURN_IF_ERROR(shard.validate(mc));
  ASSIGN_OR_RETURN(PipelineSchedule schedule, parse_pipeline_schedule(c.schedule));
  std::unique_ptr<GPT> model;
  if (whole && c.tp == 1 && c.pp == 1) {
    model = std::move(whole);
  } else {
    model = std::make_unique<GPT>(mc, backend, shard, c.tp > 1 ? &mesh->tp() : nullptr);
    if (whole) {
      copy_from_whole(*whole, *model);
      whole.reset();
    } else {
      model->init_weights(static_cast<uint64_t>(c.seed));
    }
  }
  const MatmulPrecision prec = c.dtype == "bf16" ? MatmulPrecision::kBF16 : MatmulPrecision::kF32;
  model->set_precision(prec);
  const bool sharded = !model->whole();
  DataParallel ddp(*model, nccl_dp ? *nccl_dp : dp,
                   {static_cast<int64_t>(c.bucket_mb * (1 << 20)), c.zero, sharded ? &world : nullptr});
  RETURN_IF_ERROR(ddp.sync_parameters());
  Pipeline pipe(*model, mesh->pp(), schedule);
  ASSIGN_OR_RETURN(std::unique_ptr<TiedEmbedding> tied, TiedEmbedding::create(*mesh));
  // The loss lives on the last stage; tp rank 0 of it reports it.
  const bool reports_loss = shard.layer_end == mc.layers && coord.tp == 0;

  // The whole model in the Hugging Face layout, written by rank 0 (every
  // rank takes part in gathering a sharded model).
  const std::string final_weights_path = (std::filesystem::path(c.checkpoint_dir) / "model.safetensors").string();
  auto save_final_weights = [&]() -> Status {
    std::unique_ptr<GPT> full;
    if (sharded && rank == 0) full = std::make_unique<GPT>(mc);
    if (sharded) RETURN_IF_ERROR(gather_whole(*model, *mesh, stage_layers, full.get()));
    if (rank == 0) {
      std::filesystem::create_directories(c.checkpoint_dir);
      RETURN_IF_ERROR(save_hf(sharded ? *full : *model, final_weights_path));
      say("saved %s (+ config.json)\n", final_weights_path.c_str());
    }
    return Status::OK();
  };

  MetricsLog metrics;
  if (rank == 0) RETURN_IF_ERROR(metrics.open(c.metrics));
  nlohmann::json layout_json = {{"dp", c.dp},           {"tp", c.tp},        {"pp", c.pp},
                                {"zero", c.zero},       {"stages", stage_layers}, {"schedule", c.schedule}};
  int start_step = 0;
  if (!c.resume.empty()) {
    const std::string path = c.resume == "latest" ? c.checkpoint_dir : c.resume;
    ASSIGN_OR_RETURN(ckpt::Checkpoint ck, ckpt::Checkpoint::open(path));
    ASSIGN_OR_RETURN(ResumeState rs, load_checkpoint(ck, *model, ddp));
    start_step = static_cast<int>(rs.step);
    RETURN_IF_ERROR(ddp.check_parameters_identical());
    // A resume of a finished run (an attempt killed after publishing its
    // last checkpoint, before it exited) trains nothing: say so and only
    // write the final weights, which that attempt may not have written.
    if (start_step >= c.steps) {
      say("already finished: %s is at step %d of train.steps = %d; nothing to train\n", ck.dir().c_str(),
          start_step, c.steps);
      RETURN_IF_ERROR(save_final_weights());
      return TrainSummary{.weights_path = final_weights_path};
    }
    say("resumed from %s at step %d (saved by layout %s)\n", ck.dir().c_str(), start_step, ck.layout().dump().c_str());
  }
  std::unique_ptr<ckpt::Checkpointer> checkpointer;
  CheckpointMirror mirror;  // host copies of a CUDA model's tensors
  if (c.checkpoint_every > 0) {
    ckpt::CheckpointerOptions o;
    o.dir = c.checkpoint_dir;
    o.keep = c.checkpoint_keep;
    o.on_busy = c.checkpoint_on_busy == "skip" ? ckpt::OnBusy::kSkip : ckpt::OnBusy::kWait;
    o.config = {{"model", model_config_json(mc)}, {"seed", c.seed}, {"micro_batch", c.micro_batch},
                {"seq", c.seq},                     {"grad_accum", c.grad_accum}, {"dtype", c.dtype}};
    o.layout = layout_json;
    checkpointer = std::make_unique<ckpt::Checkpointer>(std::move(o));
    size_t floats = 0;
    for (const ckpt::SavePiece& p : checkpoint_pieces(*model, ddp, coord.dp, c.zero, &mirror))
      floats += static_cast<size_t>(p.slice.numel());
    checkpointer->reserve_staging(floats);
  }
  // Time the training thread spends in the checkpointer (staging copies, the
  // agreement and rank 0's publishing), and all of training.
  double stall_s = 0.0, train_s = 0.0;
  // Reports a finished save (rank 0): published, with its costs, or failed.
  auto report_save = [&](const ckpt::PollResult& r) {
    if (r.state == ckpt::SaveState::kPublished) {
      say("checkpoint step %lld published: %.1f MB, staging copy %.1f ms, write %.0f MB/s; checkpoints have "
          "stalled training %.1f ms so far (%.3f%%)%s%s\n",
          static_cast<long long>(r.step), r.stats.bytes_total / 1e6, r.stats.stall_ms, r.stats.write_mb_s,
          stall_s * 1e3, train_s > 0 ? 100.0 * stall_s / (train_s + stall_s) : 0.0, r.warning.empty() ? "" : "; ",
          r.warning.c_str());
      metrics.write({{"checkpoint_step", r.step},
                     {"stall_ms", r.stats.stall_ms},
                     {"stalled_total_ms", stall_s * 1e3},
                     {"bytes", r.stats.bytes_total},
                     {"write_mb_s", r.stats.write_mb_s},
                     {"stall_share", train_s > 0 ? stall_s / (train_s + stall_s) : 0.0}});
    } else if (r.state == ckpt::SaveState::kFailed) {
      if (out) std::fprintf(stderr, "tessera: warning: %s; training goes on, the previous checkpoint stays latest\n",
                            r.error.message().c_str());
      metrics.write({{"checkpoint_step", r.step}, {"checkpoint_error", r.error.message()}});
    }
  };

  ASSIGN_OR_RETURN(data::TokenLoader train, data::TokenLoader::open(c.train_data, c.seq, c.seed));
  std::vector<uint16_t> val_tokens;
  if (!c.val_data.empty()) {
    ASSIGN_OR_RETURN(data::TokenLoader val, data::TokenLoader::open(c.val_data, c.seq, c.seed));
    val_tokens = val.all_tokens();
  }

  const int B = c.micro_batch, T = c.seq, GA = c.grad_accum;
  // The global batch of a step: rows [0, B*GA*dp); dp rank r's micro-step m
  // takes rows [(r*GA + m)*B, +B), so the step's sequences do not depend on
  // the split between ranks and micro-steps. Every tp and pp rank of a data-
  // parallel replica reads the same rows.
  const int64_t rows_per_step = int64_t{B} * GA * dp.size();
  const double tokens_per_step = static_cast<double>(rows_per_step) * T;
  // On a GPU the stated peak (train/flops.h), not a measurement.
  const double peak = on_cuda ? kCudaPeakTflops * 1e3 : cpu::measure_matmul_gflops(1536, prec, 3);
  model->reserve_activations(B, T, pipeline_slots(schedule, c.pp, coord.pp, GA));
  // Memory per rank, the largest over ranks: parameters, gradients, optimizer
  // state, activations (bytes).
  double mem[4] = {static_cast<double>(model->params().bytes()), static_cast<double>(model->grads().bytes()),
                   static_cast<double>(ddp.optimizer_state_bytes()), static_cast<double>(model->activation_bytes())};
  RETURN_IF_ERROR(world.all_reduce(mem, mem, 4, comm::ElemType::kF64, comm::ReduceOp::kMax));
  say("model: %s, %.2fM parameters, %s; data: %lld train tokens in %zu shard(s)\n", mc.str().c_str(),
      mc.num_parameters() / 1e6, c.dtype.c_str(), static_cast<long long>(train.tokens()), train.files().size());
  say("batch: %d x %d tokens x %d micro-steps x %d dp ranks = %.0f tokens/step; matmul peak %.0f GFLOP/s/rank\n", B,
      T, GA, dp.size(), tokens_per_step, peak);
  if (world.size() > 1) {
    std::string stages;
    for (int n : stage_layers) stages += fmt::format("{}{}", stages.empty() ? "" : ",", n);
    say("layout: dp=%d tp=%d pp=%d (layers per stage %s, %s), %s, %d gradient bucket(s)\n", c.dp, c.tp, c.pp,
        stages.c_str(), c.schedule.c_str(), c.zero ? "ZeRO-1" : "all-reduce", ddp.buckets());
  }
  say("memory per rank (max): params %.1f MB, grads %.1f MB, optimizer %.1f MB, activations %.1f MB\n",
      mem[0] / 1e6, mem[1] / 1e6, mem[2] / 1e6, mem[3] / 1e6);

  TrainSummary summary;
  // Validation batches are dealt round-robin to the dp replicas, run through
  // the pipeline, and the last stage's sums all-reduced, so every rank gets
  // the same mean.
  auto run_eval = [&](int step) -> Status {
    if (val_tokens.empty()) return Status::OK();
    const int64_t BT = int64_t{B} * T;
    const int64_t available = val_tokens.size() > 0 ? (static_cast<int64_t>(val_tokens.size()) - 1) / BT : 0;
    if (available == 0)
      return Status::InvalidArgument(fmt::format("{}: {} tokens are fewer than one batch needs ({})", c.val_data,
                                                 val_tokens.size(), BT + 1));
    const int64_t batches = std::min<int64_t>(available, c.eval_batches);
    std::vector<int> in(BT), tg(BT);
    double sums[2] = {0.0, 0.0};  // loss sum, batches
    for (int64_t k = dp.rank(); k < batches; k += dp.size()) {
      const uint16_t* base = val_tokens.data() + k * BT;
      for (int64_t i = 0; i < BT; i++) {
        in[i] = base[i];
        tg[i] = base[i + 1];
      }
      RETURN_IF_ERROR(with_vocab_hint(model->check_batch(in.data(), tg.data(), B, T), c.val_data));
      float loss = 0.0f;
      RETURN_IF_ERROR(pipe.forward_only(B, T, in.data(), tg.data(), &loss));
      if (reports_loss) {
        sums[0] += loss;
        sums[1] += 1;
      }
    }
    RETURN_IF_ERROR(world.all_reduce(sums, sums, 2, comm::ElemType::kF64));
    const double loss = sums[0] / sums[1];
    if (!summary.has_val) summary.first_val_loss = loss;
    summary.has_val = true;
    summary.last_val_loss = loss;
    say("step %5d | val loss %.4f (%lld tokens)\n", step, loss, static_cast<long long>(batches * BT));
    metrics.write({{"step", step}, {"val_loss", loss}});
    return Status::OK();
  };
  RETURN_IF_ERROR(run_eval(0));
  pipe.take_times();
  model->take_tp_comm_seconds();

  for (int step = start_step; step < c.steps; step++) {
    auto t0 = Clock::now();
    model->zero_grad();
    auto fill = [&](int micro, int* inputs, int* targets) -> Status {
      const int64_t row0 = (int64_t{dp.rank()} * GA + micro) * B;
      train.fill(step, rows_per_step, row0, B, inputs, targets);
      return with_vocab_hint(model->check_batch(inputs, targets, B, T), c.train_data);
    };
    auto before_backward = [&](int micro) {
      if (micro == 0) maybe_inject_fault(rank, step);
      ddp.begin_backward(micro == GA - 1);
    };
    double loss_sum = 0.0;
    RETURN_IF_ERROR(pipe.train_step(GA, B, T, 1.0f / GA, fill, before_backward, &loss_sum));
    // The tied embedding's two gradients are summed before ZeRO shards the
    // flat gradients, or after plain DP has averaged them (the sums commute).
    if (c.zero == 1) RETURN_IF_ERROR(tied->sum_grads(*model));
    RETURN_IF_ERROR(ddp.finish_gradients());
    if (c.zero == 0) RETURN_IF_ERROR(tied->sum_grads(*model));
    const float lr = lr_at(c.opt, step);
    ASSIGN_OR_RETURN(float norm, ddp.optimizer_step(c.opt, lr));
    // The step's loss is the mean over the replicas' last stages; the times
    // are means over all ranks.
    const Pipeline::Times pt = pipe.take_times();
    const double tp_s = model->take_tp_comm_seconds();
    double sums[4] = {reports_loss ? loss_sum / GA : 0.0, ddp.comm_seconds() + tp_s + tied->take_seconds(),
                      pt.bubble, pt.p2p};
    auto tl = Clock::now();
    RETURN_IF_ERROR(world.all_reduce(sums, sums, 4, comm::ElemType::kF64));
    const double loss = sums[0] / dp.size();
    const double comm_s = sums[1] / world.size() + std::chrono::duration<double>(Clock::now() - tl).count();
    const double bubble_s = sums[2] / world.size(), p2p_s = sums[3] / world.size();
    if (!std::isfinite(loss))
      return Status::Internal(fmt::format("loss became {} at step {}; lower train.lr or check the data", loss, step));
    const double step_s = std::chrono::duration<double>(Clock::now() - t0).count();
    const double tps = tokens_per_step / step_s;
    const double mfu = flops_per_token(mc, T) * tokens_per_step / step_s / (peak * 1e9 * world.size());
    summary.last_train_loss = loss;
    if (c.pp > 1)
      say("step %5d/%d | loss %.4f | lr %.2e | norm %.3f | %.0f ms (comm %.0f, bubble %.0f, p2p %.0f) | %.0f tok/s | "
          "mfu %.2f\n",
          step + 1, c.steps, loss, lr, norm, step_s * 1e3, comm_s * 1e3, bubble_s * 1e3, p2p_s * 1e3, tps, mfu);
    else
      say("step %5d/%d | loss %.4f | lr %.2e | norm %.3f | %.0f ms (comm %.0f) | %.0f tok/s | mfu %.2f\n", step + 1,
          c.steps, loss, lr, norm, step_s * 1e3, comm_s * 1e3, tps, mfu);
    if (out) std::fflush(out);
    metrics.write({{"step", step + 1},
                   {"loss", loss},
                   {"lr", lr},
                   {"grad_norm", norm},
                   {"step_ms", step_s * 1e3},
                   {"comm_ms", comm_s * 1e3},
                   {"bubble_ms", bubble_s * 1e3},
                   {"p2p_ms", p2p_s * 1e3},
                   {"compute_ms", std::max(0.0, step_s - comm_s - bubble_s - p2p_s) * 1e3},
                   {"tokens_per_s", tps},
                   {"mfu", mfu},
                   {"mem_params_mb", mem[0] / 1e6},
                   {"mem_grads_mb", mem[1] / 1e6},
                   {"mem_optimizer_mb", mem[2] / 1e6},
                   {"mem_activations_mb", mem[3] / 1e6}});
    train_s += step_s;
    const bool stop = c.stop_at > 0 && step + 1 == c.stop_at && step + 1 < c.steps;
    const bool last = step + 1 == c.steps || stop;
    if (last || (c.eval_every > 0 && (step + 1) % c.eval_every == 0)) RETURN_IF_ERROR(run_eval(step + 1));
    if (checkpointer) {
      if ((step + 1) % c.checkpoint_every == 0 || stop) {
        // On CUDA, checkpoint_pieces copies the tensors to the host: part of the stall.
        auto ts = Clock::now();
        const std::vector<ckpt::SavePiece> pieces = checkpoint_pieces(*model, ddp, coord.dp, c.zero, &mirror);
        const std::string state =
            nlohmann::json{{"step", step + 1}, {"adam_t", ddp.optimizer_steps()}}.dump();
        ASSIGN_OR_RETURN(bool started, checkpointer->save(world, step + 1, pieces, state));
        stall_s += std::chrono::duration<double>(Clock::now() - ts).count();
        if (!started) say("checkpoint step %d skipped: the previous save is still being written\n", step + 1);
      }
      auto tp = Clock::now();
      ASSIGN_OR_RETURN(ckpt::PollResult r, checkpointer->poll(world, last));
      if (!last) stall_s += std::chrono::duration<double>(Clock::now() - tp).count();  // waiting at the end is not a stall
      report_save(r);
    }
    if (stop) {
      say("stopped after step %d of %d (train.stop_at)\n", step + 1, c.steps);
      break;
    }
  }
  if (checkpointer) {
    ASSIGN_OR_RETURN(ckpt::PollResult r, checkpointer->poll(world, true));
    report_save(r);
    if (train_s > 0)
      say("checkpoints: %.1f ms stalled in %.1f s of training (%.3f%%)\n", stall_s * 1e3, train_s,
          100.0 * stall_s / (train_s + stall_s));
  }
  RETURN_IF_ERROR(ddp.check_parameters_identical());

  summary.weights_path = final_weights_path;
  RETURN_IF_ERROR(save_final_weights());
  return summary;
}

}  // namespace tessera
