#include "ckpt/env.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <vector>

#include "io/file.h"

namespace tessera::ckpt {
namespace {

// "<file>: <what>: <strerror(err)>".
Status io_error(const std::string& file, std::string_view what, int err) {
  return Status::IOError(fmt::format("{}: {}: {}", file, what, std::strerror(err)));
}

class PosixEnv : public Env {
 public:
  Status write_file(const std::string& path, std::span<const std::span<const std::byte>> pieces) override {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return io_error(path, "cannot create", errno);
    Status st;
    for (std::span<const std::byte> piece : pieces) {
      while (!piece.empty() && st.ok()) {
        const ssize_t n = ::write(fd, piece.data(), piece.size());
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) st = io_error(path, "write failed", errno);
        else piece = piece.subspan(static_cast<size_t>(n));
      }
      if (!st.ok()) break;
    }
    if (st.ok() && ::fsync(fd) != 0) st = io_error(path, "fsync failed", errno);
    // close() reports some errors late (NFS); a failed close is a failed write.
    if (::close(fd) != 0 && st.ok()) st = io_error(path, "close failed", errno);
    if (!st.ok()) ::unlink(path.c_str());
    return st;
  }
};

}  // namespace

Env& posix_env() {
  static PosixEnv env;
  return env;
}

Status FaultEnv::write_file(const std::string& path, std::span<const std::span<const std::byte>> pieces) {
  size_t total = 0;
  for (auto p : pieces) total += p.size();
  // The first half of the bytes really reach the file, so cleanup is exercised.
  std::vector<std::span<const std::byte>> half;
  size_t left = total / 2;
  for (auto p : pieces) {
    if (left == 0) break;
    half.push_back(p.first(std::min(left, p.size())));
    left -= half.back().size();
  }
  Status st = base_.write_file(path, half);
  if (!st.ok()) return st;
  ::unlink(path.c_str());
  return io_error(path, "write failed", err_);
}

Status sync_dir(const std::string& dir) { return io::sync_dir(dir); }

}  // namespace tessera::ckpt
