#include "perf/comm_bench.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <vector>

#include "runtime/cuda_device.h"

namespace tessera::perf {

using comm::Communicator;
using comm::ElemType;
using Clock = std::chrono::steady_clock;

const char* comm_op_name(CommOp op) {
  switch (op) {
    case CommOp::kAllReduce: return "allreduce";
    case CommOp::kReduceScatter: return "reduce_scatter";
    case CommOp::kAllGather: return "all_gather";
    case CommOp::kBroadcast: return "broadcast";
    case CommOp::kSendRecv: return "sendrecv";
    case CommOp::kAllToAll: return "alltoall";
  }
  return "?";
}

CommLayout comm_layout(CommOp op, int64_t bytes, int64_t ts, int n) {
  const int64_t count = bytes / ts;
  CommLayout l;
  switch (op) {
    case CommOp::kAllReduce:
      l.send_count = l.recv_count = l.param_count = count;
      l.bus_factor = 2.0 * (n - 1) / n;
      break;
    case CommOp::kReduceScatter:
      l.param_count = l.recv_count = count / n;
      l.send_count = l.recv_count * n;
      l.bus_factor = double(n - 1) / n;
      break;
    case CommOp::kAllGather:
      l.param_count = l.send_count = count / n;
      l.recv_count = l.send_count * n;
      l.bus_factor = double(n - 1) / n;
      break;
    case CommOp::kAllToAll:
      l.param_count = count / n;  // per peer
      l.send_count = l.recv_count = l.param_count * n;
      l.bus_factor = double(n - 1) / n;
      break;
    case CommOp::kBroadcast:
    case CommOp::kSendRecv:
      l.send_count = l.recv_count = l.param_count = count;
      break;
  }
  l.size_bytes = std::max(l.send_count, l.recv_count) * ts;
  l.alg_bytes = (op == CommOp::kReduceScatter || op == CommOp::kAllGather || op == CommOp::kAllToAll)
                    ? double(l.param_count) * n * ts
                    : double(count) * ts;
  return l;
}

namespace {

// Rank r's element i: small integers, so float sums are exact and every
// rank can compute every other rank's data to check results.
template <typename T>
T pattern(int64_t i, int r) {
  return static_cast<T>((i * 7 + r * 3 + 1) % 17);
}

// Host vectors, and with --backend nccl their device twins (which the
// operations then use; the host side only fills and checks).
template <typename T>
struct Buffers {
  std::vector<T> send, recv;
  void* dev_send = nullptr;
  void* dev_recv = nullptr;
  bool on_device = false;

