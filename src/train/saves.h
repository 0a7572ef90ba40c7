// The checkpoint side of every training loop (GPT's and DLRM's): a save
// when one is due, the poll of the one in flight, its report (the log line,
// the tessera_train_checkpoint_* series, the JSONL record), the training
// time the saves stalled, and the verified save a stop signal asks for.
// One implementation, so both models report and stop alike.
//
// Collective: every rank of `world` makes the same calls in the same order.
// Not thread safe: the training thread owns it.
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ckpt/checkpointer.h"
#include "comm/communicator.h"
#include "core/status.h"
#include "obs/metrics.h"
#include "train/monitoring.h"

namespace tessera {

// What a save of step `step` writes: this rank's pieces (read inside the
// call that takes them) and its state JSON (rank 0's is the resume state).
struct SaveSnapshot {
  std::vector<ckpt::SavePiece> pieces;
  std::string state;
};
// Makes the snapshot of a step. Collective: when it can fail on one rank it
// must agree (comm::agree) so every rank returns the same error.
using SnapshotFn = std::function<Result<SaveSnapshot>(int64_t step)>;

class TrainingSaves {
 public:
  // checkpointer: null when the run saves nothing (checkpoint.every = 0 and
  // no final save). every: a save every that many steps (0: only forced
  // ones). out: rank 0's console (null elsewhere); warnings go to stderr
  // where out is set. The registry and the metrics log outlive this.
  TrainingSaves(comm::Communicator& world, std::unique_ptr<ckpt::Checkpointer> checkpointer, std::string dir,
                int every, obs::Registry& registry, MetricsLog& metrics, std::FILE* out);

  bool enabled() const { return checkpointer_ != nullptr; }
  ckpt::Checkpointer* checkpointer() { return checkpointer_.get(); }

  // After step `step` (1-based): a save when one is due (every `every`
  // steps, and `force`), unless this step was saved already; then the poll
  // of the save in flight, waiting for it when `last`. The snapshot, the
  // save's staging copy and a poll that waits (not at the end) count as
  // stalled training time.
  Status after_step(int64_t step, bool force, bool last, const SnapshotFn& snapshot);
  // A stop signal after step `step`: the save in flight finishes, then this
  // step's is saved, published and read back against its hashes by rank 0
  // (train/stop.h) before any rank returns; its folder. `name` names the
  // signal in errors. FailedPrecondition-like Unavailable when the run saves
  // nothing; IOError when the save failed.
  Result<std::string> save_for_stop(int64_t step, const std::string& name, const SnapshotFn& snapshot);
  // Polls until no save is in flight (the end of a run).
  Status drain();
  // A resumed run: `step` is saved already (the checkpoint it resumed from),
  // so a forced save of it is not made again.
  void resumed_at(int64_t step) { last_started_ = step; }
  // Drops the checkpointer and its staging buffer (after drain()).
  void close() { checkpointer_.reset(); }

  // Training time (seconds) the stall share is measured against.
  void add_train_seconds(double s) { train_s_ += s; }
  double stall_seconds() const { return stall_s_; }
  // "checkpoints: 12.0 ms stalled in 30.2 s of training (0.040%)" ("" before any training).
  std::string stall_line() const;
  // The folder of the last published save (empty: none yet).
  const std::string& last_published() const { return last_published_; }

 private:
  void report(const ckpt::PollResult& r);
  void add_stall(double seconds);

  comm::Communicator& world_;
  std::unique_ptr<ckpt::Checkpointer> checkpointer_;
  const std::string dir_;
  const int every_;
  obs::Registry& registry_;
  MetricsLog& metrics_;
  std::FILE* out_;
  obs::Counter* stall_total_ = nullptr;
  double stall_s_ = 0.0, train_s_ = 0.0;
  int64_t last_started_ = -1;
  std::string last_published_;
  uint64_t last_published_bytes_ = 0;  // all ranks' files of it
  // A stop's check reads the checkpoint back at least this fast (MB/s).
  static constexpr double kVerifyReadMBps = 50.0;
};

}  // namespace tessera
