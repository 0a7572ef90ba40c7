#include "serve/http_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <system_error>
#include <thread>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>
#include <httplib.h>
#include <openssl/err.h>
#include <openssl/ssl.h>

#include "io/file.h"
#include "obs/metrics.h"

namespace tessera::serve {

namespace {

using Clock = std::chrono::steady_clock;

// A task queue with no threads: cpp-httplib's own listen loop (below) never
// accepts a connection, so it never has a task.
class NoTasks final : public httplib::TaskQueue {
 public:
  void enqueue(std::function<void()> fn) override { fn(); }
  void shutdown() override {}
};

// cpp-httplib's request handling (protected in httplib::Server) over any
// stream: here the buffered request and the connection's socket.
class Routes final : public httplib::Server {
 public:
  ~Routes() override { end_loop(); }

  bool serve(httplib::Stream& strm, bool close_connection, bool& connection_closed) {
    return process_request(strm, close_connection, connection_closed, [](httplib::Request&) {});
  }
  int write_timeout_ms() const {
    return static_cast<int>(write_timeout_sec_ * 1000 + write_timeout_usec_ / 1000);
  }
  size_t max_body() const { return payload_max_length_; }

  // cpp-httplib writes a chunked answer (server-sent events) only while
  // is_running(), which is true inside its listen loop alone. The loop runs
  // here over the read end of a pipe, which never has a connection (the
  // front end accepts them) and is written once to end it.
  Status start_loop() {
    if (::pipe2(wake_, O_CLOEXEC) != 0)
      return Status::ResourceExhausted(fmt::format("cannot start the HTTP front end: pipe: {}", std::strerror(errno)));
    svr_sock_ = wake_[0];
    set_idle_interval(3600, 0);  // waits on the pipe, never in accept()
    new_task_queue = [] { return new NoTasks; };
    try {
      loop_ = std::thread([this] { listen_after_bind(); });
    } catch (const std::system_error& e) {
      return Status::ResourceExhausted(fmt::format("cannot start the HTTP front end: {}", e.what()));
    }
    for (int i = 0; i < 10000 && !is_running(); i++) std::this_thread::sleep_for(std::chrono::microseconds(100));
    return Status::OK();
  }
  // Ends the loop: is_running() is false after, so chunked answers still
  // being written end at their next chunk (as cpp-httplib's stop()).
  void end_loop() {
    std::lock_guard<std::mutex> lock(loop_mu_);
    if (!loop_.joinable()) return;
    const char byte = 0;
    [[maybe_unused]] ssize_t w = ::write(wake_[1], &byte, 1);  // accept() on a pipe fails: the loop ends
    loop_.join();
    ::close(wake_[1]);  // the loop closed the read end
  }

