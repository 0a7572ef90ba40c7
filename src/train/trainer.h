// The training loop behind `tessera train`: model, data, optimizer, periodic
// validation, progress lines, JSON-lines and Prometheus metrics, and the
// final weights.
#pragma once

#include <cstdio>

#include "core/status.h"
#include "comm/communicator.h"
#include "obs/metrics.h"
#include "train/config.h"

namespace tessera {

struct TrainSummary {
  double first_val_loss = 0.0, last_val_loss = 0.0;  // meaningful only when has_val
  double last_train_loss = 0.0;
  bool has_val = false;
  std::string weights_path;  // checkpoint.dir/model.safetensors; empty when stopped by a signal
  // A stop signal (train/stop.h): the signal (-1: another rank's), and the
  // step whose checkpoint was published and verified. 0 otherwise.
  int stopped_by = 0, stopped_at = 0;
};

struct StopFlag;
struct FaultPlan;

// Runs c.steps optimizer steps on the ranks of `world` (size 1 without
// mpirun), laid out as c.dp x c.tp x c.pp. Rank 0 prints progress to `out`,
// writes the metrics and saves the weights. Every rank records its figures
// (tessera_train_*: steps, tokens, loss, learning rate, norm, step times,
// memory, checkpoints) into `metrics` when given (it must outlive the call),
// else into a registry of its own, and sets the registry's constant labels
// to the rank's (train/monitoring.h). With c.metrics_port > 0 each rank
// serves that registry at GET /metrics while the call runs. With `stop`,
// a signal recorded there on any rank ends the run at the next step with a
// verified checkpoint (stopped_by set). `faults`: what a test injects
// (core/fault_plan.h); null: nothing.
Result<TrainSummary> run_training(const TrainConfig& c, comm::Communicator& world, std::FILE* out,
                                  obs::Registry* metrics = nullptr, const StopFlag* stop = nullptr,
                                  const FaultPlan* faults = nullptr);

}  // namespace tessera
