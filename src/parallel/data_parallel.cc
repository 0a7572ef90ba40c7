#include "parallel/data_parallel.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include <fmt/format.h>
#include <xxhash.h>

#include "kernels/cuda/reduce.h"
#include "runtime/cuda_device.h"
#include "nn/ops_table.h"
#include "tensor/device_memory.h"
#ifdef TESSERA_HAVE_CUDA
#include "parallel/cuda/dp_device.h"
#endif
#ifdef TESSERA_HAVE_NCCL
#include "comm/nccl/nccl_communicator.h"
#endif

namespace tessera {

namespace {
using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// The per-layer parameter kinds, in arena order.
constexpr int kFirstLayerParam = kLn1W, kLastLayerParam = kFcProjB;
}  // namespace

DataParallel::DataParallel(GPT& model, comm::Communicator& comm, const DataParallelOptions& o)
    : model_(model), comm_(comm), opts_(o) {
  on_device_ = model_.device() == Device::kCUDA;
  if (on_device_) {
    // The sharded norm (tensor or pipeline parallel) sums host values; the
    // trainer refuses those layouts on CUDA.
    CHECK(o.norm_comm == nullptr);
    if (comm_.size() > 1) {
#ifdef TESSERA_HAVE_NCCL
      nccl_ = dynamic_cast<comm::NcclCommunicator*>(&comm_);
#endif
      CHECK(nccl_ != nullptr && "a CUDA model with dp > 1 needs an NCCL communicator");
#ifdef TESSERA_HAVE_NCCL
      // Every collective reads what the compute stream (the legacy default
      // stream) has queued before it is posted: packed buckets, gradients,
      // updated parameter shards.
      nccl_->set_producer_stream(cudaStreamLegacy);
#endif
      scratch_.reserve("scratch", DType::kF32, Shape{4});
      scratch_.set_device(Device::kCUDA);
      scratch_.allocate();
    }
  }
  model_.set_grad_listener(this);
  const Arena& params = model_.params();
  flat_ = static_cast<int64_t>(params.bytes() / sizeof(float));
  if (opts_.zero == 1) {
    shard_ = (flat_ + comm_.size() - 1) / comm_.size();
    if (on_device_) {
      zero_moments_.reserve("m", DType::kF32, Shape{shard_});
      zero_moments_.reserve("v", DType::kF32, Shape{shard_});
      zero_moments_.set_device(Device::kCUDA);
      zero_moments_.allocate();  // zeroed
    } else {
      m_.assign(shard_, 0.0f);
      v_.assign(shard_, 0.0f);
    }
  } else {
    adamw_ = std::make_unique<AdamW>(model_);
    if (comm_.size() > 1) plan_buckets(opts_.bucket_bytes);
  }
}

DataParallel::~DataParallel() {
  model_.set_grad_listener(nullptr);
#ifdef TESSERA_HAVE_NCCL
  if (nccl_) nccl_->set_producer_stream(nullptr);
#endif
}

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
    for (const Slice& s : b.slices) b.count += s.count;
    if (!on_device_) b.buffer.assign(b.count, 0.0f);
  }
  if (on_device_) {
    for (int i = 0; i < static_cast<int>(buckets_.size()); i++)
      bucket_arena_.reserve(fmt::format("bucket{}", i), DType::kF32, Shape{buckets_[i].count});
    bucket_arena_.set_device(Device::kCUDA);
    bucket_arena_.allocate();
    for (int i = 0; i < static_cast<int>(buckets_.size()); i++)
      buckets_[i].device_buffer = bucket_arena_.tensor(i).f32();
  }
}

