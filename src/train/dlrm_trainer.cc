#include "train/dlrm_trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <optional>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "ckpt/checkpoint.h"
#include "ckpt/checkpointer.h"
#include "ckpt/dir_lock.h"
#include "comm/agree.h"
#include "core/host.h"
#include "data/criteo.h"
#include "io/file.h"
#include "obs/http/metrics_exporter.h"
#include "obs/link.h"
#include "obs/process.h"
#include "train/dlrm_checkpointing.h"
#include "parallel/dlrm_parallel.h"
#include "core/fault_plan.h"
#include "train/loop.h"
#include "train/memory_check.h"
#include "train/monitoring.h"
#include "train/plan_check.h"
#include "train/saves.h"
#include "train/stop.h"
#include "train/tracing.h"
#include "comm/mpi/local_device.h"
#include "obs/trace.h"
#include "perf/machine.h"
#include "perf/profile.h"
#include "plan/dlrm.h"

namespace tessera {

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// B rows of a click shard from row `begin` on, wrapping to row 0 at the end
// (so a step's batch is always full and is a function of the step alone), as
// a DlrmBatch (one id per table per sample). Owns the copies it points to.
class ClickBatch {
 public:
  const DlrmBatch& fill(const data::ClickShard& s, int64_t begin, int B, bool wrap) {
    const int T = s.num_cat, Nd = s.num_dense;
    const int64_t N = s.rows();
    if (!wrap) B = static_cast<int>(std::min<int64_t>(B, N - begin));
    dense_.resize(static_cast<size_t>(B) * Nd);
    labels_.resize(B);
    ids_.resize(T);
    offsets_.resize(B + 1);
    for (int b = 0; b <= B; b++) offsets_[b] = b;
    for (int t = 0; t < T; t++) ids_[t].resize(B);
    for (int b = 0; b < B; b++) {
      const int64_t r = (begin + b) % N;
      labels_[b] = s.labels[r];
      std::memcpy(&dense_[static_cast<size_t>(b) * Nd], &s.dense[r * Nd], sizeof(float) * Nd);
      for (int t = 0; t < T; t++) ids_[t][b] = s.cats[r * T + t];
    }
    batch_.B = B;
    batch_.dense = dense_.data();
    batch_.labels = labels_.data();
    batch_.ids.resize(T);
    batch_.offsets.assign(T, offsets_.data());
    for (int t = 0; t < T; t++) batch_.ids[t] = ids_[t].data();
    return batch_;
  }

 private:
  std::vector<float> dense_, labels_;
  std::vector<std::vector<int>> ids_;
  std::vector<int> offsets_;
  DlrmBatch batch_;
};

// The DLRM's part of the training loop (train/loop.h): its setup, step, log
// line, evaluation, saves and stop; run() sets up and runs the loop.
class DlrmTrainer final : public TrainTask {
 public:
  DlrmTrainer(const TrainConfig& c, comm::Communicator& world, std::FILE* out, obs::Registry* registry,
              const StopFlag* stop, const FaultPlan* faults)
      : c_(c), world_(world), out_(world.rank() == 0 ? out : nullptr), rank_(world.rank()), stop_(stop),
        faults_(faults),
        registry_(registry ? *registry : own_registry_) {}

  Result<DlrmTrainSummary> run();

  // TrainTask (train/loop.h).
  Result<StepResult> step(int step) override;
  Status log(int done, bool flush) override;
  Status evaluate(int step) override;
  // A save every checkpoint.every steps, and at the end (a stop_at's too).
  Status save(int done, bool stop_at, bool last) override { return save_when(done, last, last); }
  Status stop_on_signal(int step) override;

 private:
  // Every rank learns whether all succeeded: a failure on some ranks only
  // (one rank's memory, one rank's piece of a checkpoint) would leave the
  // others in the next collective until its deadline. A failing rank other
  // than 0 prints its own line (only rank 0 reports the returned error).
  Status setup();
  Status setup_outputs();
  Result<DlrmConfig> model_config() const;
  Status save_when(int step, bool force, bool last);
  SnapshotFn snapshot();
  Result<bool> stop_agreed();
  Status log(int step, double loss_sum, int steps, double secs);
  Status predict_plan(const DlrmConfig& mc);
  Status check_memory_fits(const DlrmConfig& mc);
  Status setup_peak();
  Status report_plan_check();
  template <typename... Args>
  void say(const char* fmt, Args... args) {
    if (out_) {
      std::fprintf(out_, fmt, args...);
      std::fflush(out_);
    }
  }

