// The TCP rendezvous store and the Gloo communicator: N ranks as threads of
// one process over loopback, as Gloo's own tests do.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "all_to_all_cases.h"
#include "comm/gloo/gloo_communicator.h"
#include "comm/rendezvous/tcp_store.h"

namespace tessera::comm {
namespace {

using std::chrono::milliseconds;

std::unique_ptr<StoreClient> client(int port) {
  auto c = StoreClient::connect("127.0.0.1", port, milliseconds(5000));
  EXPECT_TRUE(c.ok()) << c.status().message();
  return std::move(c).value();
}

TEST(TcpStore, SetGetAddWait) {
  auto server = StoreServer::start("127.0.0.1", 0);
  ASSERT_TRUE(server.ok()) << server.status().message();
  auto c = client((*server)->port());
  ASSERT_TRUE(c->set("a", std::string("x\0y", 3)).ok());
  EXPECT_EQ(c->get("a").value(), std::string("x\0y", 3));
  EXPECT_EQ(c->get("missing").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(c->add("n", 1).value(), 1);
  EXPECT_EQ(c->add("n", 5).value(), 6);
  EXPECT_EQ(c->add("n", 0).value(), 6);
  std::thread later([&] {
    std::this_thread::sleep_for(milliseconds(50));
    auto c2 = client((*server)->port());
    EXPECT_TRUE(c2->set("late", "1").ok());
  });
  EXPECT_TRUE(c->wait({"a", "late"}, milliseconds(5000)).ok());
  later.join();
  Status s = c->wait({"never"}, milliseconds(50));
  EXPECT_EQ(s.code(), StatusCode::kUnavailable);
  EXPECT_NE(s.message().find("never"), std::string::npos) << s.message();
}

TEST(TcpStore, OversizedFrameIsRefusedAndClosed) {
  auto server = StoreServer::start("127.0.0.1", 0);
  ASSERT_TRUE(server.ok());
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>((*server)->port()));
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa), 0);
  const unsigned char huge[4] = {0xff, 0xff, 0xff, 0x7f};
  ASSERT_EQ(::write(fd, huge, 4), 4);
  char buf[256];
  ssize_t n = ::read(fd, buf, sizeof buf);
  ASSERT_GT(n, 5);
  EXPECT_EQ(buf[4], 2);  // bad request
  EXPECT_NE(std::string(buf + 5, n - 5).find("frame of"), std::string::npos);
  EXPECT_EQ(::read(fd, buf, sizeof buf), 0);  // closed
  ::close(fd);
  // The server still serves others.
  auto c = client((*server)->port());
  EXPECT_TRUE(c->set("k", "v").ok());
}

// Connections that come and go (workers restarting, reconnecting) are
// reaped: more of them than the server's limit on open connections (4096)
// still leaves it serving.
TEST(TcpStore, ClosedConnectionsAreReaped) {
  auto server = StoreServer::start("127.0.0.1", 0);
  ASSERT_TRUE(server.ok());
  for (int i = 0; i < 4200; i++) {
    auto c = client((*server)->port());
    ASSERT_TRUE(c->set("k", std::to_string(i)).ok()) << "connection " << i;
  }
  EXPECT_EQ(client((*server)->port())->get("k").value(), "4199");
}

TEST(TcpStore, ClientErrorsNameTheStore) {
  auto c = StoreClient::connect("127.0.0.1", 1, milliseconds(200));
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("127.0.0.1:1"), std::string::npos) << c.status().message();
  std::string host;
  int port = 0;
  EXPECT_FALSE(parse_host_port("nohost", &host, &port).ok());
  EXPECT_FALSE(parse_host_port("h:99999", &host, &port).ok());
  EXPECT_TRUE(parse_host_port("h:29400", &host, &port).ok());
  EXPECT_EQ(port, 29400);
}

// Runs f(rank, comm) on n threads, each with its own store client and
// communicator built under `prefix`.
template <typename F>
void run_ranks(int port, int n, const std::string& prefix, F f, milliseconds timeout = milliseconds(20000)) {
  std::vector<std::thread> ts;
  for (int r = 0; r < n; r++)
    ts.emplace_back([&, r] {
      auto c = client(port);
      CommOptions o;
      o.timeout = timeout;
      auto comm = make_gloo_communicator(*c, prefix, r, n, "127.0.0.1", o);
      ASSERT_TRUE(comm.ok()) << comm.status().message();
      f(r, **comm);
    });
  for (auto& t : ts) t.join();
}

