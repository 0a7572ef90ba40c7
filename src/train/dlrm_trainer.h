// The DLRM training loop behind `tessera train` with model.kind = "dlrm"
// (docs/dlrm.md, "Training"): click shards in, the engine (DlrmParallel) steps,
// held-out exact AUC and log loss every train.eval_every steps and at the
// end, progress lines, JSON-lines and Prometheus metrics (samples/s,
// lookups/s, all-to-all time), and sharded checkpoints with the sparse
// optimizer state that resume bit-exactly (docs/formats/dlrm-checkpoint.md).
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

#include "comm/communicator.h"
#include "core/status.h"
#include "obs/metrics.h"
#include "train/config.h"

namespace tessera {

struct DlrmTrainSummary {
  bool has_val = false;  // data.val given
  double first_auc = 0.0, last_auc = 0.0, last_logloss = 0.0;  // held-out; first: before training (or at resume)
  double last_train_loss = 0.0;
  int64_t steps = 0;       // steps completed, all attempts
  std::string checkpoint;  // the final checkpoint's folder
  // A stop signal (train/stop.h): the signal (-1: another rank's) and the
  // step whose checkpoint was published and verified; 0 otherwise.
  int stopped_by = 0, stopped_at = 0;
};

struct StopFlag;
struct FaultPlan;

// Runs c.steps steps (c.model_kind == "dlrm") on the ranks of `world`. Rank 0
// prints progress to `out`, writes the metrics file and publishes the
// checkpoints; every rank records its series into `metrics` when given (it
// must outlive the call), else into a registry of its own. With `stop`, a
// signal recorded there on any rank ends the run at the next step with a
// verified checkpoint (stopped_by set). `faults`: what a test injects
// (core/fault_plan.h); null: nothing.
Result<DlrmTrainSummary> run_dlrm_training(const TrainConfig& c, comm::Communicator& world, std::FILE* out,
                                           obs::Registry* metrics = nullptr, const StopFlag* stop = nullptr,
                                           const FaultPlan* faults = nullptr);

}  // namespace tessera
