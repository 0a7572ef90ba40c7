#include "io/file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

namespace tessera::io {

namespace fs = std::filesystem;

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

Status check_writable_folder(const std::string& dir) {
  if (dir.empty()) return Status::InvalidArgument("the folder is an empty path");
  std::error_code ec;
  const fs::file_status st = fs::status(dir, ec);
  if (fs::exists(st) && !fs::is_directory(st)) {
    struct stat info;
    const unsigned mode = ::stat(dir.c_str(), &info) == 0 ? info.st_mode : 0;
    return Status::InvalidArgument(fmt::format("{}: is {}, not a folder", dir, file_kind(mode)));
  }
  if (!fs::exists(st)) {
    fs::create_directories(dir, ec);
    if (ec) return Status::IOError(fmt::format("{}: cannot create the folder: {}", dir, ec.message()));
  }
  // The probe's name is unique to this process, so two jobs checking one
  // folder do not remove each other's probe.
  const std::string probe = (fs::path(dir) / fmt::format(".tessera-write-probe-{}", ::getpid())).string();
  UniqueFd fd(::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
  if (fd.get() < 0) return errno_status(dir, "cannot create files in the folder", errno);
  fd.close();
  if (::unlink(probe.c_str()) != 0) return errno_status(probe, "cannot remove the write probe", errno);
  return Status::OK();
}

Status check_writable_file(const std::string& path) {
  if (path.empty()) return Status::InvalidArgument("the output file is an empty path");
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (fs::exists(st) && !fs::is_regular_file(st)) {
    struct stat info;
    const unsigned mode = ::stat(path.c_str(), &info) == 0 ? info.st_mode : 0;
    return Status::InvalidArgument(fmt::format("{}: is {}, not a regular file", path, file_kind(mode)));
  }
  std::string dir = fs::path(path).parent_path().string();
  if (dir.empty()) dir = ".";
  return check_writable_folder(dir);
}

Status check_openable_for_writing(const std::string& path) {
  if (path.empty()) return Status::InvalidArgument("the output file is an empty path");
  if (const fs::path dir = fs::path(path).parent_path(); !dir.empty()) {
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) {
      fs::create_directories(dir, ec);
      if (ec) return Status::IOError(fmt::format("{}: cannot create the folder: {}", dir.string(), ec.message()));
    }
  }
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_NONBLOCK | O_CLOEXEC, 0644));
  if (fd.get() < 0) return errno_status(path, "cannot open for writing", errno);
  return Status::OK();
}

Status sync_dir(const std::string& dir) {
  UniqueFd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (fd.get() < 0) return errno_status(dir, "cannot open folder to fsync", errno);
  if (::fsync(fd.get()) != 0 && errno != EINVAL) return errno_status(dir, "fsync of folder failed", errno);
  return Status::OK();
}

}  // namespace tessera::io