TEST(GlooCommunicator, CollectivesForSizes1To4) {
  auto server = StoreServer::start("127.0.0.1", 0);
  ASSERT_TRUE(server.ok());
  for (int n = 1; n <= 4; n++) {
    run_ranks((*server)->port(), n, "size" + std::to_string(n) + "/", [n](int r, Communicator& c) {
      EXPECT_EQ(c.rank(), r);
      EXPECT_EQ(c.size(), n);
      for (int64_t count : {0, 1, 1000}) {
        std::vector<float> x(count, static_cast<float>(r + 1));
        ASSERT_TRUE(c.all_reduce(x.data(), count).ok());
        for (float v : x) EXPECT_EQ(v, n * (n + 1) / 2.0f);
      }
      double d = r;
      ASSERT_TRUE(c.all_reduce(&d, &d, 1, ElemType::kF64, ReduceOp::kMax).ok());
      EXPECT_EQ(d, n - 1);
      std::vector<int64_t> b(5, r == n - 1 ? 42 : -1);
      ASSERT_TRUE(c.broadcast(b.data(), 5, ElemType::kI64, n - 1).ok());
      for (int64_t v : b) EXPECT_EQ(v, 42);
      std::vector<int32_t> g(2 * n, -1);
      int32_t mine[2] = {r, 10 * r};
      ASSERT_TRUE(c.all_gather(mine, g.data(), 2, ElemType::kI32).ok());
      for (int k = 0; k < n; k++) {
        EXPECT_EQ(g[2 * k], k);
        EXPECT_EQ(g[2 * k + 1], 10 * k);
      }
      ASSERT_TRUE(c.barrier().ok());
      if (n > 1) {  // a ring of point-to-point messages
        int out = r, in = -1;
        auto s = c.send_async(&out, sizeof out, (r + 1) % n, 7);
        ASSERT_TRUE(c.recv(&in, sizeof in, (r + n - 1) % n, 7).ok());
        ASSERT_TRUE(s->wait().ok());
        EXPECT_EQ(in, (r + n - 1) % n);
      }
    });
  }
}

// all_to_all_v at 1-4 ranks: uneven splits, a rank sending nothing, nobody
// sending, large blocks, the base class's default, bad arguments.
TEST(GlooCommunicator, AllToAllVForSizes1To4) {
  auto server = StoreServer::start("127.0.0.1", 0);
  ASSERT_TRUE(server.ok());
  for (int n = 1; n <= 4; n++) {
    run_ranks((*server)->port(), n, "a2a" + std::to_string(n) + "/", [](int, Communicator& c) {
      namespace a2a = a2a_test;
      for (bool use_default : {false, true}) {
        for (int64_t gap : {0, 3}) {
          a2a::check<float>(c, ElemType::kF32, a2a::uneven, gap, use_default, "uneven f32");
          a2a::check<int32_t>(c, ElemType::kI32, a2a::rank1_silent, gap, use_default, "rank 1 silent i32");
          a2a::check<uint64_t>(c, ElemType::kU64, a2a::all_empty, gap, use_default, "empty u64");
        }
        a2a::check<float>(c, ElemType::kF32, a2a::large, 1, use_default, "large f32");
      }
      a2a::check_bad_arguments(c);
      a2a::check<float>(c, ElemType::kF32, a2a::uneven, 1, false, "after the errors");
    });
  }
}

// A rank that leaves (its communicator destroyed, as a killed process's
// sockets close) fails its peers' next collective quickly, well before the
// deadline, with an error naming the operation; later operations fail at
// once.
TEST(GlooCommunicator, PeerGoneFailsFastAndBreaksTheCommunicator) {
  auto server = StoreServer::start("127.0.0.1", 0);
  ASSERT_TRUE(server.ok());
  run_ranks(
      (*server)->port(), 3, "gone/",
      [](int r, Communicator& c) {
        std::vector<float> x(1 << 16, 1.0f);
        ASSERT_TRUE(c.all_reduce(x.data(), x.size()).ok());
        if (r == 2) return;  // leaves: its communicator is destroyed
        const auto t0 = std::chrono::steady_clock::now();
        Status s = c.all_reduce(x.data(), x.size());
        const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        ASSERT_FALSE(s.ok());
        EXPECT_EQ(s.code(), StatusCode::kUnavailable);
        EXPECT_NE(s.message().find("all_reduce #2"), std::string::npos) << s.message();
        EXPECT_LT(waited, 30.0) << s.message();  // the deadline is 60 s
        Status again = c.barrier();
        EXPECT_NE(again.message().find("broke earlier"), std::string::npos) << again.message();
      },
      milliseconds(60000));
}

