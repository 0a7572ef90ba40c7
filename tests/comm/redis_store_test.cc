// The Redis rendezvous store against a real redis-server (started here on a
// free loopback port, no persistence; skipped when it is not installed), the
// store address parser, and a Gloo communicator whose ranks (threads) meet
// through Redis. Error classes: a replica that refuses writes (READONLY) or
// reads (MASTERDOWN) is Unavailable, so the rendezvous retries; a server
// still loading its dataset (a fake speaking RESP by hand) is asked again
// until the connect deadline.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <hiredis/hiredis.h>

#include "comm/gloo/gloo_communicator.h"
#include "comm/store_checks.h"
#include "comm/rendezvous/redis_store.h"
#include "comm/rendezvous/store.h"

namespace tessera::comm {
namespace {

using std::chrono::milliseconds;

using testing::ClosedPort;
using testing::free_port;

// A redis-server child process for one test.
class RedisServer {
 public:
  RedisServer() {
    if (std::system("command -v redis-server >/dev/null 2>&1") != 0) return;
    port_ = free_port();
    dir_ = std::filesystem::temp_directory_path() / ("tessera-redis-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
    pid_ = ::fork();
    if (pid_ == 0) {
      const std::string port = std::to_string(port_);
      if (std::freopen("/dev/null", "w", stdout) == nullptr) ::_exit(127);
      ::execlp("redis-server", "redis-server", "--port", port.c_str(), "--bind", "127.0.0.1", "--save", "",
               "--appendonly", "no", "--dir", dir_.c_str(), "--logfile", "", "--loglevel", "warning",
               static_cast<char*>(nullptr));
      ::_exit(127);
    }
  }
  ~RedisServer() {
    if (pid_ > 0) {
      ::kill(pid_, SIGTERM);
      ::waitpid(pid_, nullptr, 0);
    }
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }
  bool running() const { return pid_ > 0; }
  int port() const { return port_; }

 private:
  pid_t pid_ = -1;
  int port_ = 0;
  std::filesystem::path dir_;
};

std::unique_ptr<RedisStore> connect(int port) {
  auto c = RedisStore::connect("127.0.0.1", port, milliseconds(10000), milliseconds(5000));
  EXPECT_TRUE(c.ok()) << c.status().message();
  return c.ok() ? std::move(c).value() : nullptr;
}

TEST(StoreAddress, ParsesEveryForm) {
  auto e = parse_store_address("embedded");
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->kind, StoreAddress::Kind::kEmbedded);
  EXPECT_EQ(e->url(), "embedded:127.0.0.1:29400");
  auto h = parse_store_address("embedded:10.0.0.1:29500");
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(h->host, "10.0.0.1");
  EXPECT_EQ(h->port, 29500);
  auto bare = parse_store_address("10.0.0.1:29500");
  ASSERT_TRUE(bare.ok());
  EXPECT_EQ(bare->kind, StoreAddress::Kind::kEmbedded);
  auto r = parse_store_address("redis://db:7000");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->kind, StoreAddress::Kind::kRedis);
  EXPECT_EQ(r->url(), "redis://db:7000");
  EXPECT_FALSE(r->tls);
  auto dflt = parse_store_address("redis://db");
  ASSERT_TRUE(dflt.ok());
  EXPECT_EQ(dflt->port, 6379);
  auto rs = parse_store_address("rediss://db:7001");
  ASSERT_TRUE(rs.ok());
  EXPECT_TRUE(rs->tls);
  EXPECT_EQ(rs->kind, StoreAddress::Kind::kRedis);
  EXPECT_EQ(rs->url(), "rediss://db:7001");
  auto es = parse_store_address("etcds://db");
  ASSERT_TRUE(es.ok());
  EXPECT_TRUE(es->tls);
  EXPECT_EQ(es->kind, StoreAddress::Kind::kEtcd);
  EXPECT_EQ(es->url(), "etcds://db:2379");
  auto e2 = parse_store_address("etcd://db");
  ASSERT_TRUE(e2.ok());
  EXPECT_FALSE(e2->tls);
  for (const char* bad : {"foo://x:1", "redis://", "redis://x:0", "embedded:nohost", "redis://x:99999"}) {
    auto b = parse_store_address(bad);
    EXPECT_EQ(b.status().code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(b.status().message().find(bad), std::string::npos) << b.status().message();
  }
}

TEST(RedisStore, UnreachableNamesTheAddress) {
  const ClosedPort closed;
  const int port = closed.port();
  ASSERT_GT(port, 0);
  const auto t0 = std::chrono::steady_clock::now();
  auto c = RedisStore::connect("127.0.0.1", port, milliseconds(300), milliseconds(1000));
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(c.status().message().find("redis://127.0.0.1:" + std::to_string(port) + " unreachable"),
            std::string::npos)
      << c.status().message();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));  // bounded by the deadline
}

