#include "elastic/elastic_trainer.h"
#include "train/evaluate.h"
#include "train/loop.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <set>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "ckpt/checkpoint.h"
#include "comm/local/self_communicator.h"
#include "core/host.h"
#include "data/loader.h"
#include "elastic/elastic_checkpoints.h"
#include "elastic/rendezvous.h"
#include "nn/gpt2_weights.h"
#include "optim/zero.h"
#include "parallel/data_parallel.h"
#include "parallel/pipeline.h"
#include "train/checkpointing.h"
#include "train/monitoring.h"

namespace tessera::elastic {

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }
double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Elastic training supports plain data parallelism on the CPU; anything else
// is refused in one line.
Status check_config(const TrainConfig& c, const ElasticOptions& o) {
  if (c.tp != 1 || c.pp != 1)
    return Status::InvalidArgument(fmt::format(
        "elastic training changes only the data-parallel size: parallel.tp ({}) and parallel.pp ({}) must be 1",
        c.tp, c.pp));
  if (c.zero != 0)
    return Status::InvalidArgument(
        "elastic training does not support ZeRO-1 (parallel.zero = 1) yet: set parallel.zero = 0 (every worker "
        "then holds the whole optimizer state, which is what lets survivors go on)");
  if (c.device != "cpu") return Status::InvalidArgument("elastic training runs on train.device = \"cpu\" only");
  if (o.min < 1 || o.max < o.min)
    return Status::InvalidArgument(fmt::format("--min {} and --max {}: need 1 <= min <= max", o.min, o.max));
  const int global = c.dp * c.grad_accum;
  if (o.max > global)
    return Status::InvalidArgument(fmt::format(
        "--max {} workers but the global batch has only {} micro-batches (parallel.dp x train.grad_accum = {} x "
        "{}); every worker needs one",
        o.max, global, c.dp, c.grad_accum));
  return Status::OK();
}

// The elastic worker: the training loop (train/loop.h) with membership as
// a policy around it. Each round runs the loop from the step the job has
// reached; a peer that fails or a worker waiting to join ends the loop with
// Unavailable, and run() forms the next round (rendezvous, state sync) and
// runs the loop again.
class ElasticTrainer final : public TrainTask {
 public:
  ElasticTrainer(const TrainConfig& c, const ElasticOptions& o, std::FILE* out) : c_(c), o_(o), out_(out) {}
  Result<ElasticSummary> run();

  // TrainTask. A step logs its line and hands its state to the checkpoints
  // itself (ElasticCheckpoints); an elastic run takes no stop signal.
  Result<StepResult> step(int) override {
    RETURN_IF_ERROR(train_step());
    return StepResult{};
  }
  Status log(int, bool) override { return Status::OK(); }
  Status evaluate(int) override {
    if (!eval_due()) return Status::OK();
    Status s = evaluate();
    eval_failed_ = !s.ok();
    return s;
  }
  Status save(int, bool, bool) override { return Status::OK(); }
  Status stop_on_signal(int) override { return Status::OK(); }

 private:
  Status setup();
  // Leaves the current round (if any) and joins the next; syncs the state.
  Status rebuild(const std::string& why);
  Status sync_state();
  // No member holds the job's newest state (every worker that held it is
  // gone): the newest disk checkpoint any member can read newer than
  // `best` is loaded by its lowest rank (then broadcast as usual), or the
  // job fails in one line when there is none and no member holds any state.
  Status recover_from_disk(int64_t best, int64_t progress);
  // Rank 0 of a new round: the steps the metrics file already has, and the
  // lines of steps this worker completed that it lacks (a rank 0 killed
  // after a step, before its line).
  void catch_up_metrics();
  // The validation loss at step_, over every member (train.eval_every,
  // data.val); Unavailable: a peer failed (the pass is redone after the
  // next round forms).
  Status evaluate();
  bool eval_failed_ = false;  // the loop ended in an evaluation (its message says so)
  bool eval_due() const {
    return !val_tokens_.empty() && step_ != evaluated_ &&
           (step_ == 0 || step_ == c_.steps || (c_.eval_every > 0 && step_ % c_.eval_every == 0));
  }
  // One step; on success step_ advanced. Unavailable: a peer failed.
  Status train_step();
  // The job cannot go on (fewer than min workers, the store gone): this
  // worker's last completed step goes to disk, then the error is returned.
  Status fail_with_checkpoint(Status why);
  void event(const nlohmann::json& j, const std::string& line);
  template <typename... Args>
  void say(fmt::format_string<Args...> f, Args&&... args) {
    if (out_ && rank_ == 0) {
      std::fputs(fmt::format(f, std::forward<Args>(args)...).c_str(), out_);
      std::fflush(out_);
    }
  }

