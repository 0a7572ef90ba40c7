// Communicator: the collective and point-to-point operations Tessera's
// parallel training uses, behind one interface so MPI (CPU clusters), NCCL
// (GPUs) and Gloo (elastic) backends are interchangeable. Layers, as in Gloo:
// this interface and its algorithms (agree.h); a backend's transport (mpi/,
// nccl/, gloo/, and local/: the one-rank self communicator and N ranks as
// threads of one process); rendezvous (how ranks find each other: mpirun/srun
// for MPI, an MPI or self communicator carrying NCCL's unique id, a
// rendezvous/ store for Gloo). NCCL's buffers are device
// memory (takes_device_memory()), the others' host memory.
//
// Every operation has an asynchronous form returning a Work handle and a
// blocking form (the async form, waited on). Every wait has a deadline
// (CommOptions::timeout, or an operation's own: OpOptionsScope): on expiry it returns Status::Unavailable naming the
// operation, its sequence number on this communicator, the communicator and
// the peers it was waiting on, instead of hanging. A rank that gets such an
// error should report it and exit non-zero (comm::abort_job).
//
// Thread safety: one thread issues operations on a communicator; Work
// handles are waited on by that same thread. Buffers passed to an async
// operation must stay valid and untouched until its Work completes.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"

namespace tessera::comm {

enum class ReduceOp { kSum, kMax, kMin };
// Element types collectives carry.
enum class ElemType { kF32, kF64, kI32, kI64, kU64, kU8 };
size_t elem_size(ElemType t);
const char* elem_name(ElemType t);  // "float", "double", "int32", ...

// Diagnostics shared by the backends' error messages.
// "0-3", "0,2,4-6": ranks in the given order, increasing runs collapsed.
std::string format_rank_runs(const std::vector<int>& ranks);
// "[1, 2, 3]", at most 16 named.
std::string format_peer_list(const std::vector<int>& peers);

// The argument checks of Communicator::all_to_all_v_async, shared by the
// backends: every vector has `size` entries, none negative, a buffer with a
// non-zero count is not null, and this rank's (`rank`) own block has equal
// send and receive counts. The error names the argument.
Status check_all_to_all_v_args(int size, int rank, const void* send, const std::vector<int64_t>& send_counts,
                               const std::vector<int64_t>& send_displs, const void* recv,
                               const std::vector<int64_t>& recv_counts, const std::vector<int64_t>& recv_displs);

struct CommOptions {
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};
};

// Options of single operations, as Gloo's per-operation options
// (AllreduceOptions::setTimeout): set for the operations issued while an
// OpOptionsScope lives (below). Point-to-point operations carry their tag as
// an argument; collectives are matched by the order they are issued in.
struct OpOptions {
  // This operation's deadline instead of CommOptions::timeout; 0: that one.
  std::chrono::milliseconds timeout{0};
};

// An operation in flight.
class Work {
 public:
  virtual ~Work() = default;
  // Non-blocking progress check: true once complete (also drives progress of
  // the transport, so call it between chunks of compute to overlap).
  virtual bool test() = 0;
  // Blocks until complete or the deadline passes (see above).
  virtual Status wait() = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // "world", "dp", "tp", "pp", ...; used in diagnostics.
  virtual const std::string& name() const = 0;
  // The world rank of a member of this communicator, for diagnostics.
  virtual int world_rank_of(int rank) const = 0;

  // In place when send == recv. count elements on every rank.
  virtual std::unique_ptr<Work> all_reduce_async(const void* send, void* recv, int64_t count, ElemType type,
                                                 ReduceOp op) = 0;
  // send holds size() * recv_count elements; rank r gets the reduction of
  // block r. In place when send == recv (rank r's block then lands at recv).
  virtual std::unique_ptr<Work> reduce_scatter_async(const void* send, void* recv, int64_t recv_count,
                                                     ElemType type, ReduceOp op) = 0;
  // recv gets size() * send_count elements, block r from rank r. In place
  // when send == recv + rank() * send_count.
  virtual std::unique_ptr<Work> all_gather_async(const void* send, void* recv, int64_t send_count,
                                                 ElemType type) = 0;
  virtual std::unique_ptr<Work> broadcast_async(void* data, int64_t count, ElemType type, int root) = 0;
  virtual std::unique_ptr<Work> send_async(const void* data, int64_t bytes, int peer, int tag) = 0;
  virtual std::unique_ptr<Work> recv_async(void* data, int64_t bytes, int peer, int tag) = 0;
  virtual std::unique_ptr<Work> barrier_async() = 0;

