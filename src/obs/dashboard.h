// What `tessera dashboard` and `tessera report` show, computed apart from
// the HTTP that serves it (tools/cmd_dashboard.cc): a run's records from its
// JSON-lines metrics file, the values worth plotting of a scraped Prometheus
// target, and the alerts over both (docs/monitoring.md, "Dashboard").
//
// The JSON shapes are the page's (web/dashboard/app.js reads them):
//   run     {"name", "found", "steps": [...], "evals": [...], "checkpoints": [...]}
//   target  {"url", "values": {"series{label=value}": number, ...}} or {"url", "error"}
//   alert   {"alert", "target", "state": "firing" | "ok" | "unknown", "detail",
//            "threshold"?, "samples"?, "value"?}
#pragma once

#include <cmath>
#include <map>
#include <mutex>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace tessera::obs {

struct AlertThresholds {
  double checkpoint_share = 0.05;  // alert above this share of training time
  // Below this share of the link's speed: training's achieved all-reduce
  // bus bandwidth (docs/monitoring.md) measured 83-91% of a shaped link when
  // the link is the bottleneck, so half the link means something is wrong.
  double busbw = 0.5;
  double device_util = 0.9;  // alert below this utilisation
  int samples = 3;           // ... for this many consecutive samples (steps)
};

// A run's metrics file: DIR/metrics.jsonl when `run` is a folder, else `run`.
std::string run_metrics_file(const std::string& run);

// The records of a run's JSON-lines metrics file (docs/monitoring.md):
// steps (the plotted keys only), evaluations, checkpoints. A line still
// being written (a live run) or not a JSON object is skipped; a missing file
// is a run with "found": false and no records.
nlohmann::json read_run(const std::string& run);

// The values of a target's /metrics text worth plotting: every tessera_*
// series (and process_resident_memory_bytes) keyed by its name and labels
// (but the rank, dp, tp, pp, host and job labels), the link speed and GPU
// utilisation also under their bare names (the first series), and the p50
// and p90 of each histogram as "NAME:p50", "NAME:p90".
nlohmann::json target_values(std::string_view metrics_text);

// An alert over consecutive samples: fires when the last `samples` values
// are all below the threshold; "unknown" without a value.
struct Streak {
  int below = 0;      // consecutive samples below the threshold, up to now
  double last = NAN;  // the last value
};

// Per scraped target, what the alerts over consecutive samples remember
// between polls: a sample is a new step (tessera_train_steps_total moved).
// Thread safety: update may be called from any thread.
class TargetHistory {
 public:
  struct Entry {
    double steps = -1;
    Streak busbw, util;
  };
  // Updates the target's streaks with its values (target_values) when they
  // are a new step; returns them.
  Entry update(const std::string& url, const nlohmann::json& values, const AlertThresholds& a);

 private:
  std::mutex mu_;
  std::map<std::string, Entry> entries_;
};

// The streak of a run's step records' values of `key` (divided by `scale`
// of the same record, when given; records without a positive scale are
// skipped) against `threshold`.
Streak run_streak(const nlohmann::json& steps, const char* key, const char* scale, double threshold);

// The alerts of the state: one per (alert, target), firing or not, or
// "unknown" when what it needs is not measured. Runs: checkpoint_share,
// allreduce_busbw, device_utilization. Targets: target_down (an "error"),
// allreduce_busbw and device_utilization for a training rank (only with
// `history`, which keeps the streaks between calls; null for a report),
// failover (a router off its gpu tier).
nlohmann::json dashboard_alerts(const nlohmann::json& runs, const nlohmann::json& targets, const AlertThresholds& a,
                                TargetHistory* history = nullptr);

}  // namespace tessera::obs
