// What every backend's operations share: how one is named in diagnostics
// (OpDesc) and how a wait() polls it until done or its deadline (Poller).
// The MPI and NCCL communicators both use these; only the rate a backend
// expects its transfers to reach differs (an argument, not a copy).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "comm/communicator.h"

namespace tessera::comm {

// One operation, as named in diagnostics: "all_reduce #12 (1024 x float)",
// "send #3 (16 bytes)", "barrier #7". Formatted only on error, so posting an
// operation builds no strings.
struct OpDesc {
  const char* op = "";
  uint64_t seq = 0;
  int64_t count = 0;  // elements, or bytes when is_bytes
  ElemType type = ElemType::kU8;
  bool is_bytes = false;
  int peer = -1;  // send/recv: the rank in the communicator; -1: every other member

  std::string describe() const;
};

// The pauses between a wait()'s polls: yield the core (sched_yield) for as
// long as the operation may plausibly still be moving data (500 us plus its
// bytes at `gb_per_s`), then sleep 50 us, doubling up to 200 us, never past
// the deadline. A peer that late is not served faster by a spinning rank,
// and the core may be shared with that peer; but shared-memory MPI
// transports move data only while some rank polls, so sleeping early would
// throttle large transfers.
class Poller {
 public:
  using Clock = std::chrono::steady_clock;
  Poller(int64_t bytes, double gb_per_s);
  void pause(Clock::time_point deadline);
  Clock::time_point start() const { return start_; }

 private:
  Clock::time_point start_;
  Clock::duration spin_for_;
  std::chrono::microseconds nap_{50};
};

// The rates the backends expect: host memory over MPI's transports (~1 GB/s
// at worst, shared memory included), and a GPU's collectives (~8 GB/s).
constexpr double kMpiSpinGBps = 1.0;
constexpr double kNcclSpinGBps = 8.0;

}  // namespace tessera::comm
