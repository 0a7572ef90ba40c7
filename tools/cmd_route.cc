// tessera route: the router of hybrid serving, in front of `tessera serve`
// workers grouped in tiers (src/serve/router.h; docs/serving.md, "Hybrid
// serving"). SIGTERM or SIGINT drains (requests in flight finish) and exits 0.
#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "serve/router.h"
#include "tools/commands.h"

namespace tessera::tools {

namespace {

struct RouteArgs {
  serve::RouterOptions opts;
  std::vector<std::string> tiers;
};

int run_route(RouteArgs a) {
  for (const std::string& spec : a.tiers) {
    Result<serve::RouteTier> t = serve::parse_route_tier(spec);
    if (!t.ok()) return fail(t.status());
    for (const serve::RouteTier& seen : a.opts.tiers)
      if (seen.name == t->name) return fail(Status::InvalidArgument(fmt::format("--tier {} is given twice", t->name)));
    a.opts.tiers.push_back(std::move(t).value());
  }
  if (a.opts.workers.health_timeout_s > a.opts.workers.stall_timeout_s)
    return fail(Status::InvalidArgument("--health-timeout must not be longer than --stall-timeout"));

  const sigset_t stop_signals = block_stop_signals();

  obs::Registry registry;
  serve::Router router(a.opts, registry);
  if (Status st = router.start(); !st.ok()) return fail(st);
  std::string tiers;
  for (const serve::RouteTier& t : a.opts.tiers) tiers += fmt::format(" {}={}", t.name, t.urls.size());
  std::fprintf(stderr, "route: listening on %s://%s:%d; tiers (workers):%s\n", a.opts.tls.scheme(), a.opts.host.c_str(), router.port(),
               tiers.c_str());
  std::fflush(stderr);

  std::atomic<bool> exiting{false};
  std::thread signals([&] {
    int sig = 0;
    sigwait(&stop_signals, &sig);
    if (exiting) return;
    std::fprintf(stderr, "route: signal %d: draining (up to %.0f s)\n", sig, a.opts.drain_timeout_s);
    const bool drained = router.shutdown();
    std::fprintf(stderr, "route: %s\n", drained ? "drained; exiting" : "drain timed out; exiting");
  });
  router.wait();
  exiting = true;
  pthread_kill(signals.native_handle(), SIGTERM);
  signals.join();
  return kExitOk;
}

}  // namespace

void add_route_command(CLI::App& app) {
  auto a = std::make_shared<RouteArgs>();
  serve::RouterOptions& o = a->opts;
  CLI::App* cmd = app.add_subcommand("route", "Route requests over tiers of `tessera serve` workers, with failover");
  cmd->add_option("--tier", a->tiers, "NAME=URL[,URL...], in order of preference (e.g. gpu=http://127.0.0.1:8001)")
      ->required();
  cmd->add_option("--host", o.host, "address to bind (loopback by default)")->capture_default_str();
  cmd->add_option("--port", o.port, "TCP port; 0 picks a free one (printed)")
      ->capture_default_str()
      ->check(CLI::Range(0, 65535));
  cmd->add_option("--served-model-name", o.model_name, "the model id clients send (default: the first worker's)");
  cmd->add_option("--api-key", o.api_key, "require 'Authorization: Bearer KEY' on /v1/*");
  cmd->add_option("--worker-api-key", o.workers.worker_api_key, "the key the workers require");
  cmd->add_option("--tls-cert", o.tls.cert, "serve HTTPS: the router's certificate chain (PEM)");
  cmd->add_option("--tls-key", o.tls.key, "HTTPS: the certificate's private key (PEM)");
  cmd->add_option("--tls-client-ca", o.tls.client_ca, "HTTPS: accept only clients with a certificate from these CAs");
  add_http_limit_options(cmd, &o.door);
  cmd->add_option("--tls-worker-ca", o.workers.worker_ca,
                  "https:// workers: check their certificates against these CAs (PEM)");
  cmd->add_option("--tls-worker-cert", o.workers.worker_cert,
                  "https:// workers: the client certificate to show them (PEM)");
  cmd->add_option("--tls-worker-key", o.workers.worker_key, "https:// workers: that certificate's private key (PEM)");
  cmd->add_option("--health-interval", o.health_interval_s, "seconds between health checks of a worker")
      ->capture_default_str()
      ->check(CLI::Range(0.01, 3600.0));
  cmd->add_option("--health-timeout", o.workers.health_timeout_s, "seconds a worker has to answer /health")
      ->capture_default_str()
      ->check(CLI::Range(0.01, 3600.0));
  cmd->add_option("--health-failures", o.workers.health_failures,
                  "missed health deadlines in a row that take a worker out")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  cmd->add_option("--hold-down", o.workers.hold_down_s,
                  "seconds a worker must stay healthy before it gets requests again")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 86400.0));
  cmd->add_option("--stall-timeout", o.workers.stall_timeout_s,
                  "seconds a worker may send nothing before the attempt fails")
      ->capture_default_str()
      ->check(CLI::Range(0.01, 86400.0));
  cmd->add_option("--wait-for-worker", o.workers.wait_for_worker_s,
                  "seconds a request waits when no worker is up (then 503)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 3600.0));
  cmd->add_option("--max-attempts", o.max_attempts, "workers a request is tried on at most")
      ->capture_default_str()
      ->check(CLI::Range(1, 100));
  cmd->add_option("--max-inflight", o.max_inflight, "requests in flight at most; more get 429")
      ->capture_default_str()
      ->check(CLI::Range(1, 100000));
  cmd->add_option("--max-body", o.max_body_bytes, "largest request body in bytes")
      ->capture_default_str()
      ->check(CLI::Range(1024, 1 << 30));
  cmd->add_option("--drain-timeout", o.drain_timeout_s, "seconds SIGTERM waits for requests in flight")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1e6));
  cmd->callback([a] { exit_code() = run_route(*a); });
}

}  // namespace tessera::tools
