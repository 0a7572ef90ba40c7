// DirLock: the advisory lock of a checkpoint folder (docs/formats/checkpoint.md,
// "The lock"), so two jobs never write one folder (they raced: manifests
// missing, "cannot rename", .old-step-* left behind).
//
// The lock is flock(LOCK_EX | LOCK_NB) on DIR/LOCK, held by one process per
// job: the rank that publishes (world rank 0 in tessera train; the other
// ranks write only inside the .tmp folder of a save that rank 0 publishes,
// and they start only after rank 0 holds the lock). The file names the
// holder as one JSON line {"job", "host", "pid", "since"}, for the error a
// second job prints; the lock itself is the kernel's, so it ends with the
// holder's process whatever way it ends (kill -9 included). A DIR/LOCK that
// still names a holder but is not locked is a stale lock of a process that
// died: it is taken over, and acquire() says whose it was. On release the
// file is emptied (never removed: removing it would let two processes lock
// two different files of one name).
//
// flock works between processes of one machine (network namespaces of the
// emulated cluster included) and, on Linux, over NFS (as fcntl locks with
// lockd/NFSv4); a file system that has no locks is an error, not a silent
// pass.
//
// Thread safety: a DirLock is owned by one thread; move-only.
#pragma once

#include <cstdint>
#include <string>

#include "core/status.h"
#include "io/file.h"

namespace tessera::ckpt {

inline constexpr const char* kLockFile = "LOCK";

struct LockHolder {
  std::string job;
  std::string host;
  int64_t pid = 0;
  std::string since;  // local time it took the lock, "2024-05-01 12:00:00"
  // "job J on host H (pid P, since S)"
  std::string str() const;
};

class DirLock {
 public:
  DirLock() = default;
  DirLock(DirLock&&) noexcept = default;
  DirLock& operator=(DirLock&&) noexcept;
  ~DirLock();

  // Locks folder `dir` (which must exist) for this process, as job `job`
  // on host `host`. Errors: Unavailable "DIR is locked by job J on host H
  // (pid P, since S)" when another process holds it; IOError naming the
  // file and the reason otherwise. *took_over, if given, gets the holder
  // of a stale lock that was taken over, else is emptied.
  static Result<DirLock> acquire(const std::string& dir, const std::string& job, const std::string& host,
                                 std::string* took_over = nullptr);

  bool held() const { return fd_.get() >= 0; }
  const std::string& path() const { return path_; }

 private:
  void release();
  io::UniqueFd fd_;
  std::string path_;
};

}  // namespace tessera::ckpt
