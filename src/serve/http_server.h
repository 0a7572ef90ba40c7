// The HTTP front end of `tessera serve`, `tessera route` and the dashboard:
// one event-driven thread (epoll) owns every connection while it is idle or
// while its request arrives, and hands a request to the request threads
// only once all of it is here. A slow client ("slowloris": a header line
// every few seconds, or a body a byte at a time) holds a file descriptor
// and a few kilobytes, never a thread, and is closed at a total deadline;
// connections past a cap (in all, and per client address) get a fast 503.
// TLS (OpenSSL) is ended here too, handshakes included, without blocking.
//
// The requests themselves are cpp-httplib's: routes are registered on
// routes() as on any httplib::Server, and each complete request is parsed,
// routed and answered by its process_request on a request thread, through
// a stream over the buffered request (reads) and the socket (writes).
#pragma once

#include <memory>
#include <string>

#include "core/status.h"
#include "serve/http.h"

namespace httplib {
class Server;
}  // namespace httplib

namespace tessera::obs {
class Registry;
}  // namespace tessera::obs

namespace tessera::serve {

// Counts since start (also exported to the registry given to start()).
struct DoorCounts {
  long open = 0;              // connections open now
  long refused = 0;           // closed at accept or at their headers: over a cap (503)
  long read_timeouts = 0;     // closed because a handshake, headers or body missed its deadline
  long idle_closed = 0;       // keep-alive connections closed idle
};

class HttpServer {
 public:
  // A server for `tls` (all empty: plain HTTP). One line naming the flag
  // for a key without a certificate (or the reverse), a file that is not a
  // readable regular file, or a certificate and key OpenSSL will not use.
  static Result<std::unique_ptr<HttpServer>> make(const TlsOptions& tls);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Where handlers, limits and error handlers are set (configure_http).
  httplib::Server& routes();

  // Binds host:port (0: any free port) and returns the port; Unavailable
  // naming the address otherwise.
  Result<int> bind(const std::string& host, int port);

  // Starts opts.threads request threads and the connection thread, with
  // opts.door's limits; counters go to `registry` when given.
  // ResourceExhausted when the threads cannot be made (nothing is left
  // running then).
  Status start(const HttpOptions& opts, obs::Registry* registry);

  // Stops accepting and closes the connections waiting for a request; the
  // requests running finish (their connections close after them). Any
  // thread, more than once.
  void stop();
  // Blocks until stop() took effect and every request thread ended.
  void wait();

  DoorCounts counts() const;

  struct Impl;

 private:
  explicit HttpServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera::serve
