// NCCL communicator: nonblocking NCCL calls on the communicator's own
// stream, a CUDA event per operation, deadline-bounded waits that abort the
// NCCL communicator on expiry. Bootstrapped over a host communicator (MPI).
#include "comm/nccl/nccl_communicator.h"

#include <nccl.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "comm/op_wait.h"
#include "comm/traffic.h"
#include "core/check.h"
#include "core/host.h"
#include "runtime/cuda_check.h"

namespace tessera::comm {

namespace {

using Clock = std::chrono::steady_clock;

// "<call>: <NCCL error string> (<NCCL's last error, if it says more>)".
std::string nccl_text(ncclResult_t rc, ncclComm_t comm) {
  std::string text = ncclGetErrorString(rc);
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && *last != '\0') text += fmt::format(" ({})", last);
  return text;
}

ncclDataType_t nccl_type(ElemType t) {
  switch (t) {
    case ElemType::kF32: return ncclFloat32;
    case ElemType::kF64: return ncclFloat64;
    case ElemType::kI32: return ncclInt32;
    case ElemType::kI64: return ncclInt64;
    case ElemType::kU64: return ncclUint64;
    case ElemType::kU8: return ncclUint8;
  }
  CHECK(false && "unknown ElemType");
  return ncclUint8;
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kMax: return ncclMax;
    case ReduceOp::kMin: return ncclMin;
  }
  CHECK(false && "unknown ReduceOp");
  return ncclSum;
}

// Makes a device current for a scope and restores the caller's.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    if (cudaGetDevice(&saved_) != cudaSuccess) saved_ = -1;
    if (saved_ != device) cudaSetDevice(device);
  }
  ~DeviceGuard() {
    int now = -1;
    if (saved_ >= 0 && cudaGetDevice(&now) == cudaSuccess && now != saved_) cudaSetDevice(saved_);
  }

 private:
  int saved_ = -1;
};

struct Event {
  cudaEvent_t ev = nullptr;
  ~Event() {
    if (ev != nullptr) cudaEventDestroy(ev);
  }
};

// One enqueue on the stream: a collective, or a group of queued p2p ops
// (whose Works then share it).
struct Launch {
  bool issued = false;
  bool complete = false;        // its event was seen done before any abort
  Status status;                // posting failed, or the communicator was aborted before it completed
  std::shared_ptr<Event> done;  // recorded on the stream after it
};

struct P2P {
  bool is_send = false;
  void* data = nullptr;
  int64_t bytes = 0;
  int peer = 0;
  std::shared_ptr<Launch> launch;
};

}  // namespace

// Everything an NcclCommunicator and its Works share; destroyed with the
// last of them.
struct NcclState {
  ncclComm_t comm = nullptr;  // null once aborted
  cudaStream_t stream = nullptr;
  int device = 0;
  std::string name;
  int rank = 0;
  std::vector<int> world_ranks;  // (size) world rank of each member
  std::vector<std::string> hosts;  // (size) host of each member
  std::chrono::milliseconds timeout{0};
  Status broken;  // non-OK once aborted: why
  uint64_t seq = 0;
  cudaStream_t producer = nullptr;
  cudaEvent_t producer_event = nullptr;
  cudaEvent_t consumer_event = nullptr;
  int32_t* scratch = nullptr;  // (1) device word the barrier reduces
  std::vector<P2P> p2p;        // queued sends/recvs, in posting order
  std::vector<std::weak_ptr<Launch>> in_flight;

  ~NcclState();

  std::string where() const {
    return fmt::format("communicator '{}' [world ranks {}]", name, format_rank_runs(world_ranks));
  }
  std::string describe_on(const OpDesc& d) const { return fmt::format("{} on {}", d.describe(), where()); }
  std::string hosts_of(const std::vector<int>& members) const {
    std::vector<std::string> names;
    for (int m : members)
      if (m >= 0 && m < static_cast<int>(hosts.size()) &&
          std::find(names.begin(), names.end(), hosts[m]) == names.end())
        names.push_back(hosts[m]);
    if (names.empty()) return "";
    std::string out = names.size() == 1 ? " on host " : " on hosts ";
    for (size_t i = 0; i < names.size() && i < 16; i++) out += (i ? ", " : "") + names[i];
    return out;
  }

