// Stopping a training run early on a signal: the warning a batch system
// sends before a time limit (Slurm's `#SBATCH --signal=USR1@90`) or on
// preemption (SIGTERM, then SIGKILL after KillWait). The handler only
// records the signal. The ranks agree on it at the next step boundary
// (one rank's signal stops them all at the same step), save a checkpoint,
// wait until it is published and verified, and return TrainSummary::
// stopped_by; `tessera train` then exits kExitRequeue (75, EX_TEMPFAIL) so
// the job script requeues and the next attempt resumes from `latest`
// (docs/cluster.md, "Slurm").
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace tessera {

// What a trainer polls: 0, or the first stop signal received.
struct StopFlag {
  std::atomic<int> signal{0};
  // When it arrived: CLOCK_MONOTONIC nanoseconds (std::chrono::steady_clock's
  // epoch on Linux), for the signal-to-checkpoint time; 0 when unknown.
  std::atomic<int64_t> at_ns{0};
};

// Seconds from the signal recorded in `f` to now; negative when unknown.
double seconds_since_signal(const StopFlag& f);

// A SIGTERM's stop has this long before the process ends anyway (SIGALRM):
// a hung rank is still ended by `kill`. Slurm's KillWait (SIGTERM, then
// SIGKILL) is shorter on most sites.
constexpr unsigned kStopGraceSeconds = 120;

// Installs handlers for SIGUSR1 and SIGTERM that record the first of them
// in the returned process-wide flag; later SIGUSR1s (one while the
// checkpoint is written) change nothing. A second SIGTERM ends the process
// at once, as it did before (the previous `latest` stays: publishing is a
// rename). Safe to call more than once.
StopFlag& install_stop_signals();

// "SIGUSR1", "SIGTERM", "signal N".
const char* stop_signal_name(int sig);

// Rank 0's check of the checkpoint a stop published: DIR opens, holds
// `step`, and every file reads back against its hashes.
Status verify_stop_checkpoint(const std::string& dir, int64_t step);

// What a stop reports: the console line (with its newline) and the metrics
// record. `secs`: the save and its check; the time since the signal comes
// from `f` (this rank's signal, when it had one).
struct StopReport {
  std::string line;
  nlohmann::json record;
};
StopReport describe_stop(const char* name, int step, int steps, const std::string& dir, double secs,
                         const StopFlag& f);

}  // namespace tessera
