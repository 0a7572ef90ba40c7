// Env: the file writes a checkpoint makes, behind a small interface so tests
// can inject I/O faults (LevelDB's Env idea). Reads and folder operations
// (mkdir, rename, fsync of a folder) go straight to POSIX.
// A test's failing disk: CheckpointerOptions::fault_errno (from the CLI's
// fault plan, core/fault_plan.h: TESSERA_CKPT_FAULT) wraps the shard write
// in a FaultEnv.
#pragma once

#include <cstddef>
#include <span>
#include <string>

#include "core/status.h"

namespace tessera::ckpt {

class Env {
 public:
  virtual ~Env() = default;
  // Creates or truncates `path`, writes `pieces` back to back, fsyncs and
  // closes it. On error the partial file is removed and the Status (IOError)
  // is one line naming the file and strerror. Called from the writer thread
  // and the training thread: implementations must be thread safe.
  virtual Status write_file(const std::string& path, std::span<const std::span<const std::byte>> pieces) = 0;
};

// Plain POSIX. Stateless, thread safe, lives forever.
Env& posix_env();

// Writes half of the bytes through `base`, then fails with errno `err`
// (e.g. EIO, ENOSPC) and removes the partial file. `base` must outlive it.
class FaultEnv : public Env {
 public:
  FaultEnv(Env& base, int err) : base_(base), err_(err) {}
  Status write_file(const std::string& path, std::span<const std::span<const std::byte>> pieces) override;

 private:
  Env& base_;
  int err_;
};

// fsync of a folder, making renames and new entries in it durable. File
// systems that cannot fsync a folder (EINVAL) count as success.
Status sync_dir(const std::string& dir);

}  // namespace tessera::ckpt
