// The checks every input file and output path goes through, and a file
// descriptor owner. Free functions, no state: safe from any thread.
//
// Inputs are regular files only: a FIFO would block open() and read() until
// a writer comes (forever, in a job nobody watches), a device reads as an
// endless or empty stream, a folder is a usage mistake. Each is refused by
// name ("PATH: is a FIFO, not a regular file").
//
// Outputs are checked before a job starts, so a path that cannot be written
// fails in the first second, not after the last training step.
#pragma once

#include <string>
#include <utility>

#include "core/status.h"

namespace tessera::io {

// Owns a file descriptor (-1: none). Move-only.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { reset(); }
  int get() const { return fd_; }
  // Gives up ownership.
  int release() { return std::exchange(fd_, -1); }
  // Closes now, so the caller can see the error (NFS reports some on close).
  int close();

 private:
  void reset();
  int fd_ = -1;
};

// "a FIFO", "a folder", "a character device", ... for a stat mode that is
// not a regular file ("a regular file" for one that is).
std::string file_kind(unsigned mode);

// Opens `path` read-only if it is a regular file (symlinks followed). The
// open itself never blocks: it uses O_NONBLOCK, checks the type with fstat
// on the descriptor it got, then clears O_NONBLOCK. Errors: NotFound if the
// path does not exist; InvalidArgument "PATH: is a FIFO, not a regular file"
// for anything but a regular file; IOError (with strerror) otherwise.
Result<UniqueFd> open_regular_file(const std::string& path);

// The same type check without keeping the file open, for readers that take
// a path (toml++, std::ifstream). Same errors as open_regular_file.
Status check_regular_file(const std::string& path);

// Checks that files can be created in folder `dir`: creates it (and its
// parents) if missing, then creates and removes a probe file in it.
// InvalidArgument for an empty path or a path that exists and is not a
// folder; IOError naming the folder and the reason (read-only file system,
// permission, a parent that is a file) otherwise.
Status check_writable_folder(const std::string& dir);

// Checks that a file can be written at `path` the way the formats write it
// (path.tmp, then a rename): its folder as check_writable_folder, and `path`
// itself, if it exists, a regular file (not a folder, FIFO or device).
Status check_writable_file(const std::string& path);

// Checks a file that is opened and written in place (a log): creates its
// folder if missing, then opens `path` for writing without truncating it
// (creating it if missing) and without blocking; a FIFO without a reader or
// a folder fails. A device such as /dev/stdout passes.
Status check_openable_for_writing(const std::string& path);

// fsync of a folder, making renames and new entries in it durable. File
// systems that cannot fsync a folder (EINVAL) count as success. IOError
// naming the folder otherwise.
Status sync_dir(const std::string& dir);

}  // namespace tessera::io