  const TrainConfig& c_;
  const ElasticOptions& o_;
  std::FILE* out_;
  std::string id_;
  std::unique_ptr<comm::Store> store_;
  std::unique_ptr<Rendezvous> rdzv_;
  std::unique_ptr<comm::Communicator> self_;  // size 1: the pipeline and the optimizer
  std::unique_ptr<comm::Communicator> comm_;  // the round's dp communicator
  std::unique_ptr<GPT> model_;
  std::unique_ptr<Pipeline> pipe_;
  std::unique_ptr<ShardedAdamW> opt_;
  std::unique_ptr<DataParallel> ddp_;
  std::unique_ptr<ElasticCheckpoints> ckpts_;  // periodic saves, the fallback save
  std::optional<data::TokenLoader> train_;
  int global_micro_ = 1;
  int64_t epoch_ = -1;
  int rank_ = -1, size_ = 0;
  std::vector<Member> members_;
  int64_t step_ = -1;  // steps completed; -1: no state yet (a new worker)
  int rounds_ = 0;
  // rebuild() found JOB/done at or past this worker's round: the job
  // finished without it (its round JOB/done names).
  int64_t finished_in_round_ = -1;
  double last_loss_ = 0.0;
  // Since the failure this worker saw, until its first completed step.
  std::optional<Clock::time_point> failed_at_;
  std::FILE* metrics_ = nullptr;
  // The records of the steps this worker completed lately (every worker
  // keeps them: its rank 0 may die before it logs one), and the steps the
  // metrics file has (rank 0, from its last scan on).
  std::deque<nlohmann::json> recent_;
  std::set<int64_t> logged_, logged_val_;
  bool loaded_from_disk_ = false;
  bool progress_written_ = false;  // this round's JOB/progress (rank 0), last written at progress_at_
  Clock::time_point progress_at_;
  std::vector<uint32_t> val_tokens_;
  int64_t evaluated_ = -1;  // the step of the last validation pass
};

constexpr size_t kRecentSteps = 1000;

void ElasticTrainer::event(const nlohmann::json& j, const std::string& line) {
  if (!line.empty()) say("{}\n", line);
  if (rank_ == 0 && !c_.metrics.empty()) {
    if (!metrics_) metrics_ = std::fopen(c_.metrics.c_str(), "a");
    if (metrics_) {
      std::fprintf(metrics_, "%s\n", j.dump().c_str());
      std::fflush(metrics_);
    }
  }
}

Status ElasticTrainer::setup() {
  RETURN_IF_ERROR(check_config(c_, o_));
  id_ = fmt::format("{}:{}", host_name(), ::getpid());
  global_micro_ = c_.dp * c_.grad_accum;
  ASSIGN_OR_RETURN(store_, comm::connect_store(o_.store, std::chrono::seconds(30)));
  RendezvousOptions ro;
  ro.job = o_.job;
  ro.min = o_.min;
  ro.max = o_.max;
  ro.last_call_s = o_.last_call_s;
  ro.timeout_s = o_.rdzv_timeout_s;
  ro.faults = o_.faults;
  ro.host = store_->local_address();
  rdzv_ = std::make_unique<Rendezvous>(*store_, ro, id_);

  GPTConfig mc = c_.model;
  if (!c_.init_from.empty()) {
    ASSIGN_OR_RETURN(model_, load_gpt2(c_.init_from, nullptr, Backend::kCPU));
  } else {
    ASSIGN_OR_RETURN(model_, GPT::create(mc, Backend::kCPU));
    RETURN_IF_ERROR(model_->init_weights(static_cast<uint64_t>(c_.seed)));
  }
  model_->set_precision(c_.dtype == "bf16" ? MatmulPrecision::kBF16 : MatmulPrecision::kF32);
  self_ = comm::self_communicator();
  pipe_ = std::make_unique<Pipeline>(*model_, *self_, PipelineSchedule::k1F1B);
  ASSIGN_OR_RETURN(opt_, ShardedAdamW::create(gpt_param_space(*model_), gpt_adamw_kernel(*model_), *self_,
                                              ShardedAdamWOptions{0, nullptr}));
  Result<data::TokenLoader> train = data::TokenLoader::open(c_.train_data, c_.seq, c_.seed, model_->config().vocab);
  if (!train.ok()) return train.status().With("data.train");
  train_ = std::move(train).value();
  if (!c_.val_data.empty()) {
    Result<data::TokenLoader> val = data::TokenLoader::open(c_.val_data, c_.seq, c_.seed, model_->config().vocab);
    if (!val.ok()) return val.status().With("data.val");
    val_tokens_ = val->all_tokens();
  }
  ckpts_ = std::make_unique<ElasticCheckpoints>(c_, o_.job, id_, *self_, out_);
  if (!c_.resume.empty()) {  // every worker reads it; the rounds then agree on its step
    ASSIGN_OR_RETURN(step_, resume_elastic(c_, *model_, *opt_));
    if (out_)
      std::fprintf(out_, "elastic: worker %s resumed at step %lld\n", id_.c_str(), static_cast<long long>(step_));
  }
  ASSIGN_OR_RETURN(epoch_, rdzv_->first_epoch());
  epoch_--;  // rebuild() joins epoch_ + 1
  return Status::OK();
}

