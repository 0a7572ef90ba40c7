#include "train/dlrm_local.h"

#include <chrono>

#include <fmt/format.h>

#include "kernels/cpu/ops.h"
#include "optim/sparse.h"

namespace tessera {

namespace {
using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }
}  // namespace

Result<std::unique_ptr<DlrmLocal>> DlrmLocal::create(const DlrmConfig& config, const DlrmTrainOptions& opts,
                                                     comm::Communicator* comm, uint64_t seed) {
  if (comm != nullptr && comm->size() > 1)
    return Status::InvalidArgument(fmt::format(
        "model.kind = \"dlrm\" trains on one process here, but {} ranks are running (model-parallel tables need "
        "DlrmParallel)",
        comm->size()));
  if (opts.table_optimizer != "adagrad" && opts.table_optimizer != "sgd")
    return Status::InvalidArgument(
        fmt::format("table optimizer \"{}\" must be \"adagrad\" or \"sgd\"", opts.table_optimizer));
  if (opts.placement != "table" && opts.placement != "row" && opts.placement != "auto")
    return Status::InvalidArgument(
        fmt::format("placement \"{}\" must be \"table\", \"row\" or \"auto\"", opts.placement));
  RETURN_IF_ERROR(config.validate());
  std::unique_ptr<DlrmLocal> e(new DlrmLocal(config, opts));
  e->model_.init(seed);
  return e;
}

DlrmLocal::DlrmLocal(const DlrmConfig& config, const DlrmTrainOptions& opts)
    : model_(config), opts_(opts), adagrad_(opts.table_optimizer == "adagrad") {
  m_.assign(model_.dense_params().size(), 0.0f);
  v_.assign(m_.size(), 0.0f);
  if (adagrad_)
    for (int e : config.table_rows) accum_.emplace_back(static_cast<size_t>(e), 0.0f);
}

Result<float> DlrmLocal::train_step(const DlrmBatch& global) {
  if (global.labels == nullptr) return Status::InvalidArgument("train_step: the batch has no labels");
  const auto t0 = Clock::now();
  const float loss = model_.forward(global);
  model_.zero_dense_grads();
  model_.backward(global);
  AdamWParams hp;
  hp.lr = opts_.lr_dense;
  hp.beta1 = opts_.beta1;
  hp.beta2 = opts_.beta2;
  hp.eps = opts_.eps;
  hp.weight_decay = opts_.weight_decay;
  hp.t = static_cast<int>(++adam_step_);
  cpu::adamw_update(model_.dense_params().data(), model_.dense_grads().data(), m_.data(), v_.data(),
                    static_cast<int64_t>(m_.size()), hp);
  const auto t1 = Clock::now();
  stats_.mlp_s += std::chrono::duration<double>(t1 - t0).count();
  const DlrmConfig& cfg = model_.config();
  for (size_t t = 0; t < cfg.table_rows.size(); t++) {
    const SparseRows& g = model_.table_grad(static_cast<int>(t));
    if (adagrad_)
      rowwise_adagrad_update(model_.table(static_cast<int>(t)).data(), accum_[t].data(), g.rows.data(),
                             g.grads.data(), g.U, cfg.dim, {opts_.lr_table, opts_.adagrad_eps});
    else
      sparse_sgd_update(model_.table(static_cast<int>(t)).data(), g.rows.data(), g.grads.data(), g.U, cfg.dim,
                        opts_.lr_table);
    stats_.lookups += global.offsets[t][global.B] - global.offsets[t][0];
  }
  stats_.lookup_s += seconds_since(t1);
  return loss;
}

Status DlrmLocal::predict(const DlrmBatch& global, std::vector<float>* logits) {
  DlrmBatch b = global;
  b.labels = nullptr;
  model_.forward(b);
  logits->assign(model_.logits().begin(), model_.logits().end());
  return Status::OK();
}

std::vector<DlrmLocal::TableShard> DlrmLocal::owned_shards() {
  std::vector<TableShard> out;
  const DlrmConfig& cfg = model_.config();
  for (size_t t = 0; t < cfg.table_rows.size(); t++)
    out.push_back({static_cast<int>(t), 0, cfg.table_rows[t], model_.table(static_cast<int>(t)).data(),
                   adagrad_ ? accum_[t].data() : nullptr});
  return out;
}

}  // namespace tessera
