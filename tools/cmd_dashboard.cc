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

#include <ctime>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "obs/dashboard.h"
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
  obs::AlertThresholds alerts;  // --alert-*
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

// A target's samples worth plotting (obs::target_values), or its error.
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
  t["values"] = obs::target_values(r->body);
  return t;
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
    if (!fs::exists(obs::run_metrics_file(r), ec) && !fs::is_directory(r, ec))
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

  obs::TargetHistory history;
  auto state = [a, &registry, &history]() {
    json runs = json::array(), targets = json::array();
    for (const std::string& r : a.runs) runs.push_back(obs::read_run(r));
    for (const std::string& u : a.scrapes) targets.push_back(scrape(u));
    json al = obs::dashboard_alerts(runs, targets, a.alerts, &history);
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
    if (!fs::is_regular_file(obs::run_metrics_file(run), ec))
      return fail(Status::NotFound(
          fmt::format("{}: no metrics file (a run folder with metrics.jsonl, or the log.metrics file)", run)));
    runs.push_back(obs::read_run(run));
  }
  std::string parts[4];
  const fs::path files[4] = {assets / "dashboard" / "index.html", assets / "dashboard" / "app.js",
                             uplot / "uPlot.iife.min.js", uplot / "uPlot.min.css"};
  for (int i = 0; i < 4; i++) {
    auto body = read_file(files[i]);
    if (!body.ok()) return fail(body.status());
    parts[i] = std::move(*body);
  }
  const std::time_t now = std::time(nullptr);
  char when[64];
  std::strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S UTC", std::gmtime(&now));
  const json state = {{"runs", runs},
                      {"targets", json::array()},
                      {"alerts", obs::dashboard_alerts(runs, json::array(), obs::AlertThresholds{})},
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
  cmd->add_option("--alert-checkpoint-share", a->alerts.checkpoint_share, "alert when checkpoints stall more of training")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--alert-busbw", a->alerts.busbw, "alert below this share of the link's bandwidth")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--alert-device-util", a->alerts.device_util, "alert below this device utilisation")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--alert-samples", a->alerts.samples,
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
