#include "parallel/dlrm_parallel.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <new>
#include <random>

#include <fmt/format.h>

#include "core/check.h"
#include "kernels/cpu/ops.h"
#include "optim/sparse.h"

namespace tessera {

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::vector<int64_t> displacements(const std::vector<int64_t>& counts) {
  std::vector<int64_t> d(counts.size(), 0);
  for (size_t i = 1; i < counts.size(); i++) d[i] = d[i - 1] + counts[i - 1];
  return d;
}

}  // namespace

Result<std::unique_ptr<DlrmParallel>> DlrmParallel::create(const DlrmConfig& config, const DlrmParallelOptions& opts,
                                                            comm::Communicator* comm, uint64_t seed) {
  if (Status st = config.validate(); !st.ok()) return st;
  if (opts.table_optimizer != "adagrad" && opts.table_optimizer != "sgd")
    return Status::InvalidArgument(
        fmt::format("dlrm: table optimizer '{}' must be adagrad or sgd", opts.table_optimizer));
  DlrmPlanOptions po;
  po.ranks = comm != nullptr ? comm->size() : 1;
  po.budget_bytes = opts.table_budget_bytes;
  po.placement = opts.placement;
  po.lookups = opts.lookups_per_sample;
  po.state_floats_per_row = opts.table_optimizer == "adagrad" ? 1 : 0;
  auto plan = plan_dlrm_tables(config, po);
  if (!plan.ok()) return plan.status();
  const int rank = comm != nullptr ? comm->rank() : 0;
  const int64_t bytes = plan->rank_bytes[static_cast<size_t>(rank)];
  try {
    std::unique_ptr<DlrmParallel> p(new DlrmParallel(config, opts, comm, std::move(*plan)));
    p->init(seed);
    return p;
  } catch (const std::bad_alloc&) {
    return Status::ResourceExhausted(fmt::format(
        "dlrm: rank {} cannot allocate its tables ({:.1f} MB of rows and optimizer state) and the MLPs", rank,
        static_cast<double>(bytes) / 1e6));
  }
}

DlrmParallel::DlrmParallel(const DlrmConfig& config, const DlrmParallelOptions& opts, comm::Communicator* comm,
                           DlrmPlan plan)
    : config_(config), opts_(opts), comm_(comm), plan_(std::move(plan)), dense_(config_) {
  if (comm_ != nullptr) {
    rank_ = comm_->rank();
    ranks_ = comm_->size();
  }
  m_.assign(dense_.params().size(), 0.0f);
  v_.assign(dense_.params().size(), 0.0f);
  tables_of_.resize(ranks_);
  for (const DlrmShard& s : plan_.shards) tables_of_[s.rank].push_back(s.table);
  const int64_t D = config_.dim;
  for (int i : plan_.shards_of_rank(rank_)) {
    const DlrmShard& s = plan_.shards[i];
    Shard sh;
    sh.table = s.table;
    sh.row_begin = s.row_begin;
    sh.row_end = s.row_end;
    sh.whole = plan_.pieces(s.table) == 1;
    sh.values.assign(static_cast<size_t>((s.row_end - s.row_begin) * D), 0.0f);
    if (opts_.table_optimizer == "adagrad") sh.accum.assign(static_cast<size_t>(s.row_end - s.row_begin), 0.0f);
    shards_.push_back(std::move(sh));
  }
}

// Dlrm::init's draws, in its order: the MLPs, then each table's E*D values
// row-major from the same generator. A rank draws the values of its rows and
// skips the rest (one engine call per uniform float; the test against
// Dlrm::init checks that).
void DlrmParallel::init(uint64_t seed) {
  std::mt19937_64 rng(seed);
  dense_.init(rng);
  const int64_t D = config_.dim;
  for (int t = 0; t < static_cast<int>(config_.table_rows.size()); t++) {
    const float a = std::sqrt(1.0f / static_cast<float>(config_.table_rows[t]));
    std::uniform_real_distribution<float> u(-a, a);
    int64_t pos = 0;  // floats of table t drawn or skipped so far
    for (Shard& sh : shards_) {
      if (sh.table != t) continue;
      rng.discard(static_cast<unsigned long long>(sh.row_begin * D - pos));
      for (float& x : sh.values) x = u(rng);
      pos = sh.row_end * D;
    }
    rng.discard(static_cast<unsigned long long>(config_.table_rows[t] * D - pos));
  }
}

int64_t DlrmParallel::num_params() const {
  int64_t n = static_cast<int64_t>(dense_.params().size());
  for (int e : config_.table_rows) n += int64_t{e} * config_.dim;
  return n;
}

int64_t DlrmParallel::slice_begin(int64_t B, int r) const {
  return r * (B / ranks_) + std::min<int64_t>(r, B % ranks_);
}

