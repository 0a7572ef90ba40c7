// tessera dashboard: a web page of training runs (their JSON-lines metrics
// files, live while a job writes them and afterwards) and of Prometheus
// endpoints (training ranks, `tessera serve`, `tessera route`), with alerts
// on the page and in the dashboard's own /metrics (docs/monitoring.md,
// "Dashboard"). The page and its chart library (uPlot, from npm: web/) are
// served from this process; nothing is fetched from elsewhere.
//
//   GET /                 the page (web/dashboard/index.html)
//   GET /app.js, /uPlot.iife.min.js, /uPlot.min.css
//   GET /api/state        every run's records, every target's samples, the alerts
//   GET /metrics          tessera_dashboard_alert{alert,target} 0/1 and the values
//   GET /health           200 while it serves
#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <cmath>
#include <ctime>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "obs/metrics.h"
#include "serve/http.h"
#include "serve/http_server.h"
#include "tools/commands.h"

namespace tessera::tools {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

struct DashboardArgs {
  std::vector<std::string> runs, scrapes;
  std::string host = "127.0.0.1", assets;
  int port = 8080;
  serve::TlsOptions tls;
  double checkpoint_share = 0.05;  // alert above this share of training time
  // Below this share of the link's speed: training's achieved all-reduce
  // bus bandwidth (docs/monitoring.md) measured 83-91% of a shaped link when
  // the link is the bottleneck, so half the link means something is wrong.
  double busbw = 0.5;
  double device_util = 0.9;        // alert below this utilisation
  int samples = 3;                 // ... for this many consecutive samples (steps)
};

// The web/ folder: --assets, else beside this binary's source tree.
fs::path find_assets(const std::string& given) {
  if (!given.empty()) return given;
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  for (fs::path p : {exe.parent_path() / "../../web", fs::path("web")}) {
    if (fs::exists(p / "dashboard" / "index.html", ec)) return fs::weakly_canonical(p, ec);
  }
  return {};
}

Result<std::string> read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  if (!f) return Status::NotFound(fmt::format("{}: cannot be read", p.string()));
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

// A run's metrics file: DIR/metrics.jsonl, or the .jsonl file itself.
fs::path metrics_file(const std::string& run) {
  std::error_code ec;
  if (fs::is_directory(run, ec)) return fs::path(run) / "metrics.jsonl";
  return run;
}

// The records of a JSON-lines metrics file (docs/monitoring.md): steps,
// evaluations, checkpoints. A line still being written (a live run) or not
// JSON is skipped.
json read_run(const std::string& run) {
  json steps = json::array(), evals = json::array(), ckpts = json::array();
  std::ifstream f(metrics_file(run));
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
  return {{"name", run}, {"found", fs::exists(metrics_file(run), ec)}, {"steps", steps}, {"evals", evals},
          {"checkpoints", ckpts}};
}

// One Prometheus text sample: name{labels} value.
struct Sample {
  std::string name;
  std::map<std::string, std::string> labels;
  double value = 0;
};

std::vector<Sample> parse_prometheus(const std::string& text) {
  std::vector<Sample> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    Sample s;
    size_t i = line.find_first_of("{ ");
    if (i == std::string::npos) continue;
    s.name = line.substr(0, i);
    if (line[i] == '{') {
      const size_t close = line.find('}', i);
      if (close == std::string::npos) continue;
      std::string body = line.substr(i + 1, close - i - 1);
      size_t k = 0;
      while (k < body.size()) {
        const size_t eq = body.find('=', k);
        if (eq == std::string::npos || eq + 1 >= body.size() || body[eq + 1] != '"') break;
        const size_t endq = body.find('"', eq + 2);
        if (endq == std::string::npos) break;
        s.labels[body.substr(k, eq - k)] = body.substr(eq + 2, endq - eq - 2);
        k = endq + 1;
        if (k < body.size() && body[k] == ',') k++;
      }
      i = close + 1;
    }
    try {
      s.value = std::stod(line.substr(i));
    } catch (const std::exception&) {
      continue;
    }
    out.push_back(std::move(s));
  }
  return out;
}

