#include "io/file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace tessera::io {

namespace {

Status errno_status(const std::string& path, std::string_view what, int err) {
  return Status::IOError(fmt::format("{}: {}: {}", path, what, std::strerror(err)));
}

Status not_regular(const std::string& path, unsigned mode) {
  return Status::InvalidArgument(fmt::format("{}: is {}, not a regular file", path, file_kind(mode)));
}

}  // namespace

int UniqueFd::close() {
  const int rc = ::close(fd_);
  fd_ = -1;
  return rc;
}

void UniqueFd::reset() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

std::string file_kind(unsigned mode) {
  if (S_ISREG(mode)) return "a regular file";
  if (S_ISDIR(mode)) return "a folder";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a file";
}

Result<UniqueFd> open_regular_file(const std::string& path) {
  // stat first names a socket (which open() refuses with ENXIO) and skips
  // opening a device at all; the fstat below closes the race with a path
  // replaced in between.
  struct stat info;
  if (::stat(path.c_str(), &info) != 0) {
    const int err = errno;
    if (err == ENOENT) return Status::NotFound(fmt::format("{}: cannot open: {}", path, std::strerror(err)));
    return errno_status(path, "cannot open", err);
  }
  if (!S_ISREG(info.st_mode)) return not_regular(path, info.st_mode);
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));
  if (fd.get() < 0) {
    const int err = errno;
    if (err == ENOENT) return Status::NotFound(fmt::format("{}: cannot open: {}", path, std::strerror(err)));
    return errno_status(path, "cannot open", err);
  }
  if (::fstat(fd.get(), &info) != 0) return errno_status(path, "cannot stat", errno);
  if (!S_ISREG(info.st_mode)) return not_regular(path, info.st_mode);
  const int flags = ::fcntl(fd.get(), F_GETFL);
  if (flags < 0 || ::fcntl(fd.get(), F_SETFL, flags & ~O_NONBLOCK) != 0)
    return errno_status(path, "cannot clear O_NONBLOCK", errno);
  return fd;
}

Status check_regular_file(const std::string& path) {
  ASSIGN_OR_RETURN(UniqueFd fd, open_regular_file(path));
  return Status::OK();
}

}  // namespace tessera::io
