#include "train/saves.h"

#include <chrono>
#include <filesystem>

#include <fmt/format.h>

#include "ckpt/checkpoint.h"
#include "comm/agree.h"
#include "train/stop.h"

namespace tessera {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

constexpr const char* kCheckpointBytesHelp = "Bytes of checkpoint shards this rank wrote (published saves)";
constexpr const char* kCheckpointWriteHelp =
    "Time this rank's checkpoint writer took for a published save's shard (hash, write, fsync)";
constexpr const char* kCheckpointStallHelp = "Training time this rank spent stalled by checkpoints";
std::vector<double> checkpoint_write_buckets() { return obs::exponential_buckets(0.001, 2, 20); }

}  // namespace

TrainingSaves::TrainingSaves(comm::Communicator& world, std::unique_ptr<ckpt::Checkpointer> checkpointer,
                             std::string dir, int every, obs::Registry& registry, MetricsLog& metrics,
                             std::FILE* out)
    : world_(world),
      checkpointer_(std::move(checkpointer)),
      dir_(std::move(dir)),
      every_(every),
      registry_(registry),
      metrics_(metrics),
      out_(out) {
  if (!checkpointer_) return;
  // Registered now, so a scrape before the first save shows them at 0.
  registry_.counter("tessera_train_checkpoints_total", "Checkpoints published");
  registry_.counter("tessera_train_checkpoint_failures_total", "Checkpoint saves that failed");
  registry_.counter("tessera_train_checkpoint_bytes_total", kCheckpointBytesHelp);
  registry_.histogram("tessera_train_checkpoint_write_seconds", kCheckpointWriteHelp, checkpoint_write_buckets());
  stall_total_ = &registry_.counter("tessera_train_checkpoint_stall_seconds_total", kCheckpointStallHelp);
}

void TrainingSaves::add_stall(double seconds) {
  stall_s_ += seconds;
  if (stall_total_) stall_total_->add(seconds);
}

std::string TrainingSaves::stall_line() const {
  if (train_s_ <= 0) return "";
  return fmt::format("checkpoints: {:.1f} ms stalled in {:.1f} s of training ({:.3f}%)\n", stall_s_ * 1e3, train_s_,
                     100.0 * stall_s_ / (train_s_ + stall_s_));
}

void TrainingSaves::report(const ckpt::PollResult& r) {
  if (r.state == ckpt::SaveState::kPublished) {
    last_published_ = (std::filesystem::path(dir_) / ckpt::step_dir_name(r.step)).string();
    last_published_bytes_ = r.stats.bytes_total;
    registry_.counter("tessera_train_checkpoints_total", "Checkpoints published").add(1);
    registry_.counter("tessera_train_checkpoint_bytes_total", kCheckpointBytesHelp)
        .add(static_cast<double>(r.stats.bytes_rank));
    registry_.histogram("tessera_train_checkpoint_write_seconds", kCheckpointWriteHelp, checkpoint_write_buckets())
        .observe(r.stats.write_s);
    const double share = train_s_ > 0 ? stall_s_ / (train_s_ + stall_s_) : 0.0;
    if (out_) {
      std::fprintf(out_,
                   "checkpoint step %lld published: %.1f MB, staging copy %.1f ms, write %.0f MB/s; checkpoints have "
                   "stalled training %.1f ms so far (%.3f%%)%s%s\n",
                   static_cast<long long>(r.step), r.stats.bytes_total / 1e6, r.stats.stall_ms, r.stats.write_mb_s,
                   stall_s_ * 1e3, 100.0 * share, r.warning.empty() ? "" : "; ", r.warning.c_str());
      std::fflush(out_);
    }
    metrics_.write({{"checkpoint_step", r.step},
                    {"stall_ms", r.stats.stall_ms},
                    {"stalled_total_ms", stall_s_ * 1e3},
                    {"bytes", r.stats.bytes_total},
                    {"write_mb_s", r.stats.write_mb_s},
                    {"stall_share", share}});
  } else if (r.state == ckpt::SaveState::kFailed) {
    registry_.counter("tessera_train_checkpoint_failures_total", "Checkpoint saves that failed").add(1);
    if (out_)
      std::fprintf(stderr, "tessera: warning: %s; training goes on, the previous checkpoint stays latest\n",
                   r.error.message().c_str());
    metrics_.write({{"checkpoint_step", r.step}, {"checkpoint_error", r.error.message()}});
  }
}