std::vector<DlrmParallel::TableShard> DlrmParallel::owned_shards() {
  std::vector<TableShard> out;
  for (Shard& sh : shards_)
    out.push_back({sh.table, sh.row_begin, sh.row_end, sh.values.data(), sh.accum.empty() ? nullptr : sh.accum.data()});
  return out;
}

Status DlrmParallel::check_batch(const DlrmBatch& b) const {
  const int T = static_cast<int>(config_.table_rows.size());
  if (b.B < 0) return Status::InvalidArgument("dlrm batch: B must be >= 0");
  if (static_cast<int>(b.ids.size()) != T || static_cast<int>(b.offsets.size()) != T)
    return Status::InvalidArgument(fmt::format("dlrm batch: {} tables' bags given for {} tables", b.ids.size(), T));
  if (b.B > 0 && b.dense == nullptr) return Status::InvalidArgument("dlrm batch: no dense features");
  for (int t = 0; t < T; t++) {
    const int* off = b.offsets[t];
    if (off == nullptr || off[0] != 0) return Status::InvalidArgument(fmt::format("dlrm batch: table {}: offsets[0] must be 0", t));
    for (int i = 0; i < b.B; i++)
      if (off[i + 1] < off[i])
        return Status::InvalidArgument(fmt::format("dlrm batch: table {}: offsets decrease at sample {}", t, i));
    if (off[b.B] > 0 && b.ids[t] == nullptr) return Status::InvalidArgument(fmt::format("dlrm batch: table {}: no ids", t));
    for (int p = 0; p < off[b.B]; p++)
      if (b.ids[t][p] < 0 || b.ids[t][p] >= config_.table_rows[t])
        return Status::InvalidArgument(fmt::format("dlrm batch: table {}: id {} at position {} is outside [0, {})", t,
                                                   b.ids[t][p], p, config_.table_rows[t]));
  }
  return Status::OK();
}

Status DlrmParallel::all_to_all(const float* send, const std::vector<int64_t>& send_counts, float* recv,
                                const std::vector<int64_t>& recv_counts) {
  if (comm_ == nullptr || ranks_ == 1) {  // no exchange: all_to_all time stays 0 on one process
    std::copy(send, send + send_counts[0], recv);
    return Status::OK();
  }
  const auto t0 = Clock::now();
  Status st = comm_->all_to_all_v(send, send_counts, displacements(send_counts), recv, recv_counts,
                                  displacements(recv_counts), comm::ElemType::kF32);
  stats_.alltoall_s += seconds_since(t0);
  return st;
}

Status DlrmParallel::forward(const DlrmBatch& g) {
  const int64_t B = g.B, D = config_.dim, F = config_.num_features();
  const int T = F - 1;
  batch_ = B;
  std::vector<int64_t> begin(ranks_ + 1), size(ranks_);
  for (int r = 0; r <= ranks_; r++) begin[r] = slice_begin(B, r);
  for (int r = 0; r < ranks_; r++) size[r] = begin[r + 1] - begin[r];
  const int64_t mine = size[rank_];
  const int64_t nshards = static_cast<int64_t>(shards_.size());

  // Lookups: every owned shard pools its rows for all B samples, laid out by
  // destination rank q, then shard, then q's samples.
  auto t0 = Clock::now();
  std::vector<int64_t> send_counts(ranks_), recv_counts(ranks_);
  for (int q = 0; q < ranks_; q++) send_counts[q] = nshards * size[q] * D;
  for (int p = 0; p < ranks_; p++) recv_counts[p] = static_cast<int64_t>(tables_of_[p].size()) * mine * D;
  const std::vector<int64_t> send_displs = displacements(send_counts);
  send_.resize(static_cast<size_t>(std::max<int64_t>(1, nshards * B * D)));
  for (int64_t k = 0; k < nshards; k++) {
    Shard& sh = shards_[k];
    const int t = sh.table;
    const int* ids = g.ids[t];
    const int* offsets = g.offsets[t];
    Pooling pooling = config_.pooling;
    if (!sh.whole) {
      // The bags restricted to this shard's rows, as local row ids; pooled
      // by sum (the sample's rank divides by the whole bag's size for mean).
      sh.ids.clear();
      sh.offsets.assign(static_cast<size_t>(B + 1), 0);
      for (int64_t b = 0; b < B; b++) {
        for (int p = offsets[b]; p < offsets[b + 1]; p++)
          if (ids[p] >= sh.row_begin && ids[p] < sh.row_end) sh.ids.push_back(static_cast<int>(ids[p] - sh.row_begin));
        sh.offsets[b + 1] = static_cast<int>(sh.ids.size());
      }
      ids = sh.ids.data();
      offsets = sh.offsets.data();
      pooling = Pooling::kSum;
    }
    stats_.lookups += offsets[B];
    for (int q = 0; q < ranks_; q++)
      if (size[q] > 0)
        cpu::embedding_bag_forward(send_.data() + send_displs[q] + k * size[q] * D, D, sh.values.data(), ids,
                                   offsets + begin[q], static_cast<int>(size[q]), static_cast<int>(D), pooling);
  }
  stats_.lookup_s += seconds_since(t0);

  recv_.resize(static_cast<size_t>(std::max<int64_t>(1, displacements(recv_counts).back() + recv_counts.back())));
  if (Status st = all_to_all(send_.data(), send_counts, recv_.data(), recv_counts); !st.ok()) return st;
  if (mine == 0) return Status::OK();

  // This rank's samples: bottom MLP, the pooled embeddings added up, top MLP.
  t0 = Clock::now();
  dense_.forward_bottom(g.dense + begin[rank_] * config_.num_dense, static_cast<int>(mine));
  std::vector<float>& feat = dense_.feat();
  for (int64_t b = 0; b < mine; b++) std::fill(feat.data() + (b * F + 1) * D, feat.data() + (b + 1) * F * D, 0.0f);
  int64_t off = 0;
  for (int p = 0; p < ranks_; p++)
    for (int t : tables_of_[p]) {
      const float* src = recv_.data() + off;
      for (int64_t b = 0; b < mine; b++) {
        float* dst = &feat[(b * F + 1 + t) * D];
        for (int64_t d = 0; d < D; d++) dst[d] += src[b * D + d];
      }
      off += mine * D;
    }
  if (config_.pooling == Pooling::kMean)
    for (int t = 0; t < T; t++) {
      if (plan_.pieces(t) == 1) continue;
      for (int64_t b = 0; b < mine; b++) {
        const int n = g.offsets[t][begin[rank_] + b + 1] - g.offsets[t][begin[rank_] + b];
        if (n == 0) continue;
        const float fn = static_cast<float>(n);
        float* dst = &feat[(b * F + 1 + t) * D];
        for (int64_t d = 0; d < D; d++) dst[d] /= fn;
      }
    }
  dense_.forward_top();
  stats_.mlp_s += seconds_since(t0);
  return Status::OK();
}

