// A TLS connection to HOST:PORT presented as a plain socket, for clients
// whose library has no TLS (Debian's hiredis 0.14, the Redis store): the
// client talks to one end of a socketpair, and one thread carries the bytes
// between its other end and the TLS connection (OpenSSL, non-blocking).
//
// open() connects, checks the server's certificate (against `ca`, else the
// system's CAs; it must name `host`, a DNS name or an IP address) and shows
// a client certificate when given. Errors name `address` (the store's URL):
// Unavailable when nothing answers (the server may be starting),
// InvalidArgument when the handshake fails (a certificate refused, no TLS
// at that port).
//
// The client owns plain_fd() once it takes it (hiredis closes it in
// redisFree); the thread ends when that end closes or the server closes
// the TLS connection, and the destructor joins it.
#pragma once

#include <signal.h>

#include <chrono>
#include <memory>
#include <string>

#include "core/status.h"

namespace tessera::comm {

// Writes to a socket whose peer closed raise SIGPIPE, which ends the
// process; OpenSSL and hiredis write with write(2), not send(MSG_NOSIGNAL).
// While one of these lives, the calling thread has SIGPIPE blocked; one
// raised meanwhile is taken back before the mask is restored, so the write
// just fails with EPIPE (what the caller handles).
class ScopedNoSigpipe {
 public:
  ScopedNoSigpipe();
  ~ScopedNoSigpipe();
  ScopedNoSigpipe(const ScopedNoSigpipe&) = delete;
  ScopedNoSigpipe& operator=(const ScopedNoSigpipe&) = delete;

 private:
  sigset_t pipe_, old_;
  bool was_pending_ = false;
};

struct TlsFiles {
  std::string ca, cert, key;  // PEM paths; empty: the system's CAs, no client certificate
};

class TlsTunnel {
 public:
  static Result<std::unique_ptr<TlsTunnel>> open(const std::string& host, int port, const TlsFiles& files,
                                                 std::chrono::milliseconds timeout, const std::string& address);
  ~TlsTunnel();
  TlsTunnel(const TlsTunnel&) = delete;
  TlsTunnel& operator=(const TlsTunnel&) = delete;

  int plain_fd() const { return plain_fd_; }
  int tls_fd() const { return tcp_fd_; }
  // Why the TLS connection failed after its handshake ("" when it did not,
  // or closed cleanly): with TLS 1.3 a server that refuses the client's
  // certificate says so only after the handshake.
  std::string tls_error() const;  // the TCP socket to the server (its local address is this end's)

  struct Impl;

 private:
  TlsTunnel() = default;
  std::unique_ptr<Impl> impl_;
  int plain_fd_ = -1;
  int tcp_fd_ = -1;
};

}  // namespace tessera::comm