// A send whose bytes are still queued on the socket when its peer leaves
// fails when the connection does, not at its deadline: Gloo (Debian 12's
// 2022 snapshot, and upstream) wakes the waits of every queued operation
// on a broken connection except the unbound buffers' sends queued for the
// socket, so such a send waited out parallel.timeout (CI: a survivor 30 s
// in an all-reduce after its peer was killed, cli.elastic_store_lost).
// Rank 0 receives 512 MiB and leaves half way; rank 1 must fail fast.
TEST(GlooCommunicator, SendCutOffMidTransferFailsFast) {
  auto server = StoreServer::start("127.0.0.1", 0);
  ASSERT_TRUE(server.ok());
  const int64_t bytes = int64_t{512} << 20;
  std::vector<char> in(bytes), out(bytes, 1);
  for (int round = 0; round < 2; round++)
    run_ranks(
        (*server)->port(), 2, "cut" + std::to_string(round) + "/",
        [&](int r, Communicator& c) {
          ASSERT_TRUE(c.barrier().ok());
          if (r == 0) {  // posts its receive, takes some of it, leaves
            auto w = c.recv_async(in.data(), bytes, 1, 5);
            std::this_thread::sleep_for(milliseconds(20));
            return;
          }
          const auto t0 = std::chrono::steady_clock::now();
          Status s = c.send(out.data(), bytes, 0, 5);
          const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          ASSERT_FALSE(s.ok()) << "the 512 MiB went through in " << waited << " s: nothing was cut off";
          EXPECT_LT(waited, 5.0) << s.message();  // the deadline is 20 s
          EXPECT_EQ(s.message().find("Timed out"), std::string::npos) << s.message();
        },
        milliseconds(20000));
}

// A deadline names the rank this one waited on (Gloo's own message names
// none): rank 1 of 2 never joins the all-reduce; rank 0 receives from it.
// The connect has its own deadline, apart from the collectives'.
TEST(GlooCommunicator, DeadlineNamesTheSilentPeer) {
  auto server = StoreServer::start("127.0.0.1", 0);
  ASSERT_TRUE(server.ok());
  std::atomic<bool> done{false};
  std::vector<std::thread> ts;
  for (int r = 0; r < 2; r++)
    ts.emplace_back([&, r] {
      auto c = client((*server)->port());
      CommOptions o;
      o.timeout = milliseconds(500);
      GlooConnect connect;
      connect.timeout = milliseconds(20000);
      connect.names = {"hostA:100", "hostB:200"};
      auto comm = make_gloo_communicator(*c, "silent/", r, 2, "127.0.0.1", o, "dp", connect);
      ASSERT_TRUE(comm.ok()) << comm.status().message();
      if (r == 1) {  // silent until rank 0 gave up
        while (!done) std::this_thread::sleep_for(milliseconds(10));
        return;
      }
      std::vector<float> x(1000, 1.0f);
      Status s = (*comm)->all_reduce(x.data(), x.size());
      done = true;
      ASSERT_FALSE(s.ok());
      EXPECT_EQ(s.code(), StatusCode::kUnavailable);
      EXPECT_NE(s.message().find("failed on rank 0 (hostA:100) of 2 (peers 1 (hostB:200)"), std::string::npos)
          << s.message();
      EXPECT_NE(s.message().find("Timed out"), std::string::npos) << s.message();
      EXPECT_NE(s.message().find("waited on rank 1 (hostB:200)"), std::string::npos) << s.message();
      EXPECT_EQ(s.message().find('\n'), std::string::npos) << s.message();
    });
  for (auto& t : ts) t.join();
}

}  // namespace
}  // namespace tessera::comm