TEST(RedisStore, SetGetAddWait) {
  RedisServer server;
  if (!server.running()) GTEST_SKIP() << "redis-server is not installed";
  auto c = connect(server.port());
  ASSERT_TRUE(c);
  testing::check_set_get_add_wait([&] { return std::unique_ptr<Store>(connect(server.port())); }, *c,
                                  "redis://127.0.0.1:" + std::to_string(server.port()));
  // A value that is not a counter: Redis refuses INCRBY, in one line.
  auto bad = c->add("job/a", 1);
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("refused INCRBY"), std::string::npos) << bad.status().message();
  // The connection is still good after a refusal.
  EXPECT_EQ(c->add("job/n", 1).value(), 7);
}

TEST(RedisStore, ConcurrentAddsAreAtomic) {
  RedisServer server;
  if (!server.running()) GTEST_SKIP() << "redis-server is not installed";
  testing::check_concurrent_adds([&] { return std::unique_ptr<Store>(connect(server.port())); }, 50);
}

TEST(RedisStore, GlooRanksMeetThroughRedis) {
  RedisServer server;
  if (!server.running()) GTEST_SKIP() << "redis-server is not installed";
  testing::check_gloo_ranks_meet([&] { return std::unique_ptr<Store>(connect(server.port())); });
}

