// The NCCL backend of Communicator (GPUs). Made by make_nccl_communicator()
// (comm/nccl/nccl_factory.h); this header adds what only CUDA code needs:
// the communicator's stream and the hooks that order it against compute
// streams. Compiled only with TESSERA_HAVE_NCCL; includes the CUDA runtime
// header, not nccl.h.
//
// Buffers are device pointers on the communicator's device (the one current
// when it was made). Every operation is enqueued on the communicator's own
// CUDA stream, in posting order, and its Work holds a CUDA event recorded
// after it: test() is cudaEventQuery, wait() polls it (yielding, then
// sleeping 50-200 us) until done or the deadline (CommOptions::timeout).
// While waiting it also checks ncclCommGetAsyncError. On expiry, or on an
// asynchronous NCCL error, the NCCL communicator is aborted (ncclCommAbort:
// kernels stuck on a dead peer exit) and wait() returns Status::Unavailable
// naming the operation, its sequence number, the communicator and the peers,
// as the MPI backend does. An aborted communicator stays aborted: every later
// operation fails at once with the reason. Unlike MPI, a timed-out wait
// cannot be retried.
//
// The NCCL communicator is nonblocking (ncclConfig_t::blocking = 0), so
// creation, split and each enqueue are bounded by the same deadline.
//
// Ordering against compute: an operation reads its input when the comm
// stream reaches it, which may be before the compute stream that produced
// the input has written it. Either
//   - set_producer_stream(compute): from then on, every operation first
//     makes the comm stream wait for all work queued on `compute` so far
//     (one event record + cudaStreamWaitEvent per operation), which is what
//     gradient buckets need: post a bucket's all_reduce right after its
//     gradients' kernels are queued, and backward keeps running while the
//     bucket reduces; or
//   - wait_for_event(ev): the next operations wait for an event you recorded.
// The other way, consumers_wait(compute) makes `compute` wait (on the GPU,
// without blocking the host) for every operation posted so far; Work::wait()
// returning OK also means the results are in place for any later stream work.
//
// Point-to-point: NCCL has no tags and needs a send and its recv to run
// concurrently, so send_async/recv_async are queued, not enqueued: the queue
// is issued as one ncclGroupStart/End when a p2p Work is tested or waited,
// or before the next collective. So "post recv, post send, wait both" works
// as with MPI. Tags must be >= 0 and are otherwise ignored: messages between
// two ranks match in posting order, and a recv must name the same byte count
// as its send.
//
// Counts are size_t in NCCL, so nothing is chunked. split() is ncclCommSplit.
//
// Thread safety: as Communicator (one thread issues and waits); that thread
// must have the communicator's device current (set_device) when it posts.
// Works may outlive the communicator; the NCCL communicator is destroyed
// (ncclCommFinalize, bounded by the deadline, then ncclCommDestroy; or
// ncclCommAbort if work is still pending) when the last of them goes.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>

#include "comm/communicator.h"
#include "comm/nccl/nccl_factory.h"

namespace tessera::comm {

struct NcclState;  // nccl_communicator.cc

class NcclCommunicator final : public Communicator {
 public:
  // Use make_nccl_communicator(); this takes over a created state.
  explicit NcclCommunicator(std::shared_ptr<NcclState> state);
  ~NcclCommunicator() override;

  int rank() const override;
  int size() const override;
  const std::string& name() const override;
  int world_rank_of(int rank) const override;
  std::chrono::milliseconds timeout() const override;

  std::unique_ptr<Work> all_reduce_async(const void* send, void* recv, int64_t count, ElemType type,
                                         ReduceOp op) override;
  std::unique_ptr<Work> reduce_scatter_async(const void* send, void* recv, int64_t recv_count, ElemType type,
                                             ReduceOp op) override;
  std::unique_ptr<Work> all_gather_async(const void* send, void* recv, int64_t send_count, ElemType type) override;
  std::unique_ptr<Work> broadcast_async(void* data, int64_t count, ElemType type, int root) override;
  std::unique_ptr<Work> send_async(const void* data, int64_t bytes, int peer, int tag) override;
  std::unique_ptr<Work> recv_async(void* data, int64_t bytes, int peer, int tag) override;
  // A 1-element all-reduce on a device scratch word.
  std::unique_ptr<Work> barrier_async() override;
  // One NCCL group of ncclSend/ncclRecv, one pair per peer with a non-zero
  // count (this rank's own block included); device buffers.
  std::unique_ptr<Work> all_to_all_v_async(const void* send, const std::vector<int64_t>& send_counts,
                                           const std::vector<int64_t>& send_displs, void* recv,
                                           const std::vector<int64_t>& recv_counts,
                                           const std::vector<int64_t>& recv_displs, ElemType type) override;
  Result<std::unique_ptr<Communicator>> split(int color, int key, const std::string& name) override;
  bool takes_device_memory() const override { return true; }
  // set_producer_stream(on ? cudaStreamLegacy : nullptr).
  void order_after_compute(bool on) override { set_producer_stream(on ? cudaStreamLegacy : nullptr); }

  // The stream every operation runs on (owned; non-blocking w.r.t. the
  // legacy default stream).
  cudaStream_t stream() const;
  // The CUDA device of this communicator.
  int device() const;
  // Every later operation waits for the work queued on `producer` at the
  // time it is posted; nullptr turns that off. `producer` must outlive its
  // use here.
  void set_producer_stream(cudaStream_t producer);
  // The next operation (and, by stream order, all after it) waits for `event`.
  Status wait_for_event(cudaEvent_t event);
  // `consumer` waits (on the GPU) for every operation posted so far.
  Status consumers_wait(cudaStream_t consumer);
  // Aborts the NCCL communicator now (ncclCommAbort), as a timed-out wait
  // does: operations not yet complete fail, later ones fail at once with
  // `why`. For a rank that knows its peers are gone or about to abort (NCCL
  // may make an abort wait for the other ranks on the host to abort too).
  void abort(const std::string& why);

 private:
  std::shared_ptr<NcclState> state_;
};

}  // namespace tessera::comm
