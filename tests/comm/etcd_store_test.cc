// The etcd rendezvous store against a real etcd (v3 JSON gateway; started
// here on free loopback ports with its own data folder; skipped when it is
// not installed): set/get/add/wait, concurrent adds (compare-and-swap
// transactions), and a Gloo communicator whose ranks meet through etcd.
// Error classes against a fake etcd (a cpp-httplib server): 5xx is
// Unavailable (connect asks again until its deadline), 4xx a refusal, a
// reply that is not JSON or a value that is not base64 an error naming the
// reply.
#include <arpa/inet.h>
#include <netinet/in.h>
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
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <httplib.h>

#include "comm/gloo/gloo_communicator.h"
#include "comm/store_checks.h"
#include "comm/rendezvous/etcd_store.h"

namespace tessera::comm {
namespace {

using std::chrono::milliseconds;

using testing::ClosedPort;
using testing::free_port;

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
  const ClosedPort closed;
  const int port = closed.port();
  ASSERT_GT(port, 0);
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
  testing::check_set_get_add_wait([&] { return std::unique_ptr<Store>(connect(server.port())); }, *c,
                                  "etcd://127.0.0.1:" + std::to_string(server.port()));
  EXPECT_EQ(c->get("job/fresh").status().code(), StatusCode::kNotFound);  // add(k, 0) is a read, not a write
}

TEST(EtcdStore, ConcurrentAddsAreAtomic) {
  EtcdServer server;
  if (!server.running()) GTEST_SKIP() << "etcd is not installed";
  testing::check_concurrent_adds([&] { return std::unique_ptr<Store>(connect(server.port())); }, 15);
}

TEST(EtcdStore, GlooRanksMeetThroughEtcd) {
  EtcdServer server;
  if (!server.running()) GTEST_SKIP() << "etcd is not installed";
  testing::check_gloo_ranks_meet([&] { return std::unique_ptr<Store>(connect(server.port())); });
}

TEST(EtcdStore, HttpErrorsAreClassified) {
  EXPECT_TRUE(etcd_http_status("etcd://h:1", "/v3/kv/put", 200, "{}").ok());
  for (int code : {500, 502, 503, 504, 429, 408}) {
    Status s = etcd_http_status("etcd://h:1", "/v3/kv/put", code, "{\"error\":\"etcdserver: no leader\"}");
    EXPECT_EQ(s.code(), StatusCode::kUnavailable) << code;
    EXPECT_NE(s.message().find("etcd://h:1"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("no leader"), std::string::npos) << s.message();
  }
  for (int code : {400, 401, 403, 404, 405}) {
    Status s = etcd_http_status("etcd://h:1", "/v3/kv/put", code, "bad");
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << code;
    EXPECT_NE(s.message().find("refused /v3/kv/put: HTTP " + std::to_string(code)), std::string::npos)
        << s.message();
  }
}

// A fake etcd: a cpp-httplib server on a loopback port whose replies the
// test sets per path (HTTP status and body); it counts the requests.
class FakeEtcd {
 public:
  struct Answer {
    int status = 200;
    std::string body = "{}";
  };
  FakeEtcd() {
    for (const char* path : {"/v3/maintenance/status", "/v3/kv/put", "/v3/kv/range", "/v3/kv/txn"})
      server_.Post(path, [this, path](const httplib::Request&, httplib::Response& res) {
        std::lock_guard<std::mutex> l(mu_);
        const int n = count_[path]++;
        auto& list = answers_[path];
        const Answer a = list.empty() ? Answer{} : list[std::min<size_t>(n, list.size() - 1)];
        res.status = a.status;
        res.set_content(a.body, "application/json");
      });
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
  }
  ~FakeEtcd() {
    server_.stop();
    thread_.join();
  }
  // The n-th request to path gets answers[n] (the last one after that).
  void answer(const std::string& path, std::vector<Answer> answers) {
    std::lock_guard<std::mutex> l(mu_);
    answers_[path] = std::move(answers);
    count_[path] = 0;
  }
  int requests(const std::string& path) {
    std::lock_guard<std::mutex> l(mu_);
    return count_[path];
  }
  int port() const { return port_; }

 private:
  httplib::Server server_;
  std::thread thread_;
  int port_ = 0;
  std::mutex mu_;
  std::map<std::string, std::vector<Answer>> answers_;
  std::map<std::string, int> count_;
};

TEST(EtcdStore, ConnectAsksAgainWhileTheServerAnswers5xx) {
  FakeEtcd fake;
  ASSERT_GT(fake.port(), 0);
  fake.answer("/v3/maintenance/status", {{503, "{\"error\":\"etcdserver: no leader\"}"}, {503, ""}, {200, "{}"}});
  auto c = EtcdStore::connect("127.0.0.1", fake.port(), milliseconds(10000), milliseconds(2000));
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(fake.requests("/v3/maintenance/status"), 3);

  // Past the deadline: Unavailable, with etcd's words.
  fake.answer("/v3/maintenance/status", {{503, "{\"error\":\"etcdserver: no leader\"}"}});
  auto late = EtcdStore::connect("127.0.0.1", fake.port(), milliseconds(400), milliseconds(2000));
  ASSERT_FALSE(late.ok());
  EXPECT_EQ(late.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(late.status().message().find("HTTP 503"), std::string::npos) << late.status().message();
  EXPECT_NE(late.status().message().find("no leader"), std::string::npos) << late.status().message();
  EXPECT_GE(fake.requests("/v3/maintenance/status"), 2);

  // A 4xx, or a 200 that is not JSON (not etcd): refused at once.
  fake.answer("/v3/maintenance/status", {{404, "404 page not found"}});
  auto refused = EtcdStore::connect("127.0.0.1", fake.port(), milliseconds(10000), milliseconds(2000));
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument) << refused.status().message();
  EXPECT_EQ(fake.requests("/v3/maintenance/status"), 1);
  fake.answer("/v3/maintenance/status", {{200, "<html>"}});
  auto html = EtcdStore::connect("127.0.0.1", fake.port(), milliseconds(10000), milliseconds(2000));
  EXPECT_EQ(html.status().code(), StatusCode::kInvalidArgument) << html.status().message();
}

TEST(EtcdStore, A5xxIsUnavailableA4xxARefusal) {
  FakeEtcd fake;
  ASSERT_GT(fake.port(), 0);
  auto c = EtcdStore::connect("127.0.0.1", fake.port(), milliseconds(10000), milliseconds(2000));
  ASSERT_TRUE(c.ok()) << c.status().message();
  fake.answer("/v3/kv/put", {{503, "{\"error\":\"etcdserver: request timed out\"}"}, {200, "{}"}});
  Status s = (*c)->set("job/a", "1");
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.message();
  EXPECT_NE(s.message().find("request timed out"), std::string::npos) << s.message();
  EXPECT_TRUE((*c)->set("job/a", "1").ok());  // the server answers again: the same client goes on
  fake.answer("/v3/kv/range", {{500, "{}"}});
  EXPECT_EQ((*c)->get("job/a").status().code(), StatusCode::kUnavailable);
  EXPECT_EQ((*c)->add("job/n", 1).status().code(), StatusCode::kUnavailable);
  fake.answer("/v3/kv/range", {{200, "{}"}});
  fake.answer("/v3/kv/txn", {{504, "{}"}});
  EXPECT_EQ((*c)->add("job/n", 1).status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(fake.requests("/v3/kv/txn"), 1);  // a transaction that may have been applied is not sent again
  fake.answer("/v3/kv/put", {{400, "{\"error\":\"key is not provided\"}"}});
  s = (*c)->set("job/a", "1");
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.message();
  EXPECT_NE(s.message().find("refused /v3/kv/put: HTTP 400"), std::string::npos) << s.message();
}

TEST(EtcdStore, ARangeReplyThatIsNotJsonIsAnError) {
  FakeEtcd fake;
  ASSERT_GT(fake.port(), 0);
  auto c = EtcdStore::connect("127.0.0.1", fake.port(), milliseconds(10000), milliseconds(2000));
  ASSERT_TRUE(c.ok()) << c.status().message();
  fake.answer("/v3/kv/range", {{200, "garbled reply"}});
  // Before, add(key, 0) took this for an absent key and returned 0.
  Result<int64_t> n = (*c)->add("job/n", 0);
  ASSERT_FALSE(n.ok()) << *n;
  EXPECT_EQ(n.status().code(), StatusCode::kCorruption);
  EXPECT_NE(n.status().message().find("garbled reply"), std::string::npos) << n.status().message();
  EXPECT_EQ((*c)->add("job/n", 1).status().code(), StatusCode::kCorruption);
  EXPECT_EQ(fake.requests("/v3/kv/txn"), 0);
  Result<std::string> v = (*c)->get("job/n");
  EXPECT_EQ(v.status().code(), StatusCode::kCorruption);
  EXPECT_NE(v.status().message().find("garbled reply"), std::string::npos) << v.status().message();
}

TEST(EtcdStore, AValueThatIsNotBase64IsAnError) {
  FakeEtcd fake;
  ASSERT_GT(fake.port(), 0);
  auto c = EtcdStore::connect("127.0.0.1", fake.port(), milliseconds(10000), milliseconds(2000));
  ASSERT_TRUE(c.ok()) << c.status().message();
  // "eHl6" is "xyz"; "MTI" an unpadded "12"; an empty value is left out.
  fake.answer("/v3/kv/range", {{200, R"({"kvs":[{"value":"eHl6","mod_revision":"3"}]})"},
                               {200, R"({"kvs":[{"value":"MTI"}]})"},
                               {200, R"({"kvs":[{"key":"am9i"}]})"}});
  EXPECT_EQ((*c)->get("job/a").value(), "xyz");
  EXPECT_EQ((*c)->add("job/a", 0).value(), 12);
  EXPECT_EQ((*c)->get("job/a").value(), "");
  // Before, decoding stopped at the first bad character: "MT" then '!' read as "1".
  for (const char* bad : {"MT!y", "MTI=x", "M===", "eHl6e", "MTI\\u0000"}) {
    const std::string body = std::string(R"({"kvs":[{"value":")") + bad + R"("}]})";
    fake.answer("/v3/kv/range", {{200, body}});
    Result<int64_t> n = (*c)->add("job/a", 0);
    ASSERT_FALSE(n.ok()) << bad << " read as " << *n;
    EXPECT_EQ(n.status().code(), StatusCode::kCorruption) << bad;
    EXPECT_NE(n.status().message().find("not base64"), std::string::npos) << n.status().message();
    EXPECT_NE(n.status().message().find(body.substr(0, 20)), std::string::npos) << n.status().message();
    EXPECT_EQ((*c)->get("job/a").status().code(), StatusCode::kCorruption) << bad;
  }
}

}  // namespace
}  // namespace tessera::comm