// The q-quantile of a histogram's cumulative buckets (Prometheus'
// histogram_quantile, linear within a bucket); NaN without observations.
double bucket_quantile(std::vector<std::pair<double, double>> buckets, double q) {
  std::sort(buckets.begin(), buckets.end());
  if (buckets.empty() || buckets.back().second <= 0) return std::nan("");
  const double rank = q * buckets.back().second;
  double lo = 0, below = 0;
  for (const auto& [le, count] : buckets) {
    if (count >= rank) {
      if (std::isinf(le)) return lo;
      return lo + (le - lo) * (count > below ? (rank - below) / (count - below) : 0);
    }
    lo = le;
    below = count;
  }
  return lo;
}

// A target's samples worth plotting: every unlabelled or simply labelled
// tessera_* series, and p50/p90 of the serving latency histograms.
json scrape(const std::string& url) {
  json t = {{"url", url}};
  const std::string scheme = "http://";
  std::string rest = url.rfind(scheme, 0) == 0 ? url.substr(scheme.size()) : url;
  const size_t slash = rest.find('/');
  const std::string hostport = rest.substr(0, slash);
  const std::string path = slash == std::string::npos ? "/metrics" : rest.substr(slash);
  const size_t colon = hostport.rfind(':');
  if (colon == std::string::npos) {
    t["error"] = "not http://HOST:PORT[/path]";
    return t;
  }
  httplib::Client c(hostport.substr(0, colon), std::atoi(hostport.c_str() + colon + 1));
  c.set_connection_timeout(1, 0);
  c.set_read_timeout(2, 0);
  auto r = c.Get(path);
  if (!r || r->status != 200) {
    t["error"] = r ? fmt::format("HTTP {}", r->status) : httplib::to_string(r.error());
    return t;
  }
  json values = json::object();
  std::map<std::string, std::vector<std::pair<double, double>>> hist;
  for (const Sample& s : parse_prometheus(r->body)) {
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
  t["values"] = values;
  return t;
}

// A threshold alert over consecutive samples: fires when the last
// `a.samples` values are all below `threshold`; "unknown" without values.
struct Streak {
  int below = 0;      // consecutive samples below the threshold, up to now
  double last = NAN;  // the last value
};

// Per scraped target, what the alerts over consecutive samples remember
// between polls: a sample is a new step (tessera_train_steps_total moved).
class TargetHistory {
 public:
  struct Entry {
    double steps = -1;
    Streak busbw, util;
  };
  // Updates the target's streaks with its values when they are a new step.
  Entry update(const std::string& url, const json& values, const DashboardArgs& a) {
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

 private:
  std::mutex mu_;
  std::map<std::string, Entry> entries_;
};

// The streak of a run's step records' values of `key` (scaled by `scale`
// of the same record, when given) against `threshold`.
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

// The alerts of the state: one per (alert, target), firing or not, or
// "unknown" when what it needs is not measured. `history` (null for a
// report) keeps scraped targets' streaks between calls.
json alerts(const json& runs, const json& targets, const DashboardArgs& a, TargetHistory* history = nullptr) {
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

int run_dashboard(const DashboardArgs& a) {
  const fs::path assets = find_assets(a.assets);
  if (assets.empty())
    return fail(Status::NotFound("the dashboard's files (web/dashboard) are not found: pass --assets WEB_DIR"));
  const fs::path uplot = assets / "node_modules" / "uplot" / "dist";
  std::error_code ec;
  if (!fs::exists(uplot / "uPlot.iife.min.js", ec))
    return fail(Status::NotFound(fmt::format(
        "{}: the chart library is not installed (scripts/setup.sh runs npm ci --prefix web)", uplot.string())));
  for (const std::string& r : a.runs) {
    if (!fs::exists(metrics_file(r), ec) && !fs::is_directory(r, ec))
      return fail(Status::NotFound(fmt::format("--run {}: no such metrics file or run folder", r)));
  }

  const sigset_t stop_signals = block_stop_signals();

  obs::Registry registry;
  Result<std::unique_ptr<serve::HttpServer>> made = serve::HttpServer::make(a.tls);
  if (!made.ok()) return fail(made.status());
  httplib::Server& http = (*made)->routes();
  serve::HttpOptions ho;
  ho.threads = 8;
  ho.max_body_bytes = 4096;
  serve::configure_http(http, ho, [](httplib::Response& res, const serve::ApiError& e) {
    res.status = e.http;
    res.set_content(e.body().dump(), "application/json");
  });
  auto file = [&http](const std::string& route, fs::path p, const char* type) {
    http.Get(route, [p, type](const httplib::Request&, httplib::Response& res) {
      auto body = read_file(p);
      if (!body.ok()) {
        res.status = 404;
        res.set_content(body.status().message(), "text/plain");
        return;
      }
      res.set_content(*body, type);
    });
  };
  file("/", assets / "dashboard" / "index.html", "text/html; charset=utf-8");
  file("/app.js", assets / "dashboard" / "app.js", "text/javascript; charset=utf-8");
  file("/uPlot.iife.min.js", uplot / "uPlot.iife.min.js", "text/javascript; charset=utf-8");
  file("/uPlot.min.css", uplot / "uPlot.min.css", "text/css; charset=utf-8");

  TargetHistory history;
  auto state = [a, &registry, &history]() {
    json runs = json::array(), targets = json::array();
    for (const std::string& r : a.runs) runs.push_back(read_run(r));
    for (const std::string& u : a.scrapes) targets.push_back(scrape(u));
    json al = alerts(runs, targets, a, &history);
    for (const json& x : al) {
      const obs::Labels l{{"alert", x["alert"].get<std::string>()}, {"target", x["target"].get<std::string>()}};
      registry.gauge("tessera_dashboard_alert", "1 while the alert fires, 0 otherwise (-1: not measured)", l)
          .set(x["state"] == "firing" ? 1 : x["state"] == "ok" ? 0 : -1);
      if (x.contains("value"))
        registry.gauge("tessera_dashboard_alert_value", "The figure the alert compares with its threshold", l)
            .set(x["value"].get<double>());
    }
    return json{{"runs", runs}, {"targets", targets}, {"alerts", al}};
  };
  http.Get("/health", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("{\"status\":\"ok\"}", "application/json");
  });
  http.Get("/api/state", [state](const httplib::Request&, httplib::Response& res) {
    res.set_content(state().dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
  });
  http.Get("/metrics", [state, &registry](const httplib::Request&, httplib::Response& res) {
    state();  // the alerts as of now
    res.set_content(registry.render_prometheus(), "text/plain; version=0.0.4; charset=utf-8");
  });

  Result<int> port = (*made)->bind(a.host, a.port);
  if (!port.ok()) return fail(port.status());
  if (Status st = (*made)->start(ho, nullptr); !st.ok()) return fail(st);
  std::fprintf(stderr, "dashboard: listening on %s://%s:%d (%zu runs, %zu targets)\n", a.tls.scheme(), a.host.c_str(), *port,
               a.runs.size(), a.scrapes.size());
  std::fflush(stderr);
  int sig = 0;
  sigwait(&stop_signals, &sig);
  (*made)->stop();
  (*made)->wait();
  return kExitOk;
}

// "</" inside inlined code or JSON would end its <script> element early.
std::string script_safe(std::string s) {
  for (size_t i = 0; (i = s.find("</", i)) != std::string::npos; i += 3) s.replace(i, 2, "<\\/");
  return s;
}

// Replaces the one occurrence of `what` in html; false when it is missing.
bool replace_once(std::string& html, const std::string& what, const std::string& with) {
  const size_t i = html.find(what);
  if (i == std::string::npos) return false;
  html.replace(i, what.size(), with);
  return true;
}

struct ReportArgs {
  std::vector<std::string> runs;
  std::string out, assets;
};

// tessera report: the dashboard's page for finished runs with everything
// inline (the chart library, the script, the runs' records): one file to
// share, opened without a server or a network.
int run_report(const ReportArgs& r) {
  const fs::path assets = find_assets(r.assets);
  if (assets.empty())
    return fail(Status::NotFound("the dashboard's files (web/dashboard) are not found: pass --assets WEB_DIR"));
  const fs::path uplot = assets / "node_modules" / "uplot" / "dist";
  std::error_code ec;
  json runs = json::array();
  for (const std::string& run : r.runs) {
    if (!fs::is_regular_file(metrics_file(run), ec))
      return fail(Status::NotFound(
          fmt::format("{}: no metrics file (a run folder with metrics.jsonl, or the log.metrics file)", run)));
    runs.push_back(read_run(run));
  }
  std::string parts[4];
  const fs::path files[4] = {assets / "dashboard" / "index.html", assets / "dashboard" / "app.js",
                             uplot / "uPlot.iife.min.js", uplot / "uPlot.min.css"};
  for (int i = 0; i < 4; i++) {
    auto body = read_file(files[i]);
    if (!body.ok()) return fail(body.status());
    parts[i] = std::move(*body);
  }
  DashboardArgs defaults;
  const std::time_t now = std::time(nullptr);
  char when[64];
  std::strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S UTC", std::gmtime(&now));
  const json state = {{"runs", runs},
                      {"targets", json::array()},
                      {"alerts", alerts(runs, json::array(), defaults)},
                      {"generated", fmt::format("report generated {}", when)}};
  std::string html = parts[0];
  const bool ok = replace_once(html, "<link rel=\"stylesheet\" href=\"/uPlot.min.css\">", "<style>" + parts[3] + "</style>") &&
                  replace_once(html, "<script src=\"/uPlot.iife.min.js\"></script>",
                               "<script>" + script_safe(parts[2]) + "</script>") &&
                  replace_once(html, "<script src=\"/app.js\"></script>",
                               "<script>window.TESSERA_STATE = " +
                                   script_safe(state.dump(-1, ' ', false, json::error_handler_t::replace)) +
                                   ";</script>\n<script>" + script_safe(parts[1]) + "</script>");
  if (!ok) return fail(Status::Corruption(fmt::format("{}: not the dashboard's page", files[0].string())));
  // Written beside the target, then renamed: never a half report.
  const fs::path out = r.out;
  const fs::path tmp = out.string() + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) return fail(Status::IOError(fmt::format("--out {}: cannot be written", out.string())));
    f << html;
    f.close();
    if (!f) {
      fs::remove(tmp, ec);
      return fail(Status::IOError(fmt::format("--out {}: write failed", out.string())));
    }
  }
  fs::rename(tmp, out, ec);
  if (ec) return fail(Status::IOError(fmt::format("--out {}: {}", out.string(), ec.message())));
  std::printf("wrote %s: %zu runs, %.1f KB, self-contained\n", out.string().c_str(), runs.size(), html.size() / 1e3);
  return kExitOk;
}

}  // namespace

