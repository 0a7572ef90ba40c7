// Serves a metrics Registry over HTTP for Prometheus to scrape:
//
//   GET /metrics  the registry in the text format 0.0.4 (Registry::
//                 render_prometheus), after refreshing the process_* figures
//                 (obs/process.h)
//
// Used by `tessera train --metrics-port` (one exporter per rank); `tessera
// serve` has its own route for the same text. A layer of its own so that
// only what exports links cpp-httplib.
//
// Life cycle: start() binds and returns once the listener thread serves
// (cpp-httplib's stop() is lost before its loop runs); stop() or the
// destructor stops it and joins the thread. The registry must outlive the
// exporter.
//
// Threads: a listener thread and a pool of kThreads serving connections,
// one request each (no keep-alive, so stop() never waits for an idle
// connection): enough for Prometheus, a person with curl and a dashboard. A
// scrape renders under the registry's lock; the training thread's counters
// and gauges never wait for it, a histogram observation at most for one
// copy of its buckets.
#pragma once

#include <memory>
#include <string>
#include <thread>

#include "core/status.h"
#include "obs/metrics.h"

namespace httplib {
class Server;
}

namespace tessera::obs {

class MetricsExporter {
 public:
  static constexpr int kThreads = 4;

  explicit MetricsExporter(Registry& registry);
  ~MetricsExporter();
  MetricsExporter(const MetricsExporter&) = delete;
  MetricsExporter& operator=(const MetricsExporter&) = delete;

  // Binds host:port (0: any free port; port() tells which) and starts
  // serving. Unavailable naming the address when it cannot bind: the port
  // is in use, or host is not an address of this machine. A port is bound
  // with SO_REUSEADDR only (not SO_REUSEPORT), so a second process asking
  // for a port in use is refused instead of sharing it. Call once.
  Status start(const std::string& host, int port);
  int port() const { return port_; }
  const std::string& host() const { return host_; }

  // Stops serving and joins the threads; idempotent.
  void stop();

 private:
  Registry& registry_;
  std::unique_ptr<httplib::Server> http_;
  std::thread listener_;
  std::string host_;
  int port_ = 0;
};

}  // namespace tessera::obs
