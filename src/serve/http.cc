#include "serve/http.h"

#include <chrono>
#include <exception>

#include <fmt/format.h>
#include <httplib.h>

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

std::optional<ApiError> check_api_key(const std::string& key, const std::string& authorization) {
  if (key.empty()) return std::nullopt;
  const std::string want = "Bearer " + key;
  unsigned diff = authorization.size() != want.size();
  for (size_t i = 0; i < want.size(); i++)
    diff |= static_cast<unsigned>(want[i] ^ (i < authorization.size() ? authorization[i] : 0));
  if (diff == 0) return std::nullopt;
  return api_error(401,
                   authorization.empty() ? "no API key: send the header 'Authorization: Bearer KEY'"
                                         : "the API key is wrong",
                   "invalid_request_error", "", "invalid_api_key");
}

void write_error(httplib::Response& res, const ApiError& e) {
  res.status = e.http;
  if (e.http == 429 || e.http == 503) res.set_header("Retry-After", "1");
  res.set_content(e.body().dump(-1, ' ', false, nlohmann::json::error_handler_t::replace), "application/json");
}

std::shared_ptr<void> InFlight::enter(int limit) {
  std::lock_guard<std::mutex> lock(mu_);
  if (limit > 0 && count_ >= limit) return nullptr;
  count_++;
  if (on_change_) on_change_(count_);
  return std::shared_ptr<void>(this, [](InFlight* f) { f->leave(); });
}

void InFlight::leave() {
  std::lock_guard<std::mutex> lock(mu_);
  count_--;
  if (on_change_) on_change_(count_);
  if (count_ == 0) idle_.notify_all();
}

int InFlight::count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return count_;
}

bool InFlight::wait_idle(double timeout_s) {
  std::unique_lock<std::mutex> lock(mu_);
  return idle_.wait_for(lock, std::chrono::duration<double>(timeout_s), [&] { return count_ == 0; });
}

void configure_http(httplib::Server& s, const HttpOptions& opts, const ErrorSender& send_error,
                    std::function<void(const std::string& path)> pre_route) {
  s.set_payload_max_length(opts.max_body_bytes);
  // A response's writes each wait at most this for the client to read
  // (reading is the front end's: http_server.h).
  s.set_write_timeout(10, 0);

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

}  // namespace tessera::serve