// Every member reports the steps it completed; the one with the most (the
// lowest rank among equals) broadcasts the parameters, AdamW's moments and
// its step count when anyone differs (a joiner has none). A survivor that
// completed the step in flight before the failure is ahead by one: its
// update used the complete all-reduced gradient, so it is the state to keep.
//
// The job's progress (JOB/progress in the store: a step the job completed,
// written by rank 0 at each round's first step) tells a new job (none)
// from one whose every worker holding the state is gone (all members
// behind it): the latter continues from the newest disk checkpoint, or
// fails; it never starts over from fresh weights.
Status ElasticTrainer::sync_state() {
  int64_t progress = 0;
  {
    Result<std::string> p = store_->get(o_.job + "/progress");
    if (p.ok()) progress = std::strtoll(p->c_str(), nullptr, 10);
    else if (p.status().code() != StatusCode::kNotFound) return Status::Unavailable(p.status().message());
  }
  // Each member: its steps, the progress it read, its last validation
  // pass (all then agree whether the pass at this step is still due).
  std::vector<int64_t> mine = {step_, progress, evaluated_}, all(3 * static_cast<size_t>(size_));
  RETURN_IF_ERROR(comm_->all_gather(mine.data(), all.data(), 3, comm::ElemType::kI64));
  std::vector<int64_t> steps(size_);
  int64_t evaluated = -1;
  for (int r = 0; r < size_; r++) {
    steps[r] = all[3 * r];
    progress = std::max(progress, all[3 * r + 1]);
    evaluated = std::max(evaluated, all[3 * r + 2]);
  }
  evaluated_ = evaluated;
  int64_t best = *std::max_element(steps.begin(), steps.end());
  if (progress > 0 && best < progress) {
    RETURN_IF_ERROR(recover_from_disk(best, progress));
    RETURN_IF_ERROR(comm_->all_gather(&step_, steps.data(), 1, comm::ElemType::kI64));
    best = *std::max_element(steps.begin(), steps.end());
  }
  const int root = static_cast<int>(std::find(steps.begin(), steps.end(), best) - steps.begin());
  const bool same = std::all_of(steps.begin(), steps.end(), [&](int64_t s) { return s == best; });
  if (best < 0) {  // a new job: everyone starts from the same seed
    step_ = 0;
    // Its metrics lines start now (catch_up_metrics ignores older ones in
    // the same file).
    if (rank_ == 0) {
      Status st = store_->set(o_.job + "/started", fmt::format("{:.3f}", unix_now()));
      if (!st.ok()) return Status::Unavailable(st.message());
    }
    return Status::OK();
  }
  if (same) return Status::OK();
  const auto t0 = Clock::now();
  // A worker behind `best` overwrites its state with the root's; if the
  // transfer breaks half way its state is torn (new parameters, old
  // moments), so it no longer counts as holding any: the next round's
  // transfer gives it the whole state again. (Workers at `best` receive
  // their own bytes.)
  const bool receiver = step_ != best;
  Arena& params = model_->params();
  Status s = comm_->broadcast(params.base(), static_cast<int64_t>(params.bytes() / sizeof(float)),
                              comm::ElemType::kF32, root);
  if (s.ok() && receiver) fault_point(o_.faults, "transfer", epoch_);
  ShardedAdamW::State st = opt_->state();
  if (s.ok()) s = comm_->broadcast(st.m, st.hi - st.lo, comm::ElemType::kF32, root);
  if (s.ok()) s = comm_->broadcast(st.v, st.hi - st.lo, comm::ElemType::kF32, root);
  int64_t meta[2] = {opt_->steps(), best};
  if (s.ok()) s = comm_->broadcast(meta, 2, comm::ElemType::kI64, root);
  if (!s.ok()) {
    if (receiver) step_ = -1;
    return s;
  }
  opt_->set_steps(static_cast<int>(meta[0]));
  step_ = best;  // the whole state has arrived
  // The root's records of the steps the others missed: the next rank 0 may
  // be one of them, and logs what the dead rank 0 did not
  // (catch_up_metrics). A failure here leaves the state whole.
  const int64_t lowest = *std::min_element(steps.begin(), steps.end());
  std::string recs;
  if (rank_ == root)
    for (const nlohmann::json& j : recent_)
      if (j["step"].get<int64_t>() > lowest) recs += j.dump() + "\n";
  int64_t recs_bytes = static_cast<int64_t>(recs.size());
  s = comm_->broadcast(&recs_bytes, 1, comm::ElemType::kI64, root);
  recs.resize(static_cast<size_t>(recs_bytes));
  if (s.ok()) s = comm_->broadcast(recs.data(), recs_bytes, comm::ElemType::kU8, root);
  if (!s.ok()) return s;
  if (receiver) {
    const int64_t have = recent_.empty() ? -1 : recent_.back()["step"].get<int64_t>();
    for (size_t at = 0, nl; (nl = recs.find('\n', at)) != std::string::npos; at = nl + 1) {
      nlohmann::json j = nlohmann::json::parse(recs.substr(at, nl - at), nullptr, false);
      if (j.is_object() && j["step"].get<int64_t>() > have) recent_.push_back(std::move(j));
    }
    while (recent_.size() > kRecentSteps) recent_.pop_front();
  }
  const int behind = static_cast<int>(std::count_if(steps.begin(), steps.end(), [&](int64_t s) { return s != best; }));
  const double mb = (params.bytes() + 2.0 * (st.hi - st.lo) * 4) / 1e6;
  event({{"event", "state_transfer"}, {"epoch", epoch_}, {"step", best}, {"root", root}, {"receivers", behind},
         {"mb", mb}, {"seconds", since(t0)}},
        fmt::format("elastic: state of step {} broadcast by rank {} to {} worker(s) behind it ({:.1f} MB in {:.2f} s)",
                    best, root, behind, mb, since(t0)));
  return Status::OK();
}

