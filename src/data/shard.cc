#include "data/shard.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
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
  int id_bytes = 2;
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
  if (header[1] != kShardVersion && header[1] != kShardVersion32)
    return Status::Corruption(fmt::format("{}: unsupported shard version {} (expected {} or {})", path, header[1],
                                          kShardVersion, kShardVersion32));
  shard.id_bytes = header[1] == kShardVersion ? 2 : 4;
  const int64_t count = header[2];
  if (count < 0) return Status::Corruption(fmt::format("{}: negative token count {}", path, count));
  const int64_t expected_bytes = kShardHeaderBytes + shard.id_bytes * count;
  if (file_bytes != expected_bytes)
    return Status::Corruption(fmt::format("{}: token count {} needs a file of {} bytes, but the file is {} bytes",
                                          path, count, expected_bytes, file_bytes));
  shard.count = count;
  return shard;
}

}  // namespace

namespace {

Status write_shard_bytes(const std::string& path, int32_t version, size_t count, std::span<const std::byte> ids) {
  if (count > static_cast<size_t>(std::numeric_limits<int32_t>::max()))
    return Status::InvalidArgument(
        fmt::format("{}: {} tokens do not fit in one shard (the count is an int32)", path, count));
  ShardHeader header{};  // reserved ints stay zero
  header[0] = kShardMagic;
  header[1] = version;
  header[2] = static_cast<int32_t>(count);
  const std::span<const std::byte> pieces[] = {std::as_bytes(std::span(header)), ids};
  return io::write_file_atomic(path, pieces);
}

}  // namespace

Status write_shard(const std::string& path, std::span<const uint16_t> tokens) {
  return write_shard_bytes(path, kShardVersion, tokens.size(), std::as_bytes(tokens));
}

Status write_shard(const std::string& path, std::span<const uint32_t> tokens, int id_bits) {
  if (id_bits == 32) return write_shard_bytes(path, kShardVersion32, tokens.size(), std::as_bytes(tokens));
  if (id_bits != 16) return Status::InvalidArgument(fmt::format("{}: token ids of {} bits (expected 16 or 32)", path, id_bits));
  std::vector<uint16_t> narrow(tokens.size());
  for (size_t i = 0; i < tokens.size(); i++) {
    if (tokens[i] > 0xFFFF)
      return Status::InvalidArgument(fmt::format(
          "{}: token id {} at token {} does not fit a 16-bit shard (version 1); write version 2", path, tokens[i], i));
    narrow[i] = static_cast<uint16_t>(tokens[i]);
  }
  return write_shard(path, narrow);
}

int shard_id_bits(int64_t vocab) { return vocab <= 0x10000 ? 16 : 32; }

Status check_token_ids(std::span<const uint32_t> tokens, int vocab, const std::string& path, int id_bytes) {
  for (size_t i = 0; i < tokens.size(); i++)
    if (tokens[i] >= static_cast<uint32_t>(vocab))
      return Status::InvalidArgument(
          fmt::format("{}: token id {} at token {} (byte offset {}) is outside the vocabulary [0, {})", path,
                      tokens[i], i, kShardHeaderBytes + id_bytes * static_cast<int64_t>(i), vocab));
  return Status::OK();
}

Result<int64_t> read_shard_token_count(const std::string& path) {
  ASSIGN_OR_RETURN(OpenShard shard, open_shard(path));
  return shard.count;
}

Result<std::vector<uint32_t>> read_shard(const std::string& path) {
  ASSIGN_OR_RETURN(OpenShard shard, open_shard(path));
  std::vector<uint32_t> tokens(static_cast<size_t>(shard.count));
  if (shard.id_bytes == 4) {
    RETURN_IF_ERROR(pread_all(shard.fd.get(), tokens.data(), tokens.size() * 4, kShardHeaderBytes, path));
    return tokens;
  }
  std::vector<uint16_t> narrow(tokens.size());
  RETURN_IF_ERROR(pread_all(shard.fd.get(), narrow.data(), narrow.size() * 2, kShardHeaderBytes, path));
  std::copy(narrow.begin(), narrow.end(), tokens.begin());
  return tokens;
}

Result<int> read_shard_id_bytes(const std::string& path) {
  ASSIGN_OR_RETURN(OpenShard shard, open_shard(path));
  return shard.id_bytes;
}

}  // namespace tessera::data
