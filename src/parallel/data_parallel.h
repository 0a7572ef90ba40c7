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
// A model on a CUDA device (no norm_comm: tensor and pipeline parallelism
// stay on the CPU) keeps everything on the device. With more than one rank,
// comm must be an NCCL communicator (comm/nccl) over the dp ranks, one GPU
// each; DataParallel makes it order every operation after the work queued on
// the compute stream (the legacy default stream the kernels use) at the time
// it is posted (set_producer_stream), and undoes that when destroyed.
//   - Plain DP: the buckets are device buffers. When a bucket's last event
//     fires, its gradient slices are copied into it on the compute stream
//     (cudaMemcpyAsync) and its all-reduce posted; the NCCL stream waits for
//     those copies by an event and reduces while backward goes on queueing
//     kernels. finish_gradients() waits for the reductions on the host, then
//     queues the unpack (src * 1/dp, the CPU's arithmetic) on the compute
//     stream.
//   - ZeRO-1: reduce-scatter and all-gather in place over the device arenas
//     (NCCL's in-place forms; the arena slack covers the padding to dp*S),
//     moments for the shard in device memory, the AdamW kernel on the shard,
//     the norm from cuda::sum_of_squares of the shard, summed over the ranks
//     through a small device scratch buffer.
// With one rank, comm may be any communicator (nothing is sent).
//
// Not thread-safe; one training loop drives it (on a thread with the
// model's device current).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "nn/gpt.h"
#include "tensor/arena.h"
#include "optim/optimizer.h"

namespace tessera {

namespace comm {
class NcclCommunicator;
}

struct DataParallelOptions {
  int64_t bucket_bytes = 25 << 20;
  int zero = 0;  // 0 or 1
  // With a model shard (tensor or pipeline parallel), the communicator over
  // which the global gradient norm's squares are summed: every rank of the
  // job (the world). Each rank adds the tensors it owns (GPT::counts_in_norm),
  // on dp rank 0 only unless ZeRO shards them. Null: the model is whole and
  // the norm needs only the dp ranks.
  comm::Communicator* norm_comm = nullptr;
};

class DataParallel : public GradListener {
 public:
  // Registers itself as model's gradient listener. model and comm must
  // outlive it.
  DataParallel(GPT& model, comm::Communicator& comm, const DataParallelOptions& o);
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
  // with), m[i - lo] and v[i - lo] for arena float i. On the model's device
  // (device pointers for a CUDA model).
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
    std::vector<float> buffer;  // host model
    float* device_buffer = nullptr;  // CUDA model: a tensor of bucket_arena_
    int64_t count = 0;               // floats in the bucket
    std::unique_ptr<comm::Work> work;
  };
  int event_index(int what) const;
  double owned_sum_of_squares(int64_t lo, int64_t hi) const;
  Result<float> global_norm_of_grads();
  void plan_buckets(int64_t bucket_bytes);
  void progress();
  Status zero_step(const OptimizerConfig& c, float lr, float* norm_out);
  // Buffer of bucket b (host or device memory, as the model).
  float* bucket_data(Bucket& b) { return on_device_ ? b.device_buffer : b.buffer.data(); }
  // Packs bucket b on the compute stream and posts its all-reduce.
  Status post_device_bucket(Bucket& b);
  // finish_gradients() for a CUDA model with dp > 1.
  Status finish_device_gradients(float scale);
  // ZeRO: this rank's moments (host or device memory, as the model).
  float* zero_m() { return on_device_ ? zero_moments_.tensor(0).f32() : m_.data(); }
  float* zero_v() { return on_device_ ? zero_moments_.tensor(1).f32() : v_.data(); }
  // All-reduces `count` host values over comm_ (through scratch_ when comm_
  // takes device buffers).
  Status all_reduce_host(void* data, int64_t count, comm::ElemType type, comm::ReduceOp op);

  GPT& model_;
  comm::Communicator& comm_;
  DataParallelOptions opts_;
  bool communicate_ = true;
  double comm_seconds_ = 0.0;
  std::vector<Bucket> buckets_;
  std::vector<int> events_;  // GradListener events in the order backward raises them
  // ZeRO-1 or plain optimizer state.
  std::unique_ptr<AdamW> adamw_;  // plain DP
  int64_t flat_ = 0, shard_ = 0;  // ZeRO: floats in the arena, floats per rank
  std::vector<float> m_, v_;      // ZeRO: this rank's moments (host model)
  int t_ = 0;
  // CUDA model.
  bool on_device_ = false;
  comm::NcclCommunicator* nccl_ = nullptr;  // comm_ when it is NCCL (dp > 1), else null
  Arena bucket_arena_;   // the buckets' buffers, one tensor each
  Arena zero_moments_;   // ZeRO: m (tensor 0) and v (tensor 1), shard_ floats each
  Arena scratch_;        // 16 bytes for all_reduce_host
  Status pack_error_;    // a failed pack or post in on_grads_ready, reported by finish_gradients
};

}  // namespace tessera