Status TrainingSaves::after_step(int64_t step, bool force, bool last, const SnapshotFn& snapshot) {
  if (!checkpointer_) return Status::OK();
  const bool due = (every_ > 0 && step % every_ == 0) || force;
  if (due && step != last_started_) {
    const auto t0 = Clock::now();
    ASSIGN_OR_RETURN(SaveSnapshot s, snapshot(step));
    ASSIGN_OR_RETURN(bool started, checkpointer_->save(world_, step, s.pieces, s.state));
    add_stall(seconds_since(t0));
    if (started) {
      last_started_ = step;
    } else if (out_) {
      std::fprintf(out_, "checkpoint step %lld skipped: the previous save is still being written\n",
                   static_cast<long long>(step));
      std::fflush(out_);
    }
  }
  const auto tp = Clock::now();
  ASSIGN_OR_RETURN(ckpt::PollResult r, checkpointer_->poll(world_, last));
  if (!last) add_stall(seconds_since(tp));  // waiting at the end is not a stall
  report(r);
  return Status::OK();
}

Status TrainingSaves::drain() {
  while (checkpointer_ && checkpointer_->pending()) {
    ASSIGN_OR_RETURN(ckpt::PollResult r, checkpointer_->poll(world_, true));
    report(r);
  }
  return Status::OK();
}

Result<std::string> TrainingSaves::save_for_stop(int64_t step, const std::string& name, const SnapshotFn& snapshot) {
  if (!checkpointer_)
    return Status::Unavailable(fmt::format("stopped by {} after step {}, and checkpoint.every = 0, so nothing was "
                                           "saved; set checkpoint.every to resume such a job",
                                           name, step));
  RETURN_IF_ERROR(drain());  // a periodic save still being written
  const std::string dir = (std::filesystem::path(dir_) / ckpt::step_dir_name(step)).string();
  if (last_published_ != dir) {
    const auto t0 = Clock::now();
    ASSIGN_OR_RETURN(SaveSnapshot s, snapshot(step));
    ASSIGN_OR_RETURN(bool started, checkpointer_->save(world_, step, s.pieces, s.state));
    add_stall(seconds_since(t0));
    if (!started) return Status::Internal(fmt::format("the checkpoint of step {} did not start", step));
    last_started_ = step;
    ASSIGN_OR_RETURN(ckpt::PollResult r, checkpointer_->poll(world_, true));
    report(r);
    if (r.state != ckpt::SaveState::kPublished)
      return Status::IOError(
          fmt::format("stopped by {} after step {}, but its checkpoint failed: {}", name, step, r.error.message()));
  }
  // Rank 0 reads every file of what it published back against its hashes;
  // the others wait for the verdict, so no rank exits before it is known.
  // That wait is rank 0's reading, not a peer's message: its deadline is the
  // communicator's plus the checkpoint read at kVerifyReadMBps, so a large
  // checkpoint under a short parallel.timeout is not taken for a dead rank.
  Status verified;
  if (world_.rank() == 0) verified = verify_stop_checkpoint(dir, step);
  const auto reading =
      std::chrono::milliseconds(static_cast<int64_t>(last_published_bytes_ / (kVerifyReadMBps * 1e3)));
  comm::OpOptionsScope verdict(world_, {.timeout = world_.timeout() + reading});
  RETURN_IF_ERROR(comm::agree(world_, verified));
  return dir;
}

}  // namespace tessera