  Buffers() = default;
  Buffers(const Buffers&) = delete;
  Buffers& operator=(const Buffers&) = delete;
  ~Buffers() {
    (void)cuda::device_free(dev_send);
    (void)cuda::device_free(dev_recv);
  }
  // Device buffers of the host ones' sizes (at least one element each).
  Status to_device() {
    on_device = true;
    ASSIGN_OR_RETURN(dev_send, cuda::device_malloc(std::max<size_t>(send.size(), 1) * sizeof(T)));
    ASSIGN_OR_RETURN(dev_recv, cuda::device_malloc(std::max<size_t>(recv.size(), 1) * sizeof(T)));
    return upload();
  }
  Status upload() {
    if (!on_device) return Status::OK();
    RETURN_IF_ERROR(cuda::memcpy_h2d(dev_send, send.data(), send.size() * sizeof(T)));
    return cuda::memcpy_h2d(dev_recv, recv.data(), recv.size() * sizeof(T));
  }
  Status download_recv() {
    if (!on_device) return Status::OK();
    return cuda::memcpy_d2h(recv.data(), dev_recv, recv.size() * sizeof(T));
  }
  void* send_ptr() { return on_device ? dev_send : send.data(); }
  void* recv_ptr() { return on_device ? dev_recv : recv.data(); }
};

// Posts one iteration of the operation; its Works go to `out`.
template <typename T>
void post_once(Communicator& c, CommOp op, Buffers<T>& b, const CommLayout& l, ElemType et,
               std::vector<std::unique_ptr<comm::Work>>& out) {
  const int n = c.size(), r = c.rank();
  switch (op) {
    case CommOp::kAllReduce:
      out.push_back(c.all_reduce_async(b.send_ptr(), b.recv_ptr(), l.param_count, et, comm::ReduceOp::kSum));
      return;
    case CommOp::kReduceScatter:
      out.push_back(c.reduce_scatter_async(b.send_ptr(), b.recv_ptr(), l.param_count, et, comm::ReduceOp::kSum));
      return;
    case CommOp::kAllGather: out.push_back(c.all_gather_async(b.send_ptr(), b.recv_ptr(), l.param_count, et)); return;
    case CommOp::kBroadcast: out.push_back(c.broadcast_async(b.recv_ptr(), l.param_count, et, 0)); return;
    case CommOp::kAllToAll: {
      std::vector<int64_t> counts(n, l.param_count), displs(n);
      for (int p = 0; p < n; p++) displs[p] = p * l.param_count;
      out.push_back(c.all_to_all_v_async(b.send_ptr(), counts, displs, b.recv_ptr(), counts, displs, et));
      out.back()->test();  // starts it now (NCCL issues its group when tested or waited)
      return;
    }
    case CommOp::kSendRecv: {
      const int64_t bytes = l.param_count * static_cast<int64_t>(sizeof(T));
      out.push_back(c.recv_async(b.recv_ptr(), bytes, (r + n - 1) % n, 0));
      out.push_back(c.send_async(b.send_ptr(), bytes, (r + 1) % n, 0));
      out.back()->test();  // starts the pair now (NCCL queues p2p until a Work is tested or waited)
      return;
    }
  }
}

Status wait_all(std::vector<std::unique_ptr<comm::Work>>& works) {
  Status first;
  for (auto& w : works) {
    Status st = w->wait();
    if (first.ok()) first = st;
  }
  works.clear();
  return first;
}

template <typename T>
Status run_once(Communicator& c, CommOp op, Buffers<T>& b, const CommLayout& l, ElemType et) {
  std::vector<std::unique_ptr<comm::Work>> works;
  post_once(c, op, b, l, et, works);
  return wait_all(works);
}

// Fills the inputs, runs the operation once and counts the wrong elements of
// this rank's output.
template <typename T>
Result<int64_t> check_once(Communicator& c, CommOp op, Buffers<T>& b, const CommLayout& l, ElemType et) {
  const int n = c.size(), r = c.rank();
  for (int64_t i = 0; i < l.send_count; i++) b.send[i] = pattern<T>(i, r);
  std::fill(b.recv.begin(), b.recv.end(), T(99));
  if (op == CommOp::kBroadcast && r == 0)
    for (int64_t i = 0; i < l.recv_count; i++) b.recv[i] = pattern<T>(i, 0);
  RETURN_IF_ERROR(b.upload());
  RETURN_IF_ERROR(run_once(c, op, b, l, et));
  RETURN_IF_ERROR(b.download_recv());
  int64_t wrong = 0;
  for (int64_t i = 0; i < l.recv_count; i++) {
    T want{};
    switch (op) {
      case CommOp::kAllReduce:
        for (int q = 0; q < n; q++) want = static_cast<T>(want + pattern<T>(i, q));
        break;
      case CommOp::kReduceScatter:
        for (int q = 0; q < n; q++) want = static_cast<T>(want + pattern<T>(r * l.recv_count + i, q));
        break;
      case CommOp::kAllGather: want = pattern<T>(i % l.send_count, static_cast<int>(i / l.send_count)); break;
      case CommOp::kBroadcast: want = pattern<T>(i, 0); break;
      case CommOp::kSendRecv: want = pattern<T>(i, (r + n - 1) % n); break;
      case CommOp::kAllToAll:  // block q of the output: block r of rank q's input
        want = pattern<T>(r * l.param_count + i % l.param_count, static_cast<int>(i / l.param_count));
        break;
    }
    wrong += b.recv[i] != want;
  }
  return wrong;
}


template <typename T>
Result<CollectiveResult> bench_size(Communicator& c, Communicator& host, const CollectiveOptions& a, int64_t bytes,
                                    ElemType et, bool on_device) {
  CollectiveResult row;
  row.layout = comm_layout(a.op, bytes, sizeof(T), c.size());
  const CommLayout& l = row.layout;
  Buffers<T> b;
  b.send.assign(l.send_count, T(1));
  b.recv.assign(l.recv_count, T(0));
  if (on_device) RETURN_IF_ERROR(b.to_device());
  for (int i = 0; i < a.warmup; i++) RETURN_IF_ERROR(run_once(c, a.op, b, l, et));
  RETURN_IF_ERROR(c.barrier());
  const auto t0 = Clock::now();
  if (on_device) {
    // Back to back on the stream; done when the last has completed.
    std::vector<std::unique_ptr<comm::Work>> works;
    for (int i = 0; i < a.iters; i++) post_once(c, a.op, b, l, et, works);
    RETURN_IF_ERROR(wait_all(works));
  } else {
    for (int i = 0; i < a.iters; i++) RETURN_IF_ERROR(run_once(c, a.op, b, l, et));
  }
  double seconds = std::chrono::duration<double>(Clock::now() - t0).count() / a.iters;
  RETURN_IF_ERROR(host.all_reduce(&seconds, &seconds, 1, ElemType::kF64, comm::ReduceOp::kMax));
  row.time_us = seconds * 1e6;
  row.algbw = l.alg_bytes / seconds / 1e9;
  row.busbw = row.algbw * l.bus_factor;
  if (a.check) {
    ASSIGN_OR_RETURN(row.wrong, check_once(c, a.op, b, l, et));
    RETURN_IF_ERROR(host.all_reduce(&row.wrong, &row.wrong, 1, ElemType::kI64));
  }
  return row;
}

}  // namespace

Result<CollectiveResult> bench_collective(Communicator& c, Communicator& host, const CollectiveOptions& a,
                                          int64_t bytes, ElemType et, bool on_device) {
  switch (et) {
    case ElemType::kF32: return bench_size<float>(c, host, a, bytes, et, on_device);
    case ElemType::kF64: return bench_size<double>(c, host, a, bytes, et, on_device);
    case ElemType::kI32: return bench_size<int32_t>(c, host, a, bytes, et, on_device);
    case ElemType::kI64: return bench_size<int64_t>(c, host, a, bytes, et, on_device);
    case ElemType::kU64: return bench_size<uint64_t>(c, host, a, bytes, et, on_device);
    case ElemType::kU8: return bench_size<uint8_t>(c, host, a, bytes, et, on_device);
  }
  return Status::Internal("unknown type");
}


namespace {

// Message tags; stream s of a transfer uses kDataTag + s.
constexpr int kAckTag = 1, kPingTag = 2, kPongTag = 3, kDataTag = 16;
constexpr int kLatencyWarmup = 10;


Status wait_all_first_error(std::vector<std::unique_ptr<comm::Work>>& works) {
  Status first;
  for (auto& w : works) {
    Status st = w->wait();
    if (first.ok() && !st.ok()) first = st;
  }
  return first;
}

// One transfer of buf (bytes) from src to dst as `streams` concurrent
// messages, then a 1-byte ack back. Called on src and dst only.
Status transfer(Communicator& c, std::vector<char>& buf, int64_t bytes, int streams, int src, int dst) {
  const bool sending = c.rank() == src;
  const int peer = sending ? dst : src;
  std::vector<std::unique_ptr<comm::Work>> works;
  works.reserve(streams);
  int64_t offset = 0;
  for (int s = 0; s < streams; s++) {
    // The first bytes % streams streams carry one byte more.
    const int64_t len = bytes / streams + (s < bytes % streams ? 1 : 0);
    works.push_back(sending ? c.send_async(buf.data() + offset, len, peer, kDataTag + s)
                            : c.recv_async(buf.data() + offset, len, peer, kDataTag + s));
    offset += len;
  }
  RETURN_IF_ERROR(wait_all_first_error(works));
  char ack = 1;
  return sending ? c.recv(&ack, 1, peer, kAckTag) : c.send(&ack, 1, peer, kAckTag);
}

// Mean seconds per transfer over a.iters, after a.warmup; this rank's view.
Result<double> time_transfers(Communicator& c, const P2pOptions& a, std::vector<char>& buf, int64_t bytes, int streams,
                              int src, int dst) {
  for (int i = 0; i < a.warmup; i++) RETURN_IF_ERROR(transfer(c, buf, bytes, streams, src, dst));
  const auto t0 = Clock::now();
  for (int i = 0; i < a.iters; i++) RETURN_IF_ERROR(transfer(c, buf, bytes, streams, src, dst));
  return std::chrono::duration<double>(Clock::now() - t0).count() / a.iters;
}

// Median one-way latency in seconds on src (half the round trip); 0 on dst,
// which only echoes.
Result<double> time_latency(Communicator& c, const P2pOptions& a, std::vector<char>& msg, int src, int dst) {
  const int64_t n = static_cast<int64_t>(msg.size());
  const bool pinging = c.rank() == src;
  std::vector<double> half_rtt;
  half_rtt.reserve(a.lat_iters);
  for (int i = 0; i < kLatencyWarmup + a.lat_iters; i++) {
    const auto t0 = Clock::now();
    if (pinging) {
      RETURN_IF_ERROR(c.send(msg.data(), n, dst, kPingTag));
      RETURN_IF_ERROR(c.recv(msg.data(), n, dst, kPongTag));
    } else {
      RETURN_IF_ERROR(c.recv(msg.data(), n, src, kPingTag));
      RETURN_IF_ERROR(c.send(msg.data(), n, src, kPongTag));
    }
    if (i >= kLatencyWarmup) half_rtt.push_back(std::chrono::duration<double>(Clock::now() - t0).count() / 2);
  }
  if (!pinging) return 0.0;
  std::nth_element(half_rtt.begin(), half_rtt.begin() + half_rtt.size() / 2, half_rtt.end());
  return half_rtt[half_rtt.size() / 2];
}


// The most waits src or dst makes in one pair. Each of them ends within the
// Communicator's deadline or the job is aborted by the rank that timed out,
// so a pair lasts at most this many deadlines.
int64_t max_waits_per_pair(const P2pOptions& a) {
  const int64_t transfers = a.warmup + a.iters;
  return transfers * (1 + 1) + transfers * (a.streams + 1) + 2 * (kLatencyWarmup + a.lat_iters) + 1;
}

}  // namespace

// Collective over c: src and dst measure, the others wait in the all_reduce.
Result<PairResult> bench_pair(Communicator& c, const P2pOptions& a, std::vector<char>& buf, std::vector<char>& msg,
                              int64_t bytes, int src, int dst) {
  double r[3] = {0, 0, 0};  // seconds_1, seconds_n, latency_s
  const bool in_pair = c.rank() == src || c.rank() == dst;
  if (in_pair) {
    ASSIGN_OR_RETURN(r[0], time_transfers(c, a, buf, bytes, 1, src, dst));
    ASSIGN_OR_RETURN(r[1], time_transfers(c, a, buf, bytes, a.streams, src, dst));
    ASSIGN_OR_RETURN(r[2], time_latency(c, a, msg, src, dst));
  }
  auto reduce = c.all_reduce_async(r, r, 3, ElemType::kF64, comm::ReduceOp::kMax);
  Status st = reduce->wait();
  // The pair's ranks arrive here within one wait of each other, so one
  // deadline is theirs. The idle ranks wait for the whole measurement, which
  // may legitimately take longer than one deadline (large -b, -n, slow
  // link): they wait again (the Work stays valid after a timeout) for as many
  // deadlines as the pair may take; a stalled pair is reported, and the job
  // ended, by the pair rank whose own wait timed out.
  for (int64_t i = 1; !in_pair && st.code() == StatusCode::kUnavailable && i < max_waits_per_pair(a); i++)
    st = reduce->wait();
  RETURN_IF_ERROR(st);
  return PairResult{r[0], r[1], r[2]};
}

}  // namespace tessera::perf
