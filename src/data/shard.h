// llm.c token shards (docs/formats/token-shard.md): a header of 256
// little-endian int32 ([0] magic, [1] version, [2] token count, rest zero),
// then `count` uint16 token ids. Free functions, no state: safe from any thread.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"

namespace tessera::data {

constexpr int32_t kShardMagic = 20240520;
constexpr int32_t kShardVersion = 1;
constexpr int kShardHeaderInts = 256;
constexpr int64_t kShardHeaderBytes = kShardHeaderInts * 4;  // 1024

// Writes path + ".tmp", fsyncs, renames over path (see io::write_file_atomic).
// InvalidArgument if there are more tokens than an int32 count can hold.
Status write_shard(const std::string& path, std::span<const uint16_t> tokens);

// All tokens of a shard, after the checks of read_shard_token_count. Only a
// regular file is read: a FIFO, folder or device is refused by name without
// blocking (io::open_regular_file).
Result<std::vector<uint16_t>> read_shard(const std::string& path);

// OK if every token id of a shard read from `path` is below `vocab`;
// otherwise InvalidArgument naming the file, the first bad id and its place
// in the file: "PATH: token id 300 at token 1234 (byte offset 3492) is
// outside the vocabulary [0, 256)".
Status check_token_ids(std::span<const uint16_t> tokens, int vocab, const std::string& path);

// Reads the header only (for loaders that read tokens lazily): checks the
// magic, the version, and that the file is exactly 1024 + 2 * count bytes.
// Returns the token count.
Result<int64_t> read_shard_token_count(const std::string& path);

}  // namespace tessera::data
