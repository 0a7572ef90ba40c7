// Disk checkpoints of an elastic job (docs/elastic.md, "Disk checkpoints"),
// in the format of `tessera train`'s (src/ckpt, docs/formats/checkpoint.md),
// so `tessera checkpoint verify`, export and --resume read them alike.
//
// In data parallelism every worker holds the whole model and AdamW state, so
// one worker writes a whole checkpoint alone: its Checkpointer runs over a
// size-1 communicator (no collective with peers that may die meanwhile) and
// saves the pieces of dp rank 0.
//   - periodic: after every checkpoint.every-th step, rank 0 of the current
//     round starts an asynchronous save (the training thread only copies
//     into the staging buffer); every later step polls it;
//   - the fallback: a worker whose job fails (fewer than min workers) saves
//     its last completed step synchronously before it exits, unless the
//     folder already holds that step or a later one (a shared folder: the
//     survivor with the most steps wins, whatever the order).
// The lock (checkpoint.dir's LOCK, ckpt/dir_lock.h) follows rank 0: rank 0
// takes it for a periodic save (waiting up to kSaveLockWait for a previous
// rank 0 that is still finishing its save), and a worker lets it go when it
// leaves its round (leave(): after its save in flight) or is not rank 0 of
// the current one. A fallback save waits up to 30 s for a peer's lock and
// lets it go once published.
//
// Threading: one thread (the training loop). Owns its Checkpointer.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>

#include "ckpt/checkpointer.h"
#include "ckpt/dir_lock.h"
#include "comm/communicator.h"
#include "nn/gpt.h"
#include "optim/zero.h"
#include "train/config.h"

namespace tessera::elastic {

class ElasticCheckpoints {
 public:
  // self: a size-1 communicator that outlives this object. id: the worker
  // ("host:pid"), for the lock's holder line.
  ElasticCheckpoints(const TrainConfig& c, std::string job, std::string id, comm::Communicator& self,
                     std::FILE* out);
  ~ElasticCheckpoints();

  // After step `step` (completed steps) on a worker of rank `rank`: starts a
  // save when one is due and this is rank 0, then polls the one in flight.
  // A failed save is a warning line, not an error: training goes on.
  void after_step(int rank, int64_t step, GPT& model, const ShardedAdamW& opt);
  // The fallback save of the state at `step`, synchronous. Errors only for
  // the line to print; the caller's job is failing anyway.
  Status save_now(int64_t step, GPT& model, const ShardedAdamW& opt);
  // Waits for a save in flight (the end of the job).
  void finish();
  // This worker leaves its round (a failure, a joiner, the end): waits for
  // its save in flight, then releases the lock, so that the next round's
  // rank 0 (maybe another worker) can take it.
  void leave();
  bool holds_lock() const { return lock_.held(); }

  // How long a periodic save waits for the lock (a previous rank 0 still
  // publishing its last save) before it is skipped with a warning.
  static constexpr double kSaveLockWait = 5.0;

 private:
  Status lock(double wait_s);
  Status start_save(int64_t step, GPT& model, const ShardedAdamW& opt);
  void report(const ckpt::PollResult& r);

  const TrainConfig& c_;
  std::string job_, id_;
  comm::Communicator& self_;
  std::FILE* out_;
  ckpt::DirLock lock_;
  std::unique_ptr<ckpt::Checkpointer> ckpt_;
};

// --resume (a checkpoint folder, or "latest": checkpoint.dir) for a new
// worker of an elastic job: reads the parameters and AdamW state into model
// and opt, returns the completed steps. Errors name the checkpoint.
Result<int64_t> resume_elastic(const TrainConfig& c, GPT& model, ShardedAdamW& opt);

}  // namespace tessera::elastic
