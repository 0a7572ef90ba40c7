#include "comm/rendezvous/tcp_store.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <fmt/format.h>

namespace tessera::comm {

namespace {

enum Op : uint8_t { kSet = 1, kGet = 2, kAdd = 3 };
enum Reply : uint8_t { kOk = 0, kNotFound = 1, kBad = 2 };

void put_u32(std::string& s, uint32_t v) {
  for (int i = 0; i < 4; i++) s.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
uint32_t get_u32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; i++) v |= static_cast<uint32_t>(static_cast<uint8_t>(p[i])) << (8 * i);
  return v;
}

// Reads exactly n bytes; false on EOF, error or (deadline > 0) timeout.
bool read_full(int fd, char* p, size_t n, int timeout_ms) {
  while (n > 0) {
    if (timeout_ms > 0) {
      pollfd pf{fd, POLLIN, 0};
      int r = ::poll(&pf, 1, timeout_ms);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) return false;
    }
    ssize_t k = ::recv(fd, p, n, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    p += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}
bool write_full(int fd, const char* p, size_t n) {
  while (n > 0) {
    ssize_t k = ::send(fd, p, n, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    p += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}
bool write_frame(int fd, const std::string& body) {
  std::string f;
  put_u32(f, static_cast<uint32_t>(body.size()));
  f += body;
  return write_full(fd, f.data(), f.size());
}

Result<addrinfo*> resolve(const std::string& host, int port, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  if (passive) hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  int rc = ::getaddrinfo(host.empty() ? nullptr : host.c_str(), std::to_string(port).c_str(), &hints, &res);
  if (rc != 0 || !res)
    return Status::InvalidArgument(fmt::format("store address {}:{}: cannot resolve: {}", host, port,
                                               ::gai_strerror(rc)));
  return res;
}

}  // namespace

Status parse_host_port(const std::string& s, std::string* host, int* port) {
  const size_t colon = s.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == s.size())
    return Status::InvalidArgument(fmt::format("'{}' is not HOST:PORT", s));
  *host = s.substr(0, colon);
  const std::string p = s.substr(colon + 1);
  char* end = nullptr;
  long v = std::strtol(p.c_str(), &end, 10);
  if (*end != '\0' || v < 1 || v > 65535)
    return Status::InvalidArgument(fmt::format("'{}': port '{}' is not a number in 1..65535", s, p));
  *port = static_cast<int>(v);
  return Status::OK();
}

// ---- server -------------------------------------------------------------------

Result<std::unique_ptr<StoreServer>> StoreServer::start(const std::string& host, int port) {
  ASSIGN_OR_RETURN(addrinfo * ai, resolve(host, port, true));
  int fd = ::socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    ::freeaddrinfo(ai);
    return Status::IOError(fmt::format("store: socket: {}", std::strerror(errno)));
  }
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || ::listen(fd, 128) != 0) {
    const int e = errno;
    ::freeaddrinfo(ai);
    ::close(fd);
    std::string msg = fmt::format("store: cannot listen on {}:{}: {}", host, port, std::strerror(e));
    if (e == EADDRINUSE || e == EADDRNOTAVAIL) return Status::Unavailable(msg);
    return Status::IOError(msg);
  }
  ::freeaddrinfo(ai);
  sockaddr_in sa{};
  socklen_t len = sizeof sa;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
  std::unique_ptr<StoreServer> s(new StoreServer());
  s->listen_fd_ = fd;
  s->port_ = ntohs(sa.sin_port);
  s->last_request_ns_ = std::chrono::steady_clock::now().time_since_epoch().count();
  s->accept_thread_ = std::thread([p = s.get()] { p->accept_loop(); });
  return s;
}

StoreServer::~StoreServer() {
  stop_ = true;
  ::shutdown(listen_fd_, SHUT_RDWR);
  if (accept_thread_.joinable()) accept_thread_.join();
  ::close(listen_fd_);
  std::list<Client> clients;
  {
    std::lock_guard<std::mutex> l(mu_);
    clients.swap(clients_);
  }
  for (Client& c : clients) ::shutdown(c.fd, SHUT_RDWR);
  for (Client& c : clients) {
    c.thread.join();
    ::close(c.fd);
  }
}

void StoreServer::set(const std::string& key, const std::string& value) {
  std::lock_guard<std::mutex> l(mu_);
  map_[key] = value;
}

bool StoreServer::get(const std::string& key, std::string* value) {
  std::lock_guard<std::mutex> l(mu_);
  auto it = map_.find(key);
  if (it == map_.end()) return false;
  *value = it->second;
  return true;
}

void StoreServer::accept_loop() {
  while (!stop_) {
    int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      return;  // shut down
    }
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    std::lock_guard<std::mutex> l(mu_);
    clients_.remove_if([](Client& c) {
      if (!c.done) return false;
      c.thread.join();
      ::close(c.fd);
      return true;
    });
    if (stop_ || clients_.size() >= 4096) {
      ::close(fd);
      continue;
    }
    Client& c = clients_.emplace_back();
    c.fd = fd;
    c.thread = std::thread([this, &c] {
      serve(c.fd);
      c.done = true;
    });
  }
}

