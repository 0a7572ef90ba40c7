#include "ckpt/dir_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace tessera::ckpt {

namespace {

// The lock file's whole text (at most 4 KiB: the holder line is short).
std::string read_text(int fd) {
  char buf[4096];
  const ssize_t n = pread(fd, buf, sizeof(buf), 0);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
}

// The holder a lock file names; an unreadable line still says something.
LockHolder parse_holder(const std::string& text) {
  LockHolder h;
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_object()) {
    h.job = j.value("job", "");
    h.host = j.value("host", "");
    h.pid = j.value("pid", int64_t{0});
    h.since = j.value("since", "");
  }
  if (h.host.empty() && h.pid == 0) h.job = "(unreadable lock file: " + text.substr(0, 80) + ")";
  return h;
}

std::string now_text() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%S", &tm);
  return buf;
}

}  // namespace

std::string LockHolder::str() const {
  return fmt::format("job {} on host {} (pid {}{}{})", job.empty() ? "?" : job, host.empty() ? "?" : host, pid,
                     since.empty() ? "" : ", since ", since);
}

DirLock& DirLock::operator=(DirLock&& o) noexcept {
  if (this != &o) {
    release();
    fd_ = std::move(o.fd_);
    path_ = std::move(o.path_);
  }
  return *this;
}

DirLock::~DirLock() { release(); }

void DirLock::release() {
  if (fd_.get() < 0) return;
  // Emptied, so the next job does not take a clean end for a dead holder;
  // closing the descriptor releases the lock.
  if (ftruncate(fd_.get(), 0) != 0) {
    // Nothing to do: the next job then reports a takeover, which is harmless.
  }
  fd_.close();
}

Result<DirLock> DirLock::acquire(const std::string& dir, const std::string& job, const std::string& host,
                                 std::string* took_over) {
  if (took_over) took_over->clear();
  const std::string path = dir + "/" + kLockFile;
  // A DirLock owns a descriptor only once it holds the lock: release()
  // empties the file, which must never happen to another job's line.
  io::UniqueFd fd(open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644));
  if (fd.get() < 0) return Status::IOError(fmt::format("{}: cannot open the lock file: {}", path, std::strerror(errno)));
  if (flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    if (err == EWOULDBLOCK) {
      const LockHolder h = parse_holder(read_text(fd.get()));
      return Status::Unavailable(fmt::format(
          "{} is locked by {}: another job is writing checkpoints there; wait for it to end, end it, or choose "
          "another checkpoint.dir",
          dir, h.str()));
    }
    return Status::IOError(fmt::format("{}: cannot lock: {} (checkpoint folders need a file system with flock)",
                                       path, std::strerror(err)));
  }
  DirLock lock;
  lock.fd_ = std::move(fd);
  lock.path_ = path;
  // Ours now. A holder still named is one that died without releasing.
  const std::string previous = read_text(lock.fd_.get());
  if (took_over && previous.find_first_not_of(" \n\t") != std::string::npos)
    *took_over = parse_holder(previous).str();
  const nlohmann::json j = {{"job", job}, {"host", host}, {"pid", static_cast<int64_t>(getpid())}, {"since", now_text()}};
  const std::string line = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  if (ftruncate(lock.fd_.get(), 0) != 0 ||
      pwrite(lock.fd_.get(), line.data(), line.size(), 0) != static_cast<ssize_t>(line.size()))
    return Status::IOError(fmt::format("{}: cannot write the lock file: {}", path, std::strerror(errno)));
  return lock;
}

}  // namespace tessera::ckpt
