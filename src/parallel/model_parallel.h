// Glue between the dp x tp x pp mesh and a GPT shard: which part of the model
// a rank holds, moving parameters between a whole model and the shards, and
// the tied embedding shared by the first and last pipeline stages.
#pragma once

#include <memory>
#include <vector>

#include "core/status.h"
#include "comm/mesh.h"
#include "nn/gpt.h"

namespace tessera {

// The shard of the rank at `coord`: tp rank coord.tp, the layers of stage
// coord.pp given every stage's layer count.
ModelShard shard_for(const comm::MeshShape& shape, const comm::MeshCoord& coord, const std::vector<int>& stage_layers);

// shard's parameters = its blocks of whole's (same GPTConfig).
void copy_from_whole(const GPT& whole, GPT& shard);

// Assembles the whole model's parameters into *whole on world rank 0 (whole
// is null elsewhere) from the shards of dp rank 0. Collective over the world.
Status gather_whole(GPT& shard, comm::Mesh& mesh, const std::vector<int>& stage_layers, GPT* whole);

// With pp > 1 the first stage's token embedding and the last stage's output
// layer are one tensor (wte), held by both: their gradients are summed so the
// two copies stay identical. Collective over the pp axis at create().
class TiedEmbedding {
 public:
  static Result<std::unique_ptr<TiedEmbedding>> create(comm::Mesh& mesh);
  // Sums wte's gradient between the two stages (no-op with pp == 1 and on
  // middle stages).
  Status sum_grads(GPT& model);
  double seconds() const { return seconds_; }  // in sum_grads, since the last call of take_seconds
  double take_seconds() {
    double s = seconds_;
    seconds_ = 0.0;
    return s;
  }

 private:
  std::unique_ptr<comm::Communicator> comm_;  // first and last stage; null if not one of them or pp == 1
  double seconds_ = 0.0;
};

}  // namespace tessera