  // Waits out ncclInProgress after a nonblocking NCCL call (on `comm`, and
  // on `other` too when given: a communicator being created from this one).
  // Any error or the deadline aborts both.
  Status settle(ncclResult_t rc, const char* call, const std::string& what, ncclComm_t other = nullptr) {
    auto failed = [](ncclResult_t r) { return r != ncclSuccess && r != ncclInProgress; };
    auto give_up = [&](const std::string& why) {
      Status st = Status::Unavailable(fmt::format("{}: {}: {}", what, call, why));
      if (other != nullptr) ncclCommAbort(other);
      abort(st);
      return st;
    };
    if (failed(rc)) return give_up(nccl_text(rc, comm));
    const auto deadline = Clock::now() + timeout;
    Poller poller(0, kNcclSpinGBps);
    while (true) {
      ncclResult_t state = ncclSuccess, other_state = ncclSuccess;
      if (comm != nullptr && ncclCommGetAsyncError(comm, &state) != ncclSuccess) state = ncclInternalError;
      if (other != nullptr && ncclCommGetAsyncError(other, &other_state) != ncclSuccess) other_state = ncclInternalError;
      if (failed(state)) return give_up(nccl_text(state, comm));
      if (failed(other_state)) return give_up(nccl_text(other_state, other));
      if (state == ncclSuccess && other_state == ncclSuccess) return Status::OK();
      if (Clock::now() >= deadline) {
        std::vector<int> peers;
        for (int m : others()) peers.push_back(world_ranks[m]);
        return give_up(fmt::format("did not complete within {:.1f} s (peers {}{}); the NCCL communicator was aborted",
                                   std::chrono::duration<double>(timeout).count(), format_peer_list(peers),
                                   hosts_of(others())));
      }
      poller.pause(deadline);
    }
  }

  std::vector<int> others() const {
    std::vector<int> out;
    for (int r = 0; r < static_cast<int>(world_ranks.size()); r++)
      if (r != rank) out.push_back(r);
    return out;
  }

  // ncclCommAbort, once: operations not complete by now fail with `why`'s
  // gist, later ones at once with `broken`.
  void abort(const Status& why) {
    if (!broken.ok()) return;
    broken = Status::Unavailable(fmt::format("{} was aborted earlier: {}", where(), why.message()));
    for (const std::weak_ptr<Launch>& weak : in_flight) {
      std::shared_ptr<Launch> l = weak.lock();
      if (!l || l->complete || !l->status.ok()) continue;
      if (l->issued && l->done && cudaEventQuery(l->done->ev) == cudaSuccess) {
        l->complete = true;
        continue;
      }
      l->status = broken;
    }
    in_flight.clear();
    for (P2P& op : p2p) op.launch->issued = true, op.launch->status = broken;
    p2p.clear();
    if (comm != nullptr) {
      DeviceGuard guard(device);
      ncclCommAbort(comm);
      comm = nullptr;
    }
  }

