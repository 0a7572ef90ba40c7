#include "comm/traffic.h"

#include <algorithm>
#include <chrono>

#include "core/check.h"

namespace tessera::comm {

namespace {

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

const char* op_kind_name(OpKind k) {
  switch (k) {
    case OpKind::kAllReduce: return "all_reduce";
    case OpKind::kReduceScatter: return "reduce_scatter";
    case OpKind::kAllGather: return "all_gather";
    case OpKind::kBroadcast: return "broadcast";
    case OpKind::kSendRecv: return "send_recv";
    case OpKind::kAllToAll: return "all_to_all";
  }
  CHECK(false && "unknown OpKind");
  return "";
}

double bus_factor(OpKind k, int n) {
  if (n <= 1) return 0.0;  // nothing crosses a link
  switch (k) {
    case OpKind::kAllReduce: return 2.0 * (n - 1) / n;
    case OpKind::kReduceScatter:
    case OpKind::kAllGather:
    case OpKind::kAllToAll: return static_cast<double>(n - 1) / n;
    case OpKind::kBroadcast:
    case OpKind::kSendRecv: return 1.0;
  }
  return 0.0;
}

void Traffic::set_world_size(int world_size) {
  // Sized once, at start-up before any operation (an MPI world's size is
  // fixed): a later call is ignored, so the table is never replaced under a
  // reader.
  if (peers_ || world_size <= 0) return;
  peers_ = std::make_unique<PeerCounters[]>(static_cast<size_t>(world_size));
  peer_count_.store(world_size, std::memory_order_release);
}

void Traffic::add_peer_bytes(int world_peer, uint64_t sent, uint64_t received) {
  if (world_peer < 0 || world_peer >= peer_count_.load(std::memory_order_acquire)) return;
  PeerCounters& p = peers_[static_cast<size_t>(world_peer)];
  if (sent) p.sent.fetch_add(sent, std::memory_order_relaxed);
  if (received) p.received.fetch_add(received, std::memory_order_relaxed);
}

void Traffic::op_posted(OpKind k, double bus_bytes) {
  KindCounters& c = kinds_[static_cast<int>(k)];
  c.ops.fetch_add(1, std::memory_order_relaxed);
  if (bus_bytes > 0) c.bus_bytes.fetch_add(static_cast<uint64_t>(bus_bytes), std::memory_order_relaxed);
  if (c.in_flight.fetch_add(1, std::memory_order_acq_rel) == 0)
    c.busy_since_ns.store(now_ns(), std::memory_order_release);
}

void Traffic::op_finished(OpKind k) {
  KindCounters& c = kinds_[static_cast<int>(k)];
  if (c.in_flight.fetch_sub(1, std::memory_order_acq_rel) == 1)
    c.busy_ns.fetch_add(now_ns() - c.busy_since_ns.load(std::memory_order_acquire), std::memory_order_relaxed);
}

void Traffic::account_collective(OpKind k, int64_t bytes, int rank, const std::vector<int>& world_ranks, int root) {
  const int n = static_cast<int>(world_ranks.size());
  if (bytes < 0) bytes = 0;
  const double bus = static_cast<double>(bytes) * bus_factor(k, n);
  op_posted(k, bus);
  if (n <= 1 || bytes == 0) return;
  const int next = world_ranks[static_cast<size_t>((rank + 1) % n)];
  const int prev = world_ranks[static_cast<size_t>((rank + n - 1) % n)];
  if (k == OpKind::kBroadcast) {
    const int pos = (rank - root + n) % n;  // place in the chain from the root
    if (pos > 0) add_peer_bytes(prev, 0, static_cast<uint64_t>(bytes));
    if (pos < n - 1) add_peer_bytes(next, static_cast<uint64_t>(bytes), 0);
    return;
  }
  add_peer_bytes(next, static_cast<uint64_t>(bus), 0);
  add_peer_bytes(prev, 0, static_cast<uint64_t>(bus));
}

void Traffic::account_all_to_all(int rank, const std::vector<int>& world_ranks,
                                 const std::vector<int64_t>& send_counts, const std::vector<int64_t>& recv_counts,
                                 int64_t elem_bytes) {
  const size_t n = world_ranks.size();
  uint64_t bus = 0;
  for (size_t p = 0; p < n && p < send_counts.size() && p < recv_counts.size(); p++) {
    if (static_cast<int>(p) == rank) continue;
    const uint64_t sent = static_cast<uint64_t>(std::max<int64_t>(send_counts[p], 0) * elem_bytes);
    const uint64_t received = static_cast<uint64_t>(std::max<int64_t>(recv_counts[p], 0) * elem_bytes);
    bus += sent;
    add_peer_bytes(world_ranks[p], sent, received);
  }
  op_posted(OpKind::kAllToAll, static_cast<double>(bus));
}

Traffic::Snapshot Traffic::snapshot() const {
  Snapshot s;
  const int n = peer_count_.load(std::memory_order_acquire);
  for (int r = 0; r < n; r++) {
    const PeerCounters& p = peers_[static_cast<size_t>(r)];
    const uint64_t sent = p.sent.load(std::memory_order_relaxed), recv = p.received.load(std::memory_order_relaxed);
    if (sent || recv) s.peers.push_back({r, sent, recv});
  }
  const int64_t now = now_ns();
  for (int k = 0; k < kOpKinds; k++) {
    const KindCounters& c = kinds_[static_cast<size_t>(k)];
    s.kinds[static_cast<size_t>(k)].ops = c.ops.load(std::memory_order_relaxed);
    s.kinds[static_cast<size_t>(k)].bus_bytes = static_cast<double>(c.bus_bytes.load(std::memory_order_relaxed));
    int64_t busy = c.busy_ns.load(std::memory_order_relaxed);
    // An interval still open counts up to now, so a snapshot taken while
    // an operation is in flight does not lose its time.
    if (c.in_flight.load(std::memory_order_acquire) > 0) busy += now - c.busy_since_ns.load(std::memory_order_acquire);
    s.kinds[static_cast<size_t>(k)].busy_seconds = static_cast<double>(busy) * 1e-9;
  }
  return s;
}

Traffic& traffic() {
  static Traffic* t = new Traffic();  // never destroyed: Works may finish during static destruction
  return *t;
}

TrafficDelta traffic_delta(const Traffic::Snapshot& before, const Traffic::Snapshot& after) {
  TrafficDelta d;
  for (size_t k = 0; k < kOpKinds; k++) {
    d.bus_bytes[k] = after.kinds[k].bus_bytes - before.kinds[k].bus_bytes;
    d.busy_seconds[k] = after.kinds[k].busy_seconds - before.kinds[k].busy_seconds;
    d.busbw[k] = d.busy_seconds[k] > 0 ? d.bus_bytes[k] / d.busy_seconds[k] : 0.0;
  }
  return d;
}

}  // namespace tessera::comm
