#include "train/dlrm_train.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include <fmt/format.h>

#include "data/criteo.h"
#include "nn/dlrm.h"
#include "parallel/dlrm_parallel.h"

namespace tessera {

namespace {

// Rows [begin, begin+B) of a shard as a DlrmBatch; owns the per-table ids.
struct ShardBatch {
  std::vector<std::vector<int>> ids;
  std::vector<int> offsets;
  DlrmBatch batch;

  void fill(const data::ClickShard& s, int64_t begin, int B) {
    const int T = s.num_cat;
    ids.resize(T);
    offsets.resize(B + 1);
    for (int b = 0; b <= B; b++) offsets[b] = b;
    batch.B = B;
    batch.dense = &s.dense[begin * s.num_dense];
    batch.labels = &s.labels[begin];
    batch.ids.resize(T);
    batch.offsets.assign(T, offsets.data());
    for (int t = 0; t < T; t++) {
      ids[t].resize(B);
      for (int b = 0; b < B; b++) ids[t][b] = s.cats[(begin + b) * T + t];
      batch.ids[t] = ids[t].data();
    }
  }
};

}  // namespace

Result<DlrmTrainResult> train_dlrm(const DlrmBenchOptions& o) {
  if (o.batch <= 0) return Status::InvalidArgument(fmt::format("--batch {} must be > 0", o.batch));
  if (o.epochs <= 0) return Status::InvalidArgument(fmt::format("--epochs {} must be > 0", o.epochs));
  if (o.table_optimizer != "adagrad" && o.table_optimizer != "sgd")
    return Status::InvalidArgument(fmt::format("--table-optimizer '{}' must be adagrad or sgd", o.table_optimizer));
  auto train = data::read_click_shard(o.train_shard);
  if (!train.ok()) return train.status();
  auto val = data::read_click_shard(o.val_shard);
  if (!val.ok()) return val.status();
  if (val->num_dense != train->num_dense || val->hash_sizes != train->hash_sizes)
    return Status::InvalidArgument("the train and val shards have different layouts");
  if (train->rows() == 0) return Status::InvalidArgument(o.train_shard + ": no rows");

  DlrmConfig cfg;
  cfg.num_dense = train->num_dense;
  cfg.dim = o.dim;
  cfg.bottom = o.bottom;
  cfg.top = o.top;
  for (int64_t e : train->hash_sizes) cfg.table_rows.push_back(static_cast<int>(e));
  if (Status st = cfg.validate(); !st.ok()) return st;
  DlrmParallelOptions opts;
  opts.lr_dense = o.lr;
  opts.lr_table = o.table_lr;
  opts.table_optimizer = o.table_optimizer;
  ASSIGN_OR_RETURN(std::unique_ptr<DlrmParallel> engine, DlrmParallel::create(cfg, opts, nullptr, o.seed));

  DlrmTrainResult res;
  res.params = engine->num_params();
  res.train_rows = train->rows();
  res.val_rows = val->rows();
  ShardBatch sb;
  std::vector<float> logits;
  for (int epoch = 0; epoch < o.epochs; epoch++) {
    DlrmEpoch ep;
    double loss_sum = 0.0;
    int batches = 0;
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t begin = 0; begin < train->rows(); begin += o.batch) {
      const int B = static_cast<int>(std::min<int64_t>(o.batch, train->rows() - begin));
      sb.fill(*train, begin, B);
      ASSIGN_OR_RETURN(float loss, engine->train_step(sb.batch));
      loss_sum += loss;
      batches++;
    }
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ep.train_loss = loss_sum / std::max(batches, 1);
    ep.samples_per_s = static_cast<double>(train->rows()) / std::max(secs, 1e-9);
    std::vector<float> scores, labels;
    double ll = 0.0;
    for (int64_t begin = 0; begin < val->rows(); begin += o.batch) {
      const int B = static_cast<int>(std::min<int64_t>(o.batch, val->rows() - begin));
      sb.fill(*val, begin, B);
      RETURN_IF_ERROR(engine->predict(sb.batch, &logits));
      for (int b = 0; b < B; b++) {  // BCE with logits
        const double x = logits[b], y = sb.batch.labels[b];
        ll += std::max(x, 0.0) - x * y + std::log1p(std::exp(-std::abs(x)));
      }
      scores.insert(scores.end(), logits.begin(), logits.end());
      labels.insert(labels.end(), sb.batch.labels, sb.batch.labels + B);
    }
    ep.val_logloss = val->rows() > 0 ? ll / static_cast<double>(val->rows()) : 0.0;
    ep.val_auc = data::exact_auc(scores, labels);  // logits rank as probabilities do
    if (o.log)
      std::fprintf(o.log, "epoch %d: train loss %.4f, val log loss %.4f, val auc %.4f, %.0f samples/s\n", epoch + 1,
                   ep.train_loss, ep.val_logloss, ep.val_auc, ep.samples_per_s);
    res.epochs.push_back(ep);
  }
  return res;
}

}  // namespace tessera
