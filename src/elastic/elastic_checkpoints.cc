#include "elastic/elastic_checkpoints.h"

#include <chrono>
#include <filesystem>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "ckpt/checkpoint.h"
#include "train/checkpointing.h"

namespace tessera::elastic {

ElasticCheckpoints::ElasticCheckpoints(const TrainConfig& c, std::string job, std::string id,
                                       comm::Communicator& self, std::FILE* out)
    : c_(c), job_(std::move(job)), id_(std::move(id)), self_(self), out_(out) {}

ElasticCheckpoints::~ElasticCheckpoints() = default;

Status ElasticCheckpoints::lock(double wait_s) {
  if (lock_.held()) return Status::OK();
  std::error_code ec;
  std::filesystem::create_directories(c_.checkpoint_dir, ec);
  if (ec)
    return Status::IOError(fmt::format("checkpoint.dir {}: cannot create it: {}", c_.checkpoint_dir, ec.message()));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(wait_s);
  while (true) {
    std::string took_over;
    Result<ckpt::DirLock> l = ckpt::DirLock::acquire(c_.checkpoint_dir, job_, id_, &took_over);
    if (l.ok()) {
      lock_ = std::move(l).value();
      return Status::OK();
    }
    // Held by a live process: on a shared folder, a peer of this job
    // writing its own fallback save; it lets go when it exits.
    if (l.status().code() != StatusCode::kUnavailable || std::chrono::steady_clock::now() >= deadline)
      return l.status().With("checkpoint.dir");
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

Status ElasticCheckpoints::start_save(int64_t step, GPT& model, const ShardedAdamW& opt) {
  if (!ckpt_) {
    ckpt::CheckpointerOptions o;
    o.dir = c_.checkpoint_dir;
    o.keep = c_.checkpoint_keep;
    o.on_busy = c_.checkpoint_on_busy == "skip" ? ckpt::OnBusy::kSkip : ckpt::OnBusy::kWait;
    o.config = {{"model", model_config_json(model.config())}, {"seed", c_.seed}, {"micro_batch", c_.micro_batch},
                {"seq", c_.seq}, {"grad_accum", c_.grad_accum}, {"dtype", c_.dtype}};
    // The layout of the global batch (dp x grad_accum micro-batches), which
    // the worker count does not change; one writer holds every piece.
    o.layout = {{"dp", c_.dp}, {"tp", 1}, {"pp", 1}, {"zero", 0}, {"elastic", true}};
    ckpt_ = std::make_unique<ckpt::Checkpointer>(std::move(o));
  }
  ASSIGN_OR_RETURN(std::vector<ckpt::SavePiece> pieces, checkpoint_pieces(model, opt, 0, 0));
  const std::string state = nlohmann::json{{"step", step}, {"adam_t", opt.steps()}}.dump();
  ASSIGN_OR_RETURN(bool started, ckpt_->save(self_, step, pieces, state));
  if (!started && out_)
    std::fprintf(out_, "checkpoint step %lld skipped: the previous save is still being written\n",
                 static_cast<long long>(step));
  return Status::OK();
}

void ElasticCheckpoints::report(const ckpt::PollResult& r) {
  if (r.state == ckpt::SaveState::kPublished && out_) {
    std::fprintf(out_, "checkpoint step %lld published in %s: %.1f MB, staging copy %.1f ms%s%s\n",
                 static_cast<long long>(r.step), c_.checkpoint_dir.c_str(), r.stats.bytes_total / 1e6,
                 r.stats.stall_ms, r.warning.empty() ? "" : "; ", r.warning.c_str());
    std::fflush(out_);
  } else if (r.state == ckpt::SaveState::kFailed) {
    std::fprintf(stderr, "tessera: warning: %s; training goes on, the previous checkpoint stays latest\n",
                 r.error.message().c_str());
  }
}

void ElasticCheckpoints::after_step(int rank, int64_t step, GPT& model, const ShardedAdamW& opt) {
  if (c_.checkpoint_every <= 0) return;
  if (rank == 0 && step % c_.checkpoint_every == 0) {
    // Usually free: the previous rank 0 let it go when it left its round;
    // it may still be publishing its last save, hence the short wait.
    Status s = lock(kSaveLockWait);
    if (s.ok()) s = start_save(step, model, opt);
    if (!s.ok())
      std::fprintf(stderr, "tessera: warning: checkpoint step %lld not saved: %s\n", static_cast<long long>(step),
                   s.message().c_str());
  }
  if (ckpt_ && ckpt_->pending()) {
    Result<ckpt::PollResult> r = ckpt_->poll(self_, false);
    if (r.ok()) report(*r);
  }
  // Not rank 0 (any more): the lock is the current rank 0's, once this
  // worker's own save is out.
  if (rank != 0 && lock_.held() && !(ckpt_ && ckpt_->pending())) lock_ = ckpt::DirLock();
}

void ElasticCheckpoints::finish() {
  if (!ckpt_) return;
  Result<ckpt::PollResult> r = ckpt_->poll(self_, true);
  if (r.ok()) report(*r);
}

void ElasticCheckpoints::leave() {
  if (!lock_.held()) return;
  finish();
  lock_ = ckpt::DirLock();
}

Status ElasticCheckpoints::save_now(int64_t step, GPT& model, const ShardedAdamW& opt) {
  RETURN_IF_ERROR(lock(30));
  finish();  // a periodic save in flight first: it may be this very step
  Result<ckpt::Checkpoint> have = ckpt::Checkpoint::open(c_.checkpoint_dir);
  if (have.ok() && have->step() >= step) {
    if (out_)
      std::fprintf(out_, "checkpoint: %s already holds step %lld (this worker completed %lld); not saved again\n",
                   have->dir().c_str(), static_cast<long long>(have->step()), static_cast<long long>(step));
    lock_ = ckpt::DirLock();
    return Status::OK();
  }
  RETURN_IF_ERROR(start_save(step, model, opt));
  ASSIGN_OR_RETURN(ckpt::PollResult r, ckpt_->poll(self_, true));
  lock_ = ckpt::DirLock();  // a peer's fallback save may be waiting for it
  if (r.state == ckpt::SaveState::kFailed) return r.error;
  report(r);
  return Status::OK();
}

Result<int64_t> resume_elastic(const TrainConfig& c, GPT& model, ShardedAdamW& opt) {
  const std::string path = c.resume == "latest" ? c.checkpoint_dir : c.resume;
  Result<ckpt::Checkpoint> ck = ckpt::Checkpoint::open(path);
  if (!ck.ok()) return ck.status().With("--resume");
  ASSIGN_OR_RETURN(ResumeState rs, load_checkpoint(*ck, model, opt));
  return rs.step;
}

}  // namespace tessera::elastic
