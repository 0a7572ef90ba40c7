#include "serve/http.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <system_error>
#include <vector>

#include <fmt/format.h>
#include <httplib.h>

#include "io/file.h"

namespace tessera::serve {

ApiError api_error(int http, std::string message, std::string type, std::string param, std::string code) {
  ApiError e;
  e.http = http;
  e.message = std::move(message);
  e.type = std::move(type);
  e.param = std::move(param);
  e.code = std::move(code);
  return e;
}

void configure_http(httplib::Server& s, const HttpOptions& opts, const ErrorSender& send_error,
                    std::function<void(const std::string& path)> pre_route) {
  s.set_payload_max_length(opts.max_body_bytes);
  s.set_read_timeout(10, 0);
  s.set_write_timeout(10, 0);
  s.set_keep_alive_timeout(5);
  // Each SSE chunk is one small write: without this, Nagle holds it until the
  // client's delayed ACK (40 ms on Linux).
  s.set_tcp_nodelay(true);
  // SO_REUSEADDR (a restarted server rebinds at once) but not cpp-httplib's
  // default SO_REUSEPORT, with which a second server on the same port would
  // bind too and share the connections instead of being refused.
  s.set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });

  // Before any body is read: cpp-httplib enforces the body limit only on a
  // Content-Length and would inflate a compressed body past it, so a POST
  // must say its length, and neither transfer nor content encodings are
  // taken (HTTP/1.1 clients send JSON with Content-Length).
  s.set_pre_routing_handler([send_error, pre_route](const httplib::Request& req, httplib::Response& res) {
    const auto refuse = [&](int status, std::string message) {
      send_error(res, api_error(status, std::move(message)));
      res.set_header("Connection", "close");
      return httplib::Server::HandlerResponse::Handled;
    };
    if (req.has_header("Transfer-Encoding"))
      return refuse(411, "chunked or encoded request bodies are not taken: send the body with Content-Length");
    const std::string ce = req.get_header_value("Content-Encoding");
    if (!ce.empty() && ce != "identity")
      return refuse(415, fmt::format("Content-Encoding '{}' is not taken: send the body uncompressed", ce));
    if (req.method == "POST" && !req.has_header("Content-Length"))
      return refuse(411, "a POST needs a Content-Length header");
    if (pre_route) pre_route(req.path);
    return httplib::Server::HandlerResponse::Unhandled;
  });
  // Errors cpp-httplib answers itself (no route, body too large, bad
  // request line) get OpenAI's error shape too.
  const size_t max_body = opts.max_body_bytes;
  s.set_error_handler(httplib::Server::HandlerWithResponse(
      [send_error, max_body](const httplib::Request& req, httplib::Response& res) {
        if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
        ApiError e;
        e.http = res.status;
        switch (res.status) {
          case 404: e.message = fmt::format("no such endpoint: {} {}", req.method, req.path); break;
          case 413: e.message = fmt::format("the request body is larger than the {} bytes allowed", max_body); break;
          default: e.message = fmt::format("HTTP {}", res.status); break;
        }
        send_error(res, e);
        return httplib::Server::HandlerResponse::Handled;
      }));
  s.set_exception_handler([send_error](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "unknown exception";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    send_error(res, api_error(500, fmt::format("internal error: {}", what), "server_error"));
  });
}

bool SseReader::feed(const char* data, size_t n, const std::function<bool(std::string_view payload)>& on_data) {
  buf_.append(data, n);
  size_t start = 0;
  bool go_on = true;
  for (size_t nl; go_on && (nl = buf_.find('\n', start)) != std::string::npos; start = nl + 1) {
    std::string_view line(buf_.data() + start, nl - start);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.substr(0, 5) != "data:") continue;
    std::string_view payload = line.substr(5);
    if (!payload.empty() && payload.front() == ' ') payload.remove_prefix(1);
    go_on = on_data(payload);
  }
  buf_.erase(0, start);
  return go_on;
}

