#include "parallel/gradient_reducer.h"

#include <chrono>
#include <cstring>

#include <fmt/format.h>

#include "core/check.h"
#include "obs/trace.h"
#ifdef TESSERA_HAVE_CUDA
#include "parallel/cuda/dp_device.h"
#endif

namespace tessera {

namespace {
using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }
}  // namespace

Result<std::unique_ptr<GradientReducer>> GradientReducer::create(comm::Communicator& comm,
                                                                 std::vector<std::vector<GradSpan>> ready_groups,
                                                                 const GradientReducerOptions& o) {
  std::unique_ptr<GradientReducer> r(new GradientReducer(Uninitialised{}, comm, std::move(ready_groups), o));
  RETURN_IF_ERROR(r->init());
  return r;
}

GradientReducer::GradientReducer(Uninitialised, comm::Communicator& comm,
                                 std::vector<std::vector<GradSpan>> ready_groups, const GradientReducerOptions& o)
    : comm_(comm), opts_(o), buckets_of_group_(ready_groups.size()) {
  on_device_ = o.device == Device::kCUDA;
  if (comm_.size() == 1) return;
  if (on_device_) {
    CHECK(comm_.takes_device_memory() && "a CUDA model with dp > 1 needs an NCCL communicator");
    // Every collective reads what the compute stream has queued before it
    // is posted: packed buckets, gradients, updated parameter shards.
    comm_.order_after_compute(true);
  }
  plan(ready_groups, o.bucket_bytes);
}

GradientReducer::~GradientReducer() {
  if (on_device_ && comm_.size() > 1) comm_.order_after_compute(false);
}

void GradientReducer::plan(const std::vector<std::vector<GradSpan>>& groups, int64_t bucket_bytes) {
  Bucket cur;
  int64_t cur_bytes = 0;
  for (int g = 0; g < static_cast<int>(groups.size()); g++) {
    int64_t group_bytes = 0;
    for (const GradSpan& s : groups[g]) group_bytes += s.count * 4;
    if (!cur.spans.empty() && cur_bytes + group_bytes > bucket_bytes) {
      buckets_.push_back(std::move(cur));
      cur = Bucket();
      cur_bytes = 0;
    }
    for (const GradSpan& s : groups[g]) cur.spans.push_back(s);
    cur.last_group = g;
    cur_bytes += group_bytes;
  }
  if (!cur.spans.empty()) buckets_.push_back(std::move(cur));
  for (int i = 0; i < static_cast<int>(buckets_.size()); i++) {
    Bucket& b = buckets_[i];
    for (const GradSpan& s : b.spans) b.count += s.count;
    buffers_.reserve(fmt::format("bucket{}", i), DType::kF32, Shape{b.count});
    buckets_of_group_[b.last_group].push_back(i);
  }
}

Status GradientReducer::init() {
  if (buckets_.empty()) return Status::OK();
  buffers_.set_device(opts_.device);
  RETURN_IF_ERROR(buffers_.try_allocate().With(fmt::format("the {} gradient bucket(s)", buckets_.size())));
  for (int i = 0; i < static_cast<int>(buckets_.size()); i++) buckets_[i].buffer = buffers_.tensor(i).f32();
  return Status::OK();
}

Status GradientReducer::post(Bucket& b) {
  const int index = static_cast<int>(&b - buckets_.data());
  obs::trace::Span span("allreduce post", "comm", {{"bucket", index}, {"bytes", b.count * 4}});
  float* dst = b.buffer;
  if (on_device_) {
#ifdef TESSERA_HAVE_CUDA
    // The copies are queued on the compute stream after the kernels that
    // produced these gradients; the all-reduce's stream waits for them by an
    // event (order_after_compute in the constructor).
    for (const GradSpan& s : b.spans) {
      RETURN_IF_ERROR(dp_cuda::copy_async(dst, s.data, s.count));
      dst += s.count;
    }
#else
    return Status::Unavailable("gradient buckets on a device need the CUDA backend");
#endif
  } else {
    for (const GradSpan& s : b.spans) {
      std::memcpy(dst, s.data, s.count * sizeof(float));
      dst += s.count;
    }
  }
  b.work = comm_.all_reduce_async(b.buffer, b.buffer, b.count, comm::ElemType::kF32, comm::ReduceOp::kSum);
  if (obs::trace::enabled()) {
    // Unique in the merged trace: the step, the bucket and the world rank.
    const uint64_t step = static_cast<uint64_t>(obs::trace::current_step() + 1);
    b.trace_id = obs::trace::mix_id((step << 32) ^ (uint64_t(comm_.world_rank_of(comm_.rank())) << 16) ^
                                    static_cast<uint64_t>(index));
    b.trace_open = true;
    obs::trace::async_begin("allreduce bucket", "comm", b.trace_id, -1,
                            {{"bucket", index}, {"bytes", b.count * 4}, {"ranks", comm_.size()}});
  }
  return Status::OK();
}

