// What this process's communicators moved: bytes sent to and received from
// every peer (world ranks), and per operation kind the bus bytes and the
// time operations of that kind were in flight, from which the achieved bus
// bandwidth follows (nccl-tests' convention, tools/cmd_bench_comm.cc):
//
//   kind            bus bytes per op (S = the op's size, n = ranks)   per-peer bytes
//   all_reduce      S * 2(n-1)/n                                      modelled: ring
//   reduce_scatter  S * (n-1)/n   (S = n blocks, the input)           modelled: ring
//   all_gather      S * (n-1)/n   (S = n blocks, the output)          modelled: ring
//   broadcast       S                                                 modelled: chain from the root
//   send_recv       S                                                 exact
//   all_to_all      the bytes sent to other ranks (S * (n-1)/n when   exact
//                   the S bytes sent are split evenly)
//
// Point-to-point and all-to-all traffic is exact: the bytes this rank posted to or from
// that peer. A collective's per-peer traffic is hidden by MPI (and NCCL),
// so it is accounted by its algorithm's model: a ring over the
// communicator's ranks (rank r sends the bus bytes to r+1 and receives as
// many from r-1; for n = 2 both are the other rank), and a broadcast as a
// chain from the root (each rank receives S from its predecessor and sends
// S to its successor). The totals per rank are the ones the algorithms
// move; which neighbour carries them may differ from MPI's real choice.
// Protocol overheads (headers, acks) are not counted.
//
// Busy time of a kind is the union of the intervals during which at least
// one operation of that kind was in flight on this process, from its
// posting to the moment its completion was seen (Work::test() or wait());
// operations queued behind each other are not counted twice.
//
// Cost on the hot path: a few relaxed atomic additions per operation posted
// and one clock read at each start and end of a busy interval; no lock, no
// allocation. Thread safety: every method may be called from any thread;
// a busy interval is exact when one thread issues operations of the kind
// (the MPI backend's rule).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

namespace tessera::comm {

enum class OpKind : int { kAllReduce = 0, kReduceScatter, kAllGather, kBroadcast, kSendRecv, kAllToAll };
constexpr int kOpKinds = 6;
// "all_reduce", "reduce_scatter", "all_gather", "broadcast", "send_recv",
// "all_to_all".
const char* op_kind_name(OpKind k);
// busbw = algbw * bus_factor(k, n) (the table above).
double bus_factor(OpKind k, int n);

class Traffic {
 public:
  // Bytes moved so far (counters since the process started).
  struct PeerBytes {
    int peer = 0;  // world rank
    uint64_t sent = 0, received = 0;
  };
  struct KindTotals {
    uint64_t ops = 0;
    double bus_bytes = 0;
    double busy_seconds = 0;  // closed intervals only
  };
  struct Snapshot {
    std::vector<PeerBytes> peers;  // peers with any traffic, by rank
    std::array<KindTotals, kOpKinds> kinds{};
  };

  // Sizes the per-peer table (world ranks 0..world_size-1); called by the
  // backend once the world is known, before operations are posted; later
  // calls are ignored. Bytes to peers beyond it are not counted per peer.
  void set_world_size(int world_size);

  void add_peer_bytes(int world_peer, uint64_t sent, uint64_t received);

  // An operation of kind k carrying bus_bytes was posted / was seen
  // complete (every posted one must be finished exactly once, also when it
  // failed or was abandoned).
  void op_posted(OpKind k, double bus_bytes);
  void op_finished(OpKind k);

  // Accounts a collective over a communicator by the model above: size n,
  // this rank's position, the world rank of each member, S bytes (for
  // broadcast, root is the root's position).
  void account_collective(OpKind k, int64_t bytes, int rank, const std::vector<int>& world_ranks, int root = 0);
  // Accounts an all-to-all(v) exactly: send_counts[p] / recv_counts[p]
  // elements of elem_bytes to / from member p (this rank's own block is not
  // traffic); the bus bytes are the bytes sent to the other members.
  void account_all_to_all(int rank, const std::vector<int>& world_ranks, const std::vector<int64_t>& send_counts,
                          const std::vector<int64_t>& recv_counts, int64_t elem_bytes);

  Snapshot snapshot() const;

 private:
  struct PeerCounters {
    std::atomic<uint64_t> sent{0}, received{0};
  };
  struct KindCounters {
    std::atomic<uint64_t> ops{0};
    std::atomic<uint64_t> bus_bytes{0};
    std::atomic<int64_t> in_flight{0};
    std::atomic<int64_t> busy_since_ns{0};
    std::atomic<int64_t> busy_ns{0};
  };
  std::unique_ptr<PeerCounters[]> peers_;
  std::atomic<int> peer_count_{0};
  std::array<KindCounters, kOpKinds> kinds_;
};

// The process's traffic (every communicator adds to it).
Traffic& traffic();

// Achieved figures between two snapshots: bus bandwidth (bytes/s) of each
// kind that was busy in between (0 when it was not), and per peer the bytes
// moved.
struct TrafficDelta {
  std::array<double, kOpKinds> busbw{};        // bytes per second; 0: no busy time
  std::array<double, kOpKinds> busy_seconds{};
  std::array<double, kOpKinds> bus_bytes{};
};
TrafficDelta traffic_delta(const Traffic::Snapshot& before, const Traffic::Snapshot& after);

}  // namespace tessera::comm
