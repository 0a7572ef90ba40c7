// Checkpointer: asynchronous, sharded, atomically published checkpoints
// (docs/formats/checkpoint.md). One per rank.
//
//   save(world, step, pieces, state)  copies every piece into a host staging
//       buffer (the training thread's only stall) and hands it to the
//       writer thread, which writes DIR/.tmp-step-N/shard-RRRRR.safetensors
//       and fsyncs it.
//   poll(world, wait_for_it)  called by the trainer on every rank at every
//       step (collective: the same calls on all ranks). While a save is
//       pending, ranks all-reduce their writer states; once every rank is
//       done, rank 0 publishes (manifest, fsync, rename to DIR/step-N,
//       replace DIR/latest, prune beyond `keep`) or, if any rank failed,
//       removes the tmp folder; every rank gets the same PollResult.
//
// A failed save is information (PollResult::kFailed, with one line naming
// the rank, the file and the errno text), not an error: `latest` and older
// checkpoints stay intact and training can go on. The Status of save() and
// poll() is non-OK only when the communicator fails (deadline, dead peer),
// which the caller treats as fatal like any other collective failure.
//
// At most one save is pending (staged, not yet published or failed). A
// save() while one is pending waits for it (OnBusy::kWait: a collective
// poll(world, true)) or is skipped (OnBusy::kSkip, returns false). Whether a
// save is pending changes only inside collective calls, so every rank makes
// the same choice.
//
// Allocation: the staging buffer and the piece list are kept between saves;
// once a save of the same pieces has been made, save() allocates nothing.
//
// Thread safety: save(), poll() and the accessors are called from one
// thread (the one that uses the communicator); the writer thread is
// internal. Destruction waits for a write in flight; a save not yet
// published is abandoned (its tmp folder is removed by the next publish).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "ckpt/env.h"
#include "core/status.h"
#include "comm/communicator.h"
#include "tensor/slice.h"

namespace tessera::ckpt {

enum class OnBusy { kWait, kSkip };

struct CheckpointerOptions {
  std::string dir;  // checkpoint root, the same (shared) folder on every rank
  int keep = 0;     // published checkpoints to keep, newest by step; 0 keeps all
  OnBusy on_busy = OnBusy::kWait;
  nlohmann::json config = nlohmann::json::object();  // copied into each manifest (rank 0's)
  nlohmann::json layout = nlohmann::json::object();  // copied into each manifest (rank 0's)
  // Not owned; must outlive the Checkpointer. nullptr: posix_env().
  Env* env = nullptr;
  // Non-zero: this rank's shard writes fail with this errno after half
  // their bytes (FaultEnv), as a full or failing disk would; a test's fault
  // (core/fault_plan.h, TESSERA_CKPT_FAULT).
  int fault_errno = 0;
};

// One piece of a global tensor held by this rank.
struct SavePiece {
  std::string name;             // e.g. "param/qkvw"; unique among this rank's pieces; opaque
  TensorSlice slice;            // where the piece sits in the global tensor
  const float* data = nullptr;  // slice.numel() floats of host memory; read only inside save()
};

struct SaveStats {
  double stall_ms = 0;       // save(): wait for a busy writer + copy into staging
  uint64_t bytes_rank = 0;   // this rank's shard file
  uint64_t bytes_total = 0;  // all shard files
  double write_s = 0;        // this rank's writer thread: hash, write, fsync
  double write_mb_s = 0;     // bytes_rank / write_s, in 10^6 bytes per second
};

enum class SaveState {
  kIdle,       // no save pending; poll() did nothing
  kPending,    // a save is still being written somewhere
  kPublished,  // DIR/step-N is complete and DIR/latest names it
  kFailed,     // nothing was published; error says why
};

struct PollResult {
  SaveState state = SaveState::kIdle;
  int64_t step = -1;    // the save's step (kPending, kPublished, kFailed)
  Status error;         // kFailed: "checkpoint step N: rank R: FILE: write failed: <strerror>"
  std::string warning;  // kPublished: a pruning problem, else empty
  SaveStats stats;      // kPublished (and kFailed: the stall)
};

class Checkpointer {
 public:
  explicit Checkpointer(CheckpointerOptions options);
  ~Checkpointer();
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  // Stages `pieces` and `state` (the caller's per-rank state, stored in the
  // shard's __metadata__ under "tessera_state"; by convention JSON) and
  // starts writing them. Collective: all ranks save the same steps. Returns
  // false when skipped (OnBusy::kSkip and a save pending). Bad pieces (wrong
  // slice, duplicate name) fail the save through poll(), not here. When it
  // had to wait, the previous save's PollResult is returned by the next poll().
  Result<bool> save(comm::Communicator& world, int64_t step, std::span<const SavePiece> pieces,
                    std::string_view state);

  // See the file comment. wait_for_it: block until this rank's writer is
  // done, so the save completes in this call. Without a pending save (and
  // no deferred result) returns kIdle at once with no communication.
  Result<PollResult> poll(comm::Communicator& world, bool wait_for_it);

  bool pending() const { return pending_; }
  const std::string& dir() const { return options_.dir; }
  size_t staging_bytes() const { return staging_.size() * sizeof(float); }
  // Allocates (and touches) the staging buffer for `floats` floats now, so
  // the first save() stalls only for its copy. Call with no save pending.
  // ResourceExhausted (naming the size) when the host cannot give it.
  Status reserve_staging(size_t floats) { return pending_ ? Status::OK() : grow_staging(floats); }

 private:
  enum class WriterState { kIdle, kWriting, kDurable, kFailed };
  struct StagedPiece {
    std::string name;
    TensorSlice slice;
    size_t offset = 0;  // in floats, into staging_
  };

  Status grow_staging(size_t floats);  // staging_ to at least floats, or out of memory
  void writer_loop();
  Status write_shard();  // the writer thread's job; fills shard_json_
  Result<PollResult> complete(comm::Communicator& world, bool wait_for_it);
  // Rank 0: manifest, renames, latest, pruning. Fills *total_bytes; pruning
  // problems go to *warning.
  Status publish(const std::vector<std::string>& shard_json, uint64_t* total_bytes, std::string* warning);
  Env& env() const { return options_.env != nullptr ? *options_.env : posix_env(); }
  std::string tmp_dir(int64_t step) const;

  const CheckpointerOptions options_;

  // Training thread only.
  bool pending_ = false;
  int64_t pending_step_ = -1;
  double stall_ms_ = 0;
  std::optional<PollResult> deferred_;

  // Handed over under mu_: the training thread writes them before setting
  // writer_state_ = kWriting; the writer reads them until it leaves kWriting.
  std::vector<StagedPiece> staged_;
  std::vector<float> staging_;  // grows, never shrinks
  size_t job_floats_ = 0;        // staging_ floats in use
  std::string rank_state_;
  int64_t job_step_ = -1;
  int job_rank_ = 0;
  int job_fault_ = 0;  // errno to inject (TESSERA_CKPT_FAULT), 0 for none

  // Written by the writer before it leaves kWriting, read after.
  std::string shard_json_;  // this rank's ShardRecord as JSON text
  Status write_error_;
  uint64_t bytes_rank_ = 0;
  double write_s_ = 0;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  WriterState writer_state_ = WriterState::kIdle;  // guarded by mu_
  bool stop_ = false;                               // guarded by mu_
  std::thread writer_;
};

}  // namespace tessera::ckpt
