// Placement of a DLRM's embedding tables over ranks (docs/dlrm.md,
// "Sharding"): a pure function of the model's table sizes, the expected
// lookups, the rank count and a per-rank memory budget; no communication.
//
// A shard is rows [row_begin, row_end) of one table on one rank. Table-wise
// placement puts whole tables on ranks; row-wise splits a table's rows over
// ranks (a lookup is answered by the rank owning the row; partial pooled
// sums are added up on the sample's rank). The planner balances two loads per
// rank, each as a share of its total: memory (rows x (D + state floats) x 4
// bytes) and lookups (expected ids per sample, a row-wise piece getting its
// share of the table's rows, as if ids were uniform over rows).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "nn/dlrm.h"

namespace tessera {

struct DlrmPlanOptions {
  int ranks = 1;
  // Bytes of table rows (values and optimizer state) one rank may hold;
  // 0: unlimited.
  int64_t budget_bytes = 0;
  // "table": whole tables only (an error if one does not fit a rank);
  // "row": every table split by rows over all ranks; "auto": whole tables,
  // a table larger than the budget split into the fewest row pieces that fit
  // (on distinct ranks), and row-wise over all ranks if whole pieces cannot
  // be packed into the budgets.
  std::string placement = "auto";
  // Expected ids per sample of each table (bag sizes); empty: 1 for every table.
  std::vector<double> lookups;
  // Optimizer state floats per row (1: row-wise Adagrad, 0: SGD).
  int state_floats_per_row = 1;
};

struct DlrmShard {
  int table = 0;
  int64_t row_begin = 0, row_end = 0;
  int rank = 0;
};

struct DlrmPlan {
  // Ordered by table, then row_begin; the shards of a table cover its rows
  // exactly once, none is empty.
  std::vector<DlrmShard> shards;
  std::vector<int64_t> rank_bytes;   // (ranks) memory of each rank's shards
  std::vector<double> rank_lookups;  // (ranks) expected ids per sample each rank looks up
  std::string placement;             // what was done: "table", "row" or "auto"

  // Indices into shards of rank r's shards, in shards' order.
  std::vector<int> shards_of_rank(int r) const;
  // Number of shards table t is split into.
  int pieces(int t) const;
};

// An error (one line naming the problem) for bad options: ranks < 1, an
// unknown placement, lookups of the wrong length or negative, a budget the
// tables cannot fit (naming the table or the totals).
Result<DlrmPlan> plan_dlrm_tables(const DlrmConfig& config, const DlrmPlanOptions& options);

// "table 3: rows 0-99999 on rank 1, ..." one line per rank, for logs.
std::string describe_plan(const DlrmPlan& plan);

}  // namespace tessera
