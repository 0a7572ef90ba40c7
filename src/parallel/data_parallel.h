// Data parallelism of a GPT over a communicator's ranks (the mesh's dp
// axis): the glue between the model and the model-agnostic parts.
//
// Every rank holds the whole model (or the same shard of it) and runs its
// slice of the global batch. Gradients are averaged across ranks (each
// rank's gradient is of its own mean loss over the same number of tokens, so
// the average is the token-weighted mean, and dp=N with micro-batch B
// updates exactly as dp=1 with N*B).
//
// DataParallel maps GPT's GradListener events (final norm, layers L-1 ... 0,
// embeddings; a pipeline stage's own subset of those) to ready groups of
// gradient spans and drives a GradientReducer (parallel/gradient_reducer.h)
// with them: buckets all-reduced while backward runs (zero = 0), or the flat
// gradient arena reduce-scattered after it (zero = 1). The optimizer step,
// ZeRO-1's sharded moments included, is optim/zero.h's ShardedAdamW over
// gpt_param_space(model).
//
// A model on a CUDA device keeps everything on the device; with more than
// one rank, comm must take device buffers (an NCCL communicator over the dp
// ranks, one GPU each). With one rank, comm may be any communicator.
//
// Not thread-safe; one training loop drives it (on a thread with the
// model's device current).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "optim/host_reduce.h"
#include "nn/gpt.h"
#include "optim/optimizer.h"
#include "parallel/gradient_reducer.h"

namespace tessera {

// The model's parameter and gradient arenas as a flat parameter space, one
// group per tensor (decay: GPT::decays, counts_in_norm: GPT::counts_in_norm).
ParamSpace gpt_param_space(GPT& model);
// The fused AdamW kernel of the model's backend (timed when profiled).
AdamWKernel gpt_adamw_kernel(const GPT& model);
// The model's gradient spans grouped by the GradListener event that makes
// them final, in the order backward raises the events; events[g] is group
// g's event.
std::vector<std::vector<GradSpan>> gpt_ready_groups(GPT& model, std::vector<int>* events);

struct DataParallelOptions {
  int64_t bucket_bytes = 25 << 20;
  int zero = 0;  // 0 or 1
};

class DataParallel : public GradListener {
 public:
  // Registers itself as model's gradient listener. model and comm must
  // outlive it. Out of host or device memory for the gradient buckets (or
  // the hashes' device scratch) is the arena's error.
  static Result<std::unique_ptr<DataParallel>> create(GPT& model, comm::Communicator& comm,
                                                      const DataParallelOptions& o);
  ~DataParallel() override;

  // Broadcasts the parameters from rank 0, then checks that every rank holds
  // the same bits (xxhash64 of the parameter arena).
  Status sync_parameters();
  // Identical parameters on every rank? Error naming the mismatch if not.
  Status check_parameters_identical();

  // Call before each micro-step's backward; only the last one communicates.
  void begin_backward(bool last_micro_step) { reducer_->set_communicate(last_micro_step); }
  void on_grads_ready(int what) override;
  // After the last micro-step's backward: averaged gradients in place
  // (plain DP), or this rank's averaged shard at its own offset (ZeRO-1).
  Status finish_gradients();

  // Seconds spent waiting on communication in the last finish_gradients().
  double comm_seconds() const { return reducer_->comm_seconds(); }
  int buckets() const { return reducer_->buckets(); }

 private:
  DataParallel(GPT& model, comm::Communicator& comm, const DataParallelOptions& o, std::vector<int> events,
               std::unique_ptr<GradientReducer> reducer, HostReduce host_reduce);

  GPT& model_;
  comm::Communicator& comm_;
  DataParallelOptions opts_;
  std::vector<int> events_;  // ready group g's GradListener event
  std::unique_ptr<GradientReducer> reducer_;
  HostReduce host_reduce_;  // the parameter hashes' min and max
};

}  // namespace tessera
