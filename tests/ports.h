// Loopback ports for the C++ tests that start a server process or need a
// port where nothing listens (tests/cli/ports.inc does the same for the
// shell tests).
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

namespace tessera::testing_util {

// Binds a TCP socket to 127.0.0.1:port (0: any); -1 when the port is taken.
inline int bind_loopback(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  sa.sin_port = htons(static_cast<uint16_t>(port));
  if (::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// A socket bound to a loopback port outside the kernel's ephemeral range
// (in 20000-32000 where possible), or -1. Servers of the tests running
// beside this one take port 0, that is an ephemeral port; one that bind(0)
// handed out here and released could be theirs before it is used.
inline int bind_unshared_port() {
  int lo = 32768, hi = 60999;
  if (FILE* f = std::fopen("/proc/sys/net/ipv4/ip_local_port_range", "r")) {
    if (std::fscanf(f, "%d %d", &lo, &hi) != 2) lo = 32768, hi = 60999;
    std::fclose(f);
  }
  std::vector<int> ports;
  for (int p = 20000; p <= 32000; ++p) {
    if (p < lo || p > hi) ports.push_back(p);
  }
  for (int p = 10000; ports.empty() && p < 65536; ++p) {
    if (p < lo || p > hi) ports.push_back(p);
  }
  std::shuffle(ports.begin(), ports.end(), std::mt19937(std::random_device{}()));
  for (size_t i = 0; i < ports.size() && i < 500; ++i) {
    int fd = bind_loopback(ports[i]);
    if (fd >= 0) return fd;
  }
  return bind_loopback(0);
}

inline int bound_port(int fd) {
  sockaddr_in sa{};
  socklen_t len = sizeof sa;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
  return ntohs(sa.sin_port);
}

// A loopback port free at the time of the call (for a test's server).
inline int free_port() {
  int fd = bind_unshared_port();
  if (fd < 0) return 0;
  int port = bound_port(fd);
  ::close(fd);
  return port;
}

// A loopback port where nothing listens while this object lives: held bound
// without listen(), so a connection is refused at once and no other process
// can bind it. (A free_port() could be taken by another test's server before
// the client under test connects to it.)
class ClosedPort {
 public:
  ClosedPort() : fd_(bind_unshared_port()) {}
  ~ClosedPort() {
    if (fd_ >= 0) ::close(fd_);
  }
  ClosedPort(const ClosedPort&) = delete;
  ClosedPort& operator=(const ClosedPort&) = delete;
  int port() const { return fd_ >= 0 ? bound_port(fd_) : 0; }

 private:
  int fd_;
};

// http://127.0.0.1:PORT of a ClosedPort.
inline std::string url_of(const ClosedPort& p) { return "http://127.0.0.1:" + std::to_string(p.port()); }

}  // namespace tessera::testing_util
