// The Slurm job script for a layout the planner recommends (`tessera plan
// --emit-sbatch FILE`, docs/cluster.md "Slurm"): nodes, tasks per node, CPUs
// per task or GPUs per node, the layout and batch as `--set` flags, the
// checkpoint interval, and the signal and requeue lines that turn a time
// limit or a preemption into a verified checkpoint and a resumed attempt.
#pragma once

#include <cstdint>
#include <string>

#include "core/status.h"
#include "plan/cluster.h"
#include "plan/estimate.h"
#include "plan/model.h"

namespace tessera::plan {

struct SbatchRequest {
  std::string plan_command;        // the command that planned it, for the header
  std::string train_config;        // CONFIG's default in the script: the TOML with the data and optimizer
  std::string dtype = "bf16";      // train.dtype the plan priced
  int64_t steps = 0;               // train.steps (0: the config's)
  int checkpoint_every = 0;        // checkpoint.every (0: the script picks 500, a signal needs checkpoints)
  double bucket_mb = 25;           // parallel.bucket_mb
  int signal_seconds = 120;        // --signal=USR1@N: the time a checkpoint may take before the limit
};

// The script's text. Errors: a layout that does not fit, or one whose
// ranks do not split evenly over its nodes.
Result<std::string> sbatch_script(const SbatchRequest& r, const ModelSpec& m, const Cluster& c, const Estimate& e);

}  // namespace tessera::plan
