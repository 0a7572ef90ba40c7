// The communication measurements shared by `tessera bench allreduce ...`,
// `bench p2p` and `tessera doctor`: nccl-tests' collective bandwidth
// semantics (its doc/PERFORMANCE.md) and iperf-style point-to-point pairs.
// The CLI commands in tools/ own the flags and the printing.
//
// Collectives, for a size S bytes of the type (count = S / typesize):
//   all_reduce      count elements in and out; algbw = S/t, busbw = algbw * 2(n-1)/n
//   reduce_scatter  n*(count/n) in, count/n out; algbw = n*(count/n)*ts/t, busbw = algbw * (n-1)/n
//   all_gather      count/n in, n*(count/n) out; algbw = n*(count/n)*ts/t, busbw = algbw * (n-1)/n
//   broadcast       count elements from rank 0; busbw = algbw = S/t
//   sendrecv        S bytes to the next rank, S from the previous; busbw = algbw = S/t
//   alltoall        n*(count/n) in and out, count/n to and from every rank (all_to_all_v
//                   with even counts); algbw = n*(count/n)*ts/t, busbw = algbw * (n-1)/n
// time is the mean over `iters` iterations after `warmup`, the maximum over
// ranks. On a device communicator (NCCL) the timed iterations are posted back
// to back and the time runs until the last has completed; on the host one
// each is waited for in turn.
//
// Point to point, one ordered pair (src -> dst) at a time, the others waiting
// in the pair's result all_reduce: bandwidth of one transfer (1 message, or
// `streams` concurrent ones), 1-byte ack back, mean over `iters`; latency:
// half the ping-pong round trip, median of `lat_iters`.
// Every call is collective over the communicator it is given.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "core/status.h"

namespace tessera::perf {

enum class CommOp { kAllReduce, kReduceScatter, kAllGather, kBroadcast, kSendRecv, kAllToAll };
const char* comm_op_name(CommOp op);  // "allreduce", "reduce_scatter", "all_gather", ...

// Buffer sizes and bandwidth factors of one size.
struct CommLayout {
  int64_t send_count = 0, recv_count = 0;  // elements in each buffer
  int64_t param_count = 0;                 // the count passed to the operation
  int64_t size_bytes = 0;                  // the larger buffer (nccl-tests' size column)
  double alg_bytes = 0;                    // bytes algbw divides by the time
  double bus_factor = 1;                   // busbw = algbw * bus_factor
};
CommLayout comm_layout(CommOp op, int64_t bytes, int64_t type_size, int ranks);

struct CollectiveOptions {
  CommOp op = CommOp::kAllReduce;
  int iters = 20, warmup = 5;
  bool check = true;  // run once more with a known pattern and count wrong elements
};

struct CollectiveResult {
  CommLayout layout;
  double time_us = 0, algbw = 0, busbw = 0;  // GB/s
  int64_t wrong = -1;                        // -1: not checked
};

// One size. `c` is measured; `host` (the MPI or self communicator, c itself
// when measuring MPI) reduces the timings and error counts. `on_device`:
// c moves device memory (NCCL), buffers are allocated on the current device.
Result<CollectiveResult> bench_collective(comm::Communicator& c, comm::Communicator& host,
                                          const CollectiveOptions& o, int64_t bytes, comm::ElemType type,
                                          bool on_device);

struct P2pOptions {
  int streams = 4;
  int iters = 10, warmup = 2;
  int lat_iters = 200;
};

// One pair's results, the same on every rank after the pair's all_reduce.
struct PairResult {
  double seconds_1 = 0, seconds_n = 0;  // mean time per transfer (1 and `streams` messages), max of src and dst
  double latency_s = 0;                 // median half round trip
};

// buf holds `bytes` (touched), msg the latency message; both on every rank.
Result<PairResult> bench_pair(comm::Communicator& c, const P2pOptions& o, std::vector<char>& buf,
                              std::vector<char>& msg, int64_t bytes, int src, int dst);

}  // namespace tessera::perf