TEST(RedisStore, ErrorRepliesAreClassified) {
  for (const char* transient :
       {"LOADING Redis is loading the dataset in memory", "BUSY Redis is busy running a script.",
        "READONLY You can't write against a read only replica.",
        "MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.",
        "TRYAGAIN Multiple keys request during rehashing of slot", "CLUSTERDOWN The cluster is down",
        "NOREPLICAS Not enough good replicas to write."}) {
    Status s = redis_error_status("redis://h:1", "SET", transient);
    EXPECT_EQ(s.code(), StatusCode::kUnavailable) << transient;
    EXPECT_NE(s.message().find("redis://h:1"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find(transient), std::string::npos) << s.message();
  }
  for (const char* refusal : {"NOAUTH Authentication required.", "WRONGTYPE Operation against a key holding the "
                              "wrong kind of value", "ERR value is not an integer or out of range",
                              "BUSYKEY Target key name already exists.", "LOADINGX made up", ""}) {
    Status s = redis_error_status("redis://h:1", "INCRBY", refusal);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << refusal;
    EXPECT_NE(s.message().find("refused INCRBY"), std::string::npos) << s.message();
  }
}

// Runs one command on the server with hiredis (an admin's redis-cli).
bool admin(int port, const std::vector<std::string>& argv) {
  redisContext* c = redisConnect("127.0.0.1", port);
  if (!c || c->err) {
    if (c) redisFree(c);
    return false;
  }
  std::vector<const char*> args;
  std::vector<size_t> lens;
  for (const std::string& a : argv) {
    args.push_back(a.data());
    lens.push_back(a.size());
  }
  auto* r = static_cast<redisReply*>(redisCommandArgv(c, static_cast<int>(args.size()), args.data(), lens.data()));
  const bool ok = r && r->type != REDIS_REPLY_ERROR;
  if (r) freeReplyObject(r);
  redisFree(c);
  return ok;
}

TEST(RedisStore, AReplicaThatCannotServeIsUnavailableNotARefusal) {
  RedisServer server;
  if (!server.running()) GTEST_SKIP() << "redis-server is not installed";
  auto c = connect(server.port());
  ASSERT_TRUE(c);
  ASSERT_TRUE(c->set("job/a", "1").ok());
  // A replica of a master that is gone (as during a failover): writes are
  // refused with READONLY, and reads with MASTERDOWN when stale data may not
  // be served.
  ASSERT_TRUE(admin(server.port(), {"CONFIG", "SET", "replica-serve-stale-data", "no"}));
  const ClosedPort gone;
  ASSERT_TRUE(admin(server.port(), {"REPLICAOF", "127.0.0.1", std::to_string(gone.port())}));
  Status set = c->set("job/a", "2");
  EXPECT_EQ(set.code(), StatusCode::kUnavailable) << set.message();
  EXPECT_NE(set.message().find("READONLY"), std::string::npos) << set.message();
  Result<int64_t> add = c->add("job/n", 1);
  EXPECT_EQ(add.status().code(), StatusCode::kUnavailable) << add.status().message();
  Result<std::string> get = c->get("job/a");
  EXPECT_EQ(get.status().code(), StatusCode::kUnavailable) << get.status().message();
  EXPECT_NE(get.status().message().find("MASTERDOWN"), std::string::npos) << get.status().message();
  // Promoted (the failover done): the same client goes on.
  ASSERT_TRUE(admin(server.port(), {"REPLICAOF", "NO", "ONE"}));
  EXPECT_TRUE(c->set("job/a", "3").ok());
  EXPECT_EQ(c->get("job/a").value(), "3");
  EXPECT_EQ(c->add("job/n", 1).value(), 1);
}

// A fake Redis that answers every command with error `error` for the first
// `errors` commands (all connections together), then PING with PONG.
class LoadingRedis {
 public:
  LoadingRedis(std::string error, int errors) : error_(std::move(error)), errors_(errors) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(fd_, reinterpret_cast<sockaddr*>(&sa), sizeof sa);
    ::listen(fd_, 16);
    socklen_t len = sizeof sa;
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&sa), &len);
    port_ = ntohs(sa.sin_port);
    thread_ = std::thread([this] { loop(); });
  }
  ~LoadingRedis() {
    stop_ = true;
    thread_.join();
    ::close(fd_);
  }
  int port() const { return port_; }
  int commands() const { return commands_; }

 private:
  void loop() {
    while (!stop_) {
      pollfd pf{fd_, POLLIN, 0};
      if (::poll(&pf, 1, 50) <= 0) continue;
      const int c = ::accept(fd_, nullptr, nullptr);
      if (c < 0) return;
      std::string in;
      while (!stop_) {
        // Every command of hiredis is one RESP array; PING's is
        // "*1\r\n$4\r\nPING\r\n". Answer per complete "PING".
        const size_t at = in.find("PING\r\n");
        if (at != std::string::npos) {
          in.erase(0, at + 6);
          const bool error = commands_++ < errors_;
          const std::string reply = error ? "-" + error_ + "\r\n" : "+PONG\r\n";
          if (::send(c, reply.data(), reply.size(), MSG_NOSIGNAL) < 0) break;
          continue;
        }
        pollfd cf{c, POLLIN, 0};
        if (::poll(&cf, 1, 50) <= 0) continue;
        char buf[256];
        const ssize_t k = ::recv(c, buf, sizeof buf, 0);
        if (k <= 0) break;
        in.append(buf, static_cast<size_t>(k));
      }
      ::close(c);
    }
  }

  std::string error_;
  int errors_ = 0;
  int fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> commands_{0};
  std::thread thread_;
};

TEST(RedisStore, ConnectWaitsWhileTheServerIsLoading) {
  LoadingRedis fake("LOADING Redis is loading the dataset in memory", 3);
  auto c = RedisStore::connect("127.0.0.1", fake.port(), milliseconds(10000), milliseconds(2000));
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(fake.commands(), 4);  // three LOADING, then PONG
}

TEST(RedisStore, ConnectToAServerLoadingPastTheDeadlineIsUnavailable) {
  LoadingRedis fake("LOADING Redis is loading the dataset in memory", 1 << 30);
  const auto t0 = std::chrono::steady_clock::now();
  auto c = RedisStore::connect("127.0.0.1", fake.port(), milliseconds(500), milliseconds(2000));
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(c.status().message().find("not ready within"), std::string::npos) << c.status().message();
  EXPECT_NE(c.status().message().find("LOADING"), std::string::npos) << c.status().message();
  EXPECT_GE(fake.commands(), 2);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
}

TEST(RedisStore, ConnectToAServerThatRefusesFailsAtOnce) {
  LoadingRedis fake("NOAUTH Authentication required.", 1 << 30);
  auto c = RedisStore::connect("127.0.0.1", fake.port(), milliseconds(10000), milliseconds(2000));
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find("refused PING: NOAUTH"), std::string::npos) << c.status().message();
  EXPECT_EQ(fake.commands(), 1);
}

}  // namespace
}  // namespace tessera::comm
