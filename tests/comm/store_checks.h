// Checks every rendezvous store (comm::Store) must pass, shared by the
// Redis and etcd tests (each starts its own server process): set/get/add/
// wait semantics, atomic adds from several clients, and Gloo ranks meeting
// through the store. `connect` makes a new client (null after reporting a
// failure).
#pragma once

#include <algorithm>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "comm/gloo/gloo_communicator.h"
#include "comm/rendezvous/store.h"
#include "ports.h"

namespace tessera::comm::testing {

using ConnectStore = std::function<std::unique_ptr<Store>()>;

using testing_util::ClosedPort;
using testing_util::free_port;

// Binary-safe set/get, NotFound, add (0 reads), address(), and a wait that a
// second client's later set ends, or that names the missing key.
inline void check_set_get_add_wait(const ConnectStore& connect, Store& c, const std::string& address) {
  using std::chrono::milliseconds;
  ASSERT_TRUE(c.set("job/a", std::string("x\0y", 3)).ok());
  EXPECT_EQ(c.get("job/a").value(), std::string("x\0y", 3));
  EXPECT_EQ(c.get("job/missing").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(c.add("job/n", 1).value(), 1);
  EXPECT_EQ(c.add("job/n", 5).value(), 6);
  EXPECT_EQ(c.add("job/n", 0).value(), 6);
  EXPECT_EQ(c.add("job/fresh", 0).value(), 0);
  EXPECT_EQ(c.address(), address);
  EXPECT_EQ(c.local_address(), "127.0.0.1");
  std::thread later([&] {
    std::this_thread::sleep_for(milliseconds(50));
    auto c2 = connect();
    if (c2) {
      EXPECT_TRUE(c2->set("job/late", "1").ok());
    }
  });
  EXPECT_TRUE(c.wait({"job/a", "job/late"}, milliseconds(5000)).ok());
  later.join();
  Status s = c.wait({"job/never"}, milliseconds(50));
  EXPECT_EQ(s.code(), StatusCode::kUnavailable);
  EXPECT_NE(s.message().find("job/never"), std::string::npos) << s.message();
}

// 4 clients add 1 `per_client` times each: every value 1..4*per_client is
// handed out exactly once.
inline void check_concurrent_adds(const ConnectStore& connect, int per_client) {
  std::vector<std::thread> ts;
  std::vector<std::vector<int64_t>> got(4);
  for (int t = 0; t < 4; t++)
    ts.emplace_back([&, t] {
      auto c = connect();
      if (!c) return;
      for (int i = 0; i < per_client; i++) got[t].push_back(c->add("job/count", 1).value());
    });
  for (auto& t : ts) t.join();
  std::vector<int64_t> all;
  for (auto& g : got) all.insert(all.end(), g.begin(), g.end());
  std::sort(all.begin(), all.end());
  ASSERT_EQ(all.size(), static_cast<size_t>(4 * per_client));
  for (int i = 0; i < 4 * per_client; i++) EXPECT_EQ(all[i], i + 1);  // every slot handed out once
}

// 3 Gloo ranks rendezvous through the store and all-reduce 1 + 2 + 3.
inline void check_gloo_ranks_meet(const ConnectStore& connect) {
  const int n = 3;
  std::vector<std::thread> ts;
  std::vector<float> sums(n);
  for (int r = 0; r < n; r++)
    ts.emplace_back([&, r] {
      auto c = connect();
      if (!c) return;
      CommOptions o;
      o.timeout = std::chrono::milliseconds(20000);
      auto comm = make_gloo_communicator(*c, "job/r0/gloo/", r, n, c->local_address(), o);
      ASSERT_TRUE(comm.ok()) << comm.status().message();
      float x = static_cast<float>(r + 1);
      ASSERT_TRUE((*comm)->all_reduce(&x, &x, 1, ElemType::kF32).ok());
      sums[r] = x;
    });
  for (auto& t : ts) t.join();
  for (int r = 0; r < n; r++) EXPECT_EQ(sums[r], 6.0f);
}

}  // namespace tessera::comm::testing
