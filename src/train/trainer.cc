#include "train/trainer.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <cmath>
#include <cstdlib>
#include <thread>
#include <filesystem>
#include <functional>
#include <memory>
#include <numeric>
#include <optional>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/fault_plan.h"
#include "core/host.h"
#include "data/loader.h"
#include "comm/agree.h"
#include "comm/mpi/local_device.h"
#include "comm/mesh.h"
#include "comm/nccl/nccl_factory.h"
#include "comm/traffic.h"
#include "ckpt/checkpointer.h"
#include "ckpt/dir_lock.h"
#include "obs/gpu.h"
#include "obs/link.h"
#include "obs/metrics.h"
#include "obs/process.h"
#include "obs/trace.h"
#include "optim/zero.h"
#include "parallel/data_parallel.h"
#include "parallel/model_parallel.h"
#include "parallel/pipeline.h"
#include "perf/gpu_checks.h"
#include "perf/profile.h"
#include "runtime/cuda_device.h"
#include "io/file.h"
#include "nn/gpt2_weights.h"
#include "train/checkpointing.h"
#include "train/plan_check.h"
#include "train/stop.h"
#include "train/evaluate.h"
#include "train/loop.h"
#include "train/memory_check.h"
#include "train/saves.h"
#include "perf/flops.h"
#include "train/memory_plan.h"
#include "train/monitoring.h"
#include "train/tracing.h"

namespace tessera {

namespace {

using Clock = std::chrono::steady_clock;


// Token ids outside the model's vocabulary almost always mean the shards were
// prepared with another tokenizer; say so.
Status with_vocab_hint(const Status& st) {
  if (st.ok() || st.message().find("outside the vocabulary") == std::string::npos) return st;
  return Status::InvalidArgument(st.message() + " (does model.vocab match the tokenizer that prepared it?)");
}

// Rank 0's outputs, checked before anything is allocated or trained:
// checkpoint.dir (the checkpoints and the final weights) must be a folder
// that exists or can be created and in which files can be created, and the
// log.metrics file must open for writing. Errors name the key and the path.
Status check_outputs(const TrainConfig& c) {
  RETURN_IF_ERROR(io::check_writable_folder(c.checkpoint_dir).With("checkpoint.dir"));
  if (!c.metrics.empty()) RETURN_IF_ERROR(io::check_openable_for_writing(c.metrics).With("log.metrics"));
  return Status::OK();
}

// "45s", "12m05s", "3h07m": a time left, to the second under an hour.
std::string format_duration(double seconds) {
  const long long t = std::llround(std::max(0.0, seconds));
  if (t < 60) return fmt::format("{}s", t);
  if (t < 3600) return fmt::format("{}m{:02}s", t / 60, t % 60);
  return fmt::format("{}h{:02}m", t / 3600, (t % 3600) / 60);
}



// The training loop in named parts: setup() (devices, mesh, model, data
// parallelism, optimizer, resume, checkpointer, data), step() (one optimizer
// step), evaluate(), save() (checkpoints), log() (the console line, the
// JSONL metrics and the registry), finish() (the last save and the export).
// Collectives run in the same order on every rank; run() calls the parts.
class Trainer final : public TrainTask {
 public:
  Trainer(const TrainConfig& c, comm::Communicator& world, std::FILE* out, obs::Registry* registry,
          const StopFlag* stop, const FaultPlan* faults)
      : c_(c),
        world_(world),
        out_(world.rank() == 0 ? out : nullptr),
        rank_(world.rank()),
        stop_(stop),
        faults_(faults),
        registry_(registry ? *registry : own_registry_) {}

  Result<TrainSummary> run();

  // TrainTask (train/loop.h).
  Result<StepResult> step(int step) override;
  Status log(int, bool) override {
    log(last_step_);
    return Status::OK();
  }
  Status evaluate(int step) override;
  Status save(int step, bool stop, bool last) override;
  Status stop_on_signal(int step) override;

 private:
  // A step's figures, the same on every rank.
  struct StepStats {
    int step = 0;  // 1-based: steps completed
    double loss = 0.0;
    float lr = 0.0f, norm = 0.0f;
    double step_s = 0.0, comm_s = 0.0, bubble_s = 0.0, p2p_s = 0.0, tokens_per_s = 0.0, mfu = 0.0;
    double gemm_efficiency = 0.0;  // achieved / the profile's measured GEMM peak; 0 without a profile
    // comm_s by kind (means over ranks): kCommKinds below.
    double comm_kind_s[5] = {0, 0, 0, 0, 0};
    bool stop = false;  // some rank received a stop signal (train/stop.h)
  };
  // The kinds of communication time a step reports (metrics label `op`,
  // JSONL comm_<op>_ms): the data-parallel gradient exchange, the
  // optimizer's (ZeRO-1 all-gather, the global norm), tensor parallelism's
  // all-reduces, the tied embedding's gradient between first and last
  // stage, and the step's own statistics all-reduce.
  static constexpr const char* kCommKinds[5] = {"gradient", "optimizer", "tensor_parallel", "tied_embedding",
                                                "step_stats"};

  Status setup();
  Status setup_device();
  void start_gpu_monitor(int device);
  Status setup_model();
  Status make_model(std::unique_ptr<GPT> whole, const ModelShard& shard);
  // A collective: every rank gives its own status and gets it back if it
  // failed, or an error saying that another rank failed (`what`: "has no
  // usable CUDA device"), so one rank's failure is every rank's error
  // instead of a wait at the next collective.
  // Rank 0 checks the outputs (check_outputs) and locks checkpoint.dir; its
  // verdict is every rank's.
  Status agree_on_outputs();
  Status setup_checkpointer();
  // Before the model allocates: refuses (InvalidArgument, every rank) a job
  // whose memory plan cannot fit in its host's memory.
  Status check_memory_fits(const ModelShard& shard);
  Result<StepStats> train_step(int step);
  SnapshotFn snapshot();
  void log(const StepStats& s);
  Status finish();
  Status save_final_weights();
  std::string final_weights_path() const {
    return (std::filesystem::path(c_.checkpoint_dir) / "model.safetensors").string();
  }

