#include "optim/zero.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "core/check.h"
#include "obs/trace.h"
#include "kernels/cuda/reduce.h"

namespace tessera {

namespace {
using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

}  // namespace

Result<std::unique_ptr<ShardedAdamW>> ShardedAdamW::create(ParamSpace space, AdamWKernel kernel,
                                                           comm::Communicator& dp, const ShardedAdamWOptions& o) {
  CHECK(o.zero == 0 || o.zero == 1);
  // The sharded norm sums host values; the trainer refuses those layouts on CUDA.
  CHECK(space.device == Device::kCPU || o.norm_comm == nullptr);
  const int64_t shard = o.zero == 1 ? zero1_shard_floats(space.count, dp.size()) : 0;
  const int64_t n = space.count;
  ASSIGN_OR_RETURN(AdamW adamw, o.zero == 1 ? AdamW::create(std::move(space), kernel, std::min(n, dp.rank() * shard),
                                                            std::min(n, (dp.rank() + 1) * shard), shard)
                                            : AdamW::create(std::move(space), kernel));
  ASSIGN_OR_RETURN(HostReduce host_reduce, HostReduce::create(dp));
  return std::unique_ptr<ShardedAdamW>(new ShardedAdamW(dp, o, shard, std::move(adamw), std::move(host_reduce)));
}

ShardedAdamW::ShardedAdamW(comm::Communicator& dp, const ShardedAdamWOptions& o, int64_t shard, AdamW adamw,
                           HostReduce host_reduce)
    : dp_(dp), opts_(o), shard_(shard), adamw_(std::move(adamw)), host_reduce_(std::move(host_reduce)) {}

// This rank's share of the squared global norm (before summing over ranks).
Result<double> ShardedAdamW::sum_of_squares() const {
  if (opts_.norm_comm) {
    // Plain DP with a model shard: dp rank 0 of each replica adds what it owns.
    if (opts_.zero == 0 && dp_.rank() != 0) return 0.0;
    return adamw_.owned_sum_of_squares();
  }
  if (adamw_.space().device == Device::kCPU) return adamw_.owned_sum_of_squares();
  // Deterministic device reduction of the shard, after the unpack queued before it.
  const int64_t lo = adamw_.lo(), hi = adamw_.hi();
  if (hi <= lo) return 0.0;
  Result<double> sq = cuda::sum_of_squares(adamw_.space().grads + lo, hi - lo);
  if (!sq.ok()) return sq.status().With("the gradient norm");
  return *sq;
}

Result<float> ShardedAdamW::step(const OptimizerConfig& c, float lr) {
  obs::trace::Span span("optimizer", "optim");
  comm_seconds_ = 0.0;
  if (opts_.zero == 0 && !opts_.norm_comm) return adamw_.try_step(c, lr);
  ASSIGN_OR_RETURN(double sq, sum_of_squares());
  auto t0 = Clock::now();
  RETURN_IF_ERROR(opts_.norm_comm ? opts_.norm_comm->all_reduce(&sq, &sq, 1, comm::ElemType::kF64)
                                  : host_reduce_.all_reduce(&sq, 1, comm::ElemType::kF64, comm::ReduceOp::kSum));
  comm_seconds_ += since(t0);
  const float norm = static_cast<float>(std::sqrt(sq));
  adamw_.apply(c, lr, norm);
  if (opts_.zero == 0) return norm;
  // One device rank holds the whole space: nothing to gather (and dp_ is
  // then a host communicator).
  if (adamw_.space().device != Device::kCPU && dp_.size() == 1) return norm;
  // On a device, the all-gather (in place) waits for the AdamW kernels by the
  // producer stream; wait() returning OK orders it before the next forward.
  float* params = adamw_.space().params;
  t0 = Clock::now();
  Status st = dp_.all_gather(params + dp_.rank() * shard_, params, shard_, comm::ElemType::kF32);
  comm_seconds_ += since(t0);
  RETURN_IF_ERROR(st);
  return norm;
}

}  // namespace tessera