 private:
  int wake_[2] = {-1, -1};
  std::mutex loop_mu_;
  std::thread loop_;
};

void peer_of(int fd, bool remote, std::string* ip, int* port) {
  sockaddr_storage a{};
  socklen_t len = sizeof(a);
  const int rc = remote ? getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len)
                        : getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ip->clear();
  *port = 0;
  if (rc != 0) return;
  char buf[INET6_ADDRSTRLEN] = {};
  if (a.ss_family == AF_INET) {
    const auto* s = reinterpret_cast<const sockaddr_in*>(&a);
    inet_ntop(AF_INET, &s->sin_addr, buf, sizeof(buf));
    *port = ntohs(s->sin_port);
  } else if (a.ss_family == AF_INET6) {
    const auto* s = reinterpret_cast<const sockaddr_in6*>(&a);
    inet_ntop(AF_INET6, &s->sin6_addr, buf, sizeof(buf));
    *port = ntohs(s->sin6_port);
  }
  *ip = buf;
}

bool iequals(std::string_view a, std::string_view b) {
  return a.size() == b.size() &&
         std::equal(a.begin(), a.end(), b.begin(), [](unsigned char x, unsigned char y) { return std::tolower(x) == std::tolower(y); });
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

// A connection. The connection thread owns it while it is idle or its
// request arrives (kHandshake, kIdle, kReading); a request thread while its
// request runs (kBusy).
struct Conn {
  enum State { kHandshake, kIdle, kReading, kBusy };
  int fd = -1;
  SSL* ssl = nullptr;
  State state = kIdle;
  std::string peer_ip, local_ip;
  int peer_port = 0, local_port = 0;
  std::string in;          // received, not yet used by a request
  size_t scanned = 0;      // bytes of `in` searched for the end of the headers
  size_t need = 0;         // the request's bytes (headers and body); 0: headers not complete
  size_t reserved = 0;     // its body's share of max_buffered_bytes
  bool close_after = false;
  bool in_body = false;    // headers complete, body arriving
  bool keep = false;       // set by the request thread: serve the next request
  int requests = 0;
  uint32_t events = 0;     // what epoll watches
  Clock::time_point deadline;
};

// What cpp-httplib reads and writes for one request: reads come from the
// buffered request (end of stream past it: the connection thread framed it
// whole), writes go to the socket, each within the write timeout.
class ConnStream final : public httplib::Stream {
 public:
  ConnStream(Conn& c, int write_timeout_ms) : c_(c), write_timeout_ms_(write_timeout_ms) {}

  bool is_readable() const override { return pos_ < c_.need; }
  bool is_writable() const override { return wait_for(POLLOUT); }

  ssize_t read(char* ptr, size_t size) override {
    const size_t n = std::min(size, c_.need - pos_);
    std::memcpy(ptr, c_.in.data() + pos_, n);
    pos_ += n;
    return static_cast<ssize_t>(n);
  }

  ssize_t write(const char* ptr, size_t size) override {
    size_t done = 0;
    while (done < size) {
      if (c_.ssl) {
        ERR_clear_error();
        const int n = SSL_write(c_.ssl, ptr + done, static_cast<int>(std::min<size_t>(size - done, 1 << 30)));
        if (n > 0) {
          done += static_cast<size_t>(n);
          continue;
        }
        const int e = SSL_get_error(c_.ssl, n);
        if (e == SSL_ERROR_WANT_WRITE ? wait_for(POLLOUT) : e == SSL_ERROR_WANT_READ ? wait_for(POLLIN) : false)
          continue;
        return -1;
      }
      const ssize_t n = ::send(c_.fd, ptr + done, size - done, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) {
        done += static_cast<size_t>(n);
      } else if (n < 0 && errno == EINTR) {
        continue;
      } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        if (!wait_for(POLLOUT)) return -1;
      } else {
        return -1;
      }
    }
    return static_cast<ssize_t>(size);
  }

  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    ip = c_.peer_ip;
    port = c_.peer_port;
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    ip = c_.local_ip;
    port = c_.local_port;
  }
  socket_t socket() const override { return c_.fd; }

 private:
  // As cpp-httplib's own socket stream: ready (or in error, which the write
  // then reports) within the write timeout.
  bool wait_for(short what) const {
    pollfd p{c_.fd, what, 0};
    for (;;) {
      const int rc = ::poll(&p, 1, write_timeout_ms_);
      if (rc < 0 && errno == EINTR) continue;
      return rc > 0;
    }
  }

  Conn& c_;
  int write_timeout_ms_;
  size_t pos_ = 0;
};

}  // namespace

struct HttpServer::Impl {
  Routes routes;
  SSL_CTX* ctx = nullptr;
  DoorLimits limits;
  int listen_fd = -1, epoll_fd = -1, wake_fd = -1;
  bool accept_paused = false;  // the connection thread's

  // Owned by the connection thread (and by wait() once every thread ended).
  std::unordered_map<int, std::unique_ptr<Conn>> conns;
  std::unordered_map<std::string, int> per_client;

  // Requests ready to run, and connections their request threads gave back.
  std::mutex mu;
  std::condition_variable ready_cv;
  std::deque<Conn*> ready;
  std::deque<Conn*> returned;
  bool stopping = false;       // under mu
  bool threads_done = false;   // under mu
  std::atomic<bool> stop_flag{false};
  std::atomic<size_t> buffered{0};

  std::thread door;
  std::vector<std::thread> workers;
  std::mutex wait_mu;
  bool joined = false;

  std::atomic<long> n_open{0}, n_refused{0}, n_timeouts{0}, n_idle{0};
  obs::Gauge* g_open = nullptr;
  obs::Counter* c_refused_total = nullptr;
  obs::Counter* c_refused_client = nullptr;
  obs::Counter* c_refused_memory = nullptr;
  obs::Counter* c_timeout_handshake = nullptr;
  obs::Counter* c_timeout_header = nullptr;
  obs::Counter* c_timeout_body = nullptr;
  obs::Counter* c_idle = nullptr;

