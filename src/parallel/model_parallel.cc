#include "parallel/model_parallel.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include <fmt/format.h>

#include "obs/trace.h"

namespace tessera {

ModelShard shard_for(const comm::MeshShape& shape, const comm::MeshCoord& coord,
                     const std::vector<int>& stage_layers) {
  ModelShard s;
  s.tp = shape.tp;
  s.tp_rank = coord.tp;
  for (int i = 0; i < coord.pp; i++) s.layer_begin += stage_layers[i];
  s.layer_end = s.layer_begin + stage_layers[coord.pp];
  return s;
}

namespace {

// Shard id's block within `whole`'s tensor. Only wte differs: a tp shard's
// view has padded_vocab(tp) rows, whole's padded_vocab(1); the rows past
// whole's are zero padding, so the block is clipped to them (it is the
// leading dimension, so the clipped block is a prefix of the local tensor).
TensorSlice block_in_whole(const GPT& whole, const GPTConfig& c, const ModelShard& s, int id) {
  TensorSlice t = param_slice(c, s, id);
  const int64_t rows = whole.params().tensor(id).shape[0];
  if ((id == kWte || id == kLmHead) && t.global[0] != rows) {
    t.global.dims[0] = rows;
    t.view.dims[0] = rows;
    t.size[0] = std::clamp<int64_t>(rows - t.begin[0], 0, t.size[0]);
    t.begin[0] = std::min(t.begin[0], rows);
  }
  return t;
}

}  // namespace

void copy_from_whole(const GPT& whole, GPT& shard) {
  for (int id = 0; id < kNumParams; id++) {
    const TensorSlice t = block_in_whole(whole, shard.config(), shard.shard(), id);
    if (t.block_numel() > 0) gather_block(whole.params().tensor(id).f32(), t, shard.params().tensor(id).f32());
  }
}

Status gather_whole(GPT& shard, comm::Mesh& mesh, const std::vector<int>& stage_layers, GPT* whole) {
  comm::Communicator& world = mesh.world();
  const comm::MeshShape& shape = mesh.shape();
  const int kTag = 7001;
  if (mesh.coord().dp == 0 && world.rank() != 0) {
    const Arena& p = shard.params();
    return world.send(p.base(), static_cast<int64_t>(p.bytes()), 0, kTag);
  }
  if (world.rank() != 0) return Status::OK();
  std::vector<char> buf;
  for (int q = 0; q < shape.size(); q++) {
    const comm::MeshCoord c = comm::mesh_coord(shape, q);
    if (c.dp != 0) continue;
    const ModelShard s = shard_for(shape, c, stage_layers);
    const Arena layout = param_layout(shard.config(), s);  // the peer's offsets
    if (q != 0) {
      buf.resize(layout.bytes());
      RETURN_IF_ERROR(world.recv(buf.data(), static_cast<int64_t>(buf.size()), q, kTag));
    }
    for (int id = 0; id < kNumParams; id++) {
      const TensorSlice t = block_in_whole(*whole, shard.config(), s, id);
      if (t.block_numel() == 0) continue;
      const float* local = q == 0 ? shard.params().tensor(id).f32()
                                  : reinterpret_cast<const float*>(buf.data() + layout.offset(id));
      scatter_block(local, t, whole->params().tensor(id).f32());
    }
  }
  return Status::OK();
}

Result<std::unique_ptr<TiedEmbedding>> TiedEmbedding::create(comm::Mesh& mesh) {
  auto tied = std::make_unique<TiedEmbedding>();
  const int pp = mesh.shape().pp, stage = mesh.coord().pp;
  if (pp == 1) return tied;
  const bool holds = stage == 0 || stage == pp - 1;
  ASSIGN_OR_RETURN(std::unique_ptr<comm::Communicator> c, mesh.pp().split(holds ? 0 : 1, stage, "embed"));
  if (holds) tied->comm_ = std::move(c);
  return tied;
}

Status TiedEmbedding::sum_grads(GPT& model) {
  if (!comm_ || !model.config().tied_head) return Status::OK();  // an untied head has its own lm_head
  obs::trace::Span span("tied embedding all_reduce", "comm");
  auto t0 = std::chrono::steady_clock::now();
  Tensor g = model.grads().tensor(kWte);
  Status st = comm_->all_reduce(g.f32(), g.f32(), g.numel(), comm::ElemType::kF32, comm::ReduceOp::kSum);
  seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return st;
}

}  // namespace tessera
