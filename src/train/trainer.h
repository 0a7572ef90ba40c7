// The training loop behind `tessera train`: model, data, optimizer, periodic
// validation, progress lines, JSON-lines metrics, and the final weights.
#pragma once

#include <cstdio>

#include "core/status.h"
#include "train/config.h"

namespace tessera {

struct TrainSummary {
  double first_val_loss = 0.0, last_val_loss = 0.0;  // NaN-free only when data.val is set
  double last_train_loss = 0.0;
  bool has_val = false;
  std::string weights_path;  // checkpoint.dir/model.safetensors
};

// Runs c.steps optimizer steps. Progress goes to `out`.
Result<TrainSummary> run_training(const TrainConfig& c, std::FILE* out);

}  // namespace tessera
