// The embedded store's client under failures: an add whose request went out
// is never sent twice (a server that applied it and then lost the
// connection would count it twice), a get is retried on a fresh
// connection, a connection the server closed before anything was sent is
// replaced without an error, and a connect to a host that drops packets
// ends at the deadline. The fake server speaks the wire format of
// docs/formats/store.md by hand.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "comm/rendezvous/tcp_store.h"

namespace tessera::comm {
namespace {

using std::chrono::milliseconds;

int listen_loopback(int backlog, int* port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0 || ::listen(fd, backlog) != 0) {
    ::close(fd);
    return -1;
  }
  socklen_t len = sizeof sa;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
  *port = ntohs(sa.sin_port);
  return fd;
}

bool read_n(int fd, char* p, size_t n) {
  while (n > 0) {
    pollfd pf{fd, POLLIN, 0};
    if (::poll(&pf, 1, 5000) <= 0) return false;
    const ssize_t k = ::recv(fd, p, n, 0);
    if (k <= 0) return false;
    p += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

uint32_t u32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; i++) v |= static_cast<uint32_t>(static_cast<uint8_t>(p[i])) << (8 * i);
  return v;
}

// A store server by hand: for each request frame (op, key), `reply` says
// what to answer (the reply frame's status byte and value) or, returning
// false, to close the connection without a reply. It counts connections and
// requests per op.
class FakeStore {
 public:
  using Reply = std::function<bool(int connection, uint8_t op, const std::string& key, std::string* reply)>;
  explicit FakeStore(Reply reply) : reply_(std::move(reply)) {
    fd_ = listen_loopback(16, &port_);
    thread_ = std::thread([this] { loop(); });
  }
  ~FakeStore() {
    stop_ = true;
    ::shutdown(fd_, SHUT_RDWR);
    thread_.join();
    ::close(fd_);
  }
  int port() const { return port_; }
  int connections() const { return connections_; }
  int requests(uint8_t op) const { return requests_[op]; }

