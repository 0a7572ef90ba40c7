#include "io/checksum.h"

#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <memory>
#include <vector>

#include <fmt/format.h>
#include <xxhash.h>

#include "io/file.h"

namespace tessera::io {

uint64_t xxh64(std::span<const std::byte> bytes) { return XXH64(bytes.data(), bytes.size(), 0); }
uint64_t xxh64(std::string_view text) { return XXH64(text.data(), text.size(), 0); }

Result<FileDigest> file_xxh64(const std::string& path) {
  ASSIGN_OR_RETURN(UniqueFd fd, open_regular_file(path));
  std::unique_ptr<XXH64_state_t, decltype(&XXH64_freeState)> hash(XXH64_createState(), &XXH64_freeState);
  if (!hash) return Status::ResourceExhausted("cannot allocate an XXH64 state");
  XXH64_reset(hash.get(), 0);
  std::vector<char> buffer(size_t{1} << 20);
  FileDigest d;
  for (;;) {
    const ssize_t n = ::read(fd.get(), buffer.data(), buffer.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status::IOError(fmt::format("{}: read failed: {}", path, std::strerror(errno)));
    if (n == 0) break;
    XXH64_update(hash.get(), buffer.data(), static_cast<size_t>(n));
    d.bytes += static_cast<uint64_t>(n);
  }
  d.xxh64 = XXH64_digest(hash.get());
  return d;
}

std::string hex64(uint64_t v) { return fmt::format("{:016x}", v); }

std::optional<uint64_t> parse_hex64(std::string_view s) {
  if (s.size() != 16) return std::nullopt;
  uint64_t v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v, 16);
  if (ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  return v;
}

}  // namespace tessera::io