Status ElasticTrainer::recover_from_disk(int64_t best, int64_t progress) {
  // Each member's newest checkpoint in its checkpoint.dir (-1: none, or
  // not newer than the state held).
  int64_t ck_step = -1;
  if (!c_.checkpoint_dir.empty()) {
    Result<ckpt::Checkpoint> ck = ckpt::Checkpoint::open(c_.checkpoint_dir);
    if (ck.ok() && ck->step() > best) ck_step = ck->step();
  }
  std::vector<int64_t> cks(size_);
  RETURN_IF_ERROR(comm_->all_gather(&ck_step, cks.data(), 1, comm::ElemType::kI64));
  const int64_t newest = *std::max_element(cks.begin(), cks.end());
  if (newest < 0) {
    if (best >= 0) {  // an older state survives (a worker cut off long ago): go on from it, loudly
      event({{"event", "state_behind"}, {"epoch", epoch_}, {"step", best}, {"progress", progress},
             {"time", unix_now()}},
            fmt::format("elastic: warning: the job had completed at least step {} but the newest state any worker "
                        "holds is step {}, and no checkpoint is newer: going on from step {}",
                        progress, best, best));
      return Status::OK();
    }
    return Status::NotFound(fmt::format(
        "elastic: no worker of round {} holds the state of job '{}' (it had completed at least step {}: every "
        "worker that held it is gone) and no member's checkpoint.dir ({}) has a checkpoint to continue from; not "
        "starting over from step 0 (set checkpoint.every, or start a new --job to train from scratch)",
        epoch_, o_.job, progress, c_.checkpoint_dir));
  }
  const int root = static_cast<int>(std::find(cks.begin(), cks.end(), newest) - cks.begin());
  if (rank_ == root) {
    Result<ckpt::Checkpoint> ck = ckpt::Checkpoint::open(c_.checkpoint_dir);
    Result<ResumeState> rs = ck.ok() ? load_checkpoint(*ck, *model_, *opt_) : Result<ResumeState>(ck.status());
    if (rs.ok()) {
      step_ = rs->step;
    } else {  // the parameters may be half overwritten: this worker holds no state
      step_ = -1;
      std::fprintf(stderr, "tessera: elastic: checkpoint of step %lld in %s could not be loaded: %s\n",
                   static_cast<long long>(newest), c_.checkpoint_dir.c_str(), rs.status().message().c_str());
    }
  }
  int64_t loaded = step_;
  RETURN_IF_ERROR(comm_->broadcast(&loaded, 1, comm::ElemType::kI64, root));
  if (loaded < 0) {
    if (best >= 0) return Status::OK();
    return Status::NotFound(fmt::format(
        "elastic: no worker of round {} holds the state of job '{}' (it had completed at least step {}) and rank {}'s "
        "checkpoint of step {} could not be loaded (its error is on that worker's stderr)",
        epoch_, o_.job, progress, root, newest));
  }
  loaded_from_disk_ = true;
  event({{"event", "state_from_disk"}, {"epoch", epoch_}, {"step", loaded}, {"progress", progress}, {"root", root},
         {"time", unix_now()}},
        fmt::format("elastic: no worker holds the job's state (it had completed at least step {}); rank {} loaded the "
                    "checkpoint of step {} from its checkpoint.dir; continuing from step {}",
                    progress, root, loaded, loaded));
  return Status::OK();
}