  // Issues one enqueue: waits on the producer stream, calls enqueue(what)
  // (NCCL calls on `stream`, each settled), records the event.
  template <typename Enqueue>
  Status issue(Launch& launch, const std::string& what, Enqueue enqueue) {
    launch.issued = true;
    if (!broken.ok()) return launch.status = broken;
    DeviceGuard guard(device);
    if (producer != nullptr) {
      if (cudaError_t e = cudaEventRecord(producer_event, producer); e != cudaSuccess)
        return launch.status = cuda::cuda_status(e, "cudaEventRecord(producer stream)").With(what);
      if (cudaError_t e = cudaStreamWaitEvent(stream, producer_event, 0); e != cudaSuccess)
        return launch.status = cuda::cuda_status(e, "cudaStreamWaitEvent(producer stream)").With(what);
    }
    if (Status st = enqueue(what); !st.ok()) return launch.status = st;
    auto ev = std::make_shared<Event>();
    cudaError_t e = cudaEventCreateWithFlags(&ev->ev, cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaEventRecord(ev->ev, stream);
    if (e != cudaSuccess) return launch.status = cuda::cuda_status(e, "cudaEventRecord").With(what);
    launch.done = std::move(ev);
    return Status::OK();
  }

  void track(const std::shared_ptr<Launch>& launch) {
    // Drop finished entries so the list stays as long as what is in flight.
    std::erase_if(in_flight, [](const std::weak_ptr<Launch>& w) {
      std::shared_ptr<Launch> l = w.lock();
      return !l || l->complete || !l->status.ok();
    });
    in_flight.push_back(launch);
  }

  // Issues the queued sends and recvs as one NCCL group.
  Status flush_p2p() {
    if (p2p.empty()) return Status::OK();
    std::vector<P2P> ops;
    ops.swap(p2p);
    auto group = std::make_shared<Launch>();
    const std::string what = fmt::format("{} send/recv operation(s) on {}", ops.size(), where());
    Status st = issue(*group, what, [&](const std::string& w) {
      ncclResult_t rc = ncclGroupStart();
      const char* call = "ncclGroupStart";
      for (const P2P& op : ops) {
        if (rc != ncclSuccess && rc != ncclInProgress) break;
        call = op.is_send ? "ncclSend" : "ncclRecv";
        rc = op.is_send ? ncclSend(op.data, static_cast<size_t>(op.bytes), ncclUint8, op.peer, comm, stream)
                        : ncclRecv(op.data, static_cast<size_t>(op.bytes), ncclUint8, op.peer, comm, stream);
      }
      const ncclResult_t end = ncclGroupEnd();  // always: a group left open would swallow later calls
      if (rc == ncclSuccess || rc == ncclInProgress) rc = end, call = "ncclGroupEnd";
      return settle(rc, call, w);
    });
    for (P2P& op : ops) {
      op.launch->issued = true;
      op.launch->status = group->status;
      op.launch->done = group->done;
      if (st.ok()) track(op.launch);
    }
    return st;
  }
};

NcclState::~NcclState() {
  DeviceGuard guard(device);
  if (comm != nullptr) {
    // Finalize when everything posted has finished (within the deadline),
    // else abort: a peer that never posts its half must not hang exit.
    const auto deadline = Clock::now() + std::min(timeout, std::chrono::milliseconds(10000));
    Poller poller(0, kNcclSpinGBps);
    cudaError_t q;
    while ((q = cudaStreamQuery(stream)) == cudaErrorNotReady && Clock::now() < deadline) poller.pause(deadline);
    bool clean = q == cudaSuccess && p2p.empty();
    if (clean) {
      ncclResult_t state = ncclCommFinalize(comm);  // nonblocking: ncclInProgress until flushed
      while (state == ncclInProgress && Clock::now() < deadline) {
        poller.pause(deadline);
        if (ncclCommGetAsyncError(comm, &state) != ncclSuccess) state = ncclInternalError;
      }
      clean = state == ncclSuccess;
    }
    if (clean) ncclCommDestroy(comm); else ncclCommAbort(comm);
    comm = nullptr;
  }
  if (scratch != nullptr) cudaFree(scratch);
  if (producer_event != nullptr) cudaEventDestroy(producer_event);
  if (consumer_event != nullptr) cudaEventDestroy(consumer_event);
  if (stream != nullptr) cudaStreamDestroy(stream);
  cudaGetLastError();
}

namespace {

class NcclWork final : public Work {
 public:
  NcclWork(std::shared_ptr<NcclState> state, const OpDesc& desc, std::shared_ptr<Launch> launch, int64_t bytes,
           std::chrono::milliseconds timeout)
      : state_(std::move(state)), desc_(desc), launch_(std::move(launch)), bytes_(bytes), timeout_(timeout) {}
  ~NcclWork() override { untrack(); }

  // Counted in traffic() as in flight until seen complete (or abandoned).
  void track(OpKind k) { kind_ = static_cast<int>(k); }

  bool test() override {
    if (!poll()) return false;
    untrack();
    return true;
  }

  bool poll() {
    if (finished_) return true;
    if (!launch_->issued) state_->flush_p2p();
    if (!launch_->status.ok() || launch_->complete) return finished_ = true;
    const cudaError_t e = cudaEventQuery(launch_->done->ev);
    if (e == cudaSuccess) {
      launch_->complete = true;
      return finished_ = true;
    }
    if (e != cudaErrorNotReady) {
      launch_->status = cuda::cuda_status(e, "cudaEventQuery").With(state_->describe_on(desc_));
      state_->abort(launch_->status);
      return finished_ = true;
    }
    if (state_->comm != nullptr) {
      ncclResult_t async = ncclSuccess;
      if (ncclCommGetAsyncError(state_->comm, &async) != ncclSuccess) async = ncclInternalError;
      if (async != ncclSuccess && async != ncclInProgress) {
        launch_->status = Status::Unavailable(fmt::format("{}: asynchronous NCCL error: {}",
                                                          state_->describe_on(desc_),
                                                          nccl_text(async, state_->comm)));
        state_->abort(launch_->status);
        return finished_ = true;
      }
    }
    return false;
  }

