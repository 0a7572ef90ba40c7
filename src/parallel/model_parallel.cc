#include "parallel/model_parallel.h"

#include <chrono>
#include <cstring>

#include <fmt/format.h>

namespace tessera {

ModelShard shard_for(const dist::MeshShape& shape, const dist::MeshCoord& coord,
                     const std::vector<int>& stage_layers) {
  ModelShard s;
  s.tp = shape.tp;
  s.tp_rank = coord.tp;
  for (int i = 0; i < coord.pp; i++) s.layer_begin += stage_layers[i];
  s.layer_end = s.layer_begin + stage_layers[coord.pp];
  return s;
}

void copy_from_whole(const GPT& whole, GPT& shard) {
  for (int id = 0; id < kNumParams; id++) {
    TensorSlice t = param_slice(shard.config(), shard.shard(), id);
    if (t.block_numel() == 0) continue;
    // whole's wte has padded_vocab(1) rows; a tp shard's view may have more
    // (padded_vocab(tp)): the rows past whole's are padding, zero.
    if (id == kWte && t.global[0] != whole.params().tensor(id).shape[0]) {
      const int64_t C = whole.config().channels, rows = whole.params().tensor(id).shape[0];
      std::vector<float> padded(t.global.numel(), 0.0f);
      std::memcpy(padded.data(), whole.params().tensor(id).f32(), sizeof(float) * rows * C);
      gather_block(padded.data(), t, shard.params().tensor(id).f32());
      continue;
    }
    gather_block(whole.params().tensor(id).f32(), t, shard.params().tensor(id).f32());
  }
}

Status gather_whole(GPT& shard, dist::Mesh& mesh, const std::vector<int>& stage_layers, GPT* whole) {
  dist::Communicator& world = mesh.world();
  const dist::MeshShape& shape = mesh.shape();
  const int kTag = 7001;
  if (mesh.coord().dp == 0 && world.rank() != 0) {
    const Arena& p = shard.params();
    return world.send(p.base(), static_cast<int64_t>(p.bytes()), 0, kTag);
  }
  if (world.rank() != 0) return Status::OK();
  std::vector<char> buf;
  for (int q = 0; q < shape.size(); q++) {
    const dist::MeshCoord c = dist::mesh_coord(shape, q);
    if (c.dp != 0) continue;
    const ModelShard s = shard_for(shape, c, stage_layers);
    // The peer's arena layout: the same reserve sequence as GPT's constructor.
    GPT layout_only(shard.config(), Backend::kRef, s, &world);
    const Arena* src = &shard.params();
    if (q != 0) {
      buf.resize(layout_only.params().bytes());
      RETURN_IF_ERROR(world.recv(buf.data(), static_cast<int64_t>(buf.size()), q, kTag));
    }
    for (int id = 0; id < kNumParams; id++) {
      TensorSlice t = param_slice(shard.config(), s, id);
      if (t.block_numel() == 0) continue;
      const float* local = q == 0 ? src->tensor(id).f32()
                                  : reinterpret_cast<const float*>(buf.data() + layout_only.params().offset(id));
      float* dst = whole->params().tensor(id).f32();
      if (id == kWte && t.global[0] != whole->params().tensor(id).shape[0]) {
        // Padded more for tp: scatter into a padded copy, keep whole's rows.
        const int64_t C = shard.config().channels, rows = whole->params().tensor(id).shape[0];
        std::vector<float> padded(t.global.numel(), 0.0f);
        std::memcpy(padded.data(), dst, sizeof(float) * rows * C);
        scatter_block(local, t, padded.data());
        std::memcpy(dst, padded.data(), sizeof(float) * rows * C);
        continue;
      }
      scatter_block(local, t, dst);
    }
  }
  return Status::OK();
}

Result<std::unique_ptr<TiedEmbedding>> TiedEmbedding::create(dist::Mesh& mesh) {
  auto tied = std::make_unique<TiedEmbedding>();
  const int pp = mesh.shape().pp, stage = mesh.coord().pp;
  if (pp == 1) return tied;
  const bool holds = stage == 0 || stage == pp - 1;
  ASSIGN_OR_RETURN(std::unique_ptr<dist::Communicator> c, mesh.pp().split(holds ? 0 : 1, stage, "embed"));
  if (holds) tied->comm_ = std::move(c);
  return tied;
}

Status TiedEmbedding::sum_grads(GPT& model) {
  if (!comm_) return Status::OK();
  auto t0 = std::chrono::steady_clock::now();
  Tensor g = model.grads().tensor(kWte);
  Status st = comm_->all_reduce(g.f32(), g.f32(), g.numel(), dist::ElemType::kF32, dist::ReduceOp::kSum);
  seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return st;
}

}  // namespace tessera
