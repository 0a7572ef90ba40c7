// The HTTP front end (serve/http_server.h) with real sockets on loopback:
// keep-alive and pipelining, deadlines on headers, bodies and idle
// connections, the connection caps, Expect: 100-continue, streamed
// answers, TLS, and a stop with connections open. Slow clients must never
// hold the request threads: each test that trickles runs with one thread.
#include "serve/http_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <httplib.h>

#include "obs/metrics.h"
#include "serve/http.h"

namespace tessera::serve {
namespace {

using Clock = std::chrono::steady_clock;

// A raw client socket, for what a well-behaved client library will not do.
class Raw {
 public:
  explicit Raw(int port, const char* from = "127.0.0.1") {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in src{};
    src.sin_family = AF_INET;
    inet_pton(AF_INET, from, &src.sin_addr);
    ::bind(fd_, reinterpret_cast<sockaddr*>(&src), sizeof(src));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    ok_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  }
  ~Raw() {
    if (fd_ >= 0) ::close(fd_);
  }
  bool ok() const { return ok_; }
  bool send(const std::string& s) { return ::send(fd_, s.data(), s.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(s.size()); }
  // Everything that arrives until `until` is in it, the peer closes, or
  // `timeout` passes.
  std::string read(const std::string& until, double timeout_s = 5) {
    const auto end = Clock::now() + std::chrono::duration<double>(timeout_s);
    while (got_.find(until) == std::string::npos && Clock::now() < end) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 20) <= 0) continue;
      char buf[4096];
      const ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
      if (n <= 0) {
        closed_ = true;
        break;
      }
      got_.append(buf, static_cast<size_t>(n));
    }
    return got_;
  }
  // Whether the server closed the connection within `timeout_s`.
  bool closed_within(double timeout_s) {
    read("\x01never\x02", timeout_s);
    return closed_;
  }
  void clear() { got_.clear(); }

 private:
  int fd_ = -1;
  bool ok_ = false;
  bool closed_ = false;
  std::string got_;
};

struct Fixture {
  obs::Registry registry;  // outlives the server, which counts into it
  std::unique_ptr<HttpServer> http;
  int port = 0;

  explicit Fixture(DoorLimits limits, int threads = 1, TlsOptions tls = {}) {
    auto made = HttpServer::make(tls);
    EXPECT_TRUE(made.ok()) << made.status().message();
    http = std::move(*made);
    HttpOptions ho;
    ho.threads = threads;
    ho.max_body_bytes = 1 << 16;
    ho.door = limits;
    configure_http(http->routes(), ho, [](httplib::Response& res, const ApiError& e) {
      res.status = e.http;
      res.set_content(e.body().dump(), "application/json");
    });
    http->routes().Get("/ping", [](const httplib::Request& req, httplib::Response& res) {
      res.set_content("pong from " + req.remote_addr, "text/plain");
    });
    http->routes().Post("/echo", [](const httplib::Request& req, httplib::Response& res) {
      res.set_content(std::to_string(req.body.size()) + ":" + req.body, "text/plain");
    });
    http->routes().Get("/stream", [](const httplib::Request&, httplib::Response& res) {
      res.set_chunked_content_provider("text/event-stream", [](size_t, httplib::DataSink& sink) {
        for (int i = 0; i < 3; i++) {
          const std::string ev = "data: " + std::to_string(i) + "\n\n";
          if (!sink.write(ev.data(), ev.size())) return false;
        }
        sink.done();
        return true;
      });
    });
    auto port_or = http->bind("127.0.0.1", 0);
    EXPECT_TRUE(port_or.ok());
    port = *port_or;
    EXPECT_TRUE(http->start(ho, &registry).ok());
  }
};

DoorLimits fast_limits() {
  DoorLimits l;
  l.header_timeout_s = 0.5;
  l.idle_timeout_s = 0.5;
  return l;
}

TEST(HttpFrontEnd, KeepAliveAndPipelinedRequestsOnOneConnection) {
  Fixture f(DoorLimits{});
  Raw c(f.port);
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE(c.send("GET /ping HTTP/1.1\r\nHost: x\r\n\r\n"));
  EXPECT_NE(c.read("pong from 127.0.0.1").find("pong from 127.0.0.1"), std::string::npos);
  c.clear();
  // Two requests in one write, the second with a body: two answers, in order.
  ASSERT_TRUE(c.send("GET /ping HTTP/1.1\r\nHost: x\r\n\r\nPOST /echo HTTP/1.1\r\nHost: x\r\n"
                     "Content-Type: text/plain\r\nContent-Length: 5\r\n\r\nhello"));
  const std::string both = c.read("5:hello");
  const size_t pong = both.find("pong"), echo = both.find("5:hello");
  ASSERT_NE(pong, std::string::npos) << both;
  ASSERT_NE(echo, std::string::npos) << both;
  EXPECT_LT(pong, echo);
  EXPECT_EQ(f.http->counts().open, 1);
}

