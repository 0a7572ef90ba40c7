#include "comm/rendezvous/tls_tunnel.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <thread>

#include <fmt/format.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

namespace tessera::comm {

namespace {

std::string openssl_reason() {
  const unsigned long e = ERR_get_error();
  ERR_clear_error();
  if (e == 0) return "the connection closed in the handshake";
  char buf[256];
  ERR_error_string_n(e, buf, sizeof(buf));
  return buf;
}

void set_nonblocking(int fd, bool on) {
  const int fl = fcntl(fd, F_GETFL, 0);
  fcntl(fd, F_SETFL, on ? (fl | O_NONBLOCK) : (fl & ~O_NONBLOCK));
}

// A TCP connection within `timeout`; -1 with *why otherwise.
int connect_tcp(const std::string& host, int port, std::chrono::milliseconds timeout, std::string* why) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (const int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res); rc != 0) {
    *why = gai_strerror(rc);
    return -1;
  }
  int fd = -1;
  for (addrinfo* a = res; a && fd < 0; a = a->ai_next) {
    fd = ::socket(a->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) continue;
    if (::connect(fd, a->ai_addr, a->ai_addrlen) != 0 && errno != EINPROGRESS) {
      *why = std::strerror(errno);
      ::close(fd);
      fd = -1;
      continue;
    }
    pollfd p{fd, POLLOUT, 0};
    int err = 0;
    socklen_t len = sizeof(err);
    if (::poll(&p, 1, static_cast<int>(timeout.count())) != 1 ||
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0) {
      *why = err ? std::strerror(err) : "connect timed out";
      ::close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(res);
  return fd;
}

}  // namespace

struct TlsTunnel::Impl {
  SSL_CTX* ctx = nullptr;
  SSL* ssl = nullptr;
  int tcp = -1, pair = -1;  // pair: the tunnel's end of the socketpair
  std::thread pump;
  std::mutex mu;
  std::string tls_error;  // under mu: why the TLS connection failed (an alert, a broken record)

  ~Impl() {
    if (pump.joinable()) {
      ::shutdown(pair, SHUT_RDWR);  // wakes the pump, which then ends
      pump.join();
    }
    if (ssl) SSL_free(ssl);
    if (ctx) SSL_CTX_free(ctx);
    if (tcp >= 0) ::close(tcp);
    if (pair >= 0) ::close(pair);
  }

  // Ends the tunnel: the client's end sees it close; an OpenSSL error
  // (SSL_ERROR_SSL: an alert from the server, a bad record) is kept.
  void fail(int ssl_error) {
    if (ssl_error == SSL_ERROR_SSL) {
      std::lock_guard<std::mutex> lock(mu);
      tls_error = openssl_reason();
    }
    ::shutdown(pair, SHUT_RDWR);
  }

  // Carries bytes both ways until either side closes.
  void run() {
    ScopedNoSigpipe no_sigpipe;
    std::string to_tls, to_plain;
    char buf[16 << 10];
    bool want_write = false;  // SSL asked for the socket to be writable
    for (;;) {
      pollfd p[2] = {{pair, static_cast<short>(POLLIN | (to_plain.empty() ? 0 : POLLOUT)), 0},
                     {tcp, static_cast<short>(POLLIN | ((to_tls.empty() && !want_write) ? 0 : POLLOUT)), 0}};
      if (::poll(p, 2, 1000) < 0 && errno != EINTR) return;
      if (p[0].revents & POLLIN) {
        const ssize_t n = ::recv(pair, buf, sizeof(buf), MSG_DONTWAIT);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) break;  // the client closed
        if (n > 0) to_tls.append(buf, static_cast<size_t>(n));
      } else if (p[0].revents & (POLLHUP | POLLERR)) {
        break;
      }
      want_write = false;
      while (!to_tls.empty()) {
        ERR_clear_error();
        const int n = SSL_write(ssl, to_tls.data(), static_cast<int>(to_tls.size()));
        if (n > 0) {
          to_tls.erase(0, static_cast<size_t>(n));
          continue;
        }
        const int e = SSL_get_error(ssl, n);
        if (e == SSL_ERROR_WANT_WRITE || e == SSL_ERROR_WANT_READ) {
          want_write = e == SSL_ERROR_WANT_WRITE;
          break;
        }
        fail(e);  // the TLS connection broke: the client sees its end close
        return;
      }
      for (;;) {
        ERR_clear_error();
        const int n = SSL_read(ssl, buf, sizeof(buf));
        if (n > 0) {
          to_plain.append(buf, static_cast<size_t>(n));
          continue;
        }
        const int e = SSL_get_error(ssl, n);
        if (e == SSL_ERROR_WANT_READ) break;
        if (e == SSL_ERROR_WANT_WRITE) {
          want_write = true;
          break;
        }
        // The server closed (or the connection broke): hand over what came.
        if (!to_plain.empty()) {
          set_nonblocking(pair, false);
          [[maybe_unused]] ssize_t w = ::send(pair, to_plain.data(), to_plain.size(), MSG_NOSIGNAL);
        }
        fail(e);
        return;
      }
      while (!to_plain.empty()) {
        const ssize_t n = ::send(pair, to_plain.data(), to_plain.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
          to_plain.erase(0, static_cast<size_t>(n));
        } else {
          if (n < 0 && errno != EAGAIN && errno != EINTR) {
            fail(SSL_ERROR_NONE);
            return;
          }
          break;
        }
      }
    }
    SSL_shutdown(ssl);  // best effort
  }
};

