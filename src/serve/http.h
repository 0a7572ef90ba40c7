// What `tessera serve` (server.h), `tessera route` (router.h) and the
// dashboard set up the same way on their HTTP servers (http_server.h): TLS
// and connection limits, refusing bodies that cannot be bounded, and
// OpenAI-shaped errors for what cpp-httplib answers itself.
#pragma once

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include "core/status.h"
#include "serve/openai.h"

namespace httplib {
class Server;
struct Response;
}  // namespace httplib

namespace tessera::serve {

// TLS for a server (--tls-cert, --tls-key, --tls-client-ca): all empty is
// plain HTTP. client_ca: PEM file of the CAs whose client certificates are
// accepted; set, a client without such a certificate is refused in the
// handshake.
struct TlsOptions {
  std::string cert, key, client_ca;
  bool enabled() const { return !cert.empty() || !key.empty() || !client_ca.empty(); }
  const char* scheme() const { return enabled() ? "https" : "http"; }
};

// What a client may take (docs/serving.md, "Slow and many clients").
struct DoorLimits {
  // From a connection's accept (its TLS handshake included), or from a
  // keep-alive request's first byte, to the blank line ending its headers.
  double header_timeout_s = 5;
  // A body of N bytes must be in header_timeout_s + N / body_min_rate after
  // its headers.
  double body_min_rate = 64 * 1024;
  // A keep-alive connection that starts no request is closed after this.
  double idle_timeout_s = 5;
  int max_connections = 4096;  // open at once, all clients (fast 503 beyond)
  int max_per_client = 256;    // open at once from one address
  // Bodies held while they arrive, all connections together; a request
  // whose Content-Length does not fit gets a 503.
  size_t max_buffered_bytes = size_t{256} << 20;
  int max_requests_per_connection = 1000;  // then "Connection: close"
  size_t max_header_bytes = 16 << 10;      // request line and headers (431 beyond)
};

struct HttpOptions {
  int threads = 8;
  size_t max_body_bytes = 1 << 20;
  DoorLimits door;
};

// Writes an error answer (and counts it). Called from any request thread.
using ErrorSender = std::function<void(httplib::Response&, const ApiError&)>;

// The body limit, the write timeout, the pre-routing refusals (411, 415)
// and the error and exception handlers.
// `pre_route` (may be empty) runs after the refusals for every request.
void configure_http(httplib::Server& s, const HttpOptions& opts, const ErrorSender& send_error,
                    std::function<void(const std::string& path)> pre_route = {});

// Work in flight at a front end (requests, streams still being written) and
// the wait for it to end that a drain at shutdown makes; what `tessera serve`
// and `tessera route` both count. Thread safe.
class InFlight {
 public:
  // One more, unless `limit` (> 0) are in flight already: then null. The
  // token counts it until its last copy is destroyed.
  std::shared_ptr<void> enter(int limit = 0);
  int count() const;
  // Waits up to timeout_s for none to be in flight; whether none are.
  bool wait_idle(double timeout_s);
  // Called (under the lock) with the new count on every change: a gauge.
  void on_change(std::function<void(int)> f) { on_change_ = std::move(f); }

 private:
  void leave();
  mutable std::mutex mu_;
  std::condition_variable idle_;
  int count_ = 0;
  std::function<void(int)> on_change_;
};

// Server-sent events as bytes arrive: calls on_data with each "data:" line's
// payload (without "data:" and one leading space). Works on lines, so "\n"
// and "\r\n" endings and events split across reads are the same; other
// lines (comments, event:, id:, blanks) are skipped. on_data returns false to
// stop: feed() then returns false too.
class SseReader {
 public:
  bool feed(const char* data, size_t n, const std::function<bool(std::string_view payload)>& on_data);

 private:
  std::string buf_;
};

ApiError api_error(int http, std::string message, std::string type = "invalid_request_error",
                   std::string param = "", std::string code = "");

// The API key check of both front ends: nothing when `key` is empty or the
// Authorization header is "Bearer KEY" (compared in constant time in the
// key's length), else the 401 to send.
std::optional<ApiError> check_api_key(const std::string& key, const std::string& authorization);

// An error answer as both front ends write it: the status, Retry-After: 1 on
// a 429 or 503 (the client may try again soon), the OpenAI-shaped JSON body.
void write_error(httplib::Response& res, const ApiError& e);

}  // namespace tessera::serve