Status ElasticTrainer::rebuild(const std::string& why) {
  const auto t0 = Clock::now();
  ddp_.reset();
  comm_.reset();  // closes this worker's connections
  // The checkpoint lock follows rank 0: the next round's may be another
  // worker (this one's save in flight is published first).
  ckpts_->leave();
  const std::vector<Member> before = members_;
  const bool was_rank0 = rank_ == 0 && !before.empty();
  // Two deadlines: the collectives' is parallel.timeout (a slow step is not
  // a failure before it); the connect's, bounded by the rendezvous timeout
  // too, is how long a round with a dead member waits before it is tried again.
  comm::CommOptions co;
  co.timeout = std::chrono::milliseconds(static_cast<int64_t>(c_.timeout_s * 1000.0));
  const auto connect =
      std::min(co.timeout, std::chrono::milliseconds(static_cast<int64_t>(o_.rdzv_timeout_s * 1e3)));
  std::string last_error;
  // Since when the store has failed every request (none: it answers).
  std::optional<Clock::time_point> store_lost;
  while (true) {
    if (since(t0) > o_.rdzv_timeout_s + o_.last_call_s + 60)
      return Status::Unavailable(
          fmt::format("elastic: no round could be formed within {:.0f} s; last: {}", since(t0), last_error));
    // The next round after this worker's last and after the job's last
    // closed one: a worker that was cut off (or slow) goes straight to the
    // round the running job will see. The store unreachable (this host cut
    // off, or the store's host gone) is retried on the same round for
    // --rdzv-timeout, so a host whose link heals in that time rejoins the
    // job's next round; past it the store is taken for gone (issue #34: the
    // flag bounds the wait, plus one retry interval).
    Result<int64_t> next = rdzv_->first_epoch();
    if (!next.ok()) {
      last_error = next.status().message();
      if (!store_lost) store_lost = Clock::now();
      const double lost_s = std::chrono::duration<double>(Clock::now() - *store_lost).count();
      if (lost_s >= o_.rdzv_timeout_s)
        return Status::Unavailable(fmt::format(
            "elastic: the rendezvous store at {} is gone: no answer for {:.0f} s (--rdzv-timeout {:g}; last: {}); "
            "resume the job with --resume latest, or keep the store on Redis or etcd (--rdzv redis://HOST:PORT), "
            "which outlives any one host",
            store_->address(), lost_s, o_.rdzv_timeout_s, last_error));
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      continue;
    }
    store_lost.reset();
    // A worker that was in a round of this job and comes back after the job
    // finished without it (a collective that had not seen its peers leave
    // until its deadline) ends: JOB/done names the job's last round.
    if (rounds_ > 0) {
      Result<std::string> done = store_->get(o_.job + "/done");
      if (done.ok() && std::strtoll(done->c_str(), nullptr, 10) >= epoch_) {
        finished_in_round_ = std::strtoll(done->c_str(), nullptr, 10);
        return Status::OK();
      }
    }
    Result<Round> r = rdzv_->join(std::max(epoch_ + 1, *next), step_ >= 0 ? rank_ : -1, co, connect);
    if (!r.ok()) {
      if (r.status().code() != StatusCode::kUnavailable) return r.status();
      last_error = r.status().message();
      std::fprintf(stderr, "tessera: elastic: round %lld failed, joining the next: %s\n",
                   static_cast<long long>(rdzv_->last_epoch_tried()), r.status().message().c_str());
      epoch_ = std::max(epoch_, rdzv_->last_epoch_tried());
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      continue;
    }
    epoch_ = r->epoch;
    progress_written_ = false;
    rank_ = r->rank;
    size_ = r->size;
    members_ = r->members;
    comm_ = std::move(r->comm);
    Status s = sync_state();
    if (!s.ok() && s.code() != StatusCode::kUnavailable) return s;  // no state anywhere: the job's error
    if (s.ok()) {
      ASSIGN_OR_RETURN(ddp_, DataParallel::create(*model_, *comm_,
                                                  DataParallelOptions{static_cast<int64_t>(c_.bucket_mb * (1 << 20)),
                                                                      0}));
      break;
    }
    std::fprintf(stderr, "tessera: elastic: state transfer in round %lld failed, joining the next: %s\n",
                 static_cast<long long>(epoch_), s.message().c_str());
    comm_.reset();
  }
  rounds_++;
  std::set<std::string> old_ids, new_ids;
  for (const Member& m : before) old_ids.insert(m.id);
  for (const Member& m : members_) new_ids.insert(m.id);
  std::vector<std::string> left, joined;
  for (const Member& m : before)
    if (!new_ids.count(m.id)) left.push_back(m.id);
  for (const Member& m : members_)
    if (!old_ids.count(m.id)) joined.push_back(m.id);
  auto list = [](const std::vector<std::string>& v) {
    std::string s;
    for (const std::string& x : v) s += (s.empty() ? "" : ", ") + x;
    return s.empty() ? std::string("none") : s;
  };
  const double rdzv_s = since(t0);
  event({{"event", "membership"}, {"epoch", epoch_}, {"workers", size_}, {"workers_before", before.size()},
         {"left", left}, {"joined", joined}, {"reason", why}, {"step", step_}, {"rendezvous_s", rdzv_s},
         {"time", unix_now()}},
        fmt::format("elastic: round {}: {} worker(s) (was {}) at step {}; left: {}; joined: {}; reason: {}; "
                    "rendezvous {:.2f} s",
                    epoch_, size_, before.size(), step_, list(left), list(joined), why, rdzv_s));
  if (rank_ == 0 && (!was_rank0 || loaded_from_disk_)) catch_up_metrics();
  loaded_from_disk_ = false;
  return Status::OK();
}