 private:
  void loop() {
    while (!stop_) {
      pollfd pf{fd_, POLLIN, 0};
      if (::poll(&pf, 1, 50) <= 0) continue;
      const int c = ::accept(fd_, nullptr, nullptr);
      if (c < 0) return;
      const int n = connections_++;
      while (true) {
        char h[9];
        if (!read_n(c, h, 9)) break;
        const uint32_t len = u32(h), klen = u32(h + 5);
        std::string rest(len - 5, '\0');
        if (!read_n(c, rest.data(), rest.size())) break;
        const uint8_t op = static_cast<uint8_t>(h[4]);
        requests_[op]++;
        std::string reply;
        if (!reply_(n, op, rest.substr(0, klen), &reply)) break;
        std::string frame;
        for (int i = 0; i < 4; i++) frame.push_back(static_cast<char>((reply.size() >> (8 * i)) & 0xff));
        frame += reply;
        if (::send(c, frame.data(), frame.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(frame.size())) break;
      }
      ::close(c);
    }
  }

  Reply reply_;
  int fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> connections_{0};
  std::atomic<int> requests_[4] = {0, 0, 0, 0};
  std::thread thread_;
};

constexpr uint8_t kSetOp = 1, kGetOp = 2, kAddOp = 3;

TEST(TcpStore, AddIsNotResentAfterItsRequestWentOut) {
  // The server applies the add, then the connection breaks before the reply.
  FakeStore fake([](int, uint8_t op, const std::string&, std::string* reply) {
    if (op == kAddOp) return false;
    *reply = std::string(1, '\0');
    return true;
  });
  auto c = StoreClient::connect("127.0.0.1", fake.port(), milliseconds(5000), milliseconds(5000));
  ASSERT_TRUE(c.ok()) << c.status().message();
  Result<int64_t> r = (*c)->add("job/r0/count", 1);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(r.status().message().find("not resent"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("job/r0/count"), std::string::npos) << r.status().message();
  std::this_thread::sleep_for(milliseconds(200));
  EXPECT_EQ(fake.requests(kAddOp), 1);
  EXPECT_EQ(fake.connections(), 1);
  // The client goes on with a fresh connection.
  EXPECT_TRUE((*c)->set("job/k", "v").ok());
  EXPECT_EQ(fake.connections(), 2);
}

TEST(TcpStore, GetIsRetriedOnAFreshConnection) {
  // The first connection breaks on its first get; the second answers.
  FakeStore fake([](int connection, uint8_t op, const std::string& key, std::string* reply) {
    if (op == kGetOp && connection == 0) return false;
    reply->assign(1, '\0');
    if (op == kGetOp) reply->append("value of ").append(key);
    return true;
  });
  auto c = StoreClient::connect("127.0.0.1", fake.port(), milliseconds(5000), milliseconds(5000));
  ASSERT_TRUE(c.ok()) << c.status().message();
  Result<std::string> v = (*c)->get("job/a");
  ASSERT_TRUE(v.ok()) << v.status().message();
  EXPECT_EQ(*v, "value of job/a");
  EXPECT_EQ(fake.requests(kGetOp), 2);
  EXPECT_EQ(fake.connections(), 2);
  EXPECT_EQ(fake.requests(kSetOp), 0);
}

// The embedded store's agent serves on after a job's last round while a
// client still holds its connection (a straggling worker): the server
// counts the connections its clients have not closed.
TEST(TcpStore, OpenConnectionsCountsClientsUntilTheyClose) {
  auto server = StoreServer::start("127.0.0.1", 0);
  ASSERT_TRUE(server.ok()) << server.status().message();
  EXPECT_EQ((*server)->open_connections(), 0);
  auto a = StoreClient::connect("127.0.0.1", (*server)->port(), milliseconds(5000), milliseconds(5000));
  auto b = StoreClient::connect("127.0.0.1", (*server)->port(), milliseconds(5000), milliseconds(5000));
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE((*a)->set("job/k", "v").ok());
  ASSERT_TRUE((*b)->get("job/k").ok());  // both connections accepted and served
  EXPECT_EQ((*server)->open_connections(), 2);
  a->reset();  // closes its connection
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while ((*server)->open_connections() != 1 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(milliseconds(10));
  EXPECT_EQ((*server)->open_connections(), 1);
}

TEST(TcpStore, AddAfterTheServerRestartedIsAppliedOnce) {
  // The server's end of the connection closed before the add was sent: the
  // client sees that, reconnects and sends it once.
  auto first = StoreServer::start("127.0.0.1", 0);
  ASSERT_TRUE(first.ok()) << first.status().message();
  const int port = (*first)->port();
  auto c = StoreClient::connect("127.0.0.1", port, milliseconds(5000), milliseconds(5000));
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ((*c)->add("job/n", 1).value(), 1);
  first->reset();
  std::this_thread::sleep_for(milliseconds(50));  // the FIN reaches the client
  auto second = StoreServer::start("127.0.0.1", port);
  if (!second.ok()) GTEST_SKIP() << "port " << port << " taken by another process: " << second.status().message();
  Result<int64_t> r = (*c)->add("job/n", 1);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(*r, 1);
  std::string n;
  ASSERT_TRUE((*second)->get("job/n", &n));
  EXPECT_EQ(n, "1");
}

TEST(TcpStore, ConnectToAHostThatDropsPacketsEndsAtTheDeadline) {
  // A listener whose accept queue is full: the kernel drops further SYNs, as
  // a firewalled or unplugged host does; a blocking connect would wait for
  // the SYN retries (about 2 min).
  int port = 0;
  const int lfd = listen_loopback(0, &port);
  ASSERT_GE(lfd, 0);
  std::vector<int> fill;
  bool hangs = false;
  for (int i = 0; i < 16 && !hangs; i++) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    sa.sin_port = htons(static_cast<uint16_t>(port));
    ::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa);
    fill.push_back(fd);
    pollfd pf{fd, POLLOUT, 0};
    hangs = ::poll(&pf, 1, 300) == 0;
  }
  if (!hangs) {
    for (int fd : fill) ::close(fd);
    ::close(lfd);
    GTEST_SKIP() << "connects to a full accept queue do not hang here";
  }
  const auto t0 = std::chrono::steady_clock::now();
  auto c = StoreClient::connect("127.0.0.1", port, milliseconds(1500), milliseconds(1000));
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (int fd : fill) ::close(fd);
  ::close(lfd);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(c.status().message().find("127.0.0.1:" + std::to_string(port)), std::string::npos)
      << c.status().message();
  EXPECT_NE(c.status().message().find("timed out"), std::string::npos) << c.status().message();
  EXPECT_GE(s, 1.0);
  EXPECT_LT(s, 20.0);  // the deadline (1.5 s) with a wide margin, far below the SYN retries' ~127 s
}

}  // namespace
}  // namespace tessera::comm
