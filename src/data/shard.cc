#include "data/shard.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>

#include "io/file.h"         // io::open_regular_file
#include "io/safetensors.h"  // io::write_file_atomic

namespace tessera::data {
namespace {

// Header ints and tokens are copied straight out of the file.
static_assert(std::endian::native == std::endian::little, "token shards assume a little-endian host");

using ShardHeader = std::array<int32_t, kShardHeaderInts>;

Status errno_status(const std::string& path, std::string_view what) {
  return Status::IOError(fmt::format("{}: {}: {}", path, what, std::strerror(errno)));
}

using io::UniqueFd;

// An open shard whose header has been checked against the file size.
struct OpenShard {
  UniqueFd fd;
  int64_t count = 0;
};

// Reads exactly n bytes at `offset`.
Status pread_all(int fd, void* dst, size_t n, int64_t offset, const std::string& path) {
  auto* out = static_cast<char*>(dst);
  while (n > 0) {
    ssize_t got = ::pread(fd, out, n, offset);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) return errno_status(path, "read failed");
    if (got == 0) return Status::IOError(fmt::format("{}: file shrank while being read", path));
    out += got;
    n -= static_cast<size_t>(got);
    offset += got;
  }
  return Status::OK();
}

Result<OpenShard> open_shard(const std::string& path) {
  // A FIFO, a folder or a device is refused by name, without blocking.
  ASSIGN_OR_RETURN(UniqueFd fd, io::open_regular_file(path));
  const int raw_fd = fd.get();
  OpenShard shard{std::move(fd)};  // owns the fd from here on
  struct stat info;
  if (::fstat(raw_fd, &info) != 0) return errno_status(path, "cannot stat");
  const int64_t file_bytes = info.st_size;
  if (file_bytes < kShardHeaderBytes)
    return Status::Corruption(fmt::format("{}: file is {} bytes, shorter than the {}-byte shard header (truncated?)",
                                          path, file_bytes, kShardHeaderBytes));
  ShardHeader header;
  RETURN_IF_ERROR(pread_all(raw_fd, header.data(), kShardHeaderBytes, 0, path));
  if (header[0] != kShardMagic)
    return Status::Corruption(fmt::format("{}: wrong magic {} (expected {}); not an llm.c token shard", path,
                                          header[0], kShardMagic));
  if (header[1] != kShardVersion)
    return Status::Corruption(
        fmt::format("{}: unsupported shard version {} (expected {})", path, header[1], kShardVersion));
  const int64_t count = header[2];
  if (count < 0) return Status::Corruption(fmt::format("{}: negative token count {}", path, count));
  const int64_t expected_bytes = kShardHeaderBytes + 2 * count;
  if (file_bytes != expected_bytes)
    return Status::Corruption(fmt::format("{}: token count {} needs a file of {} bytes, but the file is {} bytes",
                                          path, count, expected_bytes, file_bytes));
  shard.count = count;
  return shard;
}

}  // namespace

Status write_shard(const std::string& path, std::span<const uint16_t> tokens) {
  if (tokens.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max()))
    return Status::InvalidArgument(
        fmt::format("{}: {} tokens do not fit in one shard (the count is an int32)", path, tokens.size()));
  ShardHeader header{};  // reserved ints stay zero
  header[0] = kShardMagic;
  header[1] = kShardVersion;
  header[2] = static_cast<int32_t>(tokens.size());
  const std::span<const std::byte> pieces[] = {std::as_bytes(std::span(header)), std::as_bytes(tokens)};
  return io::write_file_atomic(path, pieces);
}

Status check_token_ids(std::span<const uint16_t> tokens, int vocab, const std::string& path) {
  for (size_t i = 0; i < tokens.size(); i++)
    if (tokens[i] >= vocab)
      return Status::InvalidArgument(
          fmt::format("{}: token id {} at token {} (byte offset {}) is outside the vocabulary [0, {})", path,
                      tokens[i], i, kShardHeaderBytes + 2 * static_cast<int64_t>(i), vocab));
  return Status::OK();
}

Result<int64_t> read_shard_token_count(const std::string& path) {
  ASSIGN_OR_RETURN(OpenShard shard, open_shard(path));
  return shard.count;
}

Result<std::vector<uint16_t>> read_shard(const std::string& path) {
  ASSIGN_OR_RETURN(OpenShard shard, open_shard(path));
  std::vector<uint16_t> tokens(static_cast<size_t>(shard.count));
  RETURN_IF_ERROR(pread_all(shard.fd.get(), tokens.data(), tokens.size() * 2, kShardHeaderBytes, path));
  return tokens;
}

}  // namespace tessera::data
