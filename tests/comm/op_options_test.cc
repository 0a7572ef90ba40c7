// Per-operation deadlines (comm::OpOptionsScope, as Gloo's per-operation
// options): an operation issued inside a scope waits for the scope's
// deadline, not the communicator's; the communicator's comes back when the
// scope ends; scopes nest. On threads-as-ranks and on Gloo over a real TCP
// store; the MPI backend's case is MpiDeadline.AScopeSetsOneOperationsDeadline.
#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "comm/gloo/gloo_communicator.h"
#include "comm/local/thread_communicator.h"
#include "comm/rendezvous/tcp_store.h"

namespace tessera::comm {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

TEST(OpOptions, ScopesSetTheDeadlineOfTheOperationsIssuedInThem) {
  ThreadHub hub(2, std::chrono::seconds(20));
  ThreadCommunicator c(hub, 0);
  EXPECT_EQ(c.timeout(), std::chrono::seconds(20));
  EXPECT_EQ(c.op_timeout(), std::chrono::seconds(20));
  {
    OpOptionsScope outer(c, {.timeout = milliseconds(300)});
    EXPECT_EQ(c.op_timeout(), milliseconds(300));
    {
      OpOptionsScope inner(c, {.timeout = milliseconds(50)});
      EXPECT_EQ(c.op_timeout(), milliseconds(50));
    }
    EXPECT_EQ(c.op_timeout(), milliseconds(300));
    OpOptionsScope zero(c, {});  // 0: the communicator's own
    EXPECT_EQ(c.op_timeout(), std::chrono::seconds(20));
  }
  EXPECT_EQ(c.op_timeout(), std::chrono::seconds(20));
}

TEST(OpOptions, ARecvInAScopeEndsAtItsDeadlineAndTheNextWaitsLonger) {
  std::atomic<bool> timed_out{false};
  run_ranks(2, [&](Communicator& c) {  // a hub with a 20 s deadline
    int64_t v = 0;
    if (c.rank() == 0) {
      const auto t0 = Clock::now();
      Status st;
      {
        OpOptionsScope quick(c, {.timeout = milliseconds(200)});
        st = c.recv(&v, 8, 1, 5);  // rank 1 never sends tag 5
      }
      EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.message();
      EXPECT_NE(st.message().find("timed out after 200 ms"), std::string::npos) << st.message();
      EXPECT_LT(seconds_since(t0), 5.0);
      timed_out = true;
      // Outside the scope: the hub's deadline, well past rank 1's 0.5 s delay.
      ASSERT_TRUE(c.recv(&v, 8, 1, 6).ok());
      EXPECT_EQ(v, 77);
    } else {
      while (!timed_out) std::this_thread::sleep_for(milliseconds(10));
      std::this_thread::sleep_for(milliseconds(500));
      v = 77;
      ASSERT_TRUE(c.send(&v, 8, 0, 6).ok());
    }
  });
}

TEST(OpOptions, AGlooCollectiveInAScopeEndsAtItsDeadline) {
  auto server = StoreServer::start("127.0.0.1", 0);
  ASSERT_TRUE(server.ok()) << server.status().message();
  std::atomic<bool> done{false};
  std::vector<std::thread> ts;
  for (int r = 0; r < 2; r++)
    ts.emplace_back([&, r] {
      auto store = StoreClient::connect("127.0.0.1", (*server)->port(), milliseconds(5000));
      ASSERT_TRUE(store.ok()) << store.status().message();
      CommOptions o;
      o.timeout = std::chrono::seconds(30);
      auto comm = make_gloo_communicator(**store, "scope/", r, 2, "127.0.0.1", o);
      ASSERT_TRUE(comm.ok()) << comm.status().message();
      EXPECT_EQ((*comm)->timeout(), std::chrono::seconds(30));
      if (r == 1) {  // silent until rank 0 gave up
        while (!done) std::this_thread::sleep_for(milliseconds(10));
        return;
      }
      std::vector<float> x(100, 1.0f);
      const auto t0 = Clock::now();
      Status s;
      {
        OpOptionsScope quick(**comm, {.timeout = milliseconds(400)});
        s = (*comm)->all_reduce(x.data(), x.size());
      }
      done = true;
      EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.message();
      EXPECT_NE(s.message().find("deadline 0.4 s"), std::string::npos) << s.message();
      EXPECT_LT(seconds_since(t0), 10.0);
    });
  for (auto& t : ts) t.join();
}

}  // namespace
}  // namespace tessera::comm
