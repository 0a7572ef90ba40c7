// `tessera plan` for DLRM jobs (docs/planner.md, "DLRM"): the model as
// Tessera trains it (docs/dlrm.md: tables model-parallel over an
// all-to-all, MLPs data-parallel), one training step on a Cluster under a
// placement, split into terms, with the memory each rank needs; and the
// search over placements and node counts. Pure functions: no I/O, no clocks.
// Letters as in src/nn/dlrm.h: B global batch (samples), B_r a rank's
// samples, T tables, E_t rows of table t, D embedding dimension, Nd dense
// features, F = 1 + T features, P = F(F-1)/2 interactions.
// Units: seconds, bytes, FLOP.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "plan/cluster.h"

namespace tessera::plan {

struct DlrmSpec {
  std::string name;                  // "dlrm-500m", a config file, or "custom"
  int num_dense = 13;                // Nd
  int dim = 64;                      // D
  std::vector<int> bottom;           // bottom MLP sizes; the last equals dim
  std::vector<int> top;              // top MLP hidden sizes; a final layer to 1 logit is added
  std::vector<int64_t> table_rows;   // E_t, one per table
  double bag = 1;                    // ids per sample and table (Criteo: 1)
  int64_t global_batch = 2048;       // B, samples per step over all ranks
  std::string table_optimizer = "adagrad";  // "adagrad" (row-wise: one accumulator per row) or "sgd"

  int tables() const { return static_cast<int>(table_rows.size()); }
  int64_t table_parameters() const;  // sum_t E_t x D
  int64_t mlp_parameters() const;    // weights and biases of both MLPs
  int64_t parameters() const { return table_parameters() + mlp_parameters(); }
  // The MLP layers as (in, out), bottom then top (the last top layer has out 1).
  std::vector<std::pair<int, int>> mlp_layers() const;
  // FLOPs per sample, forward and backward: MLPs 6 x weights (2 forward,
  // 4 backward), the interaction 3 x 2 x P x D.
  double flops_per_sample() const;
  Status validate() const;
  std::string str() const;  // "dlrm-500m: 26 tables x 300000 rows x D=64, bottom 512-256-64, top 512-256-1, ..."
};

// "dlrm-500m" (configs/dlrm_500m.toml's shape); NotFound names the known ones.
Result<DlrmSpec> dlrm_preset(const std::string& name);
std::string dlrm_preset_names();

struct DlrmJob {
  DlrmSpec model;
  std::string dtype = "fp32";  // MLP matmul inputs (Tessera's DLRM is fp32)
  double samples = 0;          // samples to train (0: per step only)
  bool checkpoint_staging = true;  // Tessera stages a copy of its tables for the (final) checkpoint (CPU memory)
};

// Where the tables go (docs/dlrm.md, "Sharding"): whole tables packed onto
// ranks (table-wise), or every table split by rows over all ranks (row-wise).
enum class DlrmPlacement { kTable, kRow };
const char* placement_name(DlrmPlacement p);

struct DlrmTerm {
  std::string name;     // "lookup", "alltoall", ...
  double value = 0;     // seconds per step (memory terms: bytes)
  std::string formula;  // the formula with its numbers
};

struct DlrmEstimate {
  int nodes = 1, ranks = 1;
  DlrmPlacement placement = DlrmPlacement::kTable;
  bool fits = true;
  std::string refusal;
  // Per step, seconds, of the slowest rank: step = mlp + interaction + lookup
  // + update + alltoall + allreduce + optimizer + launch.
  double step = 0, mlp = 0, interaction = 0, lookup = 0, update = 0, alltoall = 0, allreduce = 0, optimizer = 0,
         launch = 0;
  double alltoall_bytes = 0;  // sent by the busiest rank per step, forward + backward
  double samples_per_s = 0, train_seconds = 0, cost_usd = 0, mfu = 0;
  // Per rank (the largest), bytes.
  double mem_tables = 0, mem_table_state = 0, mem_mlp = 0, mem_activations = 0, mem_buffers = 0, mem_staging = 0,
         mem_total = 0, mem_capacity = 0;
  int max_tables_per_rank = 0;  // shards on the busiest rank
  std::vector<DlrmTerm> terms;
  std::string bottleneck() const;  // the largest part, with its share of the step
};

DlrmEstimate estimate_dlrm(const DlrmJob& job, const Cluster& cluster, DlrmPlacement placement, int nodes);

// Both placements (or the one given) on the cluster's nodes (objective
// "time"), or also on 1, 2, 4, ... of them ("cost"); the fitting ones sorted
// by the objective, at most `keep`. Empty when none fits; `closest` then
// gets the one that came nearest to fitting.
std::vector<DlrmEstimate> search_dlrm(const DlrmJob& job, const Cluster& cluster, const std::string& objective, int keep,
                                      DlrmEstimate* closest = nullptr, const DlrmPlacement* only = nullptr);

}  // namespace tessera::plan
