#include "parallel/data_parallel.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include <fmt/format.h>
#include <xxhash.h>

#include "nn/ops_table.h"

namespace tessera {

namespace {
using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// The per-layer parameter kinds, in arena order.
constexpr int kFirstLayerParam = kLn1W, kLastLayerParam = kFcProjB;
}  // namespace

DataParallel::DataParallel(GPT& model, dist::Communicator& comm, const DataParallelOptions& o)
    : model_(model), comm_(comm), opts_(o) {
  // Bucket packing, ZeRO and the sharded norm work on host memory; a device
  // model runs here only as a single replica (the trainer refuses the rest).
  CHECK(model_.device() == Device::kCPU || (comm_.size() == 1 && o.zero == 0 && o.norm_comm == nullptr));
  model_.set_grad_listener(this);
  const Arena& params = model_.params();
  flat_ = static_cast<int64_t>(params.bytes() / sizeof(float));
  if (opts_.zero == 1) {
    shard_ = (flat_ + comm_.size() - 1) / comm_.size();
    m_.assign(shard_, 0.0f);
    v_.assign(shard_, 0.0f);
  } else {
    adamw_ = std::make_unique<AdamW>(model_);
    if (comm_.size() > 1) plan_buckets(opts_.bucket_bytes);
  }
}

DataParallel::~DataParallel() { model_.set_grad_listener(nullptr); }

// Position of an event in events_ (the order backward raises them).
int DataParallel::event_index(int what) const {
  for (int i = 0; i < static_cast<int>(events_.size()); i++)
    if (events_[i] == what) return i;
  return -1;
}

void DataParallel::plan_buckets(int64_t bucket_bytes) {
  const ModelShard& shard = model_.shard();
  const int Ll = shard.layer_end - shard.layer_begin;
  const Arena& grads = model_.grads();
  ParamPtrs g = model_.grad_ptrs();
  auto whole = [&](int id) { return Slice{g[id], grads.tensor(id).numel()}; };
  std::vector<std::vector<Slice>> events;
  if (shard.last) {
    events_.push_back(GradListener::kFinalNorm);
    events.push_back({whole(kLnfW), whole(kLnfB)});
  }
  for (int l = Ll - 1; l >= 0; l--) {
    std::vector<Slice> e;
    for (int id = kFirstLayerParam; id <= kLastLayerParam; id++) {
      int64_t per_layer = grads.tensor(id).numel() / Ll;
      e.push_back({g[id] + l * per_layer, per_layer});
    }
    events_.push_back(shard.layer_begin + l);
    events.push_back(std::move(e));
  }
  if (shard.first || shard.last) {
    events_.push_back(GradListener::kEmbeddings);
    std::vector<Slice> e;
    for (int id : {kWte, kWpe})
      if (grads.tensor(id).numel() > 0) e.push_back(whole(id));
    events.push_back(std::move(e));
  }

  Bucket cur;
  int64_t cur_bytes = 0;
  for (int ev = 0; ev < static_cast<int>(events.size()); ev++) {
    int64_t ev_bytes = 0;
    for (const Slice& s : events[ev]) ev_bytes += s.count * 4;
    if (!cur.slices.empty() && cur_bytes + ev_bytes > bucket_bytes) {
      buckets_.push_back(std::move(cur));
      cur = Bucket();
      cur_bytes = 0;
    }
    for (const Slice& s : events[ev]) cur.slices.push_back(s);
    cur.last_event = ev;
    cur_bytes += ev_bytes;
  }
  if (!cur.slices.empty()) buckets_.push_back(std::move(cur));
  for (Bucket& b : buckets_) {
    int64_t n = 0;
    for (const Slice& s : b.slices) n += s.count;
    b.buffer.assign(n, 0.0f);
  }
}

void DataParallel::progress() {
  for (Bucket& b : buckets_)
    if (b.work) b.work->test();
}

void DataParallel::on_grads_ready(int what) {
  if (!communicate_ || buckets_.empty()) return;
  const int ev = event_index(what);
  for (Bucket& b : buckets_) {
    if (b.last_event != ev) continue;
    float* dst = b.buffer.data();
    for (const Slice& s : b.slices) {
      std::memcpy(dst, s.grad, s.count * sizeof(float));
      dst += s.count;
    }
    b.work = comm_.all_reduce_async(b.buffer.data(), b.buffer.data(), static_cast<int64_t>(b.buffer.size()),
                                    dist::ElemType::kF32, dist::ReduceOp::kSum);
  }
  progress();
}

Status DataParallel::finish_gradients() {
  comm_seconds_ = 0.0;
  if (comm_.size() == 1) return Status::OK();
  const float scale = 1.0f / static_cast<float>(comm_.size());
  auto t0 = Clock::now();
  if (opts_.zero == 1) {
    // Average the flat gradients in place (the arena's slack covers the
    // padding to dp*S floats). In place, rank r's block lands at the start;
    // move it to its own offset r*S, where the optimizer step reads it.
    float* g = reinterpret_cast<float*>(model_.grads().base());
    Status st = comm_.reduce_scatter(g, g, shard_, dist::ElemType::kF32);
    comm_seconds_ = since(t0);
    RETURN_IF_ERROR(st);
    float* mine = g + comm_.rank() * shard_;
    if (comm_.rank() > 0) std::memmove(mine, g, shard_ * sizeof(float));
    for (int64_t i = 0; i < shard_; i++) mine[i] *= scale;
    return Status::OK();
  }
  for (Bucket& b : buckets_) {
    if (!b.work) return Status::Internal("a gradient bucket was never reduced (backward skipped a layer?)");
    Status st = b.work->wait();
    b.work.reset();
    RETURN_IF_ERROR(st);
  }
  comm_seconds_ = since(t0);
  for (Bucket& b : buckets_) {
    const float* src = b.buffer.data();
    for (const Slice& s : b.slices) {
      for (int64_t i = 0; i < s.count; i++) s.grad[i] = src[i] * scale;
      src += s.count;
    }
  }
  return Status::OK();
}

Result<float> DataParallel::optimizer_step(const OptimizerConfig& c, float lr) {
  if (opts_.zero == 0) {
    if (!opts_.norm_comm) return adamw_->step(model_, c, lr);
    ASSIGN_OR_RETURN(float norm, global_norm_of_grads());
    adamw_->apply(model_, c, lr, norm);
    return norm;
  }
  float norm = 0.0f;
  RETURN_IF_ERROR(zero_step(c, lr, &norm));
  return norm;
}

// Sum of squares of the gradients in flat range [lo, hi) of the arena that
// belong to tensors this rank owns for the norm (alignment gaps are zero).
double DataParallel::owned_sum_of_squares(int64_t lo, int64_t hi) const {
  const Arena& arena = model_.grads();
  const float* grads = reinterpret_cast<const float*>(arena.base());
  double sq = 0.0;
  for (int id = 0; id < arena.count(); id++) {
    if (!model_.counts_in_norm(id)) continue;
    const int64_t begin = static_cast<int64_t>(arena.offset(id) / sizeof(float));
    const int64_t a = std::max(begin, lo), b = std::min(begin + arena.tensor(id).numel(), hi);
    for (int64_t i = a; i < b; i++) sq += static_cast<double>(grads[i]) * grads[i];
  }
  return sq;
}

// Plain DP with a model shard: dp rank 0 of each model replica adds the
// squares of what it owns; the sum runs over every rank.
Result<float> DataParallel::global_norm_of_grads() {
  double sq = comm_.rank() == 0 ? owned_sum_of_squares(0, flat_) : 0.0;
  auto t0 = Clock::now();
  Status st = opts_.norm_comm->all_reduce(&sq, &sq, 1, dist::ElemType::kF64);
  comm_seconds_ += since(t0);
  RETURN_IF_ERROR(st);
  return static_cast<float>(std::sqrt(sq));
}

Status DataParallel::zero_step(const OptimizerConfig& c, float lr, float* norm_out) {
  const int r = comm_.rank();
  const int64_t lo = r * shard_, hi = std::min(flat_, lo + shard_);
  float* params = reinterpret_cast<float*>(model_.params().base());
  float* grads = reinterpret_cast<float*>(model_.grads().base());
  // Global norm from the shards: alignment gaps and padding are zero.
  double sq = 0.0;
  if (opts_.norm_comm) {
    sq = owned_sum_of_squares(lo, hi);
  } else {
    for (int64_t i = lo; i < hi; i++) sq += static_cast<double>(grads[i]) * grads[i];
  }
  auto t0 = Clock::now();
  RETURN_IF_ERROR((opts_.norm_comm ? *opts_.norm_comm : comm_).all_reduce(&sq, &sq, 1, dist::ElemType::kF64));
  comm_seconds_ += since(t0);
  const float norm = static_cast<float>(std::sqrt(sq));
  float scale = 1.0f;
  if (c.grad_clip > 0.0f) scale = std::min(1.0f, c.grad_clip / (norm + 1e-6f));
  t_++;
  const OpsTable& ops = ops_for(model_.backend());
  const Arena& arena = model_.params();
  for (int id = 0; id < arena.count(); id++) {
    const int64_t begin = static_cast<int64_t>(arena.offset(id) / sizeof(float));
    const int64_t end = begin + arena.tensor(id).numel();
    const int64_t a = std::max(begin, lo), b = std::min(end, hi);
    if (a >= b) continue;
    AdamWParams hp{lr, c.beta1, c.beta2, c.eps, GPT::decays(id) ? c.weight_decay : 0.0f, t_, scale};
    ops.adamw_update(params + a, grads + a, m_.data() + (a - lo), v_.data() + (a - lo), b - a, hp);
  }
  t0 = Clock::now();
  Status st = comm_.all_gather(params + lo, params, shard_, dist::ElemType::kF32);
  comm_seconds_ += since(t0);
  *norm_out = norm;
  return st;
}

DataParallel::OptimizerState DataParallel::optimizer_state() {
  if (opts_.zero == 1) {
    const int64_t lo = comm_.rank() * shard_;
    return {m_.data(), v_.data(), lo, std::min(flat_, lo + shard_)};
  }
  return {reinterpret_cast<float*>(adamw_->m().base()), reinterpret_cast<float*>(adamw_->v().base()), 0, flat_};
}

int DataParallel::optimizer_steps() const { return opts_.zero == 1 ? t_ : adamw_->t(); }

void DataParallel::set_optimizer_steps(int t) {
  if (opts_.zero == 1) {
    t_ = t;
  } else {
    adamw_->set_t(t);
  }
}

int64_t DataParallel::optimizer_state_bytes() const {
  if (opts_.zero == 1) return 2 * shard_ * static_cast<int64_t>(sizeof(float));
  return 2 * flat_ * static_cast<int64_t>(sizeof(float));
}

Status DataParallel::sync_parameters() {
  if (comm_.size() == 1) return Status::OK();
  RETURN_IF_ERROR(comm_.broadcast(model_.params().base(), static_cast<int64_t>(model_.params().bytes()),
                                  dist::ElemType::kU8, 0));
  return check_parameters_identical();
}

Status DataParallel::check_parameters_identical() {
  if (comm_.size() == 1) return Status::OK();
  uint64_t h = XXH3_64bits(model_.params().base(), model_.params().bytes());
  uint64_t lo = h, hi = h;
  RETURN_IF_ERROR(comm_.all_reduce(&lo, &lo, 1, dist::ElemType::kU64, dist::ReduceOp::kMin));
  RETURN_IF_ERROR(comm_.all_reduce(&hi, &hi, 1, dist::ElemType::kU64, dist::ReduceOp::kMax));
  if (lo != hi)
    return Status::Internal(fmt::format("parameters differ across data-parallel ranks (xxhash64 {:016x} on rank {}; "
                                        "min {:016x}, max {:016x})",
                                        h, comm_.rank(), lo, hi));
  return Status::OK();
}

}  // namespace tessera
