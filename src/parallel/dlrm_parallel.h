// DLRM over ranks as DLRM and TorchRec shard it (docs/dlrm.md, "Sharding"):
// the MLPs data-parallel, the embedding tables model-parallel.
//
// Every rank is given the SAME global batch of B samples. Rank r runs the
// MLPs (bottom, interaction, top, loss) for its contiguous slice of samples
// [begin(r), begin(r+1)) (B/n each, the first B%n one more) and looks up, for
// all B samples, the table rows it owns (parallel/dlrm_plan.h: whole tables
// or row ranges). Per step:
//   forward:  lookups of owned shards -> all_to_all_v -> each sample's rank
//             adds the partial pooled sums of a table's shards -> MLPs, loss;
//   backward: MLPs -> the pooled embeddings' gradients -> all_to_all_v back
//             to the shards' owners -> sparse gradients of the owned rows;
//             MLP gradients all-reduced (sum of dloss = 1/B gradients, so the
//             update equals one process's on the mean loss);
//   update:   AdamW on the MLPs (replicated; every rank the same bits),
//             row-wise Adagrad or SGD on each shard's touched rows.
// The weights after create(seed) equal Dlrm::init(seed) on one process, and
// 1, 2 and 4 ranks train alike up to the order of float sums.
//
// Ownership: owns its MLP parameters, moments and its shards (values and
// Adagrad accumulators); comm (may be null: one process) must outlive it.
// Not thread-safe; every rank calls train_step/predict with the same batch,
// in the same order (they are collective).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "core/status.h"
#include "nn/dlrm.h"
#include "parallel/dlrm_plan.h"

namespace tessera {

struct DlrmParallelOptions {
  float lr_dense = 1e-3f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0.0f;  // AdamW on the MLPs
  std::string table_optimizer = "adagrad";  // "adagrad" (row-wise) | "sgd"
  float lr_table = 0.05f, adagrad_eps = 1e-8f;
  std::string placement = "auto";  // "table" | "row" | "auto" (the planner)
  // The planner's inputs (parallel/dlrm_plan.h): bytes of table rows and
  // state one rank may hold (0: unlimited) and expected ids per sample of
  // each table (empty: 1 each).
  int64_t table_budget_bytes = 0;
  std::vector<double> lookups_per_sample;
};

class DlrmParallel {
 public:
  // comm null or size 1: everything local. Errors: a config that does not
  // validate, an unknown table optimizer, the planner's errors.
  static Result<std::unique_ptr<DlrmParallel>> create(const DlrmConfig& config, const DlrmParallelOptions& opts,
                                                      comm::Communicator* comm, uint64_t seed);

  // One training step on the global batch (labels required): forward,
  // backward, the all-to-alls, the MLP gradient all-reduce, the updates.
  // Returns the global mean loss (the same on every rank). A batch with ids
  // out of range or bad offsets is an error before anything is sent
  // (every rank sees the same batch, so every rank returns it).
  Result<float> train_step(const DlrmBatch& global);
  // Logits (B) of the whole global batch, on every rank.
  Status predict(const DlrmBatch& global, std::vector<float>* logits);

  // Checkpoint state, logical (independent of the rank count).
  std::vector<float>& dense_params() { return dense_.params(); }  // replicated, Dlrm's flat layout
  std::vector<float>& adam_m() { return m_; }
  std::vector<float>& adam_v() { return v_; }
  int64_t& adam_step() { return step_; }
  struct TableShard {
    int table;
    int64_t row_begin, row_end;
    float* values;  // (row_end - row_begin, D)
    float* accum;   // (row_end - row_begin) row-wise Adagrad state; null for sgd
  };
  std::vector<TableShard> owned_shards();  // in the plan's order (table, then rows)

  struct Stats {
    double alltoall_s = 0, lookup_s = 0, mlp_s = 0;  // all-reduce of the MLP gradients counts in mlp_s
    int64_t lookups = 0;                             // ids this rank looked up (forward)
  };
  const Stats& stats() const { return stats_; }

  const DlrmPlan& plan() const { return plan_; }
  const DlrmConfig& config() const { return config_; }
  // Parameters of the whole model (MLPs and every table), on any rank.
  int64_t num_params() const;
  int rank() const { return rank_; }
  int ranks() const { return ranks_; }
  // First sample of rank r's slice of a batch of B (r = ranks(): B).
  int64_t slice_begin(int64_t B, int r) const;

 private:
  struct Shard {
    int table;
    int64_t row_begin, row_end;
    bool whole;  // the table's only shard: pooled with the config's pooling
    std::vector<float> values, accum;
    // This step's bags of the rows in range (row-wise shards), local ids.
    std::vector<int> ids, offsets;
    std::vector<int> grad_rows;
    std::vector<float> grad_values, dout;
  };
  DlrmParallel(const DlrmConfig& config, const DlrmParallelOptions& opts, comm::Communicator* comm, DlrmPlan plan);
  void init(uint64_t seed);
  Status check_batch(const DlrmBatch& b) const;
  // Forward up to the top MLP's logits of this rank's slice.
  Status forward(const DlrmBatch& global);
  Status all_to_all(const float* send, const std::vector<int64_t>& send_counts, float* recv,
                    const std::vector<int64_t>& recv_counts);

  DlrmConfig config_;
  DlrmParallelOptions opts_;
  comm::Communicator* comm_;
  int rank_ = 0, ranks_ = 1;
  DlrmPlan plan_;
  DlrmDense dense_;
  std::vector<float> m_, v_;
  int64_t step_ = 0;
  std::vector<Shard> shards_;               // this rank's, in the plan's order
  std::vector<std::vector<int>> tables_of_;  // (ranks) table of each shard of rank p, in p's order
  std::vector<float> send_, recv_;
  std::vector<float> logits_all_;
  Stats stats_;
  int64_t batch_ = 0;  // B of the last forward
};

}  // namespace tessera
