// Every training run checks the planner (issue #32 item 7; docs/planner.md,
// "Every run a validation point"): at start-up the step time, memory and
// communication share that `tessera plan` predicts for this job's model,
// layout and machine profile; at the end the measured ones beside them,
// with the error. Without a doctor profile there is no prediction (the
// planner prices a CPU from its profile) and the run says so.
#pragma once

#include <cstdio>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "core/status.h"
#include "model/decoder.h"
#include "plan/dlrm.h"

namespace tessera {

class MetricsLog;  // train/monitoring.h

// The machine a run is on, as the planner is told it.
struct PlanCheckMachine {
  std::string profile_path;  // the doctor profile (log.profile or TESSERA_PROFILE); empty: none
  int hosts = 1, ranks_per_host = 1, threads_per_rank = 0;  // threads: 0 = cores / ranks per host
  bool shared_host = false;  // the hosts are one machine (the emulated cluster: one kernel, shared cores)
  double link_gbps = 0;      // between hosts; 0: unknown (10 assumed, and said)
};

// Collective: hosts = world size / local ranks; the hosts are one machine
// when every rank has the same kernel boot id (the emulated cluster's
// namespaces share cores); threads from OMP_NUM_THREADS as the launcher
// set it. `profile` is log.profile (perf::profile_path's rule applies).
Result<PlanCheckMachine> describe_run_machine(comm::Communicator& world, const std::string& profile,
                                              double link_gbps);

struct PlanCheckJob {
  PlanCheckMachine machine;
  DecoderConfig model;
  int seq = 0, micro_batch = 1, grad_accum = 1, dp = 1, tp = 1, pp = 1, zero = 0;
  std::string dtype = "fp32";
  int checkpoint_every = 0;
  double bucket_mb = 25;
};

struct PlanPrediction {
  double step_s = 0, mem_bytes = 0, comm_share = 0, bubble_share = 0;
  std::string cluster;     // what the planner was told about this machine, one line
  std::string bottleneck;  // the planner's largest term other than compute
};

// The planner's estimate for the job; an error (no profile, a profile the
// planner cannot price) says why there is none.
Result<PlanPrediction> predict_for_run(const PlanCheckJob& job);

// The same for a DLRM job under its placement; comm_share is the
// all-to-all's (the MLP all-reduce is timed inside the MLP part of a run).
Result<PlanPrediction> predict_dlrm_for_run(const PlanCheckMachine& machine, const plan::DlrmJob& job,
                                            plan::DlrmPlacement placement);

// "+12.3%": measured against predicted.
std::string plan_error(double measured, double predicted);

// What a run measured, to hold against its prediction.
struct PlanCheckMeasured {
  std::vector<double> step_seconds;  // every step's; the first (first touches) is left out
  double mem_bytes = 0;              // per rank, the largest
  double comm_share = 0;             // of the step
  const char* comm_name = "communication";  // "all-to-all" for a DLRM
};

// The plan check's line ("plan check: step ... measured vs ... predicted
// ...") on `out` (rank 0's console, or null) and its record in `metrics`
// (null: none): the median step after the first, the memory and the
// communication share beside the prediction. Nothing with fewer than two
// steps.
void report_plan_check(const PlanPrediction& plan, const PlanCheckMeasured& m, std::FILE* out,
                       MetricsLog* metrics);

}  // namespace tessera