Result<float> DlrmParallel::train_step(const DlrmBatch& g) {
  if (Status st = check_batch(g); !st.ok()) return st;
  if (g.B == 0) return Status::InvalidArgument("dlrm batch: empty (B = 0)");
  if (g.labels == nullptr) return Status::InvalidArgument("dlrm batch: training needs labels");
  if (Status st = forward(g); !st.ok()) return st;
  const int64_t B = g.B, D = config_.dim, F = config_.num_features();
  std::vector<int64_t> begin(ranks_ + 1), size(ranks_);
  for (int r = 0; r <= ranks_; r++) begin[r] = slice_begin(B, r);
  for (int r = 0; r < ranks_; r++) size[r] = begin[r + 1] - begin[r];
  const int64_t mine = size[rank_];
  const int64_t nshards = static_cast<int64_t>(shards_.size());

  // MLP backward of this rank's samples with dloss = 1/B (global B).
  auto t0 = Clock::now();
  double loss_sum = 0.0;
  dense_.zero_grads();
  if (mine > 0) {
    loss_sum = dense_.loss_sum(g.labels + begin[rank_]);
    dense_.backward(g.dense + begin[rank_] * config_.num_dense, g.labels + begin[rank_],
                    1.0f / static_cast<float>(B));
  }
  stats_.mlp_s += seconds_since(t0);

  // The pooled embeddings' gradients back to the shards' owners: to rank p,
  // for each of p's shards, this rank's samples.
  std::vector<int64_t> send_counts(ranks_), recv_counts(ranks_);
  for (int p = 0; p < ranks_; p++) send_counts[p] = static_cast<int64_t>(tables_of_[p].size()) * mine * D;
  for (int q = 0; q < ranks_; q++) recv_counts[q] = nshards * size[q] * D;
  send_.resize(static_cast<size_t>(std::max<int64_t>(1, displacements(send_counts).back() + send_counts.back())));
  {
    const std::vector<float>& dfeat = dense_.dfeat();
    int64_t off = 0;
    for (int p = 0; p < ranks_; p++)
      for (int t : tables_of_[p]) {
        for (int64_t b = 0; b < mine; b++)
          std::copy(dfeat.data() + (b * F + 1 + t) * D, dfeat.data() + (b * F + 2 + t) * D, send_.data() + off + b * D);
        off += mine * D;
      }
  }
  recv_.resize(static_cast<size_t>(std::max<int64_t>(1, nshards * B * D)));
  if (Status st = all_to_all(send_.data(), send_counts, recv_.data(), recv_counts); !st.ok()) return st;

  // Sparse gradients of the owned rows and their updates.
  t0 = Clock::now();
  const std::vector<int64_t> recv_displs = displacements(recv_counts);
  for (int64_t k = 0; k < nshards; k++) {
    Shard& sh = shards_[k];
    const int t = sh.table;
    sh.dout.resize(static_cast<size_t>(B * D));
    for (int q = 0; q < ranks_; q++) {
      const float* src = recv_.data() + recv_displs[q] + k * size[q] * D;
      std::copy(src, src + size[q] * D, sh.dout.data() + begin[q] * D);
    }
    const int* ids = g.ids[t];
    const int* offsets = g.offsets[t];
    Pooling pooling = config_.pooling;
    if (!sh.whole) {
      if (pooling == Pooling::kMean)
        for (int64_t b = 0; b < B; b++) {
          const int n = offsets[b + 1] - offsets[b];
          if (n == 0) continue;
          const float scale = 1.0f / static_cast<float>(n);
          for (int64_t d = 0; d < D; d++) sh.dout[b * D + d] *= scale;
        }
      ids = sh.ids.data();
      offsets = sh.offsets.data();
      pooling = Pooling::kSum;
    }
    const int L = offsets[B];
    sh.grad_rows.resize(std::max(L, 1));
    sh.grad_values.resize(static_cast<size_t>(std::max(L, 1) * D));
    const int U = L == 0 ? 0
                         : cpu::embedding_bag_backward(sh.grad_rows.data(), sh.grad_values.data(), sh.dout.data(), D,
                                                       ids, offsets, static_cast<int>(B), static_cast<int>(D), pooling);
    if (opts_.table_optimizer == "adagrad")
      rowwise_adagrad_update(sh.values.data(), sh.accum.data(), sh.grad_rows.data(), sh.grad_values.data(), U,
                             static_cast<int>(D), {opts_.lr_table, opts_.adagrad_eps});
    else
      sparse_sgd_update(sh.values.data(), sh.grad_rows.data(), sh.grad_values.data(), U, static_cast<int>(D),
                        opts_.lr_table);
  }
  stats_.lookup_s += seconds_since(t0);

  // MLP gradients summed over ranks (each is of dloss = 1/B), then AdamW.
  t0 = Clock::now();
  std::vector<float>& grads = dense_.grads();
  if (comm_ != nullptr && ranks_ > 1) {
    if (Status st = comm_->all_reduce(grads.data(), static_cast<int64_t>(grads.size())); !st.ok()) return st;
    if (Status st = comm_->all_reduce(&loss_sum, &loss_sum, 1, comm::ElemType::kF64); !st.ok()) return st;
  }
  AdamWParams hp;
  hp.lr = opts_.lr_dense;
  hp.beta1 = opts_.beta1;
  hp.beta2 = opts_.beta2;
  hp.eps = opts_.eps;
  hp.weight_decay = opts_.weight_decay;
  hp.t = static_cast<int>(++step_);
  cpu::adamw_update(dense_.params().data(), grads.data(), m_.data(), v_.data(), static_cast<int64_t>(m_.size()), hp);
  stats_.mlp_s += seconds_since(t0);
  return static_cast<float>(loss_sum / static_cast<double>(B));
}

