// Checkpoint: a published sharded checkpoint (docs/formats/checkpoint.md),
// opened for reading by any parallel layout.
//
// open() reads and validates only the manifest. read() reads, with pread,
// only the stored pieces whose blocks meet the wanted block, checks each
// one's XXH64 and copies the intersection: a checkpoint written by one
// layout is read by another (resharding). verify() checks whole files.
//
// Immutable after open(); every method is const and safe to call from many
// threads at once (each call opens the files it needs). Errors are one line
// naming the file (or, for a tensor-level problem, the checkpoint folder).
#pragma once

#include <map>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ckpt/manifest.h"
#include "core/status.h"
#include "tensor/slice.h"

namespace tessera::ckpt {

// The step folder `path` names: `path` itself when it holds manifest.json,
// else the folder named by `path`/latest (a checkpoint root). NotFound when
// it is neither.
Result<std::string> resolve_checkpoint_dir(const std::string& path);

class Checkpoint {
 public:
  // `path`: a step folder (DIR/step-00000050) or a checkpoint root (follows
  // DIR/latest). Errors: NotFound (no checkpoint there), Corruption (bad
  // manifest or latest pointer), IOError.
  static Result<Checkpoint> open(const std::string& path);

  const std::string& dir() const { return dir_; }  // the step folder
  const Manifest& manifest() const { return manifest_; }
  int64_t step() const { return manifest_.step; }
  int world_size() const { return manifest_.world_size; }
  const nlohmann::json& config() const { return manifest_.config; }
  const nlohmann::json& layout() const { return manifest_.layout; }

  std::vector<std::string> names() const;  // every stored tensor name, sorted
  // The stored tensor's global shape and its view (shared by its pieces).
  Result<Shape> global_shape(std::string_view name) const;
  Result<Shape> view_shape(std::string_view name) const;
  // The per-rank state string saved by `rank` (0 <= rank < world_size()),
  // checked against the manifest's checksum.
  Result<std::string> state(int rank) const;

  // Checks every shard file's size and XXH64 against the manifest (reads
  // every byte). Corruption names the file and expected vs actual values.
  Status verify() const;

  // Fills out (wanted.numel() floats, in wanted's stored order: the flat
  // range of its block, row-major) with tensor `name`. wanted must have the
  // stored view's rank; its view extents may differ (padding): elements
  // outside the stored extent are 0. Errors: NotFound (no such tensor),
  // InvalidArgument (bad wanted slice or out size), Corruption (a piece's
  // checksum or bytes; an element inside the stored extent that no piece
  // holds), IOError.
  Status read(std::string_view name, const TensorSlice& wanted, std::span<float> out) const;

 private:
  struct PieceRef {  // indices, so copies and moves stay valid
    size_t shard, piece;
  };
  const ShardRecord& shard_of(PieceRef r) const { return manifest_.shards[r.shard]; }
  const PieceRecord& piece_of(PieceRef r) const { return manifest_.shards[r.shard].pieces[r.piece]; }
  Result<const std::vector<PieceRef>*> find(std::string_view name) const;
  std::string shard_path(const ShardRecord& s) const { return dir_ + "/" + s.file; }

  std::string dir_;
  Manifest manifest_;
  std::map<std::string, std::vector<PieceRef>, std::less<>> index_;  // name -> its pieces, by rank
};

}  // namespace tessera::ckpt