  ~Impl() {
    if (ctx) SSL_CTX_free(ctx);
    for (int fd : {listen_fd, epoll_fd, wake_fd})
      if (fd >= 0) ::close(fd);
  }

  static void count(obs::Counter* c) {
    if (c) c->add(1);
  }
  void set_open() {
    if (g_open) g_open->set(static_cast<double>(n_open.load()));
  }

  // ---- the connection thread ----

  void watch(Conn& c, uint32_t events) {
    if (c.events == events) return;
    epoll_event ev{};
    ev.events = events;
    ev.data.fd = c.fd;
    const int op = c.events == 0 ? EPOLL_CTL_ADD : events == 0 ? EPOLL_CTL_DEL : EPOLL_CTL_MOD;
    epoll_ctl(epoll_fd, op, c.fd, &ev);
    c.events = events;
  }

  void close_conn(Conn* c) {
    watch(*c, 0);
    if (c->ssl) {
      if (c->state != Conn::kHandshake) SSL_shutdown(c->ssl);  // best effort, non-blocking
      SSL_free(c->ssl);
    }
    ::shutdown(c->fd, SHUT_RDWR);
    ::close(c->fd);
    if (c->reserved) buffered -= c->reserved;
    if (--per_client[c->peer_ip] <= 0) per_client.erase(c->peer_ip);
    n_open--;
    set_open();
    conns.erase(c->fd);  // frees c
  }

