// What the router's tests (route_policy_test.cc, router_test.cc) share to
// play `tessera serve` workers: an HTTP server on a free loopback port that
// runs on its own thread while the object lives, and the error answers a
// worker gives, with the status and OpenAI-shaped body a real one sends.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <thread>

#include <httplib.h>

namespace tessera::serve::fake {

// The server's routes are set up by `routes` before it listens; GET /health
// answers 200 with the model "fake-model" (so a pool takes the worker in).
class LoopbackServer {
 public:
  explicit LoopbackServer(const std::function<void(httplib::Server&)>& routes) {
    server_.Get("/health", [](const httplib::Request&, httplib::Response& res) {
      res.set_content(R"({"status":"ok","model":"fake-model"})", "application/json");
    });
    routes(server_);
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    while (!server_.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ~LoopbackServer() {
    server_.stop();
    thread_.join();
  }
  LoopbackServer(const LoopbackServer&) = delete;
  LoopbackServer& operator=(const LoopbackServer&) = delete;
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }

 private:
  httplib::Server server_;
  int port_ = 0;
  std::thread thread_;
};

// A worker's error answers: the engine failed (500), a device error (500, the
// message the router labels "device_error"), full (429, "queue_full"), the
// client's error (400).
inline void server_error(httplib::Response& res) {
  res.status = 500;
  res.set_content(R"({"error":{"message":"the engine failed"}})", "application/json");
}
inline void device_error(httplib::Response& res) {
  res.status = 500;
  res.set_content(R"({"error":{"message":"device error: Xid 79"}})", "application/json");
}
inline void full(httplib::Response& res) {
  res.status = 429;
  res.set_content(R"({"error":{"message":"full","code":"queue_full"}})", "application/json");
}
inline void client_error(httplib::Response& res) {
  res.status = 400;
  res.set_content(R"({"error":{"message":"'max_tokens' must be positive"}})", "application/json");
}

}  // namespace tessera::serve::fake
