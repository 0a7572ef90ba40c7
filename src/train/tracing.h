// Training's side of the timeline trace (`tessera train --trace DIR`,
// log.trace; docs/monitoring.md "Timeline trace"): the clock offsets of the
// ranks to rank 0, measured at start-up, and the session that turns the
// tracer (obs/trace.h) on and writes DIR/trace-rank-N.json at the end.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <span>
#include <string>

#include "core/status.h"
#include "comm/communicator.h"
#include "comm/mesh.h"
#include "train/config.h"

namespace tessera {

// One ping-pong between a rank and rank 0: the rank's clock when it sent
// (t1) and when the answer came back (t3), rank 0's clock when it answered
// (t2); nanoseconds of the steady clock.
struct ClockSample {
  int64_t t1 = 0, t2 = 0, t3 = 0;
};
// The NTP estimate: of the samples, the one with the smallest round trip
// t3 - t1; offset = t2 - (t1 + t3) / 2, so that rank 0's clock ~ this
// rank's + offset. Rank 0 answered somewhere in [t1, t3] of this rank's
// clock, so the offset is right within +-rtt/2 (error_ns), whatever the
// asymmetry of the two directions. Empty samples: all zero.
struct ClockOffset {
  int64_t offset_ns = 0;
  int64_t rtt_ns = 0;
  int64_t error_ns = 0;  // rtt / 2
};
ClockOffset estimate_clock_offset(std::span<const ClockSample> samples);

// Collective over world: returns this rank's offset (zero on rank 0). A
// rank under the same kernel as rank 0 (the same
// /proc/sys/kernel/random/boot_id) shares its steady clock: offset 0,
// nothing measured, unless same_boot_shares_clock is false. Every other
// rank r > 0 in turn does `rounds` ping-pongs with rank 0.
Result<ClockOffset> measure_clock_offset(comm::Communicator& world, bool same_boot_shares_clock = true,
                                         int rounds = 16);

// A recording trace. start_trace() returns null when c.trace is empty;
// otherwise (collective: every rank calls it) it measures the clock offset,
// names this rank's process "rank R (dpD tpT ppP) HOST" and the calling
// thread "training", and turns the tracer on. Destruction, also on an error
// path, turns it off and writes DIR/trace-rank-R.json (a failure is one
// warning line on stderr; training's result stands). `out` (rank 0's
// console, or null) gets one line naming the folder. measure_every_rank:
// measure even a rank on rank 0's host (a test's fault plan,
// TESSERA_TRACE_PING: tests/cli/train_trace.sh checks the estimate against
// the true 0).
class TraceSession {
 public:
  ~TraceSession();
  TraceSession(const TraceSession&) = delete;
  TraceSession& operator=(const TraceSession&) = delete;
  // Writes the file now (the destructor then does nothing).
  Status write();
  const std::string& path() const { return path_; }

 private:
  friend Result<std::unique_ptr<TraceSession>> start_trace(const TrainConfig& c, comm::Communicator& world,
                                                           const comm::MeshCoord& coord, std::FILE* out,
                                                           bool measure_every_rank);
  TraceSession() = default;
  std::string path_;
  int rank_ = 0;
  std::string process_name_;
  std::string metadata_;  // JSON object text, without "events"/"dropped"
  std::FILE* out_ = nullptr;
  bool written_ = false;
};

Result<std::unique_ptr<TraceSession>> start_trace(const TrainConfig& c, comm::Communicator& world,
                                                  const comm::MeshCoord& coord, std::FILE* out,
                                                  bool measure_every_rank = false);

}  // namespace tessera