TEST(HttpFrontEnd, SlowHeadersHoldNoThreadAndAreClosedAtTheDeadline) {
  Fixture f(fast_limits(), /*threads=*/1);
  std::vector<std::unique_ptr<Raw>> slow;
  for (int i = 0; i < 40; i++) {
    slow.push_back(std::make_unique<Raw>(f.port, "127.0.0.2"));
    ASSERT_TRUE(slow.back()->send("GET /ping HTTP/1.1\r\nHost: x\r\n"));  // and never the blank line
  }
  // The one request thread is free: a whole request is answered at once.
  httplib::Client ok("127.0.0.1", f.port);
  const auto t0 = Clock::now();
  auto r = ok.Get("/ping");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 0.4);
  EXPECT_GE(f.http->counts().open, 40);  // the slow ones, all still open
  for (auto& s : slow) {
    const std::string got = s->read("\r\n\r\n{", 3);
    EXPECT_NE(got.find("HTTP/1.1 408"), std::string::npos) << got;
    EXPECT_NE(got.find("did not arrive within 0.5 s"), std::string::npos) << got;
    EXPECT_TRUE(s->closed_within(2));
  }
  EXPECT_EQ(f.http->counts().read_timeouts, 40);
  const std::string metrics = f.registry.render_prometheus();
  EXPECT_NE(metrics.find("tessera_http_read_timeouts_total{phase=\"headers\"} 40"), std::string::npos) << metrics;
}

TEST(HttpFrontEnd, ATrickleDoesNotRestartTheHeaderDeadline) {
  Fixture f(fast_limits());
  Raw c(f.port);
  ASSERT_TRUE(c.send("GET /ping HTTP/1.1\r\n"));
  const auto t0 = Clock::now();
  bool closed = false;
  for (int i = 0; i < 30 && !closed; i++) {  // a header byte every 100 ms, for up to 3 s
    c.send("X");
    closed = c.closed_within(0.1);
  }
  EXPECT_TRUE(closed);
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 1.5);
}

TEST(HttpFrontEnd, ASlowBodyIsClosedAtItsDeadline) {
  DoorLimits l = fast_limits();
  l.body_min_rate = 1000;  // 100 bytes: 0.5 + 0.1 s
  Fixture f(l);
  Raw c(f.port);
  ASSERT_TRUE(c.send("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n0123456789"));
  const std::string got = c.read("\r\n\r\n{", 3);
  EXPECT_NE(got.find("HTTP/1.1 408"), std::string::npos) << got;
  EXPECT_NE(got.find("request body did not arrive in time"), std::string::npos) << got;
  EXPECT_TRUE(c.closed_within(1));
}

TEST(HttpFrontEnd, IdleKeepAliveConnectionsAreClosed) {
  Fixture f(fast_limits());
  Raw c(f.port);
  ASSERT_TRUE(c.send("GET /ping HTTP/1.1\r\nHost: x\r\n\r\n"));
  EXPECT_NE(c.read("pong").find("pong"), std::string::npos);
  EXPECT_TRUE(c.closed_within(2));
  EXPECT_EQ(f.http->counts().idle_closed, 1);
  EXPECT_EQ(f.http->counts().read_timeouts, 0);
}

TEST(HttpFrontEnd, ConnectionsPastTheCapsGetAFast503) {
  DoorLimits l;
  l.max_per_client = 3;
  l.max_connections = 5;
  Fixture f(l);
  std::vector<std::unique_ptr<Raw>> held;
  for (int i = 0; i < 3; i++) held.push_back(std::make_unique<Raw>(f.port, "127.0.0.3"));
  Raw fourth(f.port, "127.0.0.3");
  std::string got = fourth.read("\r\n\r\n{");
  EXPECT_NE(got.find("HTTP/1.1 503"), std::string::npos) << got;
  EXPECT_NE(got.find("too many connections from 127.0.0.3"), std::string::npos) << got;
  EXPECT_TRUE(fourth.closed_within(1));
  // Another address still gets in, up to the total.
  for (int i = 0; i < 2; i++) held.push_back(std::make_unique<Raw>(f.port, "127.0.0.4"));
  Raw sixth(f.port, "127.0.0.5");
  got = sixth.read("\r\n\r\n{");
  EXPECT_NE(got.find("too many connections (more than 5 open)"), std::string::npos) << got;
  EXPECT_EQ(f.http->counts().refused, 2);
  // The held ones work.
  ASSERT_TRUE(held[0]->send("GET /ping HTTP/1.1\r\nHost: x\r\n\r\n"));
  EXPECT_NE(held[0]->read("pong").find("pong"), std::string::npos);
}