void add_report_command(CLI::App& app) {
  auto r = std::make_shared<ReportArgs>();
  CLI::App* cmd = app.add_subcommand("report", "Write a self-contained HTML report of finished runs");
  cmd->add_option("runs", r->runs, "run folders (their metrics.jsonl) or metrics .jsonl files")->required();
  cmd->add_option("--out", r->out, "the HTML file to write")->required();
  cmd->add_option("--assets", r->assets, "the web/ folder (default: beside the build)");
  cmd->callback([r] { exit_code() = run_report(*r); });
}

void add_dashboard_command(CLI::App& app) {
  auto a = std::make_shared<DashboardArgs>();
  CLI::App* cmd = app.add_subcommand("dashboard", "A live web dashboard of training runs and servers, with alerts");
  cmd->add_option("--run", a->runs, "a run's folder (its metrics.jsonl) or a metrics .jsonl file; repeat");
  cmd->add_option("--scrape", a->scrapes, "a Prometheus endpoint: http://HOST:PORT[/metrics]; repeat");
  cmd->add_option("--host", a->host, "address to bind (loopback by default)")->capture_default_str();
  cmd->add_option("--port", a->port, "TCP port; 0 picks a free one (printed)")
      ->capture_default_str()
      ->check(CLI::Range(0, 65535));
  cmd->add_option("--assets", a->assets, "the web/ folder (default: beside the build)");
  cmd->add_option("--tls-cert", a->tls.cert, "serve HTTPS: the certificate chain (PEM)");
  cmd->add_option("--tls-key", a->tls.key, "HTTPS: the certificate's private key (PEM)");
  cmd->add_option("--tls-client-ca", a->tls.client_ca, "HTTPS: accept only clients with a certificate from these CAs");
  cmd->add_option("--alert-checkpoint-share", a->checkpoint_share, "alert when checkpoints stall more of training")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--alert-busbw", a->busbw, "alert below this share of the link's bandwidth")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--alert-device-util", a->device_util, "alert below this device utilisation")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--alert-samples", a->samples,
                  "the bandwidth and utilisation alerts fire after this many consecutive samples (steps) below")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000000));
  cmd->callback([a] {
    if (a->runs.empty() && a->scrapes.empty()) {
      exit_code() = fail(Status::InvalidArgument("nothing to show: give --run DIR or --scrape URL"));
      return;
    }
    exit_code() = run_dashboard(*a);
  });
}

}  // namespace tessera::tools
