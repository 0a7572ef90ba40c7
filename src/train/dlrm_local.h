// DlrmLocal: the single-process DLRM training engine behind `tessera train`
// with model.kind = "dlrm" (docs/dlrm.md, "Training"): a Dlrm, AdamW on its
// MLPs and row-wise Adagrad or SGD on the touched table rows.
//
// Its public methods are exactly those of DlrmParallel (parallel/
// dlrm_parallel.h, the model-parallel engine: tables over ranks, MLPs data-
// parallel), so the trainer runs either through the alias DlrmEngine below.
// On one process the two train alike; DlrmLocal has no communication
// (Stats::alltoall_s stays 0).
//
// Ownership: owns the model, the optimizer state and the statistics. Not
// thread-safe; one batch at a time. train_step allocates only when a batch
// is larger than any before (the model's activations).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "core/status.h"
#include "nn/dlrm.h"

#if __has_include("parallel/dlrm_parallel.h")
#include "parallel/dlrm_parallel.h"  // DlrmTrainOptions
#else
namespace tessera {
// The engines' optimizer options (the contract's; parallel/dlrm_parallel.h
// defines the same struct once it exists, and this copy goes).
struct DlrmTrainOptions {
  float lr_dense = 1e-3f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0.0f;  // AdamW on the MLPs
  std::string table_optimizer = "adagrad";  // "adagrad" (row-wise) | "sgd"
  float lr_table = 0.05f, adagrad_eps = 1e-8f;
  std::string placement = "auto";  // "table" | "row" | "auto" (the planner)
};
}  // namespace tessera
#endif

namespace tessera {

class DlrmLocal {
 public:
  // comm: null or of size 1 (more ranks need DlrmParallel: InvalidArgument).
  // Errors name a bad option (table_optimizer, placement) or config.
  static Result<std::unique_ptr<DlrmLocal>> create(const DlrmConfig& config, const DlrmTrainOptions& opts,
                                                   comm::Communicator* comm, uint64_t seed);

  // Forward, backward, AdamW on the MLPs, the tables' optimizer on the
  // touched rows. Returns the batch's mean loss. labels required.
  Result<float> train_step(const DlrmBatch& global);
  // The logits (B) of the batch, without labels or gradients.
  Status predict(const DlrmBatch& global, std::vector<float>* logits);

  // Checkpoint state, logical (Dlrm's flat MLP layout; tables by rows).
  std::vector<float>& dense_params() { return model_.dense_params(); }
  std::vector<float>& adam_m() { return m_; }
  std::vector<float>& adam_v() { return v_; }
  int64_t& adam_step() { return adam_step_; }
  // accum: the row-wise Adagrad state (one float per row), null for sgd.
  struct TableShard {
    int table;
    int64_t row_begin, row_end;
    float* values;  // (row_end - row_begin, D)
    float* accum;   // (row_end - row_begin) or null
  };
  std::vector<TableShard> owned_shards();  // every whole table, here
  struct Stats {
    // Seconds, cumulative: all-to-all (0 on one process), the tables'
    // optimizer, and the rest of the step (forward and backward, the bags
    // included, and AdamW). lookups: ids looked up in training steps.
    double alltoall_s = 0, lookup_s = 0, mlp_s = 0;
    int64_t lookups = 0;
  };
  const Stats& stats() const { return stats_; }

  const DlrmConfig& config() const { return model_.config(); }
  int64_t num_params() const { return model_.num_params(); }

 private:
  DlrmLocal(const DlrmConfig& config, const DlrmTrainOptions& opts);

  Dlrm model_;
  DlrmTrainOptions opts_;
  bool adagrad_ = true;
  std::vector<float> m_, v_;                // AdamW moments, as dense_params()
  int64_t adam_step_ = 0;                   // AdamW steps taken
  std::vector<std::vector<float>> accum_;   // per table (E_t), Adagrad only
  Stats stats_;
};

// The engine the trainer runs; DlrmParallel has the same methods.
using DlrmEngine = DlrmLocal;

}  // namespace tessera