void StoreServer::serve(int fd) {
  std::string frame;
  while (!stop_) {
    char h[4];
    if (!read_full(fd, h, 4, 0)) return;
    const uint32_t n = get_u32(h);
    if (n > kStoreMaxFrame || n < 5) {
      std::string reply(1, static_cast<char>(kBad));
      reply += fmt::format("frame of {} bytes (must be 5..{})", n, kStoreMaxFrame);
      write_frame(fd, reply);
      ::shutdown(fd, SHUT_RDWR);
      return;
    }
    frame.resize(n);
    if (!read_full(fd, frame.data(), n, 30000)) return;
    uint8_t status = kOk;
    std::string value = handle(frame, &status);
    if (!write_frame(fd, std::string(1, static_cast<char>(status)) + value)) return;
    if (status == kBad) {
      ::shutdown(fd, SHUT_RDWR);
      return;
    }
  }
}

int StoreServer::open_connections() {
  std::lock_guard<std::mutex> l(mu_);
  int n = 0;
  for (const Client& c : clients_) n += c.done ? 0 : 1;
  return n;
}

double StoreServer::idle_seconds() const {
  const int64_t now = std::chrono::steady_clock::now().time_since_epoch().count();
  const int64_t last = last_request_ns_.load();
  return last == 0 ? 0.0 : std::chrono::duration<double>(std::chrono::steady_clock::duration(now - last)).count();
}

std::string StoreServer::handle(const std::string& frame, uint8_t* status) {
  last_request_ns_ = std::chrono::steady_clock::now().time_since_epoch().count();
  const uint8_t op = static_cast<uint8_t>(frame[0]);
  const uint32_t klen = get_u32(frame.data() + 1);
  if (klen > kStoreMaxKey || 5 + static_cast<size_t>(klen) > frame.size()) {
    *status = kBad;
    return fmt::format("key of {} bytes (at most {}, within the frame)", klen, kStoreMaxKey);
  }
  const std::string key = frame.substr(5, klen);
  const std::string value = frame.substr(5 + klen);
  if (value.size() > kStoreMaxValue) {
    *status = kBad;
    return fmt::format("value of {} bytes (at most {})", value.size(), kStoreMaxValue);
  }
  std::lock_guard<std::mutex> l(mu_);
  switch (op) {
    case kSet:
      map_[key] = value;
      return "";
    case kGet: {
      auto it = map_.find(key);
      if (it == map_.end()) {
        *status = kNotFound;
        return "";
      }
      return it->second;
    }
    case kAdd: {
      char* end = nullptr;
      const long long delta = std::strtoll(value.c_str(), &end, 10);
      if (value.empty() || *end != '\0') {
        *status = kBad;
        return fmt::format("add: '{}' is not a decimal integer", value.substr(0, 32));
      }
      std::string& cur = map_[key];
      const long long now = (cur.empty() ? 0 : std::strtoll(cur.c_str(), nullptr, 10)) + delta;
      cur = std::to_string(now);
      return cur;
    }
    default:
      *status = kBad;
      return fmt::format("unknown operation {}", op);
  }
}

// ---- client -------------------------------------------------------------------

Result<std::unique_ptr<StoreClient>> StoreClient::connect(const std::string& host, int port,
                                                          std::chrono::milliseconds connect_timeout,
                                                          std::chrono::milliseconds timeout) {
  std::unique_ptr<StoreClient> c(new StoreClient());
  c->host_ = host;
  c->port_ = port;
  c->timeout_ = timeout;
  const auto deadline = std::chrono::steady_clock::now() + connect_timeout;
  Status last;
  while (true) {
    // Each attempt ends at the deadline (at least 100 ms: a last try).
    last = c->reconnect(std::max(deadline, std::chrono::steady_clock::now() + std::chrono::milliseconds(100)));
    if (last.ok()) return c;
    if (last.code() == StatusCode::kInvalidArgument || std::chrono::steady_clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return Status::Unavailable(fmt::format("rendezvous store {}:{} unreachable for {:.0f} s: {}", host, port,
                                         connect_timeout.count() / 1e3, last.message()));
}

StoreClient::~StoreClient() {
  if (fd_ >= 0) ::close(fd_);
}

std::string StoreClient::address() const { return fmt::format("{}:{}", host_, port_); }

std::string StoreClient::local_address() const {
  sockaddr_in sa{};
  socklen_t len = sizeof sa;
  if (fd_ < 0 || ::getsockname(fd_, reinterpret_cast<sockaddr*>(&sa), &len) != 0) return "127.0.0.1";
  char buf[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &sa.sin_addr, buf, sizeof buf);
  return buf;
}

Status StoreClient::reconnect(std::chrono::steady_clock::time_point deadline) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  ASSIGN_OR_RETURN(addrinfo * ai, resolve(host_, port_, false));
  // Non-blocking, so the deadline bounds it: a blocking connect to a host
  // that drops packets waits for the kernel's SYN retries (about 2 min).
  int fd = ::socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  int e = fd < 0 ? errno : 0;
  if (fd >= 0 && ::connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
    e = errno;
    while (e == EINPROGRESS || e == EINTR) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) {
        e = ETIMEDOUT;
        break;
      }
      pollfd pf{fd, POLLOUT, 0};
      const int r = ::poll(&pf, 1, static_cast<int>(std::min<int64_t>(left.count(), 1 << 30)));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) {
        e = errno;
        break;
      }
      if (r == 0) continue;  // the deadline check above ends it
      socklen_t len = sizeof e;
      if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &len) != 0) e = errno;
      break;
    }
  }
  ::freeaddrinfo(ai);
  if (e != 0) {
    if (fd >= 0) ::close(fd);
    return Status::Unavailable(fmt::format("connect to {}: {}", address(), std::strerror(e)));
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);  // the I/O below polls with its own deadline
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  fd_ = fd;
  return Status::OK();
}