Result<std::unique_ptr<httplib::Server>> make_http_server(const TlsOptions& tls) {
  if (!tls.enabled()) return std::make_unique<httplib::Server>();
  if (tls.cert.empty() || tls.key.empty())
    return Status::InvalidArgument(tls.cert.empty() ? "--tls-key and --tls-client-ca need --tls-cert"
                                                    : "--tls-cert needs --tls-key (its private key, PEM)");
  for (const auto& [flag, path] : {std::pair<const char*, const std::string&>{"--tls-cert", tls.cert},
                                   {"--tls-key", tls.key}, {"--tls-client-ca", tls.client_ca}}) {
    if (path.empty()) continue;
    if (Status st = io::check_regular_file(path); !st.ok())
      return Status::InvalidArgument(fmt::format("{} {}", flag, st.message()));
    if (::access(path.c_str(), R_OK) != 0)
      return Status::InvalidArgument(fmt::format("{} {}: cannot read: {}", flag, path, std::strerror(errno)));
  }
  auto s = std::make_unique<httplib::SSLServer>(tls.cert.c_str(), tls.key.c_str(),
                                                tls.client_ca.empty() ? nullptr : tls.client_ca.c_str());
  if (!s->is_valid())
    return Status::InvalidArgument(fmt::format(
        "--tls-cert {} and --tls-key {}{}: OpenSSL cannot use them (not a PEM certificate and its private key, or "
        "they do not match{})",
        tls.cert, tls.key, tls.client_ca.empty() ? "" : " and --tls-client-ca " + tls.client_ca,
        tls.client_ca.empty() ? "" : ", or the CA file is not PEM"));
  return std::unique_ptr<httplib::Server>(std::move(s));
}

Result<int> bind_http(httplib::Server& s, const std::string& host, int port) {
  if (port == 0) {
    const int p = s.bind_to_any_port(host);
    if (p <= 0) return Status::Unavailable(fmt::format("cannot bind {} on any port", host));
    return p;
  }
  if (!s.bind_to_port(host, port))
    return Status::Unavailable(
        fmt::format("cannot listen on {}:{} (in use, or not an address of this machine)", host, port));
  return port;
}

namespace {

// The request threads, all made before the server listens. cpp-httplib's
// own ThreadPool makes them inside the listen thread, where a thread that
// cannot be made (an address-space limit: each reserves a stack) throws
// into std::terminate; here it is a Status for the caller. Past the threads
// a connection waits in the queue for one (docs/serving.md).
class RequestThreads : public httplib::TaskQueue {
 public:
  ~RequestThreads() override { shutdown(); }

  Status start(int n) {
    try {
      for (int i = 0; i < n; i++) threads_.emplace_back([this] { work(); });
    } catch (const std::system_error& e) {
      const size_t made = threads_.size();
      shutdown();
      return Status::ResourceExhausted(
          fmt::format("cannot start {} HTTP request threads ({} started): {}", n, made, e.what()));
    }
    return Status::OK();
  }

  void enqueue(std::function<void()> fn) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      jobs_.push_back(std::move(fn));
    }
    cv_.notify_one();
  }

  void shutdown() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    for (std::thread& t : threads_)
      if (t.joinable()) t.join();
    threads_.clear();
  }

 private:
  void work() {
    for (;;) {
      std::function<void()> fn;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return stopping_ || !jobs_.empty(); });
        if (jobs_.empty()) return;  // stopping, and nothing left to run
        fn = std::move(jobs_.front());
        jobs_.pop_front();
      }
      fn();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace

Result<std::thread> listen_http(httplib::Server& s, int threads) {
  auto pool = std::make_unique<RequestThreads>();
  RETURN_IF_ERROR(pool->start(std::max(threads, 1)));
  // cpp-httplib asks for its queue once per listen and deletes it after.
  RequestThreads* handed = pool.get();
  s.new_task_queue = [handed] { return handed; };
  std::thread t;
  try {
    t = std::thread([&s] { s.listen_after_bind(); });
  } catch (const std::system_error& e) {
    s.new_task_queue = nullptr;  // the pool goes with `pool`
    return Status::ResourceExhausted(fmt::format("cannot start the HTTP listener thread: {}", e.what()));
  }
  pool.release();  // the listen loop owns it now
  // cpp-httplib's stop() does nothing before the listen loop runs: wait for
  // it, so that a shutdown right after the start is not lost.
  for (int i = 0; i < 10000 && !s.is_running(); i++) std::this_thread::sleep_for(std::chrono::microseconds(100));
  return t;
}

}  // namespace tessera::serve