  const TrainConfig& c_;
  comm::Communicator& world_;
  std::FILE* out_;
  const int rank_;
  const StopFlag* stop_;  // null: signals do not stop this run
  const FaultPlan* faults_;  // null: none injected
  obs::Registry own_registry_;
  obs::Registry& registry_;
  std::unique_ptr<obs::MetricsExporter> exporter_;
  // The trace (log.trace, --trace); writes its file when it goes.
  std::unique_ptr<TraceSession> trace_;
  ckpt::DirLock dir_lock_;
  MetricsLog metrics_;
  std::optional<data::ClickShard> train_, val_;
  std::unique_ptr<DlrmParallel> engine_;
  // The saves (train/saves.h): every checkpoint.every steps, a stop's, the
  // last; their reports and the training time they stalled.
  std::unique_ptr<TrainingSaves> saves_;
  ClickBatch batch_;
  int64_t start_step_ = 0;
  bool finished_ = false;  // resumed at or past train.steps
  int64_t last_saved_ = -1;  // the step resumed from (saved already)
  DlrmParallel::Stats stats_prev_;  // at the last log()
  double train_s_ = 0.0;
  // The steps since the last log line.
  struct Pending {
    double loss_sum = 0.0, secs = 0.0;
    int steps = 0;
  };
  Pending pending_;
  DlrmTrainSummary summary_;
  // The planner's prediction (train/plan_check.h) and what it is checked
  // against: each step's time, its all-to-all share, and the resident
  // memory before the model was built.
  std::optional<PlanPrediction> plan_;
  std::vector<double> step_seconds_;
  double train_alltoall_s_ = 0;  // of the training steps (evaluation's predict also sends)
  double resident_before_model_ = 0;
  // MFU, as a GPT run reports it: the model's FLOPs per sample (the
  // planner's count, plan/dlrm.h) over the per-rank peak of the profile or
  // the machine's theoretical one (perf/profile.h), never measured here.
  double flops_per_sample_ = 0, peak_ = 0;
  std::string peak_source_;
  obs::LinkSpeed link_;
  CommMetrics comm_metrics_;  // the network figures of each logged step
};

// The planner's description of the model (its FLOPs and memory terms).
plan::DlrmSpec dlrm_spec(const DlrmConfig& mc, const TrainConfig& c) {
  plan::DlrmSpec m;
  m.name = "this job's model";
  m.num_dense = mc.num_dense;
  m.dim = mc.dim;
  m.bottom = mc.bottom;
  m.top = mc.top;
  m.table_rows.assign(mc.table_rows.begin(), mc.table_rows.end());
  m.global_batch = c.dlrm.batch;
  m.table_optimizer = c.dlrm.table_optimizer;
  return m;
}

Status DlrmTrainer::setup_outputs() {
  Status mine;
  if (rank_ == 0) {
    mine = io::check_writable_folder(c_.checkpoint_dir).With("checkpoint.dir");
    if (mine.ok()) {
      std::string took_over;
      Result<ckpt::DirLock> lock = ckpt::DirLock::acquire(c_.checkpoint_dir, c_.job, host_name(), &took_over);
      if (lock.ok()) dir_lock_ = std::move(lock).value();
      else mine = lock.status().With("checkpoint.dir");
      if (mine.ok() && !took_over.empty())
        say("checkpoint.dir: took over the lock of %s, which ended without releasing it\n", took_over.c_str());
    }
    if (mine.ok()) mine = metrics_.open(c_.metrics).With("log.metrics");
    if (!mine.ok()) mine = Status::InvalidArgument(mine.message());
  }
  return comm::agree(world_, mine);
}

// The model: num_dense and the tables from data.train, the rest from the keys.
Result<DlrmConfig> DlrmTrainer::model_config() const {
  const DlrmSettings& d = c_.dlrm;
  DlrmConfig m;
  m.num_dense = train_->num_dense;
  m.dim = d.embedding_dim;
  m.bottom = d.bottom;
  m.top = d.top;
  m.pooling = d.pooling == "mean" ? Pooling::kMean : Pooling::kSum;
  const size_t T = train_->hash_sizes.size();
  if (d.table_rows.empty()) {
    for (int64_t h : train_->hash_sizes) m.table_rows.push_back(static_cast<int>(h));
  } else if (d.table_rows.size() == 1) {
    m.table_rows.assign(T, d.table_rows[0]);
  } else if (d.table_rows.size() == T) {
    m.table_rows = d.table_rows;
  } else {
    return Status::InvalidArgument(fmt::format("model.table_rows has {} entries but {} has {} tables (give one value "
                                               "for all, one per table, or none for the hash sizes)",
                                               d.table_rows.size(), c_.train_data, T));
  }
  for (size_t t = 0; t < T; t++)
    if (m.table_rows[t] < train_->hash_sizes[t])
      return Status::InvalidArgument(fmt::format("model.table_rows: table {} has {} rows but {} hashes it into {}",
                                                 t, m.table_rows[t], c_.train_data, train_->hash_sizes[t]));
  RETURN_IF_ERROR(m.validate());
  return m;
}

Status DlrmTrainer::setup() {
  RETURN_IF_ERROR(setup_outputs());
  registry_.set_const_labels(rank_labels(c_, rank_, comm::MeshCoord{0, 0, 0}));
  ASSIGN_OR_RETURN(exporter_, start_metrics_exporter(c_, world_, registry_));
  ASSIGN_OR_RETURN(trace_, start_trace(c_, world_, comm::MeshCoord{rank_, 0, 0}, out_,
                                       faults_ && faults_->trace_ping_every_rank));
  if (exporter_) say("metrics: http://%s:%d/metrics\n", exporter_->host().c_str(), exporter_->port());

  ASSIGN_OR_RETURN(data::ClickShard train, data::read_click_shard(c_.train_data));
  if (train.rows() == 0) return Status::InvalidArgument(c_.train_data + ": no rows");
  train_.emplace(std::move(train));
  if (!c_.val_data.empty()) {
    ASSIGN_OR_RETURN(data::ClickShard val, data::read_click_shard(c_.val_data));
    if (val.num_dense != train_->num_dense || val.hash_sizes != train_->hash_sizes)
      return Status::InvalidArgument(fmt::format("{} and {} have different layouts (dense features or tables)",
                                                 c_.train_data, c_.val_data));
    if (c_.dlrm.val_rows > 0 && val.rows() > c_.dlrm.val_rows) {
      const int64_t n = c_.dlrm.val_rows;
      val.labels.resize(n);
      val.dense.resize(n * val.num_dense);
      val.cats.resize(n * val.num_cat);
    }
    if (val.rows() > 0) val_.emplace(std::move(val));
  }
  ASSIGN_OR_RETURN(DlrmConfig mc, model_config());
  DlrmParallelOptions o;
  o.lr_dense = c_.opt.lr;
  o.beta1 = c_.opt.beta1;
  o.beta2 = c_.opt.beta2;
  o.eps = c_.opt.eps;
  o.weight_decay = c_.opt.weight_decay;
  o.table_optimizer = c_.dlrm.table_optimizer;
  o.lr_table = c_.dlrm.table_lr;
  o.adagrad_eps = c_.dlrm.adagrad_eps;
  o.placement = c_.dlrm.placement;
  RETURN_IF_ERROR(check_memory_fits(mc));
  const auto t_init = Clock::now();
  if (Result<obs::ProcessStats> ps = obs::read_process_stats(); ps.ok()) resident_before_model_ = ps->resident_bytes;
  {
    Result<std::unique_ptr<DlrmParallel>> made = DlrmParallel::create(mc, o, &world_, static_cast<uint64_t>(c_.seed));
    RETURN_IF_ERROR(comm::agree(world_, made.ok() ? Status::OK() : made.status()));
    engine_ = std::move(made).value();
  }
  int64_t table_params = 0;
  for (int e : mc.table_rows) table_params += int64_t{e} * mc.dim;
  say("model: dlrm, %d dense features, %zu tables (%lld rows of dim %d), bottom %s, top %s; %.2fM parameters "
      "(%.2fM in the MLPs); initialised in %.1f s\n",
      mc.num_dense, mc.table_rows.size(), static_cast<long long>(table_params / mc.dim), mc.dim,
      nlohmann::json(mc.bottom).dump().c_str(), nlohmann::json(mc.top).dump().c_str(),
      static_cast<double>(engine_->num_params()) / 1e6,
      static_cast<double>(engine_->num_params() - table_params) / 1e6, seconds_since(t_init));
  say("data: %lld train rows (%s), %lld held-out rows; batch %d samples/step, %.2f epochs in %d steps\n",
      static_cast<long long>(train_->rows()), c_.train_data.c_str(),
      static_cast<long long>(val_ ? val_->rows() : 0), c_.dlrm.batch,
      static_cast<double>(c_.steps) * c_.dlrm.batch / static_cast<double>(train_->rows()), c_.steps);
  RETURN_IF_ERROR(setup_peak());
  flops_per_sample_ = dlrm_spec(mc, c_).flops_per_sample();
  say("mfu against %.0f GFLOP/s/rank (%s)\n", peak_, peak_source_.c_str());
  link_ = obs::detect_link_speed(c_.link_gbps);
  comm_metrics_.start(registry_, link_);
  RETURN_IF_ERROR(predict_plan(mc));

  if (!c_.resume.empty()) {
    const std::string path = c_.resume == "latest" ? c_.checkpoint_dir : c_.resume;
    Result<ckpt::Checkpoint> opened = ckpt::Checkpoint::open(path);
    RETURN_IF_ERROR(comm::agree(world_, opened.status()));
    const ckpt::Checkpoint& ck = *opened;
    const std::string saved_opt = ck.config().value("table_optimizer", "");
    if (saved_opt != c_.dlrm.table_optimizer)  // the same on every rank: no agreement needed
      return Status::InvalidArgument(fmt::format("{} was trained with train.table_optimizer = \"{}\" but the config "
                                                 "asks for \"{}\"",
                                                 ck.dir(), saved_opt, c_.dlrm.table_optimizer));
    Result<DlrmResumeState> loaded = load_dlrm_checkpoint(ck, *engine_);
    RETURN_IF_ERROR(comm::agree(world_, loaded.status()));
    const DlrmResumeState rs = *loaded;
    const int64_t saved_rows = ck.config().value("train_rows", int64_t{-1});
    const int saved_batch = ck.config().value("batch", -1);
    if (saved_rows != train_->rows() || saved_batch != c_.dlrm.batch)
      return Status::InvalidArgument(fmt::format(
          "{} was trained on {} rows in batches of {}, but data.train has {} rows and train.batch is {}: the data "
          "position would not continue",
          ck.dir(), saved_rows, saved_batch, train_->rows(), c_.dlrm.batch));
    start_step_ = rs.step;
    last_saved_ = rs.step;
    summary_.steps = rs.step;
    if (start_step_ >= c_.steps) {
      say("already finished: %s is at step %lld of train.steps = %d; nothing to train\n", ck.dir().c_str(),
          static_cast<long long>(start_step_), c_.steps);
      summary_.checkpoint = ck.dir();
      finished_ = true;
      return Status::OK();
    }
    say("resumed from %s at step %lld (epoch %lld, row %lld; saved by %d rank(s))\n", ck.dir().c_str(),
        static_cast<long long>(start_step_), static_cast<long long>(rs.epoch), static_cast<long long>(rs.data_row),
        ck.world_size());
  }

  ckpt::CheckpointerOptions co;
  co.dir = c_.checkpoint_dir;
  co.fault_errno = faults_ ? faults_->ckpt_errno_for(rank_) : 0;
  co.keep = c_.checkpoint_keep;
  co.on_busy = c_.checkpoint_on_busy == "skip" ? ckpt::OnBusy::kSkip : ckpt::OnBusy::kWait;
  co.config = {{"kind", "dlrm"},         {"model", dlrm_config_json(mc)}, {"seed", c_.seed},
               {"batch", c_.dlrm.batch}, {"train_rows", train_->rows()},  {"table_optimizer", o.table_optimizer}};
  co.layout = {{"ranks", world_.size()}, {"placement", o.placement}};
  saves_ = std::make_unique<TrainingSaves>(world_, std::make_unique<ckpt::Checkpointer>(std::move(co)),
                                           c_.checkpoint_dir, c_.checkpoint_every, registry_, metrics_, out_);
  if (last_saved_ >= 0) saves_->resumed_at(last_saved_);
  return Status::OK();
}

// Exact AUC and log loss over the held-out rows (every rank predicts the
// whole set; rank 0 reports).
Status DlrmTrainer::evaluate(int step) {
  if (!val_) return Status::OK();
  const auto t0 = Clock::now();
  const DlrmParallel::Stats before = engine_->stats();
  const int EB = std::max(c_.dlrm.batch, 4096);
  std::vector<float> scores, logits;
  scores.reserve(static_cast<size_t>(val_->rows()));
  for (int64_t begin = 0; begin < val_->rows(); begin += EB) {
    const DlrmBatch& b = batch_.fill(*val_, begin, EB, false);
    RETURN_IF_ERROR(engine_->predict(b, &logits));
    scores.insert(scores.end(), logits.begin(), logits.end());
  }
  double ll = 0.0;  // BCE with logits: max(x,0) - xy + log(1 + e^-|x|)
  for (size_t i = 0; i < scores.size(); i++) {
    const double x = scores[i], y = val_->labels[i];
    ll += std::max(x, 0.0) - x * y + std::log1p(std::exp(-std::abs(x)));
  }
  ll /= static_cast<double>(scores.size());
  // The training figures (log()) leave evaluation's lookups and gathers out.
  const DlrmParallel::Stats& after = engine_->stats();
  stats_prev_.lookups += after.lookups - before.lookups;
  stats_prev_.alltoall_s += after.alltoall_s - before.alltoall_s;
  stats_prev_.lookup_s += after.lookup_s - before.lookup_s;
  stats_prev_.mlp_s += after.mlp_s - before.mlp_s;
  const double auc = data::exact_auc(scores, val_->labels);
  if (!summary_.has_val) summary_.first_auc = auc;
  summary_.has_val = true;
  summary_.last_auc = auc;
  summary_.last_logloss = ll;
  registry_.gauge("tessera_train_val_auc", "Exact ROC AUC on the held-out rows, last evaluation").set(auc);
  registry_.gauge("tessera_train_val_logloss", "Log loss on the held-out rows, last evaluation").set(ll);
  say("step %5d | val auc %.4f | val log loss %.4f (%lld rows, %.1f s)\n", step, auc, ll,
      static_cast<long long>(val_->rows()), seconds_since(t0));
  metrics_.write({{"step", step}, {"val_auc", auc}, {"val_logloss", ll}, {"val_rows", val_->rows()}});
  return Status::OK();
}

Status DlrmTrainer::log(int step, double loss_sum, int steps, double secs) {
  const DlrmParallel::Stats& s = engine_->stats();
  const double samples = static_cast<double>(steps) * c_.dlrm.batch;
  // Every rank looks up its own shards' rows: the job's lookups are the sum.
  int64_t lookups_all = s.lookups - stats_prev_.lookups;
  if (world_.size() > 1) RETURN_IF_ERROR(world_.all_reduce(&lookups_all, &lookups_all, 1, comm::ElemType::kI64));
  const double lookups = static_cast<double>(lookups_all);
  const double a2a = s.alltoall_s - stats_prev_.alltoall_s, lookup = s.lookup_s - stats_prev_.lookup_s,
               mlp = s.mlp_s - stats_prev_.mlp_s;
  stats_prev_ = s;
  const double loss = loss_sum / steps, sps = samples / std::max(secs, 1e-9), lps = lookups / std::max(secs, 1e-9);
  registry_.counter("tessera_train_steps_total", "Optimizer steps completed").add(steps);
  registry_.counter("tessera_train_samples_total", "Samples trained on").add(samples);
  registry_.counter("tessera_train_lookups_total", "Embedding ids looked up in training").add(lookups);
  registry_.gauge("tessera_train_loss", "Training loss, mean over the last logged steps").set(loss);
  registry_.gauge("tessera_train_samples_per_second", "Training throughput over the last logged steps").set(sps);
  registry_.gauge("tessera_train_lookups_per_second", "Embedding lookups per second over the last logged steps").set(lps);
  const char* help = "Time per step by part, mean over the last logged steps";
  registry_.gauge("tessera_train_dlrm_part_seconds", help, {{"part", "alltoall"}}).set(a2a / steps);
  registry_.gauge("tessera_train_dlrm_part_seconds", help, {{"part", "lookup"}}).set(lookup / steps);
  registry_.gauge("tessera_train_dlrm_part_seconds", help, {{"part", "mlp"}}).set(mlp / steps);
  const double left = train_s_ / std::max<int64_t>(1, step - start_step_) * (c_.steps - step);
  // Every rank does 1/size of the job's FLOPs (data-parallel MLPs, sharded tables).
  const double mfu = peak_ > 0 ? sps * flops_per_sample_ / world_.size() / (peak_ * 1e9) : 0.0;
  registry_.gauge("tessera_train_mfu", "Model FLOPs utilisation of the last logged steps").set(mfu);
  say("step %5d/%d | loss %.4f | %.2f ms/step (all-to-all %.2f) | %.0f samples/s | %.3g lookups/s | mfu %.3f | "
      "eta %.0fs\n",
      step, c_.steps, loss, secs / steps * 1e3, a2a / steps * 1e3, sps, lps, mfu, left);
  nlohmann::json record = {{"step", step},
                           {"loss", loss},
                           {"steps", steps},
                           {"step_ms", secs / steps * 1e3},
                           {"samples_per_s", sps},
                           {"lookups_per_s", lps},
                           {"mfu", mfu},
                           {"alltoall_ms", a2a / steps * 1e3},
                           {"lookup_ms", lookup / steps * 1e3},
                           {"mlp_ms", mlp / steps * 1e3}};
  comm_metrics_.log(record);
  metrics_.write(record);
  summary_.last_train_loss = loss;
  return Status::OK();
}


// After step `step` (1-based): a save when one is due (every checkpoint.every
// steps, and `force`: a stop or the end), then the poll of the one in flight
// (waiting for it when `last`). The pieces point into the engine, and the
// checkpointer copies them into its staging buffer inside save().
Status DlrmTrainer::save_when(int step, bool force, bool last) {
  RETURN_IF_ERROR(saves_->after_step(step, force, last, snapshot()));
  if (!saves_->last_published().empty()) summary_.checkpoint = saves_->last_published();
  return Status::OK();
}

// The pieces point into the engine; the checkpointer copies them into its
// staging buffer inside save().
SnapshotFn DlrmTrainer::snapshot() {
  return [this](int64_t step) -> Result<SaveSnapshot> {
    const int64_t rows_done = step * c_.dlrm.batch;
    return SaveSnapshot{dlrm_checkpoint_pieces(*engine_, rank_),
                        nlohmann::json{{"step", step},
                                       {"adam_t", engine_->adam_step()},
                                       {"data_row", rows_done % train_->rows()},
                                       {"epoch", rows_done / train_->rows()}}
                            .dump()};
  };
}

// Whether any rank received a stop signal (train/stop.h): one value
// all-reduced per step, only when the run has a stop flag.
Result<bool> DlrmTrainer::stop_agreed() {
  if (!stop_) return false;
  double any = stop_->signal.load() != 0 ? 1.0 : 0.0;
  RETURN_IF_ERROR(world_.all_reduce(&any, &any, 1, comm::ElemType::kF64));
  return any > 0.0;
}

// After step `step`, on every rank: that step's checkpoint (after the one
// in flight), published, then verified by rank 0 before any rank returns.
Status DlrmTrainer::stop_on_signal(int step) {
  const int sig = stop_->signal.load();
  const char* name = sig != 0 ? stop_signal_name(sig) : "a stop signal on another rank";
  say("%s received: saving step %d before stopping\n", name, step);
  const auto t0 = Clock::now();
  ASSIGN_OR_RETURN(std::string dir, saves_->save_for_stop(step, name, snapshot()));
  const StopReport report = describe_stop(name, step, c_.steps, dir, seconds_since(t0), *stop_);
  say("%s", report.line.c_str());
  metrics_.write(report.record);
  summary_.checkpoint = dir;
  summary_.stopped_by = sig != 0 ? sig : -1;
  summary_.stopped_at = step;
  return report_plan_check();
}

Result<DlrmTrainSummary> DlrmTrainer::run() {
  RETURN_IF_ERROR(setup());
  if (finished_) return summary_;
  RETURN_IF_ERROR(evaluate(static_cast<int>(start_step_)));
  stats_prev_ = engine_->stats();
  comm_metrics_.skip();  // the first step's figures leave out the evaluation's
  LoopOptions lo;
  lo.start = static_cast<int>(start_step_);
  lo.steps = c_.steps;
  lo.stop_at = c_.stop_at;
  lo.eval_every = c_.eval_every;
  ASSIGN_OR_RETURN(LoopEnd end, run_loop(*this, lo, out_));
  if (end == LoopEnd::kSignal) return summary_;
  // The last save may have waited for the one before it, whose result that
  // poll returned: poll until the last is published (or failed).
  RETURN_IF_ERROR(saves_->drain());
  if (!saves_->last_published().empty()) summary_.checkpoint = saves_->last_published();
  say("%s", saves_->stall_line().c_str());
  RETURN_IF_ERROR(report_plan_check());
  return summary_;
}

// One step (0-based): the batch of rows step*B... (wrapping), the engine's
// step, its time; then whether a stop signal reached any rank (one value
// all-reduced, only when the run has a stop flag and more steps follow).
Result<StepResult> DlrmTrainer::step(int step) {
  const int B = c_.dlrm.batch;
  obs::trace::Span span("step", "train");
  const auto t0 = Clock::now();
  const DlrmBatch& b = batch_.fill(*train_, int64_t{step} * B % train_->rows(), B, true);
  RETURN_IF_ERROR(inject_step_fault(faults_, rank_, step));
  const double a2a0 = engine_->stats().alltoall_s;
  ASSIGN_OR_RETURN(float loss, engine_->train_step(b));
  train_alltoall_s_ += engine_->stats().alltoall_s - a2a0;
  if (!std::isfinite(loss))
    return Status::Internal(fmt::format("loss became {} at step {}; lower train.lr or train.table_lr", loss, step + 1));
  const double dt = seconds_since(t0);
  pending_.secs += dt;
  train_s_ += dt;
  saves_->add_train_seconds(dt);
  step_seconds_.push_back(dt);
  pending_.loss_sum += loss;
  pending_.steps++;
  summary_.steps = step + 1;
  StepResult r;
  if (step + 1 < c_.steps) {
    ASSIGN_OR_RETURN(r.stop_signal, stop_agreed());
  }
  return r;
}

// A line every log.every steps, and `flush`: the steps since the last line.
Status DlrmTrainer::log(int done, bool flush) {
  if (pending_.steps == 0 || (done % c_.dlrm.log_every != 0 && !flush)) return Status::OK();
  RETURN_IF_ERROR(log(done, pending_.loss_sum, pending_.steps, pending_.secs));
  pending_ = Pending{};
  return Status::OK();
}

// The peak an MFU is measured against: the doctor profile's (log.profile
// or TESSERA_PROFILE), else this machine's theoretical fp32 peak, shared by
// the host's ranks.
Status DlrmTrainer::setup_peak() {
  Result<std::optional<perf::Profile>> profile = perf::find_profile(c_.profile);
  RETURN_IF_ERROR(comm::agree(world_, profile.status()));
  Result<comm::LocalRank> local = comm::local_rank();
  const int ranks_here = local.ok() && local->size > 0 ? local->size : 1;
  const perf::PeakReference ref = perf::cpu_peak_reference(*profile, perf::detect_machine(false), "fp32", ranks_here);
  peak_ = ref.peak_gflops;
  peak_source_ = ref.source;
  return Status::OK();
}

// Before the model is built: the host's ranks need at least their share of
// the tables (and of their optimizer state and checkpoint staging) and each
// a copy of the MLPs with gradients and AdamW moments. More than the host
// has is every rank's InvalidArgument, naming the host and the figures,
// instead of an out-of-memory kill part-way through building.
Status DlrmTrainer::check_memory_fits(const DlrmConfig& mc) {
  const plan::DlrmSpec spec = dlrm_spec(mc, c_);
  const double state = c_.dlrm.table_optimizer == "adagrad" ? 1.0 : 0.0;  // row-wise Adagrad: one float a row
  double table_rows = 0;
  for (int64_t e : spec.table_rows) table_rows += static_cast<double>(e);
  const double tables = table_rows * (spec.dim + state) * sizeof(float) / world_.size();
  // Every run saves at its end (a forced save), so the staging copy is always made.
  const double staging = c_.checkpoint_dir.empty() ? 0.0 : tables;
  const double mlp = static_cast<double>(spec.mlp_parameters()) * 4 * sizeof(float);
  const double least = tables + staging + mlp;
  return check_host_memory(
      world_, least,
      fmt::format("tables {:.1f} GB, checkpoint staging {:.1f} GB, MLPs {:.1f} GB", tables / 1e9, staging / 1e9,
                  mlp / 1e9),
      "make the tables smaller (data.hash_size) or spread them over more ranks");
}

// The planner's step time, memory and all-to-all share for this job under
// the placement the engine chose (every rank computes it; rank 0 says it).
namespace {
double link_gbps_of(float flag) {
  const obs::LinkSpeed l = obs::detect_link_speed(flag);
  return l.known() ? l.bytes_per_second * 8 / 1e9 : 0.0;
}
}  // namespace

Status DlrmTrainer::predict_plan(const DlrmConfig& mc) {
  ASSIGN_OR_RETURN(PlanCheckMachine machine, describe_run_machine(world_, c_.profile, link_gbps_of(c_.link_gbps)));
  plan::DlrmJob job;
  job.model = dlrm_spec(mc, c_);
  job.checkpoint_staging = !c_.checkpoint_dir.empty();
  // The planner prices whole placements; a mixed plan ("auto" that split
  // some tables) is priced as row-wise.
  const DlrmPlan& dp = engine_->plan();
  bool split = false;
  for (int t = 0; t < static_cast<int>(mc.table_rows.size()); t++) split = split || dp.pieces(t) > 1;
  const plan::DlrmPlacement placement = split ? plan::DlrmPlacement::kRow : plan::DlrmPlacement::kTable;
  Result<PlanPrediction> p = predict_dlrm_for_run(machine, job, placement);
  if (!p.ok()) {
    say("plan: no prediction to check: %s\n", p.status().message().c_str());
    return Status::OK();
  }
  plan_ = *p;
  say("plan: predicted step %.2f ms (all-to-all %.0f%%), memory %.1f MB per rank, %s placement, on %s; held up by "
      "%s\n",
      p->step_s * 1e3, 100 * p->comm_share, p->mem_bytes / 1e6, plan::placement_name(placement), p->cluster.c_str(),
      p->bottleneck.c_str());
  metrics_.write({{"plan_step_ms", p->step_s * 1e3},
                  {"plan_memory_mb", p->mem_bytes / 1e6},
                  {"plan_comm_share", p->comm_share},
                  {"plan_placement", plan::placement_name(placement)},
                  {"plan_cluster", p->cluster}});
  return Status::OK();
}

// Collective. The measured figures beside the prediction: the median step
// after the first (first touches), the largest rank's peak resident memory
// over its resident memory before the model was built, the mean
// all-to-all share of the logged steps.
Status DlrmTrainer::report_plan_check() {
  if (!plan_ || step_seconds_.size() < 2) return Status::OK();
  PlanCheckMeasured m;
  m.step_seconds = step_seconds_;
  if (Result<obs::ProcessStats> ps = obs::read_process_stats(); ps.ok() && ps->peak_resident_bytes > 0)
    m.mem_bytes = ps->peak_resident_bytes - resident_before_model_;
  if (world_.size() > 1)
    RETURN_IF_ERROR(world_.all_reduce(&m.mem_bytes, &m.mem_bytes, 1, comm::ElemType::kF64, comm::ReduceOp::kMax));
  m.comm_share = train_alltoall_s_ / std::max(train_s_, 1e-9);
  m.comm_name = "all-to-all";
  tessera::report_plan_check(*plan_, m, out_, &metrics_);
  return Status::OK();
}

}  // namespace

Result<DlrmTrainSummary> run_dlrm_training(const TrainConfig& c, comm::Communicator& world, std::FILE* out,
                                           obs::Registry* metrics, const StopFlag* stop, const FaultPlan* faults) {
  DlrmTrainer trainer(c, world, out, metrics, stop, faults);
  return trainer.run();
}

}  // namespace tessera