  // A short answer the connection thread writes itself before closing
  // (503, 408, 431, 400): best effort, without blocking.
  void answer_and_close(Conn* c, int status, const char* reason, const std::string& message,
                        const char* type = "invalid_request_error") {
    const std::string body = api_error(status, message, type).body().dump();
    const std::string msg = fmt::format(
        "HTTP/1.1 {} {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n{}\r\n{}",
        status, reason, body.size(), status == 503 ? "Retry-After: 1\r\n" : "", body);
    if (c->ssl) {
      if (c->state != Conn::kHandshake) SSL_write(c->ssl, msg.data(), static_cast<int>(msg.size()));
    } else {
      [[maybe_unused]] ssize_t n = ::send(c->fd, msg.data(), msg.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    }
    close_conn(c);
  }

  void accept_all() {
    for (;;) {
      const int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR) continue;
        if (errno == EMFILE || errno == ENFILE) {
          // Out of descriptors: stop watching the socket (it would wake
          // this thread at once, again and again) until the next tick.
          epoll_ctl(epoll_fd, EPOLL_CTL_DEL, listen_fd, nullptr);
          accept_paused = true;
        }
        return;  // EAGAIN: all taken
      }
      auto c = std::make_unique<Conn>();
      c->fd = fd;
      peer_of(fd, true, &c->peer_ip, &c->peer_port);
      peer_of(fd, false, &c->local_ip, &c->local_port);
      int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      Conn* p = c.get();
      conns[fd] = std::move(c);
      per_client[p->peer_ip]++;
      n_open++;
      set_open();
      p->deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                       std::chrono::duration<double>(limits.header_timeout_s));
      p->state = Conn::kReading;  // the first request's deadline runs from the accept
      const bool over_total = n_open > limits.max_connections;
      if (over_total || per_client[p->peer_ip] > limits.max_per_client) {
        n_refused++;
        count(over_total ? c_refused_total : c_refused_client);
        if (ctx) {  // no handshake yet: nothing the client could read
          close_conn(p);
          continue;
        }
        answer_and_close(p, 503, "Service Unavailable",
                         over_total ? fmt::format("too many connections (more than {} open); retry later",
                                                  limits.max_connections)
                                    : fmt::format("too many connections from {} (more than {} open); retry later",
                                                  p->peer_ip, limits.max_per_client),
                         "server_error");
        continue;
      }
      if (ctx) {
        p->ssl = SSL_new(ctx);
        if (!p->ssl) {
          close_conn(p);
          continue;
        }
        SSL_set_fd(p->ssl, fd);
        SSL_set_accept_state(p->ssl);
        p->state = Conn::kHandshake;
      }
      watch(*p, EPOLLIN);
      on_io(p);
    }
  }

  // Reads what the socket has; false when the connection is gone (closed).
  bool read_some(Conn* c) {
    char buf[16 << 10];
    for (;;) {
      // Never more than one request ahead (the next is read after it).
      if (c->need && c->in.size() >= c->need) return true;
      if (c->in.size() > limits.max_header_bytes + c->need + sizeof(buf)) return true;
      if (c->ssl) {
        ERR_clear_error();
        const int n = SSL_read(c->ssl, buf, sizeof(buf));
        if (n > 0) {
          c->in.append(buf, static_cast<size_t>(n));
          continue;
        }
        const int e = SSL_get_error(c->ssl, n);
        if (e == SSL_ERROR_WANT_READ) {
          watch(*c, EPOLLIN);
          return true;
        }
        if (e == SSL_ERROR_WANT_WRITE) {
          watch(*c, EPOLLOUT);
          return true;
        }
        close_conn(c);
        return false;
      }
      const ssize_t n = ::recv(c->fd, buf, sizeof(buf), 0);
      if (n > 0) {
        c->in.append(buf, static_cast<size_t>(n));
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
      close_conn(c);  // the client closed, or reset
      return false;
    }
  }

  // Frames the request in `in`: the headers' end, then the body's length.
  // False when the connection was answered and closed.
  bool frame(Conn* c) {
    if (c->need) return true;
    const size_t from = c->scanned >= 3 ? c->scanned - 3 : 0;
    const size_t end = c->in.find("\r\n\r\n", from);
    if (end == std::string::npos) {
      c->scanned = c->in.size();
      if (c->in.size() > limits.max_header_bytes) {
        answer_and_close(c, 431, "Request Header Fields Too Large",
                         fmt::format("the request line and headers are longer than {} bytes", limits.max_header_bytes));
        return false;
      }
      return true;
    }
    const size_t head = end + 4;
    if (head > limits.max_header_bytes) {
      answer_and_close(c, 431, "Request Header Fields Too Large",
                       fmt::format("the request line and headers are longer than {} bytes", limits.max_header_bytes));
      return false;
    }
    // Content-Length (every copy must agree), Transfer-Encoding, Expect.
    std::string_view h(c->in.data(), head);
    bool has_length = false, chunked = false, expect_continue = false;
    size_t length = 0;
    size_t expect_line = 0, expect_line_end = 0;
    for (size_t at = h.find("\r\n") + 2; at < end;) {
      size_t eol = h.find("\r\n", at);
      std::string_view line = h.substr(at, eol - at);
      const size_t colon = line.find(':');
      if (colon != std::string_view::npos) {
        const std::string_view name = trim(line.substr(0, colon)), value = trim(line.substr(colon + 1));
        if (iequals(name, "Content-Length")) {
          size_t v = 0;
          const auto [p, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
          if (ec != std::errc() || p != value.data() + value.size() || value.empty() || (has_length && v != length)) {
            answer_and_close(c, 400, "Bad Request", "the Content-Length header is not one number");
            return false;
          }
          has_length = true;
          length = v;
        } else if (iequals(name, "Transfer-Encoding")) {
          chunked = true;
        } else if (iequals(name, "Expect") && iequals(value, "100-continue")) {
          expect_continue = true;
          expect_line = at;
          expect_line_end = eol + 2;
        }
      }
      at = eol + 2;
    }
    if (chunked || length > routes.max_body()) {
      // cpp-httplib refuses these (411, 413) from the headers alone, and
      // the connection closes after.
      c->need = head;
      c->close_after = true;
      return true;
    }
    if (length > 0) {
      if (buffered + length > limits.max_buffered_bytes) {
        n_refused++;
        count(c_refused_memory);
        answer_and_close(c, 503, "Service Unavailable",
                         "too many request bodies arriving at once; retry later", "server_error");
        return false;
      }
      buffered += length;
      c->reserved = length;
      if (expect_continue && c->in.size() == head) {
        // The client waits for this before it sends the body; cpp-httplib
        // then sees no Expect (it would answer it again).
        c->in.erase(expect_line, expect_line_end - expect_line);
        const size_t cut = expect_line_end - expect_line;
        static const char kContinue[] = "HTTP/1.1 100 Continue\r\n\r\n";
        if (c->ssl) {
          SSL_write(c->ssl, kContinue, sizeof(kContinue) - 1);
        } else {
          [[maybe_unused]] ssize_t n = ::send(c->fd, kContinue, sizeof(kContinue) - 1, MSG_NOSIGNAL | MSG_DONTWAIT);
        }
        c->need = head - cut + length;
      } else {
        c->need = head + length;
      }
      c->in_body = true;
      c->deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(
                                       limits.header_timeout_s + static_cast<double>(length) / limits.body_min_rate));
      return true;
    }
    c->need = head;
    return true;
  }

  void on_io(Conn* c) {
    if (c->state == Conn::kBusy) return;
    if (c->state == Conn::kHandshake) {
      ERR_clear_error();
      const int rc = SSL_do_handshake(c->ssl);
      if (rc != 1) {
        const int e = SSL_get_error(c->ssl, rc);
        if (e == SSL_ERROR_WANT_READ) {
          watch(*c, EPOLLIN);
        } else if (e == SSL_ERROR_WANT_WRITE) {
          watch(*c, EPOLLOUT);
        } else {
          close_conn(c);  // no TLS, a certificate refused, or the client left
        }
        return;
      }
      c->state = Conn::kReading;
      watch(*c, EPOLLIN);
    }
    const size_t before = c->in.size();
    if (!read_some(c)) return;
    if (c->state == Conn::kIdle && c->in.size() > before) {
      c->state = Conn::kReading;  // a keep-alive request started: its headers' deadline runs
      c->deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                       std::chrono::duration<double>(limits.header_timeout_s));
    }
    if (c->state != Conn::kReading) return;
    if (!frame(c)) return;
    if (c->need && c->in.size() >= c->need) {
      watch(*c, 0);
      c->state = Conn::kBusy;
      {
        std::lock_guard<std::mutex> lock(mu);
        ready.push_back(c);
      }
      ready_cv.notify_one();
    }
  }

  void expire(Clock::time_point now) {
    std::vector<Conn*> late;
    for (auto& [fd, c] : conns)
      if (c->state != Conn::kBusy && c->deadline <= now) late.push_back(c.get());
    for (Conn* c : late) {
      if (c->state == Conn::kIdle) {
        n_idle++;
        count(c_idle);
        close_conn(c);
        continue;
      }
      n_timeouts++;
      if (c->state == Conn::kHandshake) {
        count(c_timeout_handshake);
        close_conn(c);
      } else if (c->in_body) {
        count(c_timeout_body);
        answer_and_close(c, 408, "Request Timeout",
                         fmt::format("the request body did not arrive in time ({} bytes at {} bytes/s, after {} s)",
                                     c->reserved, limits.body_min_rate, limits.header_timeout_s));
      } else {
        count(c_timeout_header);
        answer_and_close(c, 408, "Request Timeout",
                         fmt::format("the request headers did not arrive within {} s", limits.header_timeout_s));
      }
    }
  }

  // A connection its request thread gave back: the next request, or gone.
  void take_back(Conn* c) {
    if (!c->keep) {
      close_conn(c);
      return;
    }
    c->state = Conn::kIdle;
    c->deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                     std::chrono::duration<double>(limits.idle_timeout_s));
    if (!c->in.empty()) {  // a pipelined request, already (partly) here
      c->state = Conn::kReading;
      c->deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                       std::chrono::duration<double>(limits.header_timeout_s));
    }
    watch(*c, EPOLLIN);
    on_io(c);
  }

  void door_loop() {
    std::vector<epoll_event> events(512);
    Clock::time_point next_expiry = Clock::now();
    while (!stop_flag.load()) {
      const int n = epoll_wait(epoll_fd, events.data(), static_cast<int>(events.size()), 50);
      for (int i = 0; i < n; i++) {
        const int fd = events[i].data.fd;
        if (fd == listen_fd) {
          accept_all();
        } else if (fd == wake_fd) {
          uint64_t v;
          [[maybe_unused]] ssize_t r = ::read(wake_fd, &v, sizeof(v));
          std::deque<Conn*> back;
          {
            std::lock_guard<std::mutex> lock(mu);
            back.swap(returned);
          }
          for (Conn* c : back) take_back(c);
        } else {
          auto it = conns.find(fd);
          if (it != conns.end()) on_io(it->second.get());
        }
      }
      const Clock::time_point now = Clock::now();
      if (now >= next_expiry) {
        expire(now);
        if (accept_paused) {
          epoll_event ev{};
          ev.events = EPOLLIN;
          ev.data.fd = listen_fd;
          epoll_ctl(epoll_fd, EPOLL_CTL_ADD, listen_fd, &ev);
          accept_paused = false;
        }
        next_expiry = now + std::chrono::milliseconds(50);
      }
    }
    // Stopped: no new connections, none waiting for a request.
    ::close(listen_fd);
    listen_fd = -1;
    std::vector<Conn*> waiting;
    for (auto& [fd, c] : conns)
      if (c->state != Conn::kBusy) waiting.push_back(c.get());
    for (Conn* c : waiting) close_conn(c);
  }

  // ---- the request threads ----

  void work() {
    for (;;) {
      Conn* c;
      {
        std::unique_lock<std::mutex> lock(mu);
        ready_cv.wait(lock, [&] { return stopping || !ready.empty(); });
        if (ready.empty()) return;
        c = ready.front();
        ready.pop_front();
      }
      run(c);
    }
  }

  void run(Conn* c) {
    const bool last = c->close_after || stop_flag.load() || c->requests + 1 >= limits.max_requests_per_connection;
    bool closed = false;
    bool ok;
    {
      ConnStream strm(*c, routes.write_timeout_ms());
      ok = routes.serve(strm, last, closed);
    }
    c->in.erase(0, c->need);
    c->need = 0;
    c->scanned = 0;
    c->in_body = false;
    if (c->reserved) {
      buffered -= c->reserved;
      c->reserved = 0;
    }
    c->requests++;
    // The connection thread keeps it for the next request, or closes it.
    c->keep = ok && !closed && !last;
    {
      std::lock_guard<std::mutex> lock(mu);
      returned.push_back(c);
    }
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t w = ::write(wake_fd, &one, sizeof(one));
  }
};

