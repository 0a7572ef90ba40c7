// The gradient exchange of data parallelism: averages gradients over a
// communicator's ranks. Knows spans of floats, not models: the caller says
// which spans become ready together (a "ready group", e.g. one layer's
// gradients) and in which order backward readies the groups.
//
// Buckets (all-reduce): consecutive ready groups are packed into buckets of
// about bucket_bytes. When a bucket's last group is ready (ready(g)) during
// the step's last backward, its spans are copied into the bucket's buffer
// and an asynchronous all-reduce is posted, so it overlaps the rest of
// backward; finish() waits for the stragglers and unpacks the averages
// (sum * 1/size) into the spans. Only the wait is exposed communication.
//
// Flat reduce-scatter (ZeRO-1): reduce_scatter_flat() averages a flat buffer
// of size*S floats so that rank r's block of averages lies at its own
// offset r*S (optim/zero.h updates it there).
//
// On a CUDA device (device = kCUDA, more than one rank), the communicator
// must take device buffers (Communicator::takes_device_memory, NCCL); the
// reducer orders it after the compute stream (order_after_compute) while it
// lives. Buckets are device buffers, packed with copies queued on the
// compute stream; the unpack (the CPU's arithmetic) is queued there too.
//
// Not thread-safe; one training loop drives it (on a thread with the
// device current). The spans and the communicator must outlive it.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "core/status.h"
#include "tensor/arena.h"

namespace tessera {

struct GradSpan {
  float* data;  // on the reducer's device
  int64_t count;
};

struct GradientReducerOptions {
  int64_t bucket_bytes = 25 << 20;
  Device device = Device::kCPU;
};

class GradientReducer {
 public:
  // ready_groups[g]: the spans that become ready together, groups in the
  // order backward readies them. Empty for a reducer that only
  // reduce-scatters; with one rank nothing is planned or sent. Out of host
  // or device memory for the bucket buffers is the arena's error.
  static Result<std::unique_ptr<GradientReducer>> create(comm::Communicator& comm,
                                                         std::vector<std::vector<GradSpan>> ready_groups,
                                                         const GradientReducerOptions& o);
  ~GradientReducer();
  GradientReducer(const GradientReducer&) = delete;
  GradientReducer& operator=(const GradientReducer&) = delete;

  // Whether the coming backward's ready() calls post buckets (only the last
  // micro-step's do).
  void set_communicate(bool on) { communicate_ = on; }
  // Group g's spans hold their final gradients.
  void ready(int group);
  // Waits for every bucket and puts the averages in place. Error if a
  // bucket was never posted (a group never became ready) or a reduction
  // failed.
  Status finish();
  // The ZeRO-1 exchange over flat, which holds size()*shard floats (on the
  // device).
  Status reduce_scatter_flat(float* flat, int64_t shard);

  // Seconds spent waiting in the last finish() or reduce_scatter_flat().
  double comm_seconds() const { return comm_seconds_; }
  int buckets() const { return static_cast<int>(buckets_.size()); }

 private:
  struct Bucket {
    std::vector<GradSpan> spans;
    int last_group = 0;
    float* buffer = nullptr;  // count floats, a tensor of buffers_
    int64_t count = 0;
    std::unique_ptr<comm::Work> work;
    // The trace's async "allreduce bucket" span: open from the post until
    // the reduction is seen complete (test() or wait()).
    uint64_t trace_id = 0;
    bool trace_open = false;
  };
  // create()'s one code path: the constructor plans the buckets, init()
  // allocates their buffers.
  struct Uninitialised {};
  GradientReducer(Uninitialised, comm::Communicator& comm, std::vector<std::vector<GradSpan>> ready_groups,
                  const GradientReducerOptions& o);
  Status init();
  void plan(const std::vector<std::vector<GradSpan>>& groups, int64_t bucket_bytes);
  Status post(Bucket& b);
  void progress();
  void trace_done(Bucket& b);

  comm::Communicator& comm_;
  GradientReducerOptions opts_;
  bool on_device_ = false;
  bool communicate_ = true;
  double comm_seconds_ = 0.0;
  std::vector<Bucket> buckets_;
  std::vector<std::vector<int>> buckets_of_group_;  // group -> buckets it completes
  Arena buffers_;        // one tensor per bucket, on the device
  Status post_error_;    // a failed pack or post in ready(), reported by finish()
};

}  // namespace tessera
