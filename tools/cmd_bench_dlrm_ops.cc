// tessera bench dlrm-ops: the DLRM step broken down (perf/dlrm_bench.h):
// embedding-bag lookup bandwidth against the STREAM triad, MLP GFLOP/s
// against the fp32 GEMM peak, and each one's share of a forward + backward.
// --backend cuda: the sparse ops on the GPU (lookups against a device copy).
#include <cstdio>
#include <memory>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "perf/dlrm_bench.h"
#include "tools/bench_util.h"
#include "tools/commands.h"

namespace tessera::tools {

namespace {

// --backend cuda: the device's sparse half of the step (perf/dlrm_bench.h).
int run_dlrm_ops_cuda(const perf::DlrmOpsOptions& o, bool json) {
  auto r = perf::bench_dlrm_ops_cuda(o);
  if (!r.ok()) return r.status().code() == StatusCode::kInvalidArgument ? usage_error(r.status().message())
                                                                         : fail(r.status());
  const double table_gb = static_cast<double>(r->table_params) * 4 / 1e9;
  if (json) {
    nlohmann::json j = {{"backend", "cuda"},
                        {"device", r->device},
                        {"table_params", r->table_params},
                        {"table_gb", table_gb},
                        {"lookups", r->lookups},
                        {"unique_rows", r->unique_rows},
                        {"lookup_ms", r->lookup_s * 1e3},
                        {"lookup_bytes", r->lookup_bytes},
                        {"lookup_gbps", r->lookup_gbps},
                        {"copy_gbps", r->copy_gbps},
                        {"lookup_pct_of_copy", 100 * r->lookup_gbps / r->copy_gbps},
                        {"backward_ms", r->backward_s * 1e3},
                        {"adagrad_ms", r->adagrad_s * 1e3},
                        {"interaction_ms", r->interaction_s * 1e3}};
    std::printf("%s\n", j.dump().c_str());
    return kExitOk;
  }
  std::printf("DLRM sparse ops on %s: tables %.2f GB, batch %d, %lld lookups per step, %lld distinct rows\n",
              r->device.c_str(), table_gb, o.batch, static_cast<long long>(r->lookups),
              static_cast<long long>(r->unique_rows));
  std::printf("lookup (embedding-bag forward, all tables):   %8.3f ms  %8.1f GB/s = %5.1f%% of a device copy "
              "%.1f GB/s\n",
              r->lookup_s * 1e3, r->lookup_gbps, 100 * r->lookup_gbps / r->copy_gbps, r->copy_gbps);
  std::printf("sparse gradient (embedding-bag backward):     %8.3f ms\n", r->backward_s * 1e3);
  std::printf("row-wise Adagrad on the touched rows:         %8.3f ms\n", r->adagrad_s * 1e3);
  std::printf("interaction forward + backward (F = T + 1):   %8.3f ms\n", r->interaction_s * 1e3);
  return kExitOk;
}

}  // namespace

void add_bench_dlrm_ops_command(CLI::App& bench) {
  auto o = std::make_shared<perf::DlrmOpsOptions>();
  auto json = std::make_shared<bool>(false);
  CLI::App* cmd = bench.add_subcommand(
      "dlrm-ops", "DLRM step breakdown: lookup bandwidth vs STREAM triad, MLP time vs the GEMM peak");
  cmd->add_option("--tables", o->tables, "embedding tables T");
  cmd->add_option("--rows", o->rows, "rows per table E");
  cmd->add_option("--dim", o->dim, "embedding dimension D");
  cmd->add_option("--batch", o->batch, "samples per step B");
  cmd->add_option("--ids-per-bag", o->ids_per_bag, "ids per sample and table L (uniform over the rows)");
  cmd->add_option("--bottom", o->bottom, "bottom MLP sizes (the last must equal --dim)")->delimiter(',');
  cmd->add_option("--top", o->top, "top MLP hidden sizes")->delimiter(',');
  cmd->add_option("--iters", o->iters, "timed repetitions of each part (best kept)");
  cmd->add_flag("--json", *json, "one JSON object instead of the table");
  auto backend = std::make_shared<std::string>("cpu");
  cmd->add_option("--backend", *backend,
                  "cpu (default) or cuda: the sparse ops on device 0 (lookups vs a device copy, backward, "
                  "row-wise Adagrad, interaction; no MLPs)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  cmd->callback([o, json, backend] {
    if (*backend == "cuda") {
      exit_code() = run_dlrm_ops_cuda(*o, *json);
      return;
    }
    auto r = perf::bench_dlrm_ops(*o);
    if (!r.ok()) {
      exit_code() = usage_error(r.status().message());
      return;
    }
    const double table_gb = static_cast<double>(o->tables) * o->rows * o->dim * 4 / 1e9;
    if (*json) {
      nlohmann::json j = {{"params", r->params},
                          {"table_gb", table_gb},
                          {"lookups", r->lookups},
                          {"lookup_ms", r->lookup_s * 1e3},
                          {"lookup_bytes", r->lookup_bytes},
                          {"lookup_gbps", r->lookup_gbps},
                          {"triad_gbps", r->triad_gbps},
                          {"lookup_pct_of_triad", 100 * r->lookup_gbps / r->triad_gbps},
                          {"mlp_ms", r->mlp_s * 1e3},
                          {"mlp_gflops", r->mlp_gflops},
                          {"gemm_peak_gflops", r->gemm_peak_gflops},
                          {"mlp_pct_of_peak", 100 * r->mlp_gflops / r->gemm_peak_gflops},
                          {"step_ms", r->step_s * 1e3},
                          {"interaction_ms", r->interaction_s * 1e3},
                          {"interaction_gflops", r->interaction_gflops},
                          {"interaction_pct_of_peak", 100 * r->interaction_gflops / r->gemm_peak_gflops}};
      std::printf("%s\n", j.dump().c_str());
    } else {
      std::printf("DLRM %lld params (tables %.2f GB), batch %d, %lld lookups per step\n",
                  static_cast<long long>(r->params), table_gb, o->batch, static_cast<long long>(r->lookups));
      std::printf("lookup (embedding-bag forward, all tables): %8.2f ms  %7.2f GB/s = %5.1f%% of STREAM triad "
                  "%.2f GB/s (%.0f MB moved)\n",
                  r->lookup_s * 1e3, r->lookup_gbps, 100 * r->lookup_gbps / r->triad_gbps, r->triad_gbps,
                  r->lookup_bytes / 1e6);
      std::printf("MLPs (forward + backward, all layers):      %8.2f ms  %7.1f GFLOP/s = %5.1f%% of the fp32 "
                  "GEMM peak %.1f GFLOP/s\n",
                  r->mlp_s * 1e3, r->mlp_gflops, 100 * r->mlp_gflops / r->gemm_peak_gflops, r->gemm_peak_gflops);
      std::printf("interaction (forward + backward):           %8.2f ms  %7.1f GFLOP/s = %5.1f%% of the fp32 "
                  "GEMM peak\n",
                  r->interaction_s * 1e3, r->interaction_gflops, 100 * r->interaction_gflops / r->gemm_peak_gflops);
      std::printf("step (Dlrm forward + backward):             %8.2f ms  lookup %.0f%%, MLPs %.0f%%, interaction "
                  "%.0f%%, rest %.0f%%\n",
                  r->step_s * 1e3, 100 * r->lookup_s / r->step_s, 100 * r->mlp_s / r->step_s,
                  100 * r->interaction_s / r->step_s,
                  100 * (1 - (r->lookup_s + r->mlp_s + r->interaction_s) / r->step_s));
    }
    exit_code() = kExitOk;
  });
}

}  // namespace tessera::tools