  // All-to-all with per-peer counts (MPI_Alltoallv). This rank sends
  // send_counts[p] elements from send + send_displs[p] to peer p and receives
  // recv_counts[p] elements from p into recv + recv_displs[p]; counts and
  // displacements are in elements of `type`, size() entries each, zero allowed.
  // Every rank's send_counts[q] must equal q's recv_counts[this rank].
  // The vectors are copied; the buffers must live until wait().
  // Wrong vector sizes, negative entries or a null buffer with a non-zero
  // count: an InvalidArgument Status from wait() naming the argument (on every
  // rank that passed it; the others then time out).
  // The default is built from send_async/recv_async (tag kAllToAllTag) plus a
  // local copy for this rank's own block, so every backend has it; backends
  // override it with their native collective.
  static constexpr int kAllToAllTag = 7501;
  virtual std::unique_ptr<Work> all_to_all_v_async(const void* send, const std::vector<int64_t>& send_counts,
                                                   const std::vector<int64_t>& send_displs, void* recv,
                                                   const std::vector<int64_t>& recv_counts,
                                                   const std::vector<int64_t>& recv_displs, ElemType type);

  // Whether buffers passed to operations are device memory (NCCL) rather
  // than host memory (MPI, self).
  virtual bool takes_device_memory() const { return false; }
  // on: from now on every operation first waits for the work queued on the
  // device's compute stream (the legacy default stream, where the model's
  // kernels run) at the time it is posted, so a gradient bucket can be posted
  // right after the kernels that produce it; off undoes that. A no-op for
  // host communicators.
  virtual void order_after_compute(bool on) {}

  // A sub-communicator of the ranks that pass the same color, ordered by key
  // (MPI_Comm_split semantics). Collective over this communicator.
  virtual Result<std::unique_ptr<Communicator>> split(int color, int key, const std::string& name) = 0;

  // The deadline operations get (CommOptions::timeout).
  virtual std::chrono::milliseconds timeout() const = 0;
  // The deadline of an operation issued now: the OpOptionsScope's, else
  // timeout(). Backends read it when an operation is issued, so a Work keeps
  // the deadline it was issued with.
  std::chrono::milliseconds op_timeout() const {
    return op_options_.timeout.count() > 0 ? op_options_.timeout : timeout();
  }

  // Blocking forms.
  Status all_reduce(const void* send, void* recv, int64_t count, ElemType type, ReduceOp op = ReduceOp::kSum) {
    return all_reduce_async(send, recv, count, type, op)->wait();
  }
  Status all_reduce(float* data, int64_t count, ReduceOp op = ReduceOp::kSum) {
    return all_reduce(data, data, count, ElemType::kF32, op);
  }
  Status reduce_scatter(const void* send, void* recv, int64_t recv_count, ElemType type,
                        ReduceOp op = ReduceOp::kSum) {
    return reduce_scatter_async(send, recv, recv_count, type, op)->wait();
  }
  Status all_gather(const void* send, void* recv, int64_t send_count, ElemType type) {
    return all_gather_async(send, recv, send_count, type)->wait();
  }
  Status broadcast(void* data, int64_t count, ElemType type, int root) {
    return broadcast_async(data, count, type, root)->wait();
  }
  Status send(const void* data, int64_t bytes, int peer, int tag) { return send_async(data, bytes, peer, tag)->wait(); }
  Status recv(void* data, int64_t bytes, int peer, int tag) { return recv_async(data, bytes, peer, tag)->wait(); }
  Status barrier() { return barrier_async()->wait(); }
  Status all_to_all_v(const void* send, const std::vector<int64_t>& send_counts,
                      const std::vector<int64_t>& send_displs, void* recv, const std::vector<int64_t>& recv_counts,
                      const std::vector<int64_t>& recv_displs, ElemType type) {
    return all_to_all_v_async(send, send_counts, send_displs, recv, recv_counts, recv_displs, type)->wait();
  }

 private:
  friend class OpOptionsScope;
  OpOptions op_options_;
};

// Per-operation options for the operations issued on `c` while this lives
// (by the thread that issues them), e.g. a long deadline for the one barrier
// that waits while rank 0 runs a check, the communicator's own deadline for
// everything else:
//   { comm::OpOptionsScope wait_long(world, {.timeout = std::chrono::minutes(30)});
//     st = world.barrier(); }
// Scopes nest; the previous options come back when one ends.
class OpOptionsScope {
 public:
  OpOptionsScope(Communicator& c, OpOptions o) : c_(c), saved_(c.op_options_) { c.op_options_ = o; }
  ~OpOptionsScope() { c_.op_options_ = saved_; }
  OpOptionsScope(const OpOptionsScope&) = delete;
  OpOptionsScope& operator=(const OpOptionsScope&) = delete;

 private:
  Communicator& c_;
  OpOptions saved_;
};

}  // namespace tessera::comm
