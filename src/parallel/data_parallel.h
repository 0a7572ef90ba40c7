// Data parallelism over a communicator's ranks (the mesh's dp axis).
//
// Every rank holds the whole model and runs its slice of the global batch.
// Gradients are averaged across ranks (each rank's gradient is of its own
// mean loss over the same number of tokens, so the average is the
// token-weighted mean, and dp=N with micro-batch B updates exactly as dp=1
// with N*B).
//
// Plain DP (zero = 0): gradients are grouped into buckets of about
// bucket_bytes in the order backward finishes them (final norm, layers
// L-1 ... 0, embeddings; a pipeline stage's own subset of those). As soon as a bucket is complete during the last
// micro-step's backward, it is packed into its own buffer and all-reduced
// asynchronously; finish_gradients() waits for the stragglers and unpacks
// the averages. Only the wait is exposed communication.
//
// ZeRO-1 (zero = 1): AdamW moments are sharded: rank r owns floats
// [r*S, (r+1)*S) of the flat parameter arena (S = ceil(n / dp)). After
// backward the flat gradients are reduce-scattered (averaged), each rank
// updates its shard, and the parameters are all-gathered. Optimizer memory
// per rank falls from 2n to 2S floats.
//
// A model on a CUDA device is supported as one replica only (comm of size
// 1, zero = 0, no norm_comm): the optimizer step then runs on the device.
// Gradient buckets, ZeRO and the sharded norm use host memory (CHECKed).
//
// Not thread-safe; one training loop drives it.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "dist/communicator.h"
#include "nn/gpt.h"
#include "train/optimizer.h"

namespace tessera {

struct DataParallelOptions {
  int64_t bucket_bytes = 25 << 20;
  int zero = 0;  // 0 or 1
  // With a model shard (tensor or pipeline parallel), the communicator over
  // which the global gradient norm's squares are summed: every rank of the
  // job (the world). Each rank adds the tensors it owns (GPT::counts_in_norm),
  // on dp rank 0 only unless ZeRO shards them. Null: the model is whole and
  // the norm needs only the dp ranks.
  dist::Communicator* norm_comm = nullptr;
};

class DataParallel : public GradListener {
 public:
  // Registers itself as model's gradient listener. model and comm must
  // outlive it.
  DataParallel(GPT& model, dist::Communicator& comm, const DataParallelOptions& o);
  ~DataParallel() override;

  // Broadcasts the parameters from rank 0, then checks that every rank holds
  // the same bits (xxhash64 of the parameter arena).
  Status sync_parameters();
  // Identical parameters on every rank? Error naming the mismatch if not.
  Status check_parameters_identical();

  // Call before each micro-step's backward; only the last one communicates.
  void begin_backward(bool last_micro_step) { communicate_ = last_micro_step; }
  void on_grads_ready(int what) override;
  // After the last micro-step's backward: averaged gradients in place
  // (plain DP), or this rank's averaged shard (ZeRO-1).
  Status finish_gradients();
  // Clipping + AdamW (+ the ZeRO all-gather). Returns the pre-clip global
  // gradient norm, the same on every rank.
  Result<float> optimizer_step(const OptimizerConfig& c, float lr);

  // Seconds spent waiting on communication in the last step (exposed, not
  // hidden behind backward).
  double comm_seconds() const { return comm_seconds_; }
  // Bytes of optimizer state (AdamW m and v) held by this rank.
  int64_t optimizer_state_bytes() const;
  int buckets() const { return static_cast<int>(buckets_.size()); }

  // The AdamW moments this rank holds, for checkpoints: floats [lo, hi) of
  // the flat parameter arena (all of it without ZeRO, this rank's shard
  // with), m[i - lo] and v[i - lo] for arena float i.
  struct OptimizerState {
    float* m;
    float* v;
    int64_t lo, hi;
  };
  OptimizerState optimizer_state();
  int optimizer_steps() const;  // AdamW's step count t
  void set_optimizer_steps(int t);

 private:
  struct Slice {
    float* grad;
    int64_t count;
  };
  struct Bucket {
    std::vector<Slice> slices;
    int last_event = 0;  // index into the event order of the last slice
    std::vector<float> buffer;
    std::unique_ptr<dist::Work> work;
  };
  int event_index(int what) const;
  double owned_sum_of_squares(int64_t lo, int64_t hi) const;
  Result<float> global_norm_of_grads();
  void plan_buckets(int64_t bucket_bytes);
  void progress();
  Status zero_step(const OptimizerConfig& c, float lr, float* norm_out);

  GPT& model_;
  dist::Communicator& comm_;
  DataParallelOptions opts_;
  bool communicate_ = true;
  double comm_seconds_ = 0.0;
  std::vector<Bucket> buckets_;
  std::vector<int> events_;  // GradListener events in the order backward raises them
  // ZeRO-1 or plain optimizer state.
  std::unique_ptr<AdamW> adamw_;  // plain DP
  int64_t flat_ = 0, shard_ = 0;  // ZeRO: floats in the arena, floats per rank
  std::vector<float> m_, v_;      // ZeRO: this rank's moments
  int t_ = 0;
};

}  // namespace tessera
