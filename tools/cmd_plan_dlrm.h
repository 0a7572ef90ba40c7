// tessera plan for DLRM jobs (docs/planner.md, "DLRM"): the job from a
// `tessera train` config (model.kind = "dlrm") or from flags; the table, the
// verdict, --explain and --json. cmd_plan.cc registers the flags and calls
// run_plan_dlrm when the job is a DLRM.
#pragma once

#include <string>
#include <vector>

#include "core/status.h"

namespace tessera::tools {

struct PlanDlrmArgs {
  std::string config;                 // a tessera train config (model.kind = "dlrm")
  std::vector<std::string> overrides;  // --set section.key=value
  std::string model;                  // a preset (dlrm-500m)
  int tables = 0, dense = -1, dim = 0;
  std::string table_rows, bottom, top;  // "300000" or "1000,2000,..."; "512,256,64"
  double bag = 0;
  int64_t global_batch = 0;
  std::string samples, table_optimizer, placement;  // placement: table | row | auto
  std::string dtype = "fp32", objective = "time";
  std::vector<std::string> clusters;
  int top_k = 3, ranks_per_node = 0, threads_per_rank = 0;  // 0: the cluster file's
  bool json = false, explain = false;
};

// Whether the command line asks for a DLRM plan (a dlrm preset, a DLRM flag
// or --config).
bool plan_is_dlrm(const PlanDlrmArgs& a);
int run_plan_dlrm(const PlanDlrmArgs& a);

}  // namespace tessera::tools