  template <typename... Args>
  void say(const char* fmt, Args... args) {
    if (out_) std::fprintf(out_, fmt, args...);
  }

  const TrainConfig& c_;
  comm::Communicator& world_;
  std::FILE* out_;  // rank 0 speaks for the job; null elsewhere
  const int rank_;
  const StopFlag* stop_;  // null: signals do not stop this run
  const FaultPlan* faults_;  // null: none injected
  std::unique_ptr<TraceSession> trace_;  // --trace; destroyed last, so it writes what the others recorded
  std::unique_ptr<comm::Mesh> mesh_;
  comm::Communicator* dp_ = nullptr;
  comm::MeshCoord coord_;
  bool on_cuda_ = false;
  Backend backend_ = Backend::kCPU;
  std::unique_ptr<comm::Communicator> nccl_dp_;  // the dp axis on the GPUs (dp > 1)
  GPTConfig mc_;
  std::vector<int> stage_layers_;
  PipelineSchedule schedule_ = PipelineSchedule::k1F1B;
  MatmulPrecision prec_ = MatmulPrecision::kF32;
  std::unique_ptr<GPT> model_;
  bool sharded_ = false;
  std::unique_ptr<DataParallel> ddp_;
  std::unique_ptr<ShardedAdamW> opt_;
  std::unique_ptr<Pipeline> pipe_;
  std::unique_ptr<TiedEmbedding> tied_;
  bool reports_loss_ = false;  // the loss lives on the last stage; tp rank 0 of it reports it
  MetricsLog metrics_;
  // The per-step series of registry_, looked up once (setup_metrics()).
  struct StepMetrics {
    obs::Counter* steps;
    obs::Counter* tokens;
    obs::Gauge* loss;
    obs::Gauge* lr;
    obs::Gauge* grad_norm;
    obs::Gauge* tokens_per_s;
    obs::Gauge* mfu;
    obs::Gauge* gemm_efficiency;  // with a profile
    obs::Histogram* step_seconds;
    obs::Gauge* comm_s;
    obs::Gauge* bubble_s;
    obs::Gauge* p2p_s;
    obs::Gauge* compute_s;
    obs::Gauge* comm_kind_s[5];
  };
  void setup_metrics();
  Status predict_plan();
  void report_plan_check();
  obs::Registry own_registry_;  // when the caller passes none
  obs::Registry& registry_;
  StepMetrics step_metrics_{};
  // GET /metrics of registry_ (log.metrics_port); declared after it, so it
  // stops before the registry goes.
  std::unique_ptr<obs::MetricsExporter> exporter_;
  // NVML's figures of this rank's GPU (train.device = "cuda" and NVML
  // present); samples into registry_ from its own thread.
  std::unique_ptr<obs::GpuMonitor> gpu_;
  int start_step_ = 0;
  bool already_finished_ = false;  // resumed at or past train.steps
  // Rank 0 holds checkpoint.dir's lock from setup to the end of the job, so
  // no other job writes checkpoints or final weights there meanwhile.
  ckpt::DirLock dir_lock_;
  // The saves (train/saves.h): every checkpoint.every steps, a stop's,
  // the last; their reports and the training time they stalled.
  std::unique_ptr<TrainingSaves> saves_;
  CheckpointMirror mirror_;  // host copies of a CUDA model's tensors
  // Time the training thread spends in the checkpointer (staging copies, the
  // agreement and rank 0's publishing), and all of training.
  double train_s_ = 0.0;
  StepStats last_step_;  // the figures of the step just run, for log()
  // The planner's prediction for this run (train/plan_check.h), and what
  // the steps measured, for the check at the end.
  std::optional<PlanPrediction> plan_;
  std::vector<double> step_seconds_, comm_shares_;
  std::optional<data::TokenLoader> train_;
  std::vector<uint32_t> val_tokens_;
  int64_t rows_per_step_ = 0;
  double tokens_per_step_ = 0.0;
  // The MFU denominator per rank (GFLOP/s): the profile's theoretical peak
  // or this machine's (a GPU's datasheet peak), shared by the host's ranks;
  // never measured in this run (perf/profile.h). gemm_peak_: the profile's
  // measured GEMM peak per rank, 0 without a profile.
  double peak_ = 0.0, gemm_peak_ = 0.0;
  std::string peak_source_;
  obs::LinkSpeed link_;  // log.link_gbps, else the interface's, else unknown
  CommMetrics comm_metrics_;  // the network figures of each logged step
  // Memory per rank, the largest over ranks (bytes): parameters, gradients,
  // optimizer state, activations, and checkpoint staging (the host buffer
  // every save copies into, plus a CUDA model's host mirror; 0 without
  // checkpoints).
  static constexpr int kMemParts = 5;
  double mem_[kMemParts] = {0, 0, 0, 0, 0};
  // The checkpointer's host memory on this rank (bytes).
  double checkpoint_staging_bytes() const;
  TrainSummary summary_;
};

Status Trainer::setup_device() {
  // train.device = "cuda": one GPU per rank, data parallelism (and ZeRO-1)
  // over an NCCL communicator for the dp axis. Tensor parallelism has host
  // loops (nn/vocab_parallel.cc) and the pipeline's messages read host
  // memory, so tp and pp stay on the CPU.
  on_cuda_ = c_.device == "cuda";
  backend_ = on_cuda_ ? Backend::kCUDA : Backend::kCPU;
  if (!on_cuda_) return Status::OK();
  if (c_.tp > 1 || c_.pp > 1)
    return Status::InvalidArgument(fmt::format(
        "train.device = \"cuda\" supports data parallelism only: parallel.tp = {} and parallel.pp = {} must be 1 "
        "(tensor and pipeline parallelism on CUDA are not supported yet; use train.device = \"cpu\")",
        c_.tp, c_.pp));
  // Every rank needs its GPU; the ranks agree on each stage before going
  // on (select_local_device may itself be collective), so one rank's
  // failure is every rank's error, not a wait for it.
  RETURN_IF_ERROR(comm::agree(world_, backend_available(Backend::kCUDA)));
  Result<int> device = comm::select_local_device();
  RETURN_IF_ERROR(comm::agree(world_, device.ok() ? Status::OK() : device.status()));
  say("device: cuda:%d (%s)%s\n", *device, cuda::device_summary(*device).c_str(),
      world_.size() > 1 ? " on rank 0, one GPU per rank" : "");
  start_gpu_monitor(*device);
  if (c_.dp > 1) {
    comm::CommOptions o;
    o.timeout = std::chrono::milliseconds(static_cast<int64_t>(c_.timeout_s * 1000));
    ASSIGN_OR_RETURN(nccl_dp_, comm::make_nccl_communicator(*dp_, "dp-nccl", o));
  }
  return Status::OK();
}

void Trainer::start_gpu_monitor(int device) {
  Result<std::string> bus = cuda::pci_bus_id(device);
  Result<std::unique_ptr<obs::GpuMonitor>> gpu =
      bus.ok() ? obs::GpuMonitor::open(*bus) : Result<std::unique_ptr<obs::GpuMonitor>>(bus.status());
  if (!gpu.ok()) {  // not an error: training goes on without the GPU's figures
    say("gpu metrics: off (%s)\n", gpu.status().message().c_str());
    return;
  }
  gpu_ = std::move(gpu).value();
  gpu_->start(registry_);
}

Status Trainer::agree_on_outputs() {
  // A bad path is a user error: rank 0 reports it and every rank gets an
  // InvalidArgument, so the job ends cleanly (no abort, no hang in a peer
  // waiting at the next collective).
  Status mine = rank_ == 0 ? check_outputs(c_) : Status::OK();
  std::string took_over;
  if (rank_ == 0 && mine.ok()) {
    // Rank 0 publishes every checkpoint and writes the final weights: it
    // holds the folder's lock for the job (docs/formats/checkpoint.md).
    Result<ckpt::DirLock> lock = ckpt::DirLock::acquire(c_.checkpoint_dir, c_.job, host_name(), &took_over);
    if (lock.ok()) dir_lock_ = std::move(lock).value();
    else mine = lock.status().With("checkpoint.dir");
  }
  if (!mine.ok()) mine = Status::InvalidArgument(mine.message());
  RETURN_IF_ERROR(comm::agree(world_, mine));
  if (!took_over.empty())
    say("checkpoint.dir: took over the lock of %s, which ended without releasing it\n", took_over.c_str());
  return Status::OK();
}

// The whole model's shape, then this rank's shard of it, its data
// parallelism and its optimizer.
Status Trainer::setup_model() {
  std::unique_ptr<GPT> whole;
  mc_ = c_.model;
  if (!c_.init_from.empty()) {
    ASSIGN_OR_RETURN(whole, load_gpt2(c_.init_from, nullptr, c_.tp == 1 && c_.pp == 1 ? backend_ : Backend::kCPU));
    mc_ = whole->config();
    if (c_.seq > mc_.context)
      return Status::InvalidArgument(
          fmt::format("train.seq ({}) exceeds the context ({}) of {}", c_.seq, mc_.context, c_.init_from));
  }
  ASSIGN_OR_RETURN(std::vector<int> wanted_stages, parse_stage_counts(c_.stages));
  ASSIGN_OR_RETURN(stage_layers_, stage_layer_counts(mc_.layers, c_.pp, wanted_stages));
  const ModelShard shard = shard_for(mesh_->shape(), coord_, stage_layers_);
  RETURN_IF_ERROR(shard.validate(mc_));
  ASSIGN_OR_RETURN(schedule_, parse_pipeline_schedule(c_.schedule));
  RETURN_IF_ERROR(check_memory_fits(shard));
  // Out of memory on one rank is every rank's error before the first
  // collective over the model.
  RETURN_IF_ERROR(comm::agree(world_, make_model(std::move(whole), shard)));
  RETURN_IF_ERROR(ddp_->sync_parameters());
  pipe_ = std::make_unique<Pipeline>(*model_, mesh_->pp(), schedule_);
  ASSIGN_OR_RETURN(tied_, TiedEmbedding::create(*mesh_));
  reports_loss_ = shard.layer_end == mc_.layers && coord_.tp == 0;
  return Status::OK();
}

Status Trainer::check_memory_fits(const ModelShard& shard) {
  // One micro-batch in flight: a lower bound for every schedule (the real
  // count is computed, and allocated, later).
  MemoryPlan plan = plan_training_memory(mc_, shard, c_.micro_batch, c_.seq, 1, c_.dp, c_.zero,
                                         c_.checkpoint_every > 0);
  if (c_.checkpoint_every > 0 && coord_.dp != 0) plan.staging -= plan.params;  // dp rank 0 stores the parameters
  // The host's ranks need at least as many times the smallest rank's plan.
  double least = plan.total();
  RETURN_IF_ERROR(world_.all_reduce(&least, &least, 1, comm::ElemType::kF64, comm::ReduceOp::kMin));
  return check_host_memory(world_, least, plan.str(),
                           "make the model, train.micro_batch or train.seq smaller, or spread it over more hosts");
}

// This rank's model (whole's weights, or initialised), its data parallelism
// and its optimizer: what allocates, and no collective.
Status Trainer::make_model(std::unique_ptr<GPT> whole, const ModelShard& shard) {
  if (whole && c_.tp == 1 && c_.pp == 1) {
    model_ = std::move(whole);
  } else {
    ASSIGN_OR_RETURN(model_, GPT::create(mc_, backend_, shard, c_.tp > 1 ? &mesh_->tp() : nullptr));
    if (whole) {
      copy_from_whole(*whole, *model_);
      whole.reset();
    } else {
      RETURN_IF_ERROR(model_->init_weights(static_cast<uint64_t>(c_.seed)));
    }
  }
  prec_ = c_.dtype == "bf16" ? MatmulPrecision::kBF16 : MatmulPrecision::kF32;
  model_->set_precision(prec_);
  sharded_ = !model_->whole();
  comm::Communicator& dp_comm = nccl_dp_ ? *nccl_dp_ : *dp_;
  ASSIGN_OR_RETURN(ddp_, DataParallel::create(*model_, dp_comm,
                                              DataParallelOptions{static_cast<int64_t>(c_.bucket_mb * (1 << 20)),
                                                                  c_.zero}));
  ASSIGN_OR_RETURN(opt_, ShardedAdamW::create(gpt_param_space(*model_), gpt_adamw_kernel(*model_), dp_comm,
                                              ShardedAdamWOptions{c_.zero, sharded_ ? &world_ : nullptr}));
  return Status::OK();
}

Status Trainer::setup_checkpointer() {
  if (c_.checkpoint_every <= 0) {
    saves_ = std::make_unique<TrainingSaves>(world_, nullptr, c_.checkpoint_dir, 0, registry_, metrics_, out_);
    return Status::OK();
  }
  ckpt::CheckpointerOptions o;
  o.dir = c_.checkpoint_dir;
  o.fault_errno = faults_ ? faults_->ckpt_errno_for(rank_) : 0;
  o.keep = c_.checkpoint_keep;
  o.on_busy = c_.checkpoint_on_busy == "skip" ? ckpt::OnBusy::kSkip : ckpt::OnBusy::kWait;
  o.config = {{"model", model_config_json(mc_)}, {"seed", c_.seed}, {"micro_batch", c_.micro_batch},
              {"seq", c_.seq},                     {"grad_accum", c_.grad_accum}, {"dtype", c_.dtype}};
  o.layout = {{"dp", c_.dp},     {"tp", c_.tp},          {"pp", c_.pp},
              {"zero", c_.zero}, {"stages", stage_layers_}, {"schedule", c_.schedule}};
  auto checkpointer = std::make_unique<ckpt::Checkpointer>(std::move(o));
  ckpt::Checkpointer& ck = *checkpointer;
  saves_ = std::make_unique<TrainingSaves>(world_, std::move(checkpointer), c_.checkpoint_dir, c_.checkpoint_every,
                                           registry_, metrics_, out_);
  // The staging buffer (and a CUDA model's host mirror) now, so that a host
  // that cannot hold them is every rank's error before training starts.
  Result<std::vector<ckpt::SavePiece>> pieces = checkpoint_pieces(*model_, *opt_, coord_.dp, c_.zero, &mirror_);
  Status mine = pieces.status();
  if (mine.ok()) {
    size_t floats = 0;
    for (const ckpt::SavePiece& p : *pieces) floats += static_cast<size_t>(p.slice.numel());
    mine = ck.reserve_staging(floats);
  }
  return comm::agree(world_, mine);
}

Status Trainer::setup() {
  if (c_.dp * c_.tp * c_.pp != world_.size())
    return Status::InvalidArgument(fmt::format(
        "parallel.dp x tp x pp = {} x {} x {} = {} but {} rank(s) are running; start {} (`tessera launch -n {}`, "
        "`mpirun -np {}`, or `srun --ntasks={}` in the job script) or set parallel.dp",
        c_.dp, c_.tp, c_.pp, c_.dp * c_.tp * c_.pp, world_.size(), c_.dp * c_.tp * c_.pp, c_.dp * c_.tp * c_.pp,
        c_.dp * c_.tp * c_.pp, c_.dp * c_.tp * c_.pp));
  RETURN_IF_ERROR(agree_on_outputs());
  ASSIGN_OR_RETURN(mesh_, comm::Mesh::create(world_, {c_.dp, c_.tp, c_.pp}));
  dp_ = &mesh_->dp();
  coord_ = mesh_->coord();
  // The exporter starts before the model is built, so a port in use is
  // reported before anything slow, and a scrape during setup already
  // names the rank.
  registry_.set_const_labels(rank_labels(c_, rank_, coord_));
  ASSIGN_OR_RETURN(exporter_, start_metrics_exporter(c_, world_, registry_));
  ASSIGN_OR_RETURN(trace_, start_trace(c_, world_, coord_, out_, faults_ && faults_->trace_ping_every_rank));
  if (exporter_)
    say("metrics: http://%s:%d/metrics%s\n", exporter_->host().c_str(), exporter_->port(),
        world_.size() > 1 ? " (rank 0; each rank on this port + its local rank)" : "");
  RETURN_IF_ERROR(setup_device());
  RETURN_IF_ERROR(setup_model());

  if (rank_ == 0) RETURN_IF_ERROR(metrics_.open(c_.metrics));
  if (!c_.resume.empty()) {
    const std::string path = c_.resume == "latest" ? c_.checkpoint_dir : c_.resume;
    ASSIGN_OR_RETURN(ckpt::Checkpoint ck, ckpt::Checkpoint::open(path));
    ASSIGN_OR_RETURN(ResumeState rs, load_checkpoint(ck, *model_, *opt_));
    start_step_ = static_cast<int>(rs.step);
    RETURN_IF_ERROR(ddp_->check_parameters_identical());
    // A resume of a finished run (an attempt killed after publishing its
    // last checkpoint, before it exited) trains nothing: say so; run() only
    // writes the final weights, which that attempt may not have written.
    if (start_step_ >= c_.steps) {
      say("already finished: %s is at step %d of train.steps = %d; nothing to train\n", ck.dir().c_str(),
          start_step_, c_.steps);
      already_finished_ = true;
      return Status::OK();
    }
    say("resumed from %s at step %d (saved by layout %s)\n", ck.dir().c_str(), start_step_,
        ck.layout().dump().c_str());
  }
  RETURN_IF_ERROR(setup_checkpointer());

  // Every token id is checked against the vocabulary here, once, so a bad
  // one is reported with its shard and its place in it before training.
  Result<data::TokenLoader> train = data::TokenLoader::open(c_.train_data, c_.seq, c_.seed, mc_.vocab);
  RETURN_IF_ERROR(with_vocab_hint(train.status()));
  train_.emplace(std::move(train).value());
  if (!c_.val_data.empty()) {
    Result<data::TokenLoader> val = data::TokenLoader::open(c_.val_data, c_.seq, c_.seed, mc_.vocab);
    RETURN_IF_ERROR(with_vocab_hint(val.status()));
    val_tokens_ = val->all_tokens();
  }

  const int B = c_.micro_batch, T = c_.seq, GA = c_.grad_accum;
  // The global batch of a step: rows [0, B*GA*dp); dp rank r's micro-step m
  // takes rows [(r*GA + m)*B, +B), so the step's sequences do not depend on
  // the split between ranks and micro-steps. Every tp and pp rank of a data-
  // parallel replica reads the same rows.
  rows_per_step_ = int64_t{B} * GA * dp_->size();
  tokens_per_step_ = static_cast<double>(rows_per_step_) * T;
  {
    Result<std::optional<perf::Profile>> profile = perf::find_profile(c_.profile);
    RETURN_IF_ERROR(comm::agree(world_, profile.status()));
    perf::PeakReference ref;
    if (on_cuda_) {
      const std::optional<perf::DeviceInfo> here = perf::probe_gpu();  // the rank's current device
      ref = perf::gpu_peak_reference(*profile, here ? here->name : "", kCudaPeakTflops);
    } else {
      Result<comm::LocalRank> local = comm::local_rank();
      const int ranks_here = local.ok() && local->size > 0 ? local->size : 1;
      ref = perf::cpu_peak_reference(*profile, perf::detect_machine(false), c_.dtype, ranks_here);
    }
    peak_ = ref.peak_gflops;
    gemm_peak_ = ref.gemm_peak_gflops;
    peak_source_ = ref.source;
  }
  RETURN_IF_ERROR(
      comm::agree(world_, model_->try_reserve_activations(B, T, pipeline_slots(schedule_, c_.pp, coord_.pp, GA))));
  double mem[kMemParts] = {static_cast<double>(model_->params().bytes()),
                           static_cast<double>(model_->grads().bytes()), static_cast<double>(opt_->state_bytes()),
                           static_cast<double>(model_->activation_bytes()), checkpoint_staging_bytes()};
  RETURN_IF_ERROR(world_.all_reduce(mem, mem, kMemParts, comm::ElemType::kF64, comm::ReduceOp::kMax));
  std::copy(mem, mem + kMemParts, mem_);
  setup_metrics();
  say("model: %s, %.2fM parameters, %s; data: %lld train tokens in %zu shard(s)\n", mc_.str().c_str(),
      mc_.num_parameters() / 1e6, c_.dtype.c_str(), static_cast<long long>(train_->tokens()), train_->files().size());
  say("batch: %d x %d tokens x %d micro-steps x %d dp ranks = %.0f tokens/step\n", B, T, GA, dp_->size(),
      tokens_per_step_);
  say("mfu against %.0f GFLOP/s/rank (%s)%s\n", peak_, peak_source_.c_str(),
      gemm_peak_ > 0 ? fmt::format("; gemm efficiency against the profile's GEMM peak, {:.0f} GFLOP/s/rank", gemm_peak_).c_str()
                     : "");
  if (world_.size() > 1) {
    std::string stages;
    for (int n : stage_layers_) stages += fmt::format("{}{}", stages.empty() ? "" : ",", n);
    say("layout: dp=%d tp=%d pp=%d (layers per stage %s, %s), %s, %d gradient bucket(s)\n", c_.dp, c_.tp, c_.pp,
        stages.c_str(), c_.schedule.c_str(), c_.zero ? "ZeRO-1" : "all-reduce", ddp_->buckets());
  }
  link_ = obs::detect_link_speed(c_.link_gbps);
  if (world_.size() > 1) {
    if (link_.known())
      say("link: %.3g Gbit/s (%s); achieved bus bandwidth is compared with it\n", link_.bytes_per_second * 8 / 1e9,
          link_.source.c_str());
    else
      say("link: speed unknown (set log.link_gbps to compare achieved bus bandwidth with it)\n");
  }
  comm_metrics_.start(registry_, link_);
  RETURN_IF_ERROR(predict_plan());
  say("memory per rank (max): params %.1f MB, grads %.1f MB, optimizer %.1f MB, activations %.1f MB, checkpoint "
      "staging %.1f MB; total %.1f MB\n",
      mem_[0] / 1e6, mem_[1] / 1e6, mem_[2] / 1e6, mem_[3] / 1e6, mem_[4] / 1e6,
      std::accumulate(mem_, mem_ + kMemParts, 0.0) / 1e6);
  return Status::OK();
}

double Trainer::checkpoint_staging_bytes() const {
  if (!saves_ || !saves_->enabled()) return 0.0;
  const size_t mirror = (mirror_.params.allocated() ? mirror_.params.bytes() : 0) +
                        (mirror_.m.capacity() + mirror_.v.capacity()) * sizeof(float);
  return static_cast<double>(saves_->checkpointer()->staging_bytes() + mirror);
}

void Trainer::setup_metrics() {
  const char* kinds[kMemParts] = {"params", "grads", "optimizer", "activations", "checkpoint_staging"};
  for (int i = 0; i < kMemParts; i++)
    registry_.gauge("tessera_train_memory_bytes", "Memory per rank, the largest over ranks", {{"kind", kinds[i]}})
        .set(mem_[i]);
  step_metrics_.steps = &registry_.counter("tessera_train_steps_total", "Optimizer steps completed");
  step_metrics_.tokens = &registry_.counter("tessera_train_tokens_total", "Tokens trained on");
  step_metrics_.loss = &registry_.gauge("tessera_train_loss", "Training loss of the last step");
  step_metrics_.lr = &registry_.gauge("tessera_train_learning_rate", "Learning rate of the last step");
  step_metrics_.grad_norm = &registry_.gauge("tessera_train_grad_norm", "Global gradient norm before clipping");
  step_metrics_.tokens_per_s = &registry_.gauge("tessera_train_tokens_per_second", "Throughput of the last step");
  step_metrics_.mfu = &registry_.gauge("tessera_train_mfu", "Model FLOPs utilisation of the last step");
  step_metrics_.gemm_efficiency =
      gemm_peak_ > 0 ? &registry_.gauge("tessera_train_gemm_efficiency",
                                        "Achieved FLOP/s over the doctor profile's measured GEMM peak, last step")
                     : nullptr;
  step_metrics_.step_seconds = &registry_.histogram("tessera_train_step_seconds", "Wall time of an optimizer step",
                                         obs::exponential_buckets(0.001, 2, 20));
  const char* help = "Time of the last step by part (means over ranks)";
  step_metrics_.comm_s = &registry_.gauge("tessera_train_step_part_seconds", help, {{"part", "comm"}});
  step_metrics_.bubble_s = &registry_.gauge("tessera_train_step_part_seconds", help, {{"part", "bubble"}});
  step_metrics_.p2p_s = &registry_.gauge("tessera_train_step_part_seconds", help, {{"part", "p2p"}});
  step_metrics_.compute_s = &registry_.gauge("tessera_train_step_part_seconds", help, {{"part", "compute"}});
  for (int k = 0; k < 5; k++)
    step_metrics_.comm_kind_s[k] = &registry_.gauge(
        "tessera_train_comm_seconds",
        "Communication time of the last step by kind, mean over ranks (their sum is step_part_seconds{part=comm})",
        {{"op", kCommKinds[k]}});
}


// Validation batches are dealt round-robin to the dp replicas, run through
// the pipeline, and the last stage's sums all-reduced, so every rank gets
// the same mean.
Status Trainer::evaluate(int step) {
  if (val_tokens_.empty()) return Status::OK();
  obs::trace::set_step(step);
  obs::trace::Span span("evaluate", "train");
  ValLossOptions o;
  o.B = c_.micro_batch;
  o.T = c_.seq;
  o.max_batches = c_.eval_batches;
  o.part = dp_->rank();
  o.parts = dp_->size();
  o.counts = reports_loss_;
  o.source = c_.val_data;
  ASSIGN_OR_RETURN(EvalResult r, val_loss(
                                     val_tokens_, o,
                                     [&](const int* in, const int* tg, float* loss) -> Status {
                                       RETURN_IF_ERROR(with_vocab_hint(
                                           model_->check_batch(in, tg, o.B, o.T).With(c_.val_data)));
                                       return pipe_->forward_only(o.B, o.T, in, tg, loss);
                                     },
                                     &world_));
  const double loss = r.loss;
  if (!summary_.has_val) summary_.first_val_loss = loss;
  summary_.has_val = true;
  summary_.last_val_loss = loss;
  registry_.gauge("tessera_train_val_loss", "Validation loss of the last evaluation").set(loss);
  say("step %5d | val loss %.4f (%lld tokens)\n", step, loss, static_cast<long long>(r.tokens));
  metrics_.write({{"step", step}, {"val_loss", loss}});
  return Status::OK();
}

// One optimizer step (0-based `step`): the micro-steps through the
// pipeline, the gradient exchange, the update, and the figures averaged over
// the ranks.
Result<Trainer::StepStats> Trainer::train_step(int step) {
  const int B = c_.micro_batch, T = c_.seq, GA = c_.grad_accum;
  obs::trace::set_step(step + 1);  // 1-based, as the logs count
  obs::trace::Span span("step", "train");
  auto t0 = Clock::now();
  RETURN_IF_ERROR(model_->zero_grad());
  auto fill = [&](int micro, int* inputs, int* targets) -> Status {
    const int64_t row0 = (int64_t{dp_->rank()} * GA + micro) * B;
    train_->fill(step, rows_per_step_, row0, B, inputs, targets);
    return with_vocab_hint(model_->check_batch(inputs, targets, B, T).With(c_.train_data));
  };
  Status fault;  // a test's injected exit, when the plan cannot end the process
  auto before_backward = [&](int micro) {
    if (micro == 0) fault = inject_step_fault(faults_, rank_, step);
    ddp_->begin_backward(micro == GA - 1);
  };
  double loss_sum = 0.0;
  RETURN_IF_ERROR(pipe_->train_step(GA, B, T, 1.0f / GA, fill, before_backward, &loss_sum));
  RETURN_IF_ERROR(fault);
  // The tied embedding's two gradients are summed before ZeRO shards the
  // flat gradients, or after plain DP has averaged them (the sums commute).
  if (c_.zero == 1) RETURN_IF_ERROR(tied_->sum_grads(*model_));
  RETURN_IF_ERROR(ddp_->finish_gradients());
  if (c_.zero == 0) RETURN_IF_ERROR(tied_->sum_grads(*model_));
  StepStats s;
  s.step = step + 1;
  s.lr = lr_at(c_.opt, step);
  ASSIGN_OR_RETURN(s.norm, opt_->step(c_.opt, s.lr));
  // The step's loss is the mean over the replicas' last stages; the times
  // are means over all ranks.
  const Pipeline::Times pt = pipe_->take_times();
  const double tp_s = model_->take_tp_comm_seconds();
  // The last slot carries this rank's stop signal, so every rank learns of
  // any rank's at the same step (a signal reaches ranks at different times).
  double sums[8] = {reports_loss_ ? loss_sum / GA : 0.0,
                    pt.bubble,
                    pt.p2p,
                    ddp_->comm_seconds(),
                    opt_->comm_seconds(),
                    tp_s,
                    tied_->take_seconds(),
                    stop_ && stop_->signal.load() != 0 ? 1.0 : 0.0};
  auto tl = Clock::now();
  RETURN_IF_ERROR(world_.all_reduce(sums, sums, 8, comm::ElemType::kF64));
  s.stop = sums[7] > 0.0;
  s.loss = sums[0] / dp_->size();
  s.bubble_s = sums[1] / world_.size();
  s.p2p_s = sums[2] / world_.size();
  for (int k = 0; k < 4; k++) s.comm_kind_s[k] = sums[3 + k] / world_.size();
  s.comm_kind_s[4] = std::chrono::duration<double>(Clock::now() - tl).count();
  for (double x : s.comm_kind_s) s.comm_s += x;
  if (!std::isfinite(s.loss))
    return Status::Internal(fmt::format("loss became {} at step {}; lower train.lr or check the data", s.loss, step));
  s.step_s = std::chrono::duration<double>(Clock::now() - t0).count();
  s.tokens_per_s = tokens_per_step_ / s.step_s;
  const double flops_per_s = flops_per_token(mc_, T) * tokens_per_step_ / s.step_s / world_.size();
  s.mfu = flops_per_s / (peak_ * 1e9);
  if (gemm_peak_ > 0) s.gemm_efficiency = flops_per_s / (gemm_peak_ * 1e9);
  summary_.last_train_loss = s.loss;
  train_s_ += s.step_s;
  saves_->add_train_seconds(s.step_s);
  step_seconds_.push_back(s.step_s);
  comm_shares_.push_back(s.step_s > 0 ? s.comm_s / s.step_s : 0.0);
  return s;
}

// The console line (rank 0), the JSONL record and the registry.
void Trainer::log(const StepStats& s) {
  const double compute_s = std::max(0.0, s.step_s - s.comm_s - s.bubble_s - s.p2p_s);
  step_metrics_.steps->add(1);
  step_metrics_.tokens->add(tokens_per_step_);
  step_metrics_.loss->set(s.loss);
  step_metrics_.lr->set(s.lr);
  step_metrics_.grad_norm->set(s.norm);
  step_metrics_.tokens_per_s->set(s.tokens_per_s);
  step_metrics_.mfu->set(s.mfu);
  if (step_metrics_.gemm_efficiency) step_metrics_.gemm_efficiency->set(s.gemm_efficiency);
  step_metrics_.step_seconds->observe(s.step_s);
  step_metrics_.comm_s->set(s.comm_s);
  step_metrics_.bubble_s->set(s.bubble_s);
  step_metrics_.p2p_s->set(s.p2p_s);
  step_metrics_.compute_s->set(compute_s);
  for (int k = 0; k < 5; k++) step_metrics_.comm_kind_s[k]->set(s.comm_kind_s[k]);

  // The time left at the mean step time of this run so far.
  const int done = s.step - start_step_;
  const std::string eta = done > 0 ? format_duration(train_s_ / done * (c_.steps - s.step)) : "?";
  const std::string mfu = gemm_peak_ > 0 ? fmt::format("{:.2f} (gemm {:.2f})", s.mfu, s.gemm_efficiency)
                                         : fmt::format("{:.2f}", s.mfu);
  if (c_.pp > 1)
    say("step %5d/%d | loss %.4f | lr %.2e | norm %.3f | %.0f ms (comm %.0f, bubble %.0f, p2p %.0f) | %.0f tok/s | "
        "mfu %s | eta %s\n",
        s.step, c_.steps, s.loss, s.lr, s.norm, s.step_s * 1e3, s.comm_s * 1e3, s.bubble_s * 1e3, s.p2p_s * 1e3,
        s.tokens_per_s, mfu.c_str(), eta.c_str());
  else
    say("step %5d/%d | loss %.4f | lr %.2e | norm %.3f | %.0f ms (comm %.0f) | %.0f tok/s | mfu %s | eta %s\n",
        s.step, c_.steps, s.loss, s.lr, s.norm, s.step_s * 1e3, s.comm_s * 1e3, s.tokens_per_s, mfu.c_str(),
        eta.c_str());
  if (out_) std::fflush(out_);
  nlohmann::json record = {{"step", s.step},
                  {"loss", s.loss},
                  {"lr", s.lr},
                  {"grad_norm", s.norm},
                  {"step_ms", s.step_s * 1e3},
                  {"comm_ms", s.comm_s * 1e3},
                  {"bubble_ms", s.bubble_s * 1e3},
                  {"p2p_ms", s.p2p_s * 1e3},
                  {"compute_ms", compute_s * 1e3},
                  {"tokens_per_s", s.tokens_per_s},
                  {"mfu", s.mfu},
                  {"mem_params_mb", mem_[0] / 1e6},
                  {"mem_grads_mb", mem_[1] / 1e6},
                  {"mem_optimizer_mb", mem_[2] / 1e6},
                  {"mem_activations_mb", mem_[3] / 1e6},
                  {"mem_checkpoint_staging_mb", mem_[4] / 1e6}};
  for (int k = 0; k < 5; k++) record[fmt::format("comm_{}_ms", kCommKinds[k])] = s.comm_kind_s[k] * 1e3;
  comm_metrics_.log(record);
  if (gpu_ && gpu_->last_utilization() >= 0) record["gpu_util"] = gpu_->last_utilization();
  if (gemm_peak_ > 0) record["gemm_efficiency"] = s.gemm_efficiency;
  metrics_.write(record);
}

// Reports a finished save (rank 0): published, with its costs, or failed.

// Starts the save of step `step` (false: the previous one is still being
// written and checkpoint.on_busy is "skip"); its staging copy is a stall.
SnapshotFn Trainer::snapshot() {
  return [this](int64_t step) -> Result<SaveSnapshot> {
    // On CUDA, checkpoint_pieces copies the tensors to the host (part of the
    // stall) and can fail; the ranks agree then, so none waits in the save's
    // collectives for a failed one.
    Result<std::vector<ckpt::SavePiece>> made = checkpoint_pieces(*model_, *opt_, coord_.dp, c_.zero, &mirror_);
    if (on_cuda_) RETURN_IF_ERROR(comm::agree(world_, made.status()));
    RETURN_IF_ERROR(made.status());
    return SaveSnapshot{std::move(made).value(), nlohmann::json{{"step", step}, {"adam_t", opt_->steps()}}.dump()};
  };
}

Status Trainer::save(int step, bool stop, bool last) { return saves_->after_step(step, stop, last, snapshot()); }

// The planner's step time, memory and communication share for this job on
// this machine's profile (every rank computes it; rank 0 says it).
Status Trainer::predict_plan() {
  PlanCheckJob j;
  ASSIGN_OR_RETURN(j.machine, describe_run_machine(world_, c_.profile,
                                                   link_.known() ? link_.bytes_per_second * 8 / 1e9 : 0.0));
  j.model = mc_;
  j.seq = c_.seq, j.micro_batch = c_.micro_batch, j.grad_accum = c_.grad_accum;
  j.dp = c_.dp, j.tp = c_.tp, j.pp = c_.pp, j.zero = c_.zero;
  j.dtype = c_.dtype;
  j.checkpoint_every = c_.checkpoint_every;
  j.bucket_mb = c_.bucket_mb;
  Result<PlanPrediction> p = predict_for_run(j);
  if (!p.ok()) {
    say("plan: no prediction to check: %s\n", p.status().message().c_str());
    return Status::OK();
  }
  plan_ = *p;
  say("plan: predicted step %.1f ms (communication %.0f%%, bubble %.0f%%), memory %.1f MB per rank, on %s; held "
      "up by %s\n",
      p->step_s * 1e3, 100 * p->comm_share, 100 * p->bubble_share, p->mem_bytes / 1e6, p->cluster.c_str(),
      p->bottleneck.c_str());
  metrics_.write({{"plan_step_ms", p->step_s * 1e3},
                  {"plan_memory_mb", p->mem_bytes / 1e6},
                  {"plan_comm_share", p->comm_share},
                  {"plan_bubble_share", p->bubble_share},
                  {"plan_cluster", p->cluster}});
  return Status::OK();
}

// The measured figures beside the prediction: the median step after the
// first (which pays for first touches), the memory the ranks reported at
// start-up (the largest of each part), the mean communication share.
void Trainer::report_plan_check() {
  if (!plan_) return;
  PlanCheckMeasured m;
  m.step_seconds = step_seconds_;
  for (double x : mem_) m.mem_bytes += x;
  m.mem_bytes -= mem_[4];  // the planner prices the checkpoint's time, not its staging buffer
  for (size_t i = 1; i < comm_shares_.size(); i++) m.comm_share += comm_shares_[i];
  if (comm_shares_.size() > 1) m.comm_share /= static_cast<double>(comm_shares_.size() - 1);
  tessera::report_plan_check(*plan_, m, out_, &metrics_);
}

// A stop signal after step `step` (1-based), agreed by every rank: the
// step's checkpoint, published and verified before the call returns (a
// save in flight is finished first). No evaluation and no final weights:
// the time before SIGKILL goes to the checkpoint.
Status Trainer::stop_on_signal(int step) {
  report_plan_check();
  const int sig = stop_->signal.load();
  const char* name = sig != 0 ? stop_signal_name(sig) : "a stop signal on another rank";
  if (!saves_->enabled())
    return Status::Unavailable(fmt::format("stopped by {} after step {} of {}, and checkpoint.every = 0, so nothing "
                                           "was saved; set checkpoint.every to resume such a job",
                                           name, step, c_.steps));
  say("%s received: saving step %d before stopping\n", name, step);
  auto t0 = Clock::now();
  ASSIGN_OR_RETURN(std::string dir, saves_->save_for_stop(step, name, snapshot()));
  const StopReport report = describe_stop(name, step, c_.steps, dir, std::chrono::duration<double>(Clock::now() - t0).count(), *stop_);
  say("%s", report.line.c_str());
  metrics_.write(report.record);
  summary_.stopped_by = sig != 0 ? sig : -1;
  summary_.stopped_at = step;
  return Status::OK();
}

// The last save, the replicas' agreement, and the final weights.
Status Trainer::finish() {
  if (saves_->enabled()) {
    RETURN_IF_ERROR(saves_->drain());
    say("%s", saves_->stall_line().c_str());
    // No save is pending: the staging buffer (and a CUDA model's mirror)
    // goes before the final weights' copy is made, so the peak stays the
    // figure the memory line reports.
    saves_->close();
    mirror_ = CheckpointMirror{};
  }
  // Agreed by the world, not only the data-parallel group: a pipeline
  // stage whose replicas differ must not leave the other stages waiting in
  // the gather below until their deadline.
  RETURN_IF_ERROR(comm::agree(world_, ddp_->check_parameters_identical()));
  summary_.weights_path = final_weights_path();
  return save_final_weights();
}

// The whole model in the Hugging Face layout, written by rank 0 (every rank
// takes part in gathering a sharded model).
Status Trainer::save_final_weights() {
  std::unique_ptr<GPT> full;
  if (sharded_) {
    // Rank 0 gathers the whole model's weights (no gradients).
    Status made;
    if (rank_ == 0) {
      Result<std::unique_ptr<GPT>> r = GPT::create(mc_, Backend::kCPU, ModelShard{}, nullptr, ModelUse::kInference);
      made = r.status();
      if (r.ok()) full = std::move(r).value();
    }
    RETURN_IF_ERROR(comm::agree(world_, made));
    // Agreed, so that no rank finishes (and closes its MPI connections)
    // before rank 0 holds every piece: a sender whose send completed could
    // exit with its last bytes still in flight (seen under Slurm, a rank 0
    // waiting out its deadline for a stage that had already exited 0).
    const Status gathered = gather_whole(*model_, *mesh_, stage_layers_, full.get());
    RETURN_IF_ERROR(comm::agree(world_, gathered));
  }
  if (rank_ == 0) {
    std::error_code ec;
    std::filesystem::create_directories(c_.checkpoint_dir, ec);  // checked at start-up; gone since?
    if (ec)
      return Status::IOError(fmt::format("checkpoint.dir: {}: cannot create the folder: {}", c_.checkpoint_dir,
                                         ec.message()));
    RETURN_IF_ERROR(save_hf(sharded_ ? *full : *model_, final_weights_path()));
    say("saved %s (+ config.json)\n", final_weights_path().c_str());
  }
  return Status::OK();
}

Result<StepResult> Trainer::step(int step) {
  ASSIGN_OR_RETURN(last_step_, train_step(step));
  return StepResult{last_step_.stop};
}

Result<TrainSummary> Trainer::run() {
  RETURN_IF_ERROR(setup());
  if (already_finished_) {
    RETURN_IF_ERROR(save_final_weights());
    return TrainSummary{.weights_path = final_weights_path()};
  }
  RETURN_IF_ERROR(evaluate(0));
  pipe_->take_times();
  model_->take_tp_comm_seconds();
  comm_metrics_.skip();  // the first step's figures leave out the evaluation's
  LoopOptions lo;
  lo.start = start_step_;
  lo.steps = c_.steps;
  lo.stop_at = c_.stop_at;
  lo.eval_every = c_.eval_every;
  ASSIGN_OR_RETURN(LoopEnd end, run_loop(*this, lo, out_));
  if (end == LoopEnd::kSignal) return summary_;
  report_plan_check();
  RETURN_IF_ERROR(finish());
  return summary_;
}

}  // namespace

Result<TrainSummary> run_training(const TrainConfig& c, comm::Communicator& world, std::FILE* out,
                                  obs::Registry* metrics, const StopFlag* stop, const FaultPlan* faults) {
  Trainer trainer(c, world, out, metrics, stop, faults);
  return trainer.run();
}

}  // namespace tessera
