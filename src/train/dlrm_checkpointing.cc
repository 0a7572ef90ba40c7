#include "train/dlrm_checkpointing.h"

#include <fmt/format.h>

namespace tessera {

namespace {

// Rows [r0, r1) of a (rows, cols) tensor (cols 0: a vector of rows).
TensorSlice row_slice(int64_t rows, int64_t cols, int64_t r0, int64_t r1) {
  TensorSlice s;
  if (cols > 0) {
    s.global = Shape{rows, cols};
    s.begin = {r0, 0};
    s.size = {r1 - r0, cols};
  } else {
    s.global = Shape{rows};
    s.begin = {r0};
    s.size = {r1 - r0};
  }
  s.view = s.global;
  return s;
}

}  // namespace

nlohmann::json dlrm_config_json(const DlrmConfig& c) {
  return {{"num_dense", c.num_dense}, {"dim", c.dim},
          {"bottom", c.bottom},       {"top", c.top},
          {"table_rows", c.table_rows}, {"pooling", c.pooling == Pooling::kMean ? "mean" : "sum"}};
}

Status check_dlrm_config(const nlohmann::json& saved, const DlrmConfig& want, const std::string& where) {
  const nlohmann::json w = dlrm_config_json(want);
  for (const auto& [key, value] : w.items()) {
    if (!saved.contains(key))
      return Status::Corruption(fmt::format("{}: the manifest's model config has no '{}'", where, key));
    if (saved[key] != value)
      return Status::InvalidArgument(fmt::format("{} holds a DLRM with {} = {} but the config asks for {}", where, key,
                                                 saved[key].dump(), value.dump()));
  }
  return Status::OK();
}

std::vector<ckpt::SavePiece> dlrm_checkpoint_pieces(DlrmParallel& engine, int rank) {
  std::vector<ckpt::SavePiece> pieces;
  if (rank == 0) {
    const int64_t P = static_cast<int64_t>(engine.dense_params().size());
    const TensorSlice whole = TensorSlice::whole(Shape{P});
    pieces.push_back({"dense", whole, engine.dense_params().data()});
    pieces.push_back({"adam_m", whole, engine.adam_m().data()});
    pieces.push_back({"adam_v", whole, engine.adam_v().data()});
  }
  const DlrmConfig& cfg = engine.config();
  for (const DlrmParallel::TableShard& s : engine.owned_shards()) {
    if (s.row_end <= s.row_begin) continue;
    const int64_t E = cfg.table_rows[s.table];
    pieces.push_back({fmt::format("table/{}", s.table), row_slice(E, cfg.dim, s.row_begin, s.row_end), s.values});
    if (s.accum != nullptr)
      pieces.push_back({fmt::format("adagrad/{}", s.table), row_slice(E, 0, s.row_begin, s.row_end), s.accum});
  }
  return pieces;
}

Result<DlrmResumeState> load_dlrm_checkpoint(const ckpt::Checkpoint& ck, DlrmParallel& engine) {
  if (ck.config().value("kind", "") != "dlrm" || !ck.config().contains("model"))
    return Status::InvalidArgument(fmt::format("{} is not a DLRM checkpoint (its config has no kind \"dlrm\")", ck.dir()));
  RETURN_IF_ERROR(check_dlrm_config(ck.config()["model"], engine.config(), ck.dir()));
  auto read_all = [&](const std::string& name, std::vector<float>& v) {
    return ck.read(name, TensorSlice::whole(Shape{static_cast<int64_t>(v.size())}), std::span<float>(v));
  };
  RETURN_IF_ERROR(read_all("dense", engine.dense_params()));
  RETURN_IF_ERROR(read_all("adam_m", engine.adam_m()));
  RETURN_IF_ERROR(read_all("adam_v", engine.adam_v()));
  const DlrmConfig& cfg = engine.config();
  for (const DlrmParallel::TableShard& s : engine.owned_shards()) {
    const int64_t n = s.row_end - s.row_begin;
    if (n <= 0) continue;
    const int64_t E = cfg.table_rows[s.table];
    RETURN_IF_ERROR(ck.read(fmt::format("table/{}", s.table), row_slice(E, cfg.dim, s.row_begin, s.row_end),
                            std::span<float>(s.values, static_cast<size_t>(n * cfg.dim))));
    if (s.accum == nullptr) continue;
    const std::string name = fmt::format("adagrad/{}", s.table);
    if (!ck.global_shape(name).ok())
      return Status::InvalidArgument(fmt::format(
          "{} has no row-wise Adagrad state (it was trained with train.table_optimizer = \"sgd\"); resume with "
          "\"sgd\"",
          ck.dir()));
    RETURN_IF_ERROR(ck.read(name, row_slice(E, 0, s.row_begin, s.row_end), std::span<float>(s.accum, static_cast<size_t>(n))));
  }
  ASSIGN_OR_RETURN(std::string state, ck.state(0));
  DlrmResumeState r;
  try {
    const nlohmann::json j = nlohmann::json::parse(state);
    r.step = j.at("step").get<int64_t>();
    r.adam_t = j.at("adam_t").get<int64_t>();
    r.data_row = j.at("data_row").get<int64_t>();
    r.epoch = j.at("epoch").get<int64_t>();
  } catch (const nlohmann::json::exception& e) {
    return Status::Corruption(fmt::format("{}: rank 0's training state is unreadable: {}", ck.dir(), e.what()));
  }
  if (r.step != ck.step())
    return Status::Corruption(
        fmt::format("{}: the manifest says step {} but rank 0's state says {}", ck.dir(), ck.step(), r.step));
  engine.adam_step() = r.adam_t;
  return r;
}

}  // namespace tessera
