// The optimizer step of a data-parallel job: the global gradient norm over
// the ranks that hold gradients, clipping, AdamW, and ZeRO-1's sharding of
// the optimizer state.
//
// Plain (zero = 0): every dp rank holds the whole moments and updates the
// whole parameter space from the averaged gradients (the gradient exchange,
// parallel/gradient_reducer.h, has put them in place).
//
// ZeRO-1 (zero = 1): the moments are sharded: dp rank r owns floats
// [r*S, (r+1)*S) of the flat parameter space (S = zero1_shard_floats(n, dp),
// the last rank's range cut at n). The gradient exchange reduce-scatters the
// flat gradients so that rank r's averaged block lies at its own offset r*S;
// step() updates that block and all-gathers the parameters in place
// (the space's buffers need room for dp*S floats: an Arena's slack). Memory
// for moments per rank falls from 2n to 2S floats.
//
// The norm: with a model shard (tensor or pipeline parallel), norm_comm is
// every rank of the job and each rank adds the squares of the groups that
// count in its norm (ParamGroup::counts_in_norm), on dp rank 0 only unless
// ZeRO shards them. Without one the model is whole and the norm needs only
// the dp ranks (ZeRO) or none (plain: the flat norm of the averaged
// gradients, the same on every rank).
//
// A space on a CUDA device (no norm_comm) keeps the moments and the update
// there; the dp communicator then takes device buffers
// (Communicator::takes_device_memory) and is ordered after the compute
// stream by the gradient exchange.
//
// Not thread-safe; one training loop drives it. The space and the
// communicators must outlive it.
#pragma once

#include <cstdint>
#include <memory>

#include "comm/communicator.h"
#include "optim/host_reduce.h"
#include "core/status.h"
#include "optim/optimizer.h"

namespace tessera {

// S: floats per rank of n floats sharded over `ranks` (ceil(n / ranks)).
inline int64_t zero1_shard_floats(int64_t n, int ranks) { return (n + ranks - 1) / ranks; }

struct ShardedAdamWOptions {
  int zero = 0;  // 0 or 1
  // See the file comment; null for a whole model.
  comm::Communicator* norm_comm = nullptr;
};

class ShardedAdamW {
 public:
  // dp: the ranks that replicate the parameters (size 1 without data
  // parallelism). o.zero is 0 or 1, and a norm_comm needs a host space
  // (CHECKed). Out of host or device memory for the moments (or the norm's
  // device scratch) is the arena's error.
  static Result<std::unique_ptr<ShardedAdamW>> create(ParamSpace space, AdamWKernel kernel, comm::Communicator& dp,
                                                      const ShardedAdamWOptions& o);

  // Norm, clipping, AdamW on this rank's range (+ the ZeRO all-gather).
  // Returns the pre-clip global gradient norm, the same on every rank.
  Result<float> step(const OptimizerConfig& c, float lr);

  // The moments this rank holds, for checkpoints: floats [lo, hi) of the
  // flat space (all of it without ZeRO, this rank's shard with), m[i - lo]
  // and v[i - lo] for space float i. On the space's device.
  struct State {
    float* m;
    float* v;
    int64_t lo, hi;
  };
  State state() const { return {adamw_.m(), adamw_.v(), adamw_.lo(), adamw_.hi()}; }
  int steps() const { return adamw_.t(); }  // AdamW's step count t
  void set_steps(int t) { adamw_.set_t(t); }
  // Bytes of optimizer state (m and v) held by this rank.
  int64_t state_bytes() const { return adamw_.state_bytes(); }
  // ZeRO: floats per rank (S); 0 without ZeRO.
  int64_t shard_floats() const { return shard_; }
  // Seconds spent waiting on communication in the last step().
  double comm_seconds() const { return comm_seconds_; }

 private:
  ShardedAdamW(comm::Communicator& dp, const ShardedAdamWOptions& o, int64_t shard, AdamW adamw,
               HostReduce host_reduce);
  Result<double> sum_of_squares() const;

  comm::Communicator& dp_;
  ShardedAdamWOptions opts_;
  int64_t shard_ = 0;
  AdamW adamw_;
  HostReduce host_reduce_;  // the norm's all-reduce over dp_ (ZeRO)
  double comm_seconds_ = 0.0;
};

}  // namespace tessera