  Status wait() override {
    Poller poller(bytes_, kNcclSpinGBps);
    const auto deadline = poller.start() + timeout_;
    while (!test()) {
      const auto now = Clock::now();
      if (now >= deadline) {
        launch_->status = timed_out(now - poller.start());
        state_->abort(launch_->status);
        finished_ = true;
        break;
      }
      poller.pause(deadline);
    }
    return launch_->status;
  }

 private:
  Status timed_out(Clock::duration waited) const {
    std::vector<int> members;
    if (desc_.peer >= 0) {
      members.push_back(desc_.peer);
    } else {
      members = state_->others();
    }
    std::vector<int> peers;
    for (int m : members) peers.push_back(state_->world_ranks[m]);
    const int me = state_->world_ranks[state_->rank];
    return Status::Unavailable(fmt::format(
        "{} timed out after {:.1f} s waiting on peers {}{} (rank {}{}, cuda:{}); the NCCL communicator was aborted",
        state_->describe_on(desc_), std::chrono::duration<double>(waited).count(), format_peer_list(peers),
        state_->hosts_of(members), me, state_->hosts_of({state_->rank}), state_->device));
  }

  void untrack() {
    if (kind_ < 0) return;
    traffic().op_finished(static_cast<OpKind>(kind_));
    kind_ = -1;
  }

