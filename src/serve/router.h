// `tessera route`: the control plane of hybrid serving (docs/serving.md,
// "Hybrid serving"). One process in front of `tessera serve` workers, the
// data plane, grouped in tiers in order of preference (a GPU tier, then an
// INT8 CPU tier). It speaks the same OpenAI-compatible API.
//
// Routing: every request goes to the first tier with a worker up, to its
// worker with the fewest requests in flight.
//
// Health: a thread per worker asks GET /health every health_interval_s with
// a deadline of health_timeout_s. A worker is taken out at once when it
// refuses connections, answers 503 (device error, draining, loading) or a
// request gets a 5xx or a broken connection from it, and after
// health_failures deadlines missed in a row (a hung worker). Taking a worker
// out aborts its requests in flight (they are retried, below). A worker out
// comes back after its health checks pass for hold_down_s without a break,
// so a flapping worker does not pull traffic back and forth (failback); the
// hold-down doubles (up to 32x) each time the worker is taken out again
// before it answers a request (a circuit breaker: a worker whose /health is
// fine but whose requests fail is tried less and less often).
//
// Retries: a request whose worker fails is sent to the next worker up (in
// its tier, else the next tier), up to max_attempts times:
//   - not streamed: the request again, from the start (the client sees one
//     answer, later);
//   - streamed: the router always asks workers for a stream with the token
//     ids (return_token_ids) and relays it, so it knows the prompt's ids,
//     the ids generated and the bytes of text the client has. The next
//     worker continues the sequence from there (the "resume" field of
//     openai.h: those ids as the prompt, their text through the stop strings
//     again, nothing sent twice), and its chunks go on under the first one's
//     id: the client sees one unbroken stream.
// A worker's 4xx is the client's error and is passed through; a 429 tries
// the other workers and is passed through when all are full.
//
// The workers, the pick and the retry policy are route_policy.h; this file
// is the HTTP front end, whose two modes run through one attempt loop.
// The switch is visible: /health names the active tier and why, each switch
// writes one log line, and /metrics has tessera_route_tier_active{tier},
// tessera_route_failovers_total{from,to,reason},
// tessera_route_retries_total, tessera_route_worker_up{tier,worker} and
// per-tier latency histograms.
#pragma once

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/status.h"
#include "obs/metrics.h"
#include "serve/http_server.h"
#include "serve/route_policy.h"

namespace httplib {
class Server;
}

namespace tessera::serve {

// "NAME=URL[,URL...]"; InvalidArgument naming what is wrong.
Result<RouteTier> parse_route_tier(const std::string& spec);

struct RouterOptions {
  std::string host = "127.0.0.1";
  int port = 8000;                  // 0: any free port
  std::vector<RouteTier> tiers;     // in order of preference
  std::string model_name;           // the id clients use; empty: the first worker's
  std::string api_key;              // clients must send it; empty: none
  // The workers: health deadlines, hold-down, connect and stall deadlines,
  // the key sent to them and, for https:// workers, the CAs their
  // certificates are checked against (empty: the system's) and the client
  // certificate shown to them (for workers started with --tls-client-ca).
  route::PoolOptions workers;
  double health_interval_s = 0.5;
  int max_attempts = 4;
  int max_inflight = 256;           // more get 429
  size_t max_body_bytes = 1 << 20;
  double drain_timeout_s = 30;
  TlsOptions tls;                   // the router's own HTTPS (all empty: plain)
  DoorLimits door;                  // slow and many clients (http.h)
};

class Router {
 public:
  Router(const RouterOptions& opts, obs::Registry& registry);
  ~Router();
  Router(const Router&) = delete;
  Router& operator=(const Router&) = delete;

  // Checks every worker once (so a request at once finds the workers that
  // are up), starts the health threads, binds and serves in the background.
  Status start();
  int port() const { return port_; }
  // Refuses new requests (503), waits up to drain_timeout_s for those in
  // flight, stops. Any thread; whether everything finished in time.
  bool shutdown();
  void wait();

 private:
  struct State;
  RouterOptions opts_;
  obs::Registry& registry_;
  std::unique_ptr<HttpServer> http_;
  std::shared_ptr<State> state_;
  int port_ = 0;
};

}  // namespace tessera::serve