Status DataParallel::post_device_bucket(Bucket& b) {
#ifdef TESSERA_HAVE_CUDA
  // The copies are queued on the compute stream after the kernels that
  // produced these gradients; the all-reduce's stream waits for them by an
  // event (the producer stream set in the constructor).
  float* dst = b.device_buffer;
  for (const Slice& s : b.slices) {
    RETURN_IF_ERROR(dp_cuda::copy_async(dst, s.grad, s.count));
    dst += s.count;
  }
  b.work = comm_.all_reduce_async(b.device_buffer, b.device_buffer, b.count, comm::ElemType::kF32,
                                  comm::ReduceOp::kSum);
  return Status::OK();
#else
  return Status::Unavailable("gradient buckets on a device need the CUDA backend");
#endif
}

Status DataParallel::all_reduce_host(void* data, int64_t count, comm::ElemType type, comm::ReduceOp op) {
  if (!nccl_) return comm_.all_reduce(data, data, count, type, op);
  const size_t bytes = static_cast<size_t>(count) * comm::elem_size(type);
  CHECK(bytes <= 16);
  // Blocking copies on the compute stream; the all-reduce is ordered after
  // the first by the producer stream, and wait() returning OK means the
  // result is in place for the second.
  void* dev = scratch_.base();
  copy_to_device(Device::kCUDA, dev, data, bytes);
  RETURN_IF_ERROR(comm_.all_reduce(dev, dev, count, type, op));
  copy_to_host(Device::kCUDA, data, dev, bytes);
  return Status::OK();
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
    if (on_device_) {
      if (Status st = post_device_bucket(b); !st.ok() && pack_error_.ok()) pack_error_ = st;
      continue;
    }
    float* dst = b.buffer.data();
    for (const Slice& s : b.slices) {
      std::memcpy(dst, s.grad, s.count * sizeof(float));
      dst += s.count;
    }
    b.work = comm_.all_reduce_async(b.buffer.data(), b.buffer.data(), static_cast<int64_t>(b.buffer.size()),
                                    comm::ElemType::kF32, comm::ReduceOp::kSum);
  }
  progress();
}