  std::shared_ptr<NcclState> state_;
  OpDesc desc_;
  std::shared_ptr<Launch> launch_;
  int64_t bytes_;
  std::chrono::milliseconds timeout_;  // the deadline it was issued with
  bool finished_ = false;
  int kind_ = -1;  // the OpKind in flight in traffic(); -1: none
};

// Posts one collective: checks, then issues `enqueue` (after any queued p2p).
// `kind` (-1: not counted, the barrier) and `root` (broadcast) account it
// in traffic() by its algorithm's model, over `bytes`.
template <typename Enqueue>
std::unique_ptr<NcclWork> post(const std::shared_ptr<NcclState>& s, std::chrono::milliseconds timeout, OpDesc desc,
                           int kind, int64_t bytes,
                           const std::string& invalid, Enqueue enqueue, int root = 0) {
  desc.seq = ++s->seq;
  auto launch = std::make_shared<Launch>();
  auto work = std::make_unique<NcclWork>(s, desc, launch, bytes, timeout);
  if (!invalid.empty()) {
    launch->issued = true;
    launch->status = Status::InvalidArgument(fmt::format("{}: {}", s->describe_on(desc), invalid));
    return work;
  }
  if (kind >= 0) {
    traffic().account_collective(static_cast<OpKind>(kind), bytes, s->rank, s->world_ranks, root);
    work->track(static_cast<OpKind>(kind));
  }
  if (Status st = s->flush_p2p(); !st.ok()) {
    launch->issued = true;
    launch->status = s->broken.ok() ? st : s->broken;
    return work;
  }
  if (s->issue(*launch, s->describe_on(desc), enqueue).ok()) s->track(launch);
  return work;
}

std::string check_count(int64_t count) { return count < 0 ? "negative count" : ""; }

}  // namespace

// ---- NcclCommunicator ------------------------------------------------------

NcclCommunicator::NcclCommunicator(std::shared_ptr<NcclState> state) : state_(std::move(state)) {}
NcclCommunicator::~NcclCommunicator() = default;

int NcclCommunicator::rank() const { return state_->rank; }
int NcclCommunicator::size() const { return static_cast<int>(state_->world_ranks.size()); }
const std::string& NcclCommunicator::name() const { return state_->name; }
int NcclCommunicator::world_rank_of(int rank) const { return state_->world_ranks.at(rank); }
std::chrono::milliseconds NcclCommunicator::timeout() const { return state_->timeout; }
cudaStream_t NcclCommunicator::stream() const { return state_->stream; }
int NcclCommunicator::device() const { return state_->device; }

std::unique_ptr<Work> NcclCommunicator::all_reduce_async(const void* send, void* recv, int64_t count, ElemType type,
                                                         ReduceOp op) {
  NcclState& s = *state_;
  return post(state_, op_timeout(), {"all_reduce", 0, count, type}, static_cast<int>(OpKind::kAllReduce),
              count * elem_size(type), check_count(count),
              [&](const std::string& what) {
                if (count == 0) return Status::OK();
                return s.settle(ncclAllReduce(send, recv, static_cast<size_t>(count), nccl_type(type), nccl_op(op),
                                              s.comm, s.stream),
                                "ncclAllReduce", what);
              });
}

std::unique_ptr<Work> NcclCommunicator::reduce_scatter_async(const void* send, void* recv, int64_t recv_count,
                                                             ElemType type, ReduceOp op) {
  NcclState& s = *state_;
  const size_t esz = elem_size(type);
  return post(state_, op_timeout(), {"reduce_scatter", 0, recv_count, type}, static_cast<int>(OpKind::kReduceScatter),
              recv_count * size() * esz, check_count(recv_count),
              [&](const std::string& what) {
                if (recv_count == 0) return Status::OK();
                const size_t n = static_cast<size_t>(recv_count);
                if (send != recv)
                  return s.settle(ncclReduceScatter(send, recv, n, nccl_type(type), nccl_op(op), s.comm, s.stream),
                                  "ncclReduceScatter", what);
                // Ours lands rank r's block at recv; NCCL's in-place form
                // leaves it in block r of the buffer. Reduce there, then
                // move it (the two blocks do not overlap for r > 0).
                char* block = static_cast<char*>(recv) + s.rank * n * esz;
                RETURN_IF_ERROR(s.settle(
                    ncclReduceScatter(send, block, n, nccl_type(type), nccl_op(op), s.comm, s.stream),
                    "ncclReduceScatter", what));
                if (s.rank != 0)
                  if (cudaError_t e = cudaMemcpyAsync(recv, block, n * esz, cudaMemcpyDeviceToDevice, s.stream);
                      e != cudaSuccess)
                    return cuda::cuda_status(e, "cudaMemcpyAsync(in-place reduce_scatter result)").With(what);
                return Status::OK();
              });
}

std::unique_ptr<Work> NcclCommunicator::all_gather_async(const void* send, void* recv, int64_t send_count,
                                                         ElemType type) {
  NcclState& s = *state_;
  // In place (send == recv + rank * send_count) is NCCL's own in-place form.
  return post(state_, op_timeout(), {"all_gather", 0, send_count, type}, static_cast<int>(OpKind::kAllGather),
              send_count * size() * elem_size(type),
              check_count(send_count), [&](const std::string& what) {
                if (send_count == 0) return Status::OK();
                return s.settle(
                    ncclAllGather(send, recv, static_cast<size_t>(send_count), nccl_type(type), s.comm, s.stream),
                    "ncclAllGather", what);
              });
}

std::unique_ptr<Work> NcclCommunicator::broadcast_async(void* data, int64_t count, ElemType type, int root) {
  NcclState& s = *state_;
  std::string invalid = check_count(count);
  if (invalid.empty() && (root < 0 || root >= size())) invalid = fmt::format("root {} out of range", root);
  return post(state_, op_timeout(), {"broadcast", 0, count, type}, static_cast<int>(OpKind::kBroadcast),
              count * elem_size(type), invalid, [&](const std::string& what) {
    if (count == 0) return Status::OK();
    return s.settle(ncclBroadcast(data, data, static_cast<size_t>(count), nccl_type(type), root, s.comm, s.stream),
                    "ncclBroadcast", what);
  }, root);
}

namespace {

std::unique_ptr<Work> queue_p2p(const std::shared_ptr<NcclState>& s, std::chrono::milliseconds timeout, bool is_send,
                                void* data, int64_t bytes,
                                int peer, int tag) {
  OpDesc desc{is_send ? "send" : "recv", ++s->seq, bytes, ElemType::kU8, true, peer};
  auto launch = std::make_shared<Launch>();
  auto work = std::make_unique<NcclWork>(s, desc, launch, bytes, timeout);
  std::string invalid;
  if (bytes < 0) invalid = "negative byte count";
  else if (peer < 0 || peer >= static_cast<int>(s->world_ranks.size())) invalid = fmt::format("peer {} out of range", peer);
  else if (tag < 0) invalid = fmt::format("tag {} < 0", tag);
  if (!invalid.empty()) {
    launch->issued = true;
    launch->status = Status::InvalidArgument(fmt::format("{}: {}", s->describe_on(desc), invalid));
  } else if (!s->broken.ok()) {
    launch->issued = true;
    launch->status = s->broken;
  } else if (bytes == 0) {
    launch->issued = true;  // nothing to move; the peer's matching op is a no-op too
    launch->complete = true;
  } else {
    s->p2p.push_back({is_send, data, bytes, peer, launch});
    traffic().op_posted(OpKind::kSendRecv, static_cast<double>(bytes));
    const uint64_t b = static_cast<uint64_t>(bytes);
    traffic().add_peer_bytes(s->world_ranks[static_cast<size_t>(peer)], is_send ? b : 0, is_send ? 0 : b);
    work->track(OpKind::kSendRecv);
  }
  return work;
}

}  // namespace

std::unique_ptr<Work> NcclCommunicator::send_async(const void* data, int64_t bytes, int peer, int tag) {
  return queue_p2p(state_, op_timeout(), true, const_cast<void*>(data), bytes, peer, tag);
}

std::unique_ptr<Work> NcclCommunicator::recv_async(void* data, int64_t bytes, int peer, int tag) {
  return queue_p2p(state_, op_timeout(), false, data, bytes, peer, tag);
}

std::unique_ptr<Work> NcclCommunicator::barrier_async() {
  NcclState& s = *state_;
  return post(state_, op_timeout(), {"barrier"}, -1, 4, "", [&](const std::string& what) {
    return s.settle(ncclAllReduce(s.scratch, s.scratch, 1, ncclInt32, ncclSum, s.comm, s.stream), "ncclAllReduce",
                    what);
  });
}

std::unique_ptr<Work> NcclCommunicator::all_to_all_v_async(const void* send, const std::vector<int64_t>& send_counts,
                                                           const std::vector<int64_t>& send_displs, void* recv,
                                                           const std::vector<int64_t>& recv_counts,
                                                           const std::vector<int64_t>& recv_displs, ElemType type) {
  NcclState& s = *state_;
  const int n = size();
  const size_t esz = elem_size(type);
  Status args = check_all_to_all_v_args(n, rank(), send, send_counts, send_displs, recv, recv_counts, recv_displs);
  int64_t moved = 0;
  if (args.ok())
    for (int p = 0; p < n; p++) moved += send_counts[p] + recv_counts[p];
  // Accounted exactly (per peer) here, not by post()'s collective model.
  if (args.ok()) traffic().account_all_to_all(s.rank, s.world_ranks, send_counts, recv_counts, static_cast<int64_t>(esz));
  // The vectors are copied into the enqueue's captures: post() issues now or
  // fails, so references to the arguments are still valid inside it.
  auto w = post(state_, op_timeout(), {"all_to_all_v", 0, moved, type}, -1, moved * static_cast<int64_t>(esz),
                args.ok() ? std::string() : args.message(), [&](const std::string& what) {
    ncclResult_t rc = ncclGroupStart();
    const char* call = "ncclGroupStart";
    const ncclDataType_t dt = nccl_type(type);
    for (int p = 0; p < n; p++) {
      if (rc != ncclSuccess && rc != ncclInProgress) break;
      if (send_counts[p] > 0) {
        call = "ncclSend";
        rc = ncclSend(static_cast<const char*>(send) + send_displs[p] * esz, static_cast<size_t>(send_counts[p]), dt,
                      p, s.comm, s.stream);
      }
      if ((rc == ncclSuccess || rc == ncclInProgress) && recv_counts[p] > 0) {
        call = "ncclRecv";
        rc = ncclRecv(static_cast<char*>(recv) + recv_displs[p] * esz, static_cast<size_t>(recv_counts[p]), dt, p,
                      s.comm, s.stream);
      }
    }
    const ncclResult_t end = ncclGroupEnd();  // always: a group left open would swallow later calls
    if (rc == ncclSuccess || rc == ncclInProgress) rc = end, call = "ncclGroupEnd";
    return s.settle(rc, call, what);
  });
  if (args.ok()) w->track(OpKind::kAllToAll);
  return w;
}

void NcclCommunicator::set_producer_stream(cudaStream_t producer) { state_->producer = producer; }

Status NcclCommunicator::wait_for_event(cudaEvent_t event) {
  DeviceGuard guard(state_->device);
  TRY_CUDA(cudaStreamWaitEvent(state_->stream, event, 0));
  return Status::OK();
}

Status NcclCommunicator::consumers_wait(cudaStream_t consumer) {
  RETURN_IF_ERROR(state_->flush_p2p());
  DeviceGuard guard(state_->device);
  TRY_CUDA(cudaEventRecord(state_->consumer_event, state_->stream));
  TRY_CUDA(cudaStreamWaitEvent(consumer, state_->consumer_event, 0));
  return Status::OK();
}

void NcclCommunicator::abort(const std::string& why) {
  state_->abort(Status::Unavailable(fmt::format("{}: aborted by this rank: {}", state_->where(), why)));
}

// ---- Creation ----------------------------------------------------------------

namespace {

// What every rank tells the others before NCCL is involved.
struct JoinInfo {
  char host[64] = {};
  int32_t device = -1;
  int32_t ok = 0;
};

// The stream, events and scratch word of a new communicator on the current
// device.
Status make_local_resources(NcclState& s) {
  TRY_CUDA(cudaGetDevice(&s.device));
  TRY_CUDA(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking));
  TRY_CUDA(cudaEventCreateWithFlags(&s.producer_event, cudaEventDisableTiming));
  TRY_CUDA(cudaEventCreateWithFlags(&s.consumer_event, cudaEventDisableTiming));
  TRY_CUDA(cudaMalloc(reinterpret_cast<void**>(&s.scratch), sizeof(int32_t)));
  TRY_CUDA(cudaMemset(s.scratch, 0, sizeof(int32_t)));
  return Status::OK();
}

ncclConfig_t nonblocking_config(const std::string& name) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  config.commName = name.c_str();  // copied by NCCL during creation
  return config;
}

}  // namespace

