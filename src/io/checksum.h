// XXH64 checksums (seed 0) of buffers and whole files, and their text form:
// what checkpoint manifests (docs/formats/checkpoint.md) and model registry
// manifests (docs/formats/registry.md) record. Free functions, no state:
// safe from any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "core/status.h"

namespace tessera::io {

uint64_t xxh64(std::span<const std::byte> bytes);
uint64_t xxh64(std::string_view text);

struct FileDigest {
  uint64_t bytes = 0;  // file size
  uint64_t xxh64 = 0;  // XXH64 (seed 0) of the whole file
};
// Reads `path` once, in 1 MiB pieces (a regular file only, see
// open_regular_file). NotFound, InvalidArgument or IOError naming the file.
Result<FileDigest> file_xxh64(const std::string& path);

std::string hex64(uint64_t v);                         // 16 lower-case hex digits
std::optional<uint64_t> parse_hex64(std::string_view s);  // exactly 16 hex digits

}  // namespace tessera::io
