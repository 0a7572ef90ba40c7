// What `tessera serve` (server.h) and `tessera route` (router.h) set up the
// same way on their cpp-httplib servers: threads, timeouts, socket options,
// refusing bodies that cannot be bounded, OpenAI-shaped errors for what
// cpp-httplib answers itself, and binding.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <thread>

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

// A plain cpp-httplib server, or with TLS an OpenSSL one (SSLServer). One
// line naming the flag for a key without a certificate (or the reverse), a
// file that is not a readable regular file, or a certificate and key
// OpenSSL will not use (not PEM, or not a pair).
Result<std::unique_ptr<httplib::Server>> make_http_server(const TlsOptions& tls);

struct HttpOptions {
  int threads = 8;
  size_t max_body_bytes = 1 << 20;
};

// Writes an error answer (and counts it). Called from any request thread.
using ErrorSender = std::function<void(httplib::Response&, const ApiError&)>;

// Limits, timeouts, TCP_NODELAY, SO_REUSEADDR without SO_REUSEPORT,
// the pre-routing refusals (411, 415) and the error and exception handlers.
// `pre_route` (may be empty) runs after the refusals for every request.
void configure_http(httplib::Server& s, const HttpOptions& opts, const ErrorSender& send_error,
                    std::function<void(const std::string& path)> pre_route = {});

// Binds host:port (0: any free port) and returns the port; Unavailable
// naming the address otherwise.
Result<int> bind_http(httplib::Server& s, const std::string& host, int port);

// Starts `threads` request threads, then runs s.listen_after_bind() on a
// new thread and returns it once it listens; ResourceExhausted when the
// threads cannot be made (nothing is left running then).
Result<std::thread> listen_http(httplib::Server& s, int threads);

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

}  // namespace tessera::serve