bool nccl_compiled() { return true; }

std::string nccl_version() {
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return "?";
  // NCCL_VERSION(X,Y,Z) is X*10000 + Y*100 + Z since 2.9.
  return fmt::format("{}.{}.{}", v / 10000, (v / 100) % 100, v % 100);
}

Result<std::unique_ptr<Communicator>> make_nccl_communicator(Communicator& bootstrap, const std::string& name,
                                                             const CommOptions& options) {
  auto s = std::make_shared<NcclState>();
  s->name = name;
  s->rank = bootstrap.rank();
  s->timeout = options.timeout;
  const int n = bootstrap.size();
  for (int r = 0; r < n; r++) s->world_ranks.push_back(bootstrap.world_rank_of(r));
  const std::string context = fmt::format("creating NCCL communicator '{}'", name);

  // 1. Local resources; then everyone learns who is ready, on which host
  //    and device, so a failure anywhere is an error everywhere (no rank is
  //    left waiting in NCCL's bootstrap for one that gave up).
  Status local = make_local_resources(*s);
  JoinInfo mine;
  std::snprintf(mine.host, sizeof(mine.host), "%s", host_name().c_str());
  mine.device = s->device;
  mine.ok = local.ok();
  std::vector<JoinInfo> all(n);
  RETURN_IF_ERROR(bootstrap.all_gather(&mine, all.data(), sizeof(JoinInfo), ElemType::kU8).With(context));
  for (const JoinInfo& j : all) s->hosts.emplace_back(j.host, strnlen(j.host, sizeof(j.host)));
  if (!local.ok()) return local.With(fmt::format("{} on rank {}", context, s->rank));
  std::vector<int> failed;
  for (int r = 0; r < n; r++)
    if (!all[r].ok) failed.push_back(s->world_ranks[r]);
  if (!failed.empty())
    return Status::Unavailable(fmt::format("{}: world rank(s) {} could not set up their CUDA device (see their errors)",
                                           context, format_peer_list(failed)));
  for (int a = 0; a < n; a++)
    for (int b = a + 1; b < n; b++)
      if (s->hosts[a] == s->hosts[b] && all[a].device == all[b].device)
        return Status::InvalidArgument(fmt::format(
            "{}: ranks {} and {} both use cuda:{} on host {}; NCCL needs one device per rank (start at most as "
            "many ranks per host as it has GPUs)",
            context, s->world_ranks[a], s->world_ranks[b], all[a].device, s->hosts[a]));

  // 2. Rank 0's unique id, with whether it could make one.
  struct IdMessage {
    int32_t ok = 0;
    char error[200] = {};
    ncclUniqueId id{};
  } msg;
  if (s->rank == 0) {
    const ncclResult_t rc = ncclGetUniqueId(&msg.id);
    msg.ok = rc == ncclSuccess;
    if (!msg.ok) std::snprintf(msg.error, sizeof(msg.error), "ncclGetUniqueId: %s", nccl_text(rc, nullptr).c_str());
  }
  RETURN_IF_ERROR(bootstrap.broadcast(&msg, sizeof(msg), ElemType::kU8, 0).With(context));
  if (!msg.ok) return Status::Unavailable(fmt::format("{}: on rank 0: {}", context, msg.error));

  // 3. The NCCL communicator, nonblocking, bounded by the deadline.
  ncclConfig_t config = nonblocking_config(name);
  const ncclResult_t rc = ncclCommInitRankConfig(&s->comm, n, msg.id, s->rank, &config);
  if (rc != ncclSuccess && rc != ncclInProgress) {
    Status st = Status::Unavailable(fmt::format("{}: ncclCommInitRankConfig: {}", context, nccl_text(rc, s->comm)));
    if (s->comm != nullptr) ncclCommAbort(s->comm);
    s->comm = nullptr;
    return st;
  }
  RETURN_IF_ERROR(s->settle(rc, "ncclCommInitRankConfig", context));
  return std::unique_ptr<Communicator>(new NcclCommunicator(std::move(s)));
}