namespace {
// True when the connection is known to be gone before anything is sent on
// it: the server closed it (EOF pending) or it failed (an error pending).
// The server never sends unasked, so readable means closed.
bool connection_closed(int fd) {
  pollfd pf{fd, POLLIN, 0};
  if (::poll(&pf, 1, 0) <= 0) return false;
  if (pf.revents & (POLLERR | POLLHUP)) return true;
  char c;
  const ssize_t k = ::recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  return k <= 0 && !(k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR));
}
}  // namespace

Result<std::string> StoreClient::call(uint8_t op, const std::string& key, const std::string& value,
                                      uint8_t* status) {
  if (key.size() > kStoreMaxKey || value.size() > kStoreMaxValue)
    return Status::InvalidArgument(fmt::format("store: key '{}' or its value ({} bytes) too long",
                                               key.substr(0, 64), value.size()));
  std::string body(1, static_cast<char>(op));
  put_u32(body, static_cast<uint32_t>(key.size()));
  body += key;
  body += value;
  // A set or a get may run twice; an add may not: once its whole frame was
  // sent, the server may have applied it even if no reply comes (a second
  // add would count one joiner twice). An add is resent only when its frame
  // did not get out whole (the server ignores a partial frame).
  const bool may_repeat = op != kAdd;
  std::string why = fmt::format("no reply within {:.0f} s", timeout_.count() / 1e3);
  for (int attempt = 0; attempt < 2; attempt++) {
    if (fd_ >= 0 && connection_closed(fd_)) {  // e.g. the server restarted: nothing was sent yet
      ::close(fd_);
      fd_ = -1;
    }
    if (fd_ < 0) RETURN_IF_ERROR(reconnect(std::chrono::steady_clock::now() + timeout_));
    char h[4];
    if (!write_frame(fd_, body)) {
      ::close(fd_);  // broken before the frame got out: one more try on a fresh connection
      fd_ = -1;
      why = "the connection broke";
      continue;
    }
    if (read_full(fd_, h, 4, static_cast<int>(timeout_.count()))) {
      const uint32_t n = get_u32(h);
      std::string reply;
      if (n >= 1 && n <= kStoreMaxFrame) reply.resize(n);  // bounded before allocating
      if (!reply.empty() && read_full(fd_, reply.data(), n, static_cast<int>(timeout_.count()))) {
        *status = static_cast<uint8_t>(reply[0]);
        if (*status == kBad)
          return Status::InvalidArgument(fmt::format("store {} refused a request: {}", address(), reply.substr(1)));
        return reply.substr(1);
      }
    }
    ::close(fd_);  // broken or timed out after the request went out
    fd_ = -1;
    if (!may_repeat)
      return Status::Unavailable(fmt::format(
          "rendezvous store {}: add to '{}': no reply within {:.0f} s or the connection broke; it may or may not "
          "have been applied (not resent)",
          address(), key.substr(0, 64), timeout_.count() / 1e3));
  }
  return Status::Unavailable(fmt::format("rendezvous store {}: {} (is the first agent gone?)", address(), why));
}

Status StoreClient::set(const std::string& key, const std::string& value) {
  uint8_t st = 0;
  return call(kSet, key, value, &st).status();
}

Result<std::string> StoreClient::get(const std::string& key) {
  uint8_t st = 0;
  ASSIGN_OR_RETURN(std::string v, call(kGet, key, "", &st));
  if (st == kNotFound) return Status::NotFound(fmt::format("store: no key '{}'", key));
  return v;
}

Result<int64_t> StoreClient::add(const std::string& key, int64_t delta) {
  uint8_t st = 0;
  ASSIGN_OR_RETURN(std::string v, call(kAdd, key, std::to_string(delta), &st));
  return static_cast<int64_t>(std::strtoll(v.c_str(), nullptr, 10));
}

}  // namespace tessera::comm