HttpServer::HttpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

HttpServer::~HttpServer() {
  stop();
  wait();
}

httplib::Server& HttpServer::routes() { return impl_->routes; }

Result<std::unique_ptr<HttpServer>> HttpServer::make(const TlsOptions& tls) {
  auto impl = std::make_unique<Impl>();
  if (tls.enabled()) {
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
    SSL_CTX* ctx = SSL_CTX_new(TLS_server_method());
    impl->ctx = ctx;
    bool ok = ctx != nullptr;
    if (ok) {
      SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
      SSL_CTX_set_options(ctx, SSL_OP_NO_COMPRESSION | SSL_OP_NO_RENEGOTIATION);
      ok = SSL_CTX_use_certificate_chain_file(ctx, tls.cert.c_str()) == 1 &&
           SSL_CTX_use_PrivateKey_file(ctx, tls.key.c_str(), SSL_FILETYPE_PEM) == 1 &&
           SSL_CTX_check_private_key(ctx) == 1;
    }
    if (ok && !tls.client_ca.empty()) {
      STACK_OF(X509_NAME)* names = SSL_load_client_CA_file(tls.client_ca.c_str());
      ok = names != nullptr && SSL_CTX_load_verify_locations(ctx, tls.client_ca.c_str(), nullptr) == 1;
      if (names) SSL_CTX_set_client_CA_list(ctx, names);
      SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
    }
    if (!ok) {
      ERR_clear_error();
      return Status::InvalidArgument(fmt::format(
          "--tls-cert {} and --tls-key {}{}: OpenSSL cannot use them (not a PEM certificate and its private key, or "
          "they do not match{})",
          tls.cert, tls.key, tls.client_ca.empty() ? "" : " and --tls-client-ca " + tls.client_ca,
          tls.client_ca.empty() ? "" : ", or the CA file is not PEM"));
    }
  }
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(impl)));
}