Status DataParallel::finish_gradients() {
  comm_seconds_ = 0.0;
  if (comm_.size() == 1) return Status::OK();
  const float scale = 1.0f / static_cast<float>(comm_.size());
  auto t0 = Clock::now();
  if (on_device_) return finish_device_gradients(scale);
  if (opts_.zero == 1) {
    // Average the flat gradients in place (the arena's slack covers the
    // padding to dp*S floats). In place, rank r's block lands at the start;
    // move it to its own offset r*S, where the optimizer step reads it.
    float* g = reinterpret_cast<float*>(model_.grads().base());
    Status st = comm_.reduce_scatter(g, g, shard_, comm::ElemType::kF32);
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

Status DataParallel::finish_device_gradients(float scale) {
#ifdef TESSERA_HAVE_CUDA
  auto t0 = Clock::now();
  if (opts_.zero == 1) {
    // NCCL's in-place reduce-scatter (recv = send + r*S): rank r's block of
    // the sums stays at its own offset r*S, where the optimizer step reads it.
    float* g = reinterpret_cast<float*>(model_.grads().base());
    float* mine = g + comm_.rank() * shard_;
    Status st = comm_.reduce_scatter(g, mine, shard_, comm::ElemType::kF32);
    comm_seconds_ = since(t0);
    RETURN_IF_ERROR(st);
    return dp_cuda::scaled_copy_async(mine, mine, shard_, scale);
  }
  // Wait for every bucket, even after a failure, so none is still being
  // written when this returns.
  Status first = pack_error_;
  pack_error_ = Status::OK();
  for (Bucket& b : buckets_) {
    Status st = b.work ? b.work->wait()
                       : Status::Internal("a gradient bucket was never reduced (backward skipped a layer?)");
    b.work.reset();
    if (first.ok()) first = st;
  }
  comm_seconds_ = since(t0);
  RETURN_IF_ERROR(first);
  // The sums are in place (wait() returned OK); unpack on the compute stream.
  for (Bucket& b : buckets_) {
    const float* src = b.device_buffer;
    for (const Slice& s : b.slices) {
      RETURN_IF_ERROR(dp_cuda::scaled_copy_async(s.grad, src, s.count, scale));
      src += s.count;
    }
  }
  return Status::OK();
#else
  return Status::Unavailable("data parallelism on a device needs the CUDA backend");
#endif
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
  Status st = opts_.norm_comm->all_reduce(&sq, &sq, 1, comm::ElemType::kF64);
  comm_seconds_ += since(t0);
  RETURN_IF_ERROR(st);
  return static_cast<float>(std::sqrt(sq));
}

Status DataParallel::zero_step(const OptimizerConfig& c, float lr, float* norm_out) {
  const int r = comm_.rank();
  const int64_t lo = r * shard_, hi = std::min(flat_, lo + shard_);
  float* params = reinterpret_cast<float*>(model_.params().base());
  float* grads = reinterpret_cast<float*>(model_.grads().base());
  float* m = zero_m();
  float* v = zero_v();
  // Global norm from the shards: alignment gaps and padding are zero.
  double sq = 0.0;
  if (opts_.norm_comm) {
    sq = owned_sum_of_squares(lo, hi);
  } else if (on_device_) {
    // Deterministic device reduction, after the unpack queued before it.
    if (hi > lo) {
      Result<double> dsq = cuda::sum_of_squares(grads + lo, hi - lo);
      if (!dsq.ok()) return dsq.status().With("the gradient norm");
      sq = *dsq;
    }
  } else {
    for (int64_t i = lo; i < hi; i++) sq += static_cast<double>(grads[i]) * grads[i];
  }
  auto t0 = Clock::now();
  RETURN_IF_ERROR(opts_.norm_comm ? opts_.norm_comm->all_reduce(&sq, &sq, 1, comm::ElemType::kF64)
                                  : all_reduce_host(&sq, 1, comm::ElemType::kF64, comm::ReduceOp::kSum));
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
    ops.adamw_update(params + a, grads + a, m + (a - lo), v + (a - lo), b - a, hp);
  }
  *norm_out = norm;
  // One device rank holds the whole arena: nothing to gather (and comm_ is
  // then a host communicator).
  if (on_device_ && comm_.size() == 1) return Status::OK();
  // On a device, the all-gather (NCCL's in-place form) waits for the AdamW
  // kernels by the producer stream; wait() returning OK orders it before the
  // next forward.
  t0 = Clock::now();
  Status st = comm_.all_gather(params + lo, params, shard_, comm::ElemType::kF32);
  comm_seconds_ += since(t0);
  return st;
}

DataParallel::OptimizerState DataParallel::optimizer_state() {
  if (opts_.zero == 1) {
    const int64_t lo = comm_.rank() * shard_;
    return {zero_m(), zero_v(), lo, std::min(flat_, lo + shard_)};
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
                                  comm::ElemType::kU8, 0));
  return check_parameters_identical();
}

Status DataParallel::check_parameters_identical() {
  if (comm_.size() == 1) return Status::OK();
  const Arena& params = model_.params();
  uint64_t h = 0;
  if (on_device_) {
    // Hash a host copy (blocking, after the kernels queued so far).
    std::vector<char> host(params.bytes());
    copy_to_host(Device::kCUDA, host.data(), params.base(), host.size());
    h = XXH3_64bits(host.data(), host.size());
  } else {
    h = XXH3_64bits(params.base(), params.bytes());
  }
  uint64_t lo = h, hi = h;
  RETURN_IF_ERROR(all_reduce_host(&lo, 1, comm::ElemType::kU64, comm::ReduceOp::kMin));
  RETURN_IF_ERROR(all_reduce_host(&hi, 1, comm::ElemType::kU64, comm::ReduceOp::kMax));
  if (lo != hi)
    return Status::Internal(fmt::format("parameters differ across data-parallel ranks (xxhash64 {:016x} on rank {}; "
                                        "min {:016x}, max {:016x})",
                                        h, comm_.rank(), lo, hi));
  return Status::OK();
}

}  // namespace tessera
