#include "obs/http/metrics_exporter.h"

#include <sys/socket.h>

#include <chrono>

#include <fmt/format.h>
#include <httplib.h>

#include "obs/process.h"

namespace tessera::obs {

MetricsExporter::MetricsExporter(Registry& registry)
    : registry_(registry), http_(std::make_unique<httplib::Server>()) {}

MetricsExporter::~MetricsExporter() { stop(); }

Status MetricsExporter::start(const std::string& host, int port) {
  httplib::Server& s = *http_;
  s.new_task_queue = [] { return new httplib::ThreadPool(kThreads); };
  s.set_read_timeout(5, 0);
  s.set_write_timeout(5, 0);
  // One request per connection: an idle keep-alive connection holds its
  // thread (and so stop()) for the keep-alive timeout; a scrape a second
  // is cheap to reconnect. The timeout still bounds the wait for a new
  // connection's first request.
  s.set_keep_alive_max_count(1);
  s.set_keep_alive_timeout(2);
  // SO_REUSEADDR (a restarted job rebinds at once) but not cpp-httplib's
  // default SO_REUSEPORT, with which two jobs on one port would both bind
  // and each scrape would reach either.
  s.set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  Registry* registry = &registry_;
  s.Get("/metrics", [registry](const httplib::Request&, httplib::Response& res) {
    update_process_metrics(*registry);
    res.set_content(registry->render_prometheus(), "text/plain; version=0.0.4; charset=utf-8");
  });

  host_ = host;
  if (port == 0) {
    port_ = s.bind_to_any_port(host);
    if (port_ <= 0) return Status::Unavailable(fmt::format("cannot bind {} on any port", host));
  } else {
    if (!s.bind_to_port(host, port))
      return Status::Unavailable(
          fmt::format("cannot serve metrics on {}:{} (in use, or not an address of this machine)", host, port));
    port_ = port;
  }
  listener_ = std::thread([this] { http_->listen_after_bind(); });
  for (int i = 0; i < 10000 && !http_->is_running(); i++) std::this_thread::sleep_for(std::chrono::microseconds(100));
  return Status::OK();
}

void MetricsExporter::stop() {
  if (http_) http_->stop();
  if (listener_.joinable()) listener_.join();
}

}  // namespace tessera::obs