Result<std::unique_ptr<TlsTunnel>> TlsTunnel::open(const std::string& host, int port, const TlsFiles& files,
                                                   std::chrono::milliseconds timeout, const std::string& address) {
  auto impl = std::make_unique<Impl>();
  impl->ctx = SSL_CTX_new(TLS_client_method());
  if (!impl->ctx) return Status::ResourceExhausted(fmt::format("rendezvous store {}: TLS: {}", address, openssl_reason()));
  SSL_CTX_set_min_proto_version(impl->ctx, TLS1_2_VERSION);
  SSL_CTX_set_verify(impl->ctx, SSL_VERIFY_PEER, nullptr);
  const bool cas = files.ca.empty() ? SSL_CTX_set_default_verify_paths(impl->ctx) == 1
                                    : SSL_CTX_load_verify_locations(impl->ctx, files.ca.c_str(), nullptr) == 1;
  if (!cas)
    return Status::InvalidArgument(fmt::format("rendezvous store {}: TESSERA_RDZV_TLS_CA={}: not PEM certificates ({})",
                                               address, files.ca, openssl_reason()));
  if (!files.cert.empty() &&
      (SSL_CTX_use_certificate_chain_file(impl->ctx, files.cert.c_str()) != 1 ||
       SSL_CTX_use_PrivateKey_file(impl->ctx, files.key.c_str(), SSL_FILETYPE_PEM) != 1 ||
       SSL_CTX_check_private_key(impl->ctx) != 1))
    return Status::InvalidArgument(fmt::format(
        "rendezvous store {}: TESSERA_RDZV_TLS_CERT={} and TESSERA_RDZV_TLS_KEY={}: not a PEM certificate and its key "
        "({})",
        address, files.cert, files.key, openssl_reason()));

  std::string why;
  impl->tcp = connect_tcp(host, port, timeout, &why);
  if (impl->tcp < 0) return Status::Unavailable(fmt::format("connect to {}:{}: {}", host, port, why));
  int one = 1;
  setsockopt(impl->tcp, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));

  impl->ssl = SSL_new(impl->ctx);
  SSL_set_fd(impl->ssl, impl->tcp);
  in6_addr ip6;
  in_addr ip4;
  const bool is_ip = inet_pton(AF_INET, host.c_str(), &ip4) == 1 || inet_pton(AF_INET6, host.c_str(), &ip6) == 1;
  if (is_ip) {
    X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(impl->ssl), host.c_str());
  } else {
    SSL_set_tlsext_host_name(impl->ssl, host.c_str());
    SSL_set1_host(impl->ssl, host.c_str());
  }
  // The handshake, within the timeout.
  ScopedNoSigpipe no_sigpipe;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    ERR_clear_error();
    const int rc = SSL_connect(impl->ssl);
    if (rc == 1) break;
    const int e = SSL_get_error(impl->ssl, rc);
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count();
    if ((e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) && left > 0) {
      pollfd p{impl->tcp, static_cast<short>(e == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT), 0};
      ::poll(&p, 1, static_cast<int>(left));
      continue;
    }
    if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE)
      return Status::Unavailable(fmt::format("rendezvous store {}: TLS handshake not done within {:.0f} s", address,
                                             timeout.count() / 1e3));
    const long verify = SSL_get_verify_result(impl->ssl);
    return Status::InvalidArgument(fmt::format(
        "rendezvous store {}: TLS handshake failed: {}{} (its certificate is checked against {}{})", address,
        openssl_reason(), verify != X509_V_OK ? fmt::format(": {}", X509_verify_cert_error_string(verify)) : "",
        files.ca.empty() ? "the system's CAs; set TESSERA_RDZV_TLS_CA" : "TESSERA_RDZV_TLS_CA=" + files.ca,
        files.cert.empty() ? "; the server may want a client certificate: TESSERA_RDZV_TLS_CERT and _KEY" : ""));
  }

  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
    return Status::ResourceExhausted(fmt::format("rendezvous store {}: socketpair: {}", address, std::strerror(errno)));
  impl->pair = sv[1];
  set_nonblocking(impl->pair, true);
  std::unique_ptr<TlsTunnel> t(new TlsTunnel());
  t->plain_fd_ = sv[0];
  t->tcp_fd_ = impl->tcp;
  try {
    Impl* m = impl.get();
    impl->pump = std::thread([m] { m->run(); });
  } catch (const std::system_error& e) {
    ::close(sv[0]);
    return Status::ResourceExhausted(fmt::format("rendezvous store {}: cannot start the TLS thread: {}", address, e.what()));
  }
  t->impl_ = std::move(impl);
  return t;
}

TlsTunnel::~TlsTunnel() = default;

ScopedNoSigpipe::ScopedNoSigpipe() {
  sigemptyset(&pipe_);
  sigaddset(&pipe_, SIGPIPE);
  sigset_t pending;
  sigpending(&pending);
  was_pending_ = sigismember(&pending, SIGPIPE) == 1;
  pthread_sigmask(SIG_BLOCK, &pipe_, &old_);
}

ScopedNoSigpipe::~ScopedNoSigpipe() {
  sigset_t pending;
  sigpending(&pending);
  if (!was_pending_ && sigismember(&pending, SIGPIPE) == 1) {
    const timespec zero{0, 0};
    while (sigtimedwait(&pipe_, nullptr, &zero) < 0 && errno == EINTR) {
    }
  }
  pthread_sigmask(SIG_SETMASK, &old_, nullptr);
}

std::string TlsTunnel::tls_error() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->tls_error;
}

}  // namespace tessera::comm
