// `tessera doctor`: measures this machine into a Profile (perf/profile.h;
// the checks and their sizes are in docs/doctor.md). CPU checks (GEMM fp32,
// bf16, int8 over sizes; STREAM triad; malloc and page-fault cost; thread
// scaling; disk write with fsync), GPU checks where a device exists
// (perf/gpu_checks.h), and, given a communicator of more than one rank,
// collective bus bandwidth and point-to-point pairs (perf/comm_bench.h).
// Runs on the calling thread; each check uses every core, so nothing else
// of this process should run meanwhile.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "core/status.h"
#include "perf/profile.h"

namespace tessera::perf {

struct DoctorOptions {
  bool quick = false;        // fewer sizes and repetitions (< 2 minutes on 2 cores)
  bool tiny = false;         // tests only: the smallest sizes, one repetition (still real measurements)
  std::string disk_dir = ".";  // where the disk check writes (and removes) its file
  // A line per check as it starts ("gemm fp32: 21 shapes"), and the notes
  // (skips, with why); null: quiet.
  std::function<void(const std::string&)> progress;
};

// The communication figures (collective over `world`, which has > 1 rank):
// appended to `out` on every rank (the same values). `ranks`, `hosts` set.
Status run_comm_checks(comm::Communicator& world, const DoctorOptions& o, Profile* out);

// The CPU and GPU figures of this process's host (out->machine already
// detected), appended to `out`, on every CPU of the host (the thread's
// affinity and the OpenMP thread count are widened first: a launcher may have
// bound the rank to one core); skipped checks are reported through o.progress ("skipped: ...").
// Errors: the disk check's directory cannot be written.
Status run_local_checks(const DoctorOptions& o, Profile* out);

// "2026-12-01T01:00:00Z", now.
std::string utc_now_iso8601();

}  // namespace tessera::perf
