// The manifest of a sharded checkpoint (docs/formats/checkpoint.md): which
// shard files a step folder holds, their sizes and checksums, and where each
// stored piece sits inside its global tensor. Plain data; thread compatible.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "tensor/slice.h"

namespace tessera::ckpt {

constexpr int kFormatVersion = 1;
constexpr const char* kFormatName = "tessera-checkpoint";
constexpr const char* kManifestFile = "manifest.json";
constexpr const char* kLatestFile = "latest";
// Key of the caller's per-rank state in each shard's safetensors __metadata__.
constexpr const char* kStateKey = "tessera_state";

// One stored tensor piece (F32) of a shard file.
struct PieceRecord {
  std::string name;    // the caller's, e.g. "param/qkvw"; the safetensors key
  TensorSlice slice;   // flat_end resolved: 0 <= flat_begin <= flat_end <= block_numel()
  uint64_t offset = 0; // first byte in the shard file (not the data region)
  uint64_t bytes = 0;  // slice.numel() * 4
  uint64_t xxh64 = 0;  // XXH64 (seed 0) of those bytes
};

struct ShardRecord {
  std::string file;          // "shard-00003.safetensors", inside the step folder
  int rank = 0;
  uint64_t bytes = 0;        // file size
  uint64_t xxh64 = 0;        // XXH64 (seed 0) of the whole file
  uint64_t state_xxh64 = 0;  // XXH64 of the state string in the file's __metadata__
  std::vector<PieceRecord> pieces;
};

struct Manifest {
  int64_t step = 0;
  int world_size = 1;
  nlohmann::json config = nlohmann::json::object();  // the caller's, opaque
  nlohmann::json layout = nlohmann::json::object();  // the caller's, opaque
  std::vector<ShardRecord> shards;                   // sorted by rank, one per rank
};

nlohmann::json shard_to_json(const ShardRecord& s);
// With "manifest_xxh64": the XXH64 (seed 0) of the compact dump of every
// other field (nlohmann's dump: keys sorted, no spaces), so an edit of the
// config, the piece list or any checksum is caught (check_manifest_checksum).
nlohmann::json manifest_to_json(const Manifest& m);
// A manifest's self-check, run by Checkpoint::open after the structural
// checks: Corruption when "manifest_xxh64" does not match the rest. A
// manifest without the field (written before it existed) passes.
Status check_manifest_checksum(std::string_view text);
// XXH64 of a manifest object's compact dump without "manifest_xxh64".
uint64_t manifest_content_xxh64(nlohmann::json j);
// Every check of docs/formats/checkpoint.md; errors are one line (Corruption)
// without the file name, which the caller prefixes.
Result<ShardRecord> shard_from_json(const nlohmann::json& j);
Result<Manifest> parse_manifest(std::string_view text);

// A slice the format accepts: view rank 1..6 matching begin/size, same numel
// as global, block inside the view, flat range inside the block. Checked
// without CHECK so bad files and bad callers get a Status (InvalidArgument).
Status check_slice(const TensorSlice& s);

std::string step_dir_name(int64_t step);   // "step-00000050"
std::string shard_file_name(int rank);     // "shard-00003.safetensors"
// 50 for "step-00000050"; nullopt for anything else.
std::optional<int64_t> parse_step_dir_name(std::string_view name);
std::string hex64(uint64_t v);             // 16 lower-case hex digits

}  // namespace tessera::ckpt