TEST(HttpFrontEnd, ExpectContinueBodiesAndTheirRefusals) {
  Fixture f(DoorLimits{});
  Raw c(f.port);
  ASSERT_TRUE(c.send("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nExpect: 100-continue\r\n\r\n"));
  EXPECT_NE(c.read("100 Continue\r\n\r\n").find("HTTP/1.1 100 Continue\r\n\r\n"), std::string::npos);
  ASSERT_TRUE(c.send("abc"));
  const std::string got = c.read("3:abc");
  EXPECT_NE(got.find("3:abc"), std::string::npos) << got;
  EXPECT_EQ(got.find("100 Continue", 30), std::string::npos) << "one 100 only: " << got;

  // Larger than the body limit: 413 from the headers, and closed.
  Raw big(f.port);
  ASSERT_TRUE(big.send("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 100000000\r\n\r\n"));
  EXPECT_NE(big.read("\r\n\r\n").find("HTTP/1.1 413"), std::string::npos);
  EXPECT_TRUE(big.closed_within(2));
  // Chunked bodies are refused (411), and closed.
  Raw chunked(f.port);
  ASSERT_TRUE(chunked.send("POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"));
  EXPECT_NE(chunked.read("\r\n\r\n").find("HTTP/1.1 411"), std::string::npos);
  EXPECT_TRUE(chunked.closed_within(2));
  // Two Content-Lengths that disagree: 400.
  Raw two(f.port);
  ASSERT_TRUE(two.send("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd"));
  EXPECT_NE(two.read("\r\n\r\n").find("HTTP/1.1 400"), std::string::npos);
  // Headers past the limit: 431.
  Raw huge(f.port);
  ASSERT_TRUE(huge.send("GET /ping HTTP/1.1\r\nX-Big: " + std::string(20000, 'a') + "\r\n\r\n"));
  EXPECT_NE(huge.read("\r\n\r\n").find("HTTP/1.1 431"), std::string::npos);
}

TEST(HttpFrontEnd, StreamedAnswersAndAClientLibrary) {
  Fixture f(DoorLimits{}, 4);
  httplib::Client c("127.0.0.1", f.port);
  std::string events;
  auto r = c.Get("/stream", [&](const char* data, size_t n) {
    events.append(data, n);
    return true;
  });
  ASSERT_TRUE(r) << httplib::to_string(r.error()) << " after " << events;
  EXPECT_EQ(events, "data: 0\n\ndata: 1\n\ndata: 2\n\n");
  for (int i = 0; i < 20; i++) {
    auto e = c.Post("/echo", std::string(1000 + i, 'z'), "text/plain");
    ASSERT_TRUE(e);
    EXPECT_EQ(e->body.substr(0, e->body.find(':')), std::to_string(1000 + i));
  }
  auto missing = c.Get("/nope");
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->status, 404);
}

TEST(HttpFrontEnd, StopClosesWaitingConnectionsAndEndsPromptly) {
  Fixture f(DoorLimits{}, 2);
  std::vector<std::unique_ptr<Raw>> idle;
  for (int i = 0; i < 10; i++) {
    idle.push_back(std::make_unique<Raw>(f.port));
    idle.back()->send("GET /pi");
  }
  Raw served(f.port);
  served.send("GET /ping HTTP/1.1\r\nHost: x\r\n\r\n");
  served.read("pong");
  const auto t0 = Clock::now();
  f.http->stop();
  f.http->wait();
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 1.0);
  for (auto& c : idle) EXPECT_TRUE(c->closed_within(1));
  EXPECT_EQ(f.http->counts().open, 0);
}

TEST(HttpFrontEnd, TlsAndASlowHandshake) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("tessera_tls_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const std::string cert = (dir / "cert.pem").string(), key = (dir / "key.pem").string();
  const std::string cmd = "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=localhost -keyout " + key +
                          " -out " + cert + " >/dev/null 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  TlsOptions tls;
  tls.cert = cert;
  tls.key = key;
  Fixture f(fast_limits(), 1, tls);
  Raw slow(f.port);  // connects, never says hello
  httplib::SSLClient c("127.0.0.1", f.port);
  c.enable_server_certificate_verification(false);
  auto r = c.Get("/ping");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->body, "pong from 127.0.0.1");
  auto e = c.Post("/echo", "over tls", "text/plain");
  ASSERT_TRUE(e);
  EXPECT_EQ(e->body, "8:over tls");
  EXPECT_TRUE(slow.closed_within(2));
  EXPECT_GE(f.http->counts().read_timeouts, 1);
  // Plain HTTP to the TLS port: no answer, closed.
  Raw plain(f.port);
  plain.send("GET /ping HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_TRUE(plain.closed_within(2));

  TlsOptions wrong;
  wrong.cert = cert;
  wrong.key = cert;  // not a key
  auto bad = HttpServer::make(wrong);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("OpenSSL cannot use them"), std::string::npos);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tessera::serve