void GradientReducer::progress() {
  for (Bucket& b : buckets_)
    if (b.work && b.work->test()) trace_done(b);
}

void GradientReducer::trace_done(Bucket& b) {
  if (!b.trace_open) return;
  b.trace_open = false;
  obs::trace::async_end("allreduce bucket", "comm", b.trace_id, -1);
}

void GradientReducer::ready(int group) {
  if (!communicate_ || buckets_.empty()) return;
  for (int i : buckets_of_group_[group])
    if (Status st = post(buckets_[i]); !st.ok() && post_error_.ok()) post_error_ = st;
  progress();
}

Status GradientReducer::finish() {
  comm_seconds_ = 0.0;
  if (comm_.size() == 1) return Status::OK();
  const float scale = 1.0f / static_cast<float>(comm_.size());
  auto t0 = Clock::now();
  // Wait for every bucket, even after a failure, so none is still being
  // written when this returns.
  Status first = post_error_;
  post_error_ = Status::OK();
  for (Bucket& b : buckets_) {
    Status st = b.work ? b.work->wait()
                       : Status::Internal("a gradient bucket was never reduced (backward skipped a layer?)");
    trace_done(b);
    b.work.reset();
    if (first.ok()) first = st;
  }
  comm_seconds_ = since(t0);
  RETURN_IF_ERROR(first);
  for (Bucket& b : buckets_) {
    const float* src = b.buffer;
    for (const GradSpan& s : b.spans) {
      if (on_device_) {
#ifdef TESSERA_HAVE_CUDA
        // The sums are in place (wait() returned OK); unpack on the compute stream.
        RETURN_IF_ERROR(dp_cuda::scaled_copy_async(s.data, src, s.count, scale));
#endif
      } else {
        for (int64_t i = 0; i < s.count; i++) s.data[i] = src[i] * scale;
      }
      src += s.count;
    }
  }
  return Status::OK();
}

Status GradientReducer::reduce_scatter_flat(float* flat, int64_t shard) {
  comm_seconds_ = 0.0;
  if (comm_.size() == 1) return Status::OK();
  const float scale = 1.0f / static_cast<float>(comm_.size());
  float* mine = flat + comm_.rank() * shard;
  auto t0 = Clock::now();
  if (on_device_) {
#ifdef TESSERA_HAVE_CUDA
    // NCCL's in-place reduce-scatter (recv = send + r*S): rank r's block of
    // the sums stays at its own offset r*S.
    Status st = comm_.reduce_scatter(flat, mine, shard, comm::ElemType::kF32);
    comm_seconds_ = since(t0);
    RETURN_IF_ERROR(st);
    return dp_cuda::scaled_copy_async(mine, mine, shard, scale);
#else
    return Status::Unavailable("data parallelism on a device needs the CUDA backend");
#endif
  }
  // In place, rank r's block lands at the start; move it to its own offset.
  Status st = comm_.reduce_scatter(flat, flat, shard, comm::ElemType::kF32);
  comm_seconds_ = since(t0);
  RETURN_IF_ERROR(st);
  if (comm_.rank() > 0) std::memmove(mine, flat, shard * sizeof(float));
  for (int64_t i = 0; i < shard; i++) mine[i] *= scale;
  return Status::OK();
}

}  // namespace tessera