void ElasticTrainer::catch_up_metrics() {
  if (c_.metrics.empty()) return;
  // Which steps have a line: a record without "event" with "loss" (a
  // step) or "val_loss" (a validation pass). A plain scan, no JSON parse.
  logged_.clear();
  logged_val_.clear();
  double started = 0;  // lines of an earlier run in the same file do not count
  if (Result<std::string> t = store_->get(o_.job + "/started"); t.ok()) started = std::atof(t->c_str());
  std::ifstream in(c_.metrics);
  std::string line;
  while (std::getline(in, line)) {
    if (line.find("\"event\"") != std::string::npos) continue;
    const size_t at = line.find("\"step\":");
    if (at == std::string::npos) continue;
    const int64_t step = std::strtoll(line.c_str() + at + 7, nullptr, 10);
    const size_t t = line.find("\"time\":");
    if (t == std::string::npos || std::atof(line.c_str() + t + 7) < started) continue;
    if (line.find("\"val_loss\":") != std::string::npos) logged_val_.insert(step);
    else if (line.find("\"loss\":") != std::string::npos) logged_.insert(step);
  }
  int filled = 0;
  for (nlohmann::json j : recent_) {
    const int64_t step = j["step"].get<int64_t>();
    if (step > step_ || logged_.count(step)) continue;
    j["logged_late"] = true;
    event(j, "");
    logged_.insert(step);
    filled++;
  }
  if (filled > 0)
    say("elastic: logged {} step(s) completed before this round that had no line in {}\n", filled, c_.metrics);
}

Status ElasticTrainer::evaluate() {
  // Batches dealt round-robin to the members, sums all-reduced: the same
  // mean for every split (up to the summation order).
  ValLossOptions o;
  o.B = c_.micro_batch;
  o.T = c_.seq;
  o.max_batches = c_.eval_batches;
  o.part = rank_;
  o.parts = size_;
  o.source = c_.val_data;
  ASSIGN_OR_RETURN(EvalResult r, val_loss(
                                     val_tokens_, o,
                                     [&](const int* in, const int* tg, float* loss) -> Status {
                                       RETURN_IF_ERROR(model_->check_batch(in, tg, o.B, o.T).With(c_.val_data));
                                       return pipe_->forward_only(o.B, o.T, in, tg, loss);
                                     },
                                     comm_.get()));
  evaluated_ = step_;
  const double loss = r.loss;
  if (logged_val_.count(step_)) return Status::OK();  // redone after a reload from disk
  logged_val_.insert(step_);
  say("step {:5d} | val loss {:.4f} ({} tokens)\n", step_, loss, r.tokens);
  event({{"step", step_}, {"val_loss", loss}, {"time", unix_now()}}, "");
  return Status::OK();
}

