// llm.c token shards (docs/formats/token-shard.md): a header of 256
// little-endian int32 ([0] magic, [1] version, [2] token count, rest zero),
// then `count` token ids: uint16 in version 1 (llm.c's), uint32 in version 2
// (vocabularies past 65,536 ids: Llama 3, Qwen). Free functions, no state:
// safe from any thread.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"

namespace tessera::data {

constexpr int32_t kShardMagic = 20240520;
constexpr int32_t kShardVersion = 1;    // uint16 ids
constexpr int32_t kShardVersion32 = 2;  // uint32 ids
constexpr int kShardHeaderInts = 256;
constexpr int64_t kShardHeaderBytes = kShardHeaderInts * 4;  // 1024

// Writes path + ".tmp", fsyncs, renames over path (see io::write_file_atomic).
// InvalidArgument if there are more tokens than an int32 count can hold.
// Version 1 (16-bit ids).
Status write_shard(const std::string& path, std::span<const uint16_t> tokens);
// id_bits 16: version 1 (InvalidArgument naming the first id past 65,535);
// 32: version 2.
Status write_shard(const std::string& path, std::span<const uint32_t> tokens, int id_bits);
// 16 when every id of a vocabulary of `vocab` ids fits in 16 bits, else 32.
int shard_id_bits(int64_t vocab);

// All tokens of a shard of either version, after the checks of
// read_shard_token_count. Only a regular file is read: a FIFO, folder or
// device is refused by name without blocking (io::open_regular_file).
Result<std::vector<uint32_t>> read_shard(const std::string& path);

// OK if every token id of a shard read from `path` is below `vocab`;
// otherwise InvalidArgument naming the file, the first bad id and its place
// in the file: "PATH: token id 300 at token 1234 (byte offset 3492) is
// outside the vocabulary [0, 256)".
// (The byte offset named is that of a version-1 file: 1024 + 2 * index; a
// version-2 file's is 1024 + 4 * index, which the message gives for it.)
Status check_token_ids(std::span<const uint32_t> tokens, int vocab, const std::string& path, int id_bytes = 2);

// Reads the header only (for loaders that read tokens lazily): checks the
// magic, the version, and that the file is exactly 1024 + 2 * count bytes
// (version 1) or 1024 + 4 * count (version 2).
// Returns the token count.
Result<int64_t> read_shard_token_count(const std::string& path);
// 2 (version 1) or 4 (version 2), after the same checks.
Result<int> read_shard_id_bytes(const std::string& path);

}  // namespace tessera::data