Status DlrmParallel::predict(const DlrmBatch& g, std::vector<float>* logits) {
  if (Status st = check_batch(g); !st.ok()) return st;
  logits->assign(g.B, 0.0f);
  if (g.B == 0) return Status::OK();
  if (Status st = forward(g); !st.ok()) return st;
  const int64_t B = g.B;
  const int64_t mine = slice_begin(B, rank_ + 1) - slice_begin(B, rank_);
  if (comm_ == nullptr || ranks_ == 1) {
    std::copy(dense_.logits().begin(), dense_.logits().end(), logits->begin());
    return Status::OK();
  }
  // Slices differ by at most one sample: gather padded to the largest.
  const int64_t most = slice_begin(B, 1);
  std::vector<float> mine_padded(static_cast<size_t>(std::max<int64_t>(most, 1)), 0.0f);
  if (mine > 0) std::copy(dense_.logits().begin(), dense_.logits().begin() + mine, mine_padded.begin());
  logits_all_.resize(static_cast<size_t>(ranks_ * std::max<int64_t>(most, 1)));
  const auto t0 = Clock::now();
  Status st = comm_->all_gather(mine_padded.data(), logits_all_.data(), std::max<int64_t>(most, 1), comm::ElemType::kF32);
  stats_.alltoall_s += seconds_since(t0);
  if (!st.ok()) return st;
  for (int r = 0; r < ranks_; r++) {
    const int64_t b0 = slice_begin(B, r), n = slice_begin(B, r + 1) - b0;
    const float* from = logits_all_.data() + r * std::max<int64_t>(most, 1);
    std::copy(from, from + n, logits->begin() + b0);
  }
  return Status::OK();
}

}  // namespace tessera