Status ElasticTrainer::train_step() {
  const auto t_step = Clock::now();
  const int B = c_.micro_batch, T = c_.seq;
  // This worker's contiguous share of the global micro-batches (the first
  // G % n workers take one more).
  const int share = global_micro_ / size_ + (rank_ < global_micro_ % size_ ? 1 : 0);
  const int first = rank_ * (global_micro_ / size_) + std::min(rank_, global_micro_ % size_);
  const int64_t rows_per_step = int64_t{global_micro_} * B;
  RETURN_IF_ERROR(model_->zero_grad());
  auto fill = [&](int micro, int* inputs, int* targets) -> Status {
    train_->fill(step_, rows_per_step, int64_t{first + micro} * B, B, inputs, targets);
    return model_->check_batch(inputs, targets, B, T).With(c_.train_data);
  };
  auto before_backward = [&](int micro) { ddp_->begin_backward(micro == share - 1); };
  double loss_sum = 0.0;
  // Every micro-batch's mean loss weighs 1/G in the global mean; the
  // gradient exchange divides the sum over workers by n.
  const float scale = static_cast<float>(size_) / static_cast<float>(global_micro_);
  RETURN_IF_ERROR(pipe_->train_step(share, B, T, scale, fill, before_backward, &loss_sum));
  RETURN_IF_ERROR(ddp_->finish_gradients());
  // One store request a step, from rank 0: the all-reduce below tells every
  // worker.
  bool waiting = false;
  const auto t_store = Clock::now();
  if (rank_ == 0) {
    ASSIGN_OR_RETURN(waiting, rdzv_->joiner_waiting(epoch_));
  }
  const double store_ms = since(t_store) * 1e3;
  double sums[2] = {loss_sum, waiting ? 1.0 : 0.0};
  RETURN_IF_ERROR(comm_->all_reduce(sums, sums, 2, comm::ElemType::kF64));
  // Every collective of the step succeeded: the update is the same on every
  // worker, and no later failure can leave one worker behind by it.
  const float lr = lr_at(c_.opt, static_cast<int>(step_));
  ASSIGN_OR_RETURN(float norm, opt_->step(c_.opt, lr));
  step_++;
  last_loss_ = sums[0] / global_micro_;
  if (!std::isfinite(last_loss_))
    return Status::Internal(fmt::format("loss became {} at step {}; lower train.lr or check the data", last_loss_,
                                        step_));
  // Every worker keeps the step's record: if rank 0 dies before its line,
  // the next round's rank 0 writes it (catch_up_metrics).
  nlohmann::json record = {{"step", step_},      {"loss", last_loss_},        {"lr", lr},
                           {"grad_norm", norm}, {"workers", size_},           {"step_ms", since(t_step) * 1e3},
                           {"store_ms", store_ms}, {"time", unix_now()}};
  recent_.push_back(record);
  if (recent_.size() > kRecentSteps) recent_.pop_front();
  if (rank_ == 0) fault_point(o_.faults, "before-log", step_);
  say("step {:5d}/{} | loss {:.6f} | lr {:.2e} | norm {:.3f} | {} worker(s)\n", step_, c_.steps, last_loss_, lr, norm,
      size_);
  if (!logged_.count(step_)) {  // a step redone after a reload from disk has its line
    event(record, "");
    if (rank_ == 0) logged_.insert(step_);
  }
  // The job's progress, at a round's first step and then at most once a
  // second (a store write; negligible next to a step): what tells a round
  // whose members all lost the state from a new job (sync_state).
  if (rank_ == 0 && (!progress_written_ || since(progress_at_) >= 1.0)) {
    Status p = store_->set(o_.job + "/progress", std::to_string(step_));
    if (!p.ok()) return Status::Unavailable(p.message());  // the step stands; the next round sees the store
    progress_written_ = true;
    progress_at_ = Clock::now();
  }
  ckpts_->after_step(rank_, step_, *model_, *opt_);
  fault_point(o_.faults, "after-step", step_);
  if (failed_at_) {
    const double resume_s = since(*failed_at_);
    event({{"event", "resumed"}, {"step", step_}, {"resume_s", resume_s}, {"time", unix_now()}},
          fmt::format("elastic: resumed: step {} completed {:.2f} s after the failure was detected", step_,
                      resume_s));
    failed_at_.reset();
  }
  if (sums[1] > 0) return Status::Unavailable("a worker is waiting to join");
  return Status::OK();
}

