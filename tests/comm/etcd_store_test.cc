// The etcd rendezvous store against a real etcd (v3 JSON gateway; started
// here on free loopback ports with its own data folder; skipped when it is
// not installed): set/get/add/wait, concurrent adds (compare-and-swap
// transactions), and a Gloo communicator whose ranks meet through etcd.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "comm/gloo/gloo_communicator.h"
#include "comm/rendezvous/etcd_store.h"

namespace tessera::comm {
namespace {

using std::chrono::milliseconds;

int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa);
  socklen_t len = sizeof sa;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
  ::close(fd);
  return ntohs(sa.sin_port);
}

// An etcd child process for one test.
class EtcdServer {
 public:
  EtcdServer() {
    if (std::system("command -v etcd >/dev/null 2>&1") != 0) return;
    port_ = free_port();
    const int peer = free_port();
    dir_ = std::filesystem::temp_directory_path() / ("tessera-etcd-" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    pid_ = ::fork();
    if (pid_ == 0) {
      const std::string client = "http://127.0.0.1:" + std::to_string(port_);
      const std::string peers = "http://127.0.0.1:" + std::to_string(peer);
      const std::string cluster = "default=" + peers;
      const std::string data = (dir_ / "data").string();
      const std::string log = (dir_ / "log").string();
      if (std::freopen(log.c_str(), "w", stderr) == nullptr) ::_exit(127);
      ::execlp("etcd", "etcd", "--data-dir", data.c_str(), "--listen-client-urls", client.c_str(),
               "--advertise-client-urls", client.c_str(), "--listen-peer-urls", peers.c_str(),
               "--initial-advertise-peer-urls", peers.c_str(), "--initial-cluster", cluster.c_str(),
               static_cast<char*>(nullptr));
      ::_exit(127);
    }
  }
  ~EtcdServer() {
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

std::unique_ptr<EtcdStore> connect(int port) {
  auto c = EtcdStore::connect("127.0.0.1", port, milliseconds(20000), milliseconds(5000));
  EXPECT_TRUE(c.ok()) << c.status().message();
  return c.ok() ? std::move(c).value() : nullptr;
}

TEST(EtcdStore, UnreachableNamesTheAddress) {
  const int port = free_port();
  auto c = EtcdStore::connect("127.0.0.1", port, milliseconds(300), milliseconds(1000));
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(c.status().message().find("etcd://127.0.0.1:" + std::to_string(port) + " unreachable"),
            std::string::npos)
      << c.status().message();
}

TEST(EtcdStore, SetGetAddWait) {
  EtcdServer server;
  if (!server.running()) GTEST_SKIP() << "etcd is not installed";
  auto c = connect(server.port());
  ASSERT_TRUE(c);
  ASSERT_TRUE(c->set("job/a", std::string("x\0y", 3)).ok());
  EXPECT_EQ(c->get("job/a").value(), std::string("x\0y", 3));
  EXPECT_EQ(c->get("job/missing").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(c->add("job/n", 1).value(), 1);
  EXPECT_EQ(c->add("job/n", 5).value(), 6);
  EXPECT_EQ(c->add("job/n", 0).value(), 6);
  EXPECT_EQ(c->add("job/fresh", 0).value(), 0);
  EXPECT_EQ(c->get("job/fresh").status().code(), StatusCode::kNotFound);  // a read, not a write
  EXPECT_EQ(c->address(), "etcd://127.0.0.1:" + std::to_string(server.port()));
  EXPECT_EQ(c->local_address(), "127.0.0.1");
  std::thread later([&] {
    std::this_thread::sleep_for(milliseconds(50));
    auto c2 = connect(server.port());
    if (c2) {
      EXPECT_TRUE(c2->set("job/late", "1").ok());
    }
  });
  EXPECT_TRUE(c->wait({"job/a", "job/late"}, milliseconds(5000)).ok());
  later.join();
  Status s = c->wait({"job/never"}, milliseconds(50));
  EXPECT_EQ(s.code(), StatusCode::kUnavailable);
  EXPECT_NE(s.message().find("job/never"), std::string::npos) << s.message();
}

TEST(EtcdStore, ConcurrentAddsAreAtomic) {
  EtcdServer server;
  if (!server.running()) GTEST_SKIP() << "etcd is not installed";
  std::vector<std::thread> ts;
  std::vector<std::vector<int64_t>> got(4);
  for (int t = 0; t < 4; t++)
    ts.emplace_back([&, t] {
      auto c = connect(server.port());
      if (!c) return;
      for (int i = 0; i < 15; i++) got[t].push_back(c->add("job/count", 1).value());
    });
  for (auto& t : ts) t.join();
  std::vector<int64_t> all;
  for (auto& g : got) all.insert(all.end(), g.begin(), g.end());
  std::sort(all.begin(), all.end());
  ASSERT_EQ(all.size(), 60u);
  for (int i = 0; i < 60; i++) EXPECT_EQ(all[i], i + 1);  // every slot handed out once
}

TEST(EtcdStore, GlooRanksMeetThroughEtcd) {
  EtcdServer server;
  if (!server.running()) GTEST_SKIP() << "etcd is not installed";
  const int n = 3;
  std::vector<std::thread> ts;
  std::vector<float> sums(n);
  for (int r = 0; r < n; r++)
    ts.emplace_back([&, r] {
      auto c = connect(server.port());
      if (!c) return;
      CommOptions o;
      o.timeout = milliseconds(20000);
      auto comm = make_gloo_communicator(*c, "job/r0/gloo/", r, n, c->local_address(), o);
      ASSERT_TRUE(comm.ok()) << comm.status().message();
      float x = static_cast<float>(r + 1);
      ASSERT_TRUE((*comm)->all_reduce(&x, &x, 1, ElemType::kF32).ok());
      sums[r] = x;
    });
  for (auto& t : ts) t.join();
  for (int r = 0; r < n; r++) EXPECT_EQ(sums[r], 6.0f);
}

}  // namespace
}  // namespace tessera::comm
