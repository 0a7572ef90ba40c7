#include "comm/rendezvous/redis_store.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <thread>

#include <fmt/format.h>
#include <hiredis/hiredis.h>

namespace tessera::comm {

namespace {
timeval to_timeval(std::chrono::milliseconds ms) {
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(ms.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((ms.count() % 1000) * 1000);
  return tv;
}
}  // namespace

Status redis_error_status(const std::string& address, const std::string& command, const std::string& reply) {
  // The error's first word is its class (Redis' convention since 2.6).
  const std::string word = reply.substr(0, reply.find(' '));
  const std::string text = reply.substr(0, 200);
  for (const char* transient : {"LOADING", "BUSY", "READONLY", "MASTERDOWN", "TRYAGAIN", "CLUSTERDOWN", "NOREPLICAS"})
    if (word == transient)
      return Status::Unavailable(fmt::format("rendezvous store {} cannot serve {} now: {}", address, command, text));
  if (word == "NOAUTH")
    return Status::InvalidArgument(fmt::format(
        "rendezvous store {} refused {}: {} (give the password in TESSERA_RDZV_PASSWORD_FILE or "
        "TESSERA_RDZV_PASSWORD, and an ACL user in TESSERA_RDZV_USER)",
        address, command, text));
  return Status::InvalidArgument(fmt::format("rendezvous store {} refused {}: {}", address, command, text));
}

Result<std::unique_ptr<RedisStore>> RedisStore::connect(const std::string& host, int port,
                                                        std::chrono::milliseconds connect_timeout,
                                                        std::chrono::milliseconds timeout, StoreCredentials cred) {
  std::unique_ptr<RedisStore> s(new RedisStore());
  s->host_ = host;
  s->port_ = port;
  s->timeout_ = timeout;
  s->cred_ = std::move(cred);
  const auto deadline = std::chrono::steady_clock::now() + connect_timeout;
  // One request now, so a server that refuses us (a password, protected
  // mode, not Redis at all) is reported here, not at the first rendezvous.
  // A server that cannot answer yet (LOADING its dataset, BUSY, a broken
  // connection) is asked again until the connect deadline.
  Reply r;
  while (true) {
    if (!s->ctx_) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      RETURN_IF_ERROR(s->reconnect(std::max(left, std::chrono::milliseconds(100))));
    }
    Status ping = s->command({"PING"}, &r);
    if (ping.ok()) break;
    if (ping.code() != StatusCode::kUnavailable || std::chrono::steady_clock::now() >= deadline)
      return ping.code() == StatusCode::kUnavailable
                 ? Status::Unavailable(fmt::format("rendezvous store {} not ready within {:.0f} s: {}", s->address(),
                                                   connect_timeout.count() / 1e3, ping.message()))
                 : ping;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (r.type != REDIS_REPLY_STATUS || r.str != "PONG")
    return Status::InvalidArgument(
        fmt::format("rendezvous store {} answered PING with '{}', not PONG", s->address(), r.str.substr(0, 64)));
  return s;
}

RedisStore::~RedisStore() {
  if (ctx_) redisFree(ctx_);
}

std::string RedisStore::address() const {
  return fmt::format("{}://{}:{}", cred_.tls ? "rediss" : "redis", host_, port_);
}

std::string RedisStore::local_address() const {
  sockaddr_in sa{};
  socklen_t len = sizeof sa;
  const int fd = tunnel_ ? tunnel_->tls_fd() : ctx_ ? ctx_->fd : -1;
  if (fd < 0 || ::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len) != 0 || sa.sin_family != AF_INET)
    return "127.0.0.1";
  char buf[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &sa.sin_addr, buf, sizeof buf);
  return buf;
}

Status RedisStore::reconnect(std::chrono::milliseconds connect_timeout) {
  ScopedNoSigpipe no_sigpipe;  // a server (or tunnel) that closed must not end the process
  if (ctx_) redisFree(ctx_);  // closes the tunnel's plain end too
  ctx_ = nullptr;
  tunnel_.reset();
  const auto deadline = std::chrono::steady_clock::now() + connect_timeout;
  std::string last;
  while (true) {
    // Each attempt's own deadline: what is left, at least 100 ms.
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    const auto attempt = std::max(left, std::chrono::milliseconds(100));
    redisContext* c = nullptr;
    if (cred_.tls) {
      Result<std::unique_ptr<TlsTunnel>> t =
          TlsTunnel::open(host_, port_, TlsFiles{cred_.tls_ca, cred_.tls_cert, cred_.tls_key}, attempt, address());
      if (!t.ok()) {
        if (t.status().code() != StatusCode::kUnavailable) return t.status();  // a refused certificate
        last = t.status().message();
        if (std::chrono::steady_clock::now() >= deadline) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        continue;
      }
      tunnel_ = std::move(*t);
      c = redisConnectFd(tunnel_->plain_fd());
    } else {
      c = redisConnectWithTimeout(host_.c_str(), port_, to_timeval(attempt));
    }
    if (c && !c->err) {
      if (redisSetTimeout(c, to_timeval(timeout_)) == REDIS_OK) {
        if (!cred_.tls) redisEnableKeepAlive(c);  // a socketpair has no TCP keep-alive
        if (!cred_.password.empty()) {
          // AUTH [user] password (Redis 6 ACLs take a user; the argv form
          // keeps the password out of any formatted string).
          std::vector<const char*> args = {"AUTH"};
          std::vector<size_t> lens = {4};
          if (!cred_.user.empty()) {
            args.push_back(cred_.user.data());
            lens.push_back(cred_.user.size());
          }
          args.push_back(cred_.password.data());
          lens.push_back(cred_.password.size());
          auto* r = static_cast<redisReply*>(redisCommandArgv(c, static_cast<int>(args.size()), args.data(), lens.data()));
          if (r && r->type == REDIS_REPLY_ERROR) {
            const std::string why(r->str, r->len);
            freeReplyObject(r);
            redisFree(c);
            return Status::InvalidArgument(fmt::format(
                "rendezvous store {} refused the credentials of {}TESSERA_RDZV_PASSWORD(_FILE): {}", address(),
                cred_.user.empty() ? "" : "TESSERA_RDZV_USER and ", why.substr(0, 200)));
          }
          const bool answered = r != nullptr;
          if (r) freeReplyObject(r);
          if (answered) {
            ctx_ = c;
            return Status::OK();
          }
          // No answer to AUTH: the connection broke; try again below.
        } else {
          ctx_ = c;
          return Status::OK();
        }
      }
    }
    last = c ? c->errstr : "out of memory";
    if (c) redisFree(c);
    if (tunnel_) {
      // Let the tunnel see the server's alert, if that is what closed it.
      for (int i = 0; i < 20 && tunnel_->tls_error().empty(); i++) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      const std::string tls = tunnel_->tls_error();
      if (!tls.empty())
        return Status::InvalidArgument(fmt::format(
            "rendezvous store {}: TLS: the server closed the connection: {}{}", address(), tls,
            cred_.tls_cert.empty() ? " (it may want a client certificate: TESSERA_RDZV_TLS_CERT and TESSERA_RDZV_TLS_KEY)"
                                   : ""));
    }
    tunnel_.reset();
    if (std::chrono::steady_clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return Status::Unavailable(fmt::format("rendezvous store {} unreachable for {:.0f} s: {}", address(),
                                         connect_timeout.count() / 1e3, last));
}

Status RedisStore::command(const std::vector<std::string>& argv, Reply* out) {
  std::vector<const char*> args;
  std::vector<size_t> lens;
  for (const std::string& a : argv) {
    args.push_back(a.data());
    lens.push_back(a.size());
  }
  // Only commands that may run twice are retried on a fresh connection: an
  // INCRBY whose reply was lost may have been applied.
  const bool idempotent = argv[0] != "INCRBY";
  std::string why;
  ScopedNoSigpipe no_sigpipe;  // a server (or tunnel) that closed must not end the process
  for (int attempt = 0; attempt < (idempotent ? 2 : 1); attempt++) {
    if (!ctx_) RETURN_IF_ERROR(reconnect(timeout_));
    auto* r = static_cast<redisReply*>(
        redisCommandArgv(ctx_, static_cast<int>(args.size()), args.data(), lens.data()));
    if (r) {
      out->type = r->type;
      out->integer = r->integer;
      out->str.assign(r->str ? r->str : "", r->str ? r->len : 0);
      freeReplyObject(r);
      if (out->type == REDIS_REPLY_ERROR) return redis_error_status(address(), argv[0], out->str);
      return Status::OK();
    }
    // The context is unusable after an error: drop it.
    // A socket timeout (SO_RCVTIMEO) is an I/O error with EAGAIN's text.
    const bool timed_out =
        ctx_->err == REDIS_ERR_IO && (errno == EAGAIN || errno == EWOULDBLOCK ||
                                      std::string(ctx_->errstr).find("temporarily") != std::string::npos);
    const bool protocol = ctx_->err == REDIS_ERR_PROTOCOL;
    why = timed_out ? fmt::format("no reply within {:.0f} s", timeout_.count() / 1e3)
                    : (protocol ? fmt::format("{} (is it a Redis server?)", ctx_->errstr) : std::string(ctx_->errstr));
    redisFree(ctx_);
    ctx_ = nullptr;
    // A reply that is not Redis' protocol: not Redis, asking again will not help.
    if (protocol)
      return Status::InvalidArgument(fmt::format("rendezvous store {}: {} failed: {}", address(), argv[0], why));
  }
  return Status::Unavailable(fmt::format("rendezvous store {}: {} failed: {}", address(), argv[0], why));
}

Status RedisStore::set(const std::string& key, const std::string& value) {
  Reply r;
  return command({"SET", key, value}, &r);
}

Result<std::string> RedisStore::get(const std::string& key) {
  Reply r;
  RETURN_IF_ERROR(command({"GET", key}, &r));
  if (r.type == REDIS_REPLY_NIL) return Status::NotFound(fmt::format("store: no key '{}'", key));
  if (r.type != REDIS_REPLY_STRING)
    return Status::InvalidArgument(fmt::format("rendezvous store {}: GET {} returned reply type {}", address(), key,
                                               r.type));
  return r.str;
}

Result<int64_t> RedisStore::add(const std::string& key, int64_t delta) {
  Reply r;
  RETURN_IF_ERROR(command({"INCRBY", key, std::to_string(delta)}, &r));
  if (r.type != REDIS_REPLY_INTEGER)
    return Status::InvalidArgument(fmt::format("rendezvous store {}: INCRBY {} returned reply type {}", address(),
                                               key, r.type));
  return static_cast<int64_t>(r.integer);
}

}  // namespace tessera::comm