Status ElasticTrainer::fail_with_checkpoint(Status why) {
  const bool recoverable = why.code() == StatusCode::kResourceExhausted || why.code() == StatusCode::kUnavailable;
  if (!recoverable || step_ <= 0) return why;
  Status s = ckpts_->save_now(step_, *model_, *opt_);
  if (!s.ok())
    std::fprintf(stderr, "tessera: warning: elastic: the state of step %lld was not saved: %s\n",
                 static_cast<long long>(step_), s.message().c_str());
  return why;
}

Result<ElasticSummary> ElasticTrainer::run() {
  // A write to a peer's closed connection is an error to handle, not a
  // reason to die.
  ::signal(SIGPIPE, SIG_IGN);
  RETURN_IF_ERROR(setup());
  std::string why = "start";
  bool need_round = true;
  while (true) {
    if (need_round) {
      Status r = rebuild(why);
      if (!r.ok()) return fail_with_checkpoint(r);
      need_round = false;
      if (finished_in_round_ >= 0) {
        // Whatever its rank was (say() is rank 0's).
        if (out_) {
          std::fputs(fmt::format("elastic: the job finished in round {} without this worker (it left in round {} at "
                                 "step {})\n",
                                 finished_in_round_, epoch_, step_)
                         .c_str(),
                     out_);
          std::fflush(out_);
        }
        ckpts_->finish();
        if (metrics_) std::fclose(metrics_);
        ElasticSummary sum;
        sum.last_train_loss = last_loss_;
        sum.rounds = rounds_;
        sum.finished_without_this_worker = true;
        return sum;
      }
    }
    if (eval_due()) {
      Status e = evaluate();
      if (!e.ok()) {
        if (e.code() != StatusCode::kUnavailable) return e;
        why = e.message();
        need_round = true;
        failed_at_ = Clock::now();
        std::fprintf(stderr, "tessera: elastic: validation at step %lld abandoned: %s\n",
                     static_cast<long long>(step_), why.c_str());
        continue;
      }
    }
    if (step_ >= c_.steps) {
      Status b = comm_->barrier();  // everyone is done before anyone leaves
      if (b.ok()) break;
      why = b.message();
      need_round = true;
      continue;
    }
    LoopOptions lo;
    lo.start = static_cast<int>(step_);
    lo.steps = c_.steps;
    lo.eval_every = c_.eval_every;
    eval_failed_ = false;
    Result<LoopEnd> end = run_loop(*this, lo, nullptr);
    if (end.ok()) continue;
    const Status s = end.status();
    if (s.code() != StatusCode::kUnavailable) return s;
    why = s.message();
    need_round = true;
    if (eval_failed_) {
      failed_at_ = Clock::now();
      std::fprintf(stderr, "tessera: elastic: validation at step %lld abandoned: %s\n", static_cast<long long>(step_),
                   why.c_str());
    } else if (why != "a worker is waiting to join") {
      failed_at_ = Clock::now();
      std::fprintf(stderr, "tessera: elastic: step %lld abandoned: %s\n", static_cast<long long>(step_ + 1),
                   why.c_str());
    }
  }
  ckpts_->finish();
  // The job is done: a new one under the same id starts afresh.
  if (rank_ == 0) (void)store_->set(o_.job + "/progress", "0");
  ElasticSummary sum;
  sum.last_train_loss = last_loss_;
  sum.rounds = rounds_;
  if (rank_ == 0) {
    std::error_code ec;
    std::filesystem::create_directories(c_.checkpoint_dir, ec);
    sum.weights_path = (std::filesystem::path(c_.checkpoint_dir) / "model.safetensors").string();
    RETURN_IF_ERROR(save_hf(*model_, sum.weights_path));
    say("saved {} (+ config.json)\n", sum.weights_path);
  }
  // A worker of an earlier round that comes back now ends (rebuild); the
  // agent that serves the store waits for every finished worker.
  if (rank_ == 0) (void)store_->set(o_.job + "/done", std::to_string(epoch_));
  (void)store_->add(o_.job + "/finished", 1);
  // Let the peers read the barrier's last messages before the sockets close.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  if (metrics_) std::fclose(metrics_);
  return sum;
}

}  // namespace


Result<ElasticSummary> run_elastic_training(const TrainConfig& c, const ElasticOptions& o, std::FILE* out) {
  ElasticTrainer t(c, o, out);
  return t.run();
}

}  // namespace tessera::elastic