Result<int> HttpServer::bind(const std::string& host, int port) {
  Impl& m = *impl_;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(port);
  if (const int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &res); rc != 0)
    return Status::Unavailable(fmt::format("cannot listen on {}:{}: {}", host, port, gai_strerror(rc)));
  int fd = -1;
  for (addrinfo* a = res; a && fd < 0; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    // SO_REUSEADDR (a restarted server rebinds at once) but not
    // SO_REUSEPORT, with which a second server on the same port would bind
    // too and share the connections instead of being refused.
    int yes = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    if (::bind(fd, a->ai_addr, a->ai_addrlen) != 0 || ::listen(fd, 4096) != 0) {
      ::close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(res);
  if (fd < 0)
    return Status::Unavailable(port == 0 ? fmt::format("cannot bind {} on any port", host)
                                         : fmt::format("cannot listen on {}:{} (in use, or not an address of this machine)",
                                                       host, port));
  std::string ip;
  int bound = 0;
  peer_of(fd, false, &ip, &bound);
  if (m.listen_fd >= 0) ::close(m.listen_fd);
  m.listen_fd = fd;
  return bound;
}

Status HttpServer::start(const HttpOptions& opts, obs::Registry* registry) {
  Impl& m = *impl_;
  if (m.listen_fd < 0) return Status::Internal("HttpServer::start before bind");
  const DoorLimits& limits = opts.door;
  m.limits = limits;
  const int threads = opts.threads;
  // A client that vanishes must not end the process (a write to its
  // socket, through OpenSSL too, raises SIGPIPE).
  ::signal(SIGPIPE, SIG_IGN);
  // Each connection is a descriptor: let the process have as many as the
  // caps allow (the soft limit is often 1024).
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
    const rlim_t want = static_cast<rlim_t>(limits.max_connections) + 1024;
    if (rl.rlim_cur < want) {
      rl.rlim_cur = std::min(want, rl.rlim_max);
      setrlimit(RLIMIT_NOFILE, &rl);
    }
  }
  if (registry) {
    m.g_open = &registry->gauge("tessera_http_connections_open", "HTTP connections open now");
    const char* refused = "tessera_http_connections_refused_total";
    const char* refused_help = "Connections answered 503 and closed for a cap: total, per client, buffered bodies";
    m.c_refused_total = &registry->counter(refused, refused_help, {{"reason", "max_connections"}});
    m.c_refused_client = &registry->counter(refused, refused_help, {{"reason", "max_per_client"}});
    m.c_refused_memory = &registry->counter(refused, refused_help, {{"reason", "max_buffered_bytes"}});
    const char* late = "tessera_http_read_timeouts_total";
    const char* late_help = "Connections closed because a TLS handshake, the headers or a body missed its deadline";
    m.c_timeout_handshake = &registry->counter(late, late_help, {{"phase", "handshake"}});
    m.c_timeout_header = &registry->counter(late, late_help, {{"phase", "headers"}});
    m.c_timeout_body = &registry->counter(late, late_help, {{"phase", "body"}});
    m.c_idle = &registry->counter("tessera_http_idle_closed_total",
                                  "Keep-alive connections closed after idle_timeout without a request");
  }
  m.epoll_fd = epoll_create1(EPOLL_CLOEXEC);
  m.wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (m.epoll_fd < 0 || m.wake_fd < 0)
    return Status::ResourceExhausted(fmt::format("cannot start the HTTP front end: {}", std::strerror(errno)));
  for (int fd : {m.listen_fd, m.wake_fd}) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    epoll_ctl(m.epoll_fd, EPOLL_CTL_ADD, fd, &ev);
  }
  RETURN_IF_ERROR(m.routes.start_loop());
  const int n = std::max(threads, 1);
  try {
    for (int i = 0; i < n; i++) m.workers.emplace_back([&m] { m.work(); });
    m.door = std::thread([&m] { m.door_loop(); });
  } catch (const std::system_error& e) {
    const size_t made = m.workers.size();
    stop();
    wait();
    return Status::ResourceExhausted(
        fmt::format("cannot start {} HTTP request threads ({} started): {}", n, made, e.what()));
  }
  return Status::OK();
}

void HttpServer::stop() {
  Impl& m = *impl_;
  m.stop_flag = true;
  m.routes.end_loop();
  if (m.wake_fd >= 0) {
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t w = ::write(m.wake_fd, &one, sizeof(one));
  }
}

void HttpServer::wait() {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> wait_lock(m.wait_mu);
  if (m.joined) return;
  if (m.door.joinable()) m.door.join();
  else if (!m.stop_flag.load()) return;  // never started
  {
    std::lock_guard<std::mutex> lock(m.mu);
    m.stopping = true;
  }
  m.ready_cv.notify_all();
  for (std::thread& t : m.workers)
    if (t.joinable()) t.join();
  m.workers.clear();
  // Every thread ended: what is left (given back after the connection
  // thread stopped, or never run) closes here.
  std::vector<Conn*> left;
  for (auto& [fd, c] : m.conns) left.push_back(c.get());
  for (Conn* c : left) m.close_conn(c);
  m.ready.clear();
  m.returned.clear();
  m.joined = true;
}

DoorCounts HttpServer::counts() const {
  const Impl& m = *impl_;
  return {m.n_open.load(), m.n_refused.load(), m.n_timeouts.load(), m.n_idle.load()};
}

}  // namespace tessera::serve
