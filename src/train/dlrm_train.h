// A minimal single-process DLRM training loop over click shards
// (docs/formats/click-shard.md), by epochs: the engine of `tessera train`
// (DlrmParallel: AdamW on the MLPs, row-wise Adagrad or SGD on the touched table
// rows), held-out log loss and exact AUC after each epoch. One id per table
// per sample (the Criteo layout). Used by `tessera bench dlrm`; docs/dlrm.md.
// `tessera train` with model.kind = "dlrm" is the full loop (checkpoints,
// metrics). Not thread-safe; allocates per call.
#pragma once

#include <cstdio>
#include <string>
#include <vector>

#include "core/status.h"

namespace tessera {

struct DlrmBenchOptions {
  std::string train_shard, val_shard;
  int dim = 16;
  std::vector<int> bottom = {64, 16};  // the last must equal dim
  std::vector<int> top = {64, 32};
  int batch = 256;
  int epochs = 1;
  float lr = 1e-3f;         // AdamW on the MLPs (beta 0.9, 0.999; no weight decay)
  float table_lr = 0.05f;   // the tables' optimizer
  std::string table_optimizer = "adagrad";  // or "sgd"
  uint64_t seed = 1;
  std::FILE* log = nullptr;  // one line per epoch, nullptr: quiet
};

struct DlrmEpoch {
  double train_loss = 0.0;  // mean over the epoch's batches
  double val_logloss = 0.0, val_auc = 0.0;
  double samples_per_s = 0.0;  // training samples per second (forward, backward, update)
};

struct DlrmTrainResult {
  int64_t params = 0, train_rows = 0, val_rows = 0;
  std::vector<DlrmEpoch> epochs;
};

Result<DlrmTrainResult> train_dlrm(const DlrmBenchOptions& o);

}  // namespace tessera
