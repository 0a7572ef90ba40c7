#include "obs/dashboard.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "obs/prom_text.h"

namespace tessera::obs {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string run_metrics_file(const std::string& run) {
  std::error_code ec;
  if (fs::is_directory(run, ec)) return (fs::path(run) / "metrics.jsonl").string();
  return run;
}

json read_run(const std::string& run) {
  json steps = json::array(), evals = json::array(), ckpts = json::array();
  std::ifstream f(run_metrics_file(run));
  std::string line;
  while (std::getline(f, line)) {
    const json j = json::parse(line, nullptr, false);
    if (!j.is_object()) continue;
    if (j.contains("checkpoint_step")) {
      ckpts.push_back(j);
    } else if (j.contains("val_loss")) {
      evals.push_back({{"step", j.value("step", 0)}, {"val_loss", j["val_loss"]}});
    } else if (j.contains("loss") && j.contains("step")) {
      json s = json::object();
      for (const char* k : {"step", "loss", "tokens_per_s", "mfu", "step_ms", "compute_ms", "comm_ms", "bubble_ms",
                            "p2p_ms", "lr", "grad_norm", "busbw_all_reduce_gbps", "link_gbps", "comm_sent_bytes",
                            "comm_received_bytes", "gpu_util"})
        if (j.contains(k)) s[k] = j[k];
      steps.push_back(std::move(s));
    }
  }
  std::error_code ec;
  return {{"name", run}, {"found", fs::exists(run_metrics_file(run), ec)}, {"steps", steps}, {"evals", evals},
          {"checkpoints", ckpts}};
}

json target_values(std::string_view metrics_text) {
  json values = json::object();
  std::map<std::string, std::vector<std::pair<double, double>>> hist;
  for (const PromSample& s : parse_prometheus_text(metrics_text)) {
    if (s.name.rfind("tessera_", 0) != 0 && s.name != "process_resident_memory_bytes") continue;
    if (s.name.size() > 7 && s.name.compare(s.name.size() - 7, 7, "_bucket") == 0) {
      const auto le = s.labels.find("le");
      if (le == s.labels.end()) continue;
      const double bound = le->second == "+Inf" ? INFINITY : std::atof(le->second.c_str());
      hist[s.name.substr(0, s.name.size() - 7)].push_back({bound, s.value});
      continue;
    }
    std::string key = s.name;
    for (const auto& [k, v] : s.labels) {
      if (k == "rank" || k == "dp" || k == "tp" || k == "pp" || k == "host" || k == "job") continue;
      key += fmt::format("{{{}={}}}", k, v);
    }
    values[key] = s.value;
    // Series whose label values are not known in advance, under their bare
    // name too (the first one): the link's speed, the GPU's utilisation.
    if ((s.name == "tessera_train_link_speed_bytes_per_second" || s.name == "tessera_gpu_utilization_ratio") &&
        !values.contains(s.name))
      values[s.name] = s.value;
  }
  for (const auto& [name, b] : hist) {
    for (double q : {0.5, 0.9}) {
      const double v = bucket_quantile(b, q);
      if (!std::isnan(v)) values[fmt::format("{}:p{:.0f}", name, q * 100)] = v;
    }
  }
  return values;
}

TargetHistory::Entry TargetHistory::update(const std::string& url, const json& values, const AlertThresholds& a) {
  std::lock_guard<std::mutex> lock(mu_);
  Entry& e = entries_[url];
  const double steps = values.value("tessera_train_steps_total", -1.0);
  if (steps == e.steps) return e;
  e.steps = steps;
  const double link = values.value("tessera_train_link_speed_bytes_per_second", 0.0);
  const char* ar = "tessera_train_comm_bus_bandwidth_bytes_per_second{op=all_reduce}";
  if (link > 0 && values.contains(ar) && values[ar].get<double>() > 0) {
    e.busbw.last = values[ar].get<double>() / link;
    e.busbw.below = e.busbw.last < a.busbw ? e.busbw.below + 1 : 0;
  }
  if (values.contains("tessera_gpu_utilization_ratio")) {
    e.util.last = values["tessera_gpu_utilization_ratio"].get<double>();
    e.util.below = e.util.last < a.device_util ? e.util.below + 1 : 0;
  }
  return e;
}

Streak run_streak(const json& steps, const char* key, const char* scale, double threshold) {
  Streak s;
  for (const json& r : steps) {
    if (!r.contains(key) || !r[key].is_number()) continue;
    double v = r[key].get<double>();
    if (scale) {
      if (!r.contains(scale) || !r[scale].is_number() || r[scale].get<double>() <= 0) continue;
      v /= r[scale].get<double>();
    }
    s.last = v;
    s.below = v < threshold ? s.below + 1 : 0;
  }
  return s;
}

namespace {

// The all-reduce bandwidth and device utilisation alerts from a streak.
json streak_alert(const char* name, const json& target, const Streak& s, double threshold, int samples,
                  const std::string& unknown_why, const char* what) {
  json al = {{"alert", name}, {"target", target}, {"threshold", threshold}, {"samples", samples}};
  if (std::isnan(s.last)) {
    al["state"] = "unknown";
    al["detail"] = unknown_why;
    return al;
  }
  al["value"] = s.last;
  al["state"] = s.below >= samples ? "firing" : "ok";
  al["detail"] = fmt::format("{}: {:.1f}% ({} consecutive samples below {:.0f}%; fires at {})", what, 100 * s.last,
                             s.below, 100 * threshold, samples);
  return al;
}

}  // namespace

json dashboard_alerts(const json& runs, const json& targets, const AlertThresholds& a, TargetHistory* history) {
  json out = json::array();
  for (const json& r : runs) {
    json al = {{"alert", "checkpoint_share"}, {"target", r["name"]}, {"threshold", a.checkpoint_share}};
    if (r["checkpoints"].empty()) {
      al["state"] = "ok";
      al["value"] = 0.0;
      al["detail"] = "no checkpoint taken";
    } else {
      const double share = r["checkpoints"].back().value("stall_share", 0.0);
      al["value"] = share;
      al["state"] = share > a.checkpoint_share ? "firing" : "ok";
      al["detail"] = fmt::format("checkpoints stalled {:.1f}% of training time (alert above {:.1f}%)", 100 * share,
                                 100 * a.checkpoint_share);
    }
    out.push_back(al);
    const json& steps = r["steps"];
    bool any_busbw = false, any_link = false;
    for (const json& st : steps) {
      any_busbw = any_busbw || st.contains("busbw_all_reduce_gbps");
      any_link = any_link || (st.contains("link_gbps") && st["link_gbps"].is_number());
    }
    out.push_back(streak_alert(
        "allreduce_busbw", r["name"], run_streak(steps, "busbw_all_reduce_gbps", "link_gbps", a.busbw), a.busbw,
        a.samples,
        !any_busbw ? "no all-reduce between ranks recorded (a single-rank run)"
                   : !any_link ? "the link's speed is unknown (set log.link_gbps)" : "no sample yet",
        "all-reduce bus bandwidth, share of the link"));
    out.push_back(streak_alert("device_utilization", r["name"], run_streak(steps, "gpu_util", nullptr, a.device_util),
                               a.device_util, a.samples,
                               "no device utilisation recorded (a CPU run, or NVML absent)", "device utilisation"));
  }
  for (const json& t : targets) {
    if (t.contains("error")) {
      out.push_back({{"alert", "target_down"}, {"target", t["url"]}, {"state", "firing"}, {"detail", t["error"]}});
      continue;
    }
    const json& v = t["values"];
    if (history && v.contains("tessera_train_steps_total")) {
      const TargetHistory::Entry e = history->update(t["url"], v, a);
      out.push_back(streak_alert("allreduce_busbw", t["url"], e.busbw, a.busbw, a.samples,
                                 v.contains("tessera_train_link_speed_bytes_per_second")
                                     ? "no all-reduce between ranks yet"
                                     : "the link's speed is unknown (set log.link_gbps)",
                                 "all-reduce bus bandwidth, share of the link"));
      out.push_back(streak_alert("device_utilization", t["url"], e.util, a.device_util, a.samples,
                                 "no device utilisation reported (a CPU rank, or NVML absent)", "device utilisation"));
    }
    if (v.contains("tessera_route_tier_active{tier=gpu}") && v["tessera_route_tier_active{tier=gpu}"] == 0.0)
      out.push_back({{"alert", "failover"}, {"target", t["url"]}, {"state", "firing"},
                     {"detail", "the router is not on its gpu tier"}});
  }
  return out;
}

}  // namespace tessera::obs