Result<std::unique_ptr<Communicator>> NcclCommunicator::split(int color, int key, const std::string& name) {
  NcclState& s = *state_;
  const std::string context = fmt::format("split of '{}' into '{}'", s.name, name);
  if (color < 0) return Status::InvalidArgument(fmt::format("{}: color {} < 0", context, color));
  if (!s.broken.ok()) return s.broken.With(context);
  // Everyone's (color, key), through a device buffer: the members of the
  // new communicator, in order, for its world ranks and diagnostics.
  const int n = size();
  std::vector<int32_t> all(2 * n);
  const int32_t mine[2] = {color, key};
  int32_t* dev = nullptr;
  {
    DeviceGuard guard(s.device);
    TRY_CUDA(cudaMalloc(reinterpret_cast<void**>(&dev), all.size() * sizeof(int32_t)));
  }
  Status st = Status::OK();
  {
    DeviceGuard guard(s.device);
    if (cudaError_t e = cudaMemcpy(dev + 2 * s.rank, mine, sizeof(mine), cudaMemcpyHostToDevice); e != cudaSuccess)
      st = cuda::cuda_status(e, "cudaMemcpy");
  }
  if (st.ok()) st = all_gather(dev + 2 * s.rank, dev, 2, ElemType::kI32);
  if (st.ok()) {
    DeviceGuard guard(s.device);
    if (cudaError_t e = cudaMemcpy(all.data(), dev, all.size() * sizeof(int32_t), cudaMemcpyDeviceToHost);
        e != cudaSuccess)
      st = cuda::cuda_status(e, "cudaMemcpy");
  }
  {
    DeviceGuard guard(s.device);
    cudaFree(dev);
  }
  RETURN_IF_ERROR(st.With(context));
  std::vector<int> members;
  for (int r = 0; r < n; r++)
    if (all[2 * r] == color) members.push_back(r);
  std::stable_sort(members.begin(), members.end(), [&](int a, int b) { return all[2 * a + 1] < all[2 * b + 1]; });

  auto sub = std::make_shared<NcclState>();
  sub->name = name;
  sub->timeout = s.timeout;
  {
    DeviceGuard guard(s.device);
    RETURN_IF_ERROR(make_local_resources(*sub).With(context));
  }
  for (size_t i = 0; i < members.size(); i++) {
    sub->world_ranks.push_back(s.world_ranks[members[i]]);
    sub->hosts.push_back(s.hosts[members[i]]);
    if (members[i] == s.rank) sub->rank = static_cast<int>(i);
  }
  RETURN_IF_ERROR(s.flush_p2p().With(context));
  DeviceGuard guard(s.device);
  ncclConfig_t config = nonblocking_config(name);
  ncclComm_t child = nullptr;
  const ncclResult_t rc = ncclCommSplit(s.comm, color, key, &child, &config);
  RETURN_IF_ERROR(s.settle(rc, "ncclCommSplit", context, child));  // aborts child and parent on failure
  sub->comm = child;
  int nccl_rank = -1;
  if (ncclCommUserRank(child, &nccl_rank) == ncclSuccess) CHECK(nccl_rank == sub->rank);
  return std::unique_ptr<Communicator>(new NcclCommunicator(std::move(sub)));
}

}  // namespace tessera::comm
