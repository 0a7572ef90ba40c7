// What a rank sees when a peer is late or wrong: a wait that ends at the
// communicator's deadline with Status::Unavailable naming the operation and
// the peers, MPI errors as Status, bad arguments as InvalidArgument. Each
// test brings the ranks back in step before it ends, so nothing is left
// pending at MPI_Finalize.
#include <chrono>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "comm/mpi/mpi_communicator.h"
#include "mpi_test_env.h"

namespace tessera::comm {
namespace {

using mpi_test::test_world;
using Clock = std::chrono::steady_clock;

constexpr auto kShortTimeout = std::chrono::milliseconds(1000);

// A communicator over the whole world named "deadline" with a 1 s timeout.
std::unique_ptr<Communicator> short_deadline_world() {
  CommOptions options;
  options.timeout = kShortTimeout;
  auto world = mpi_world(options);
  EXPECT_TRUE(world.ok()) << world.status().message();
  auto sub = (*world)->split(0, (*world)->rank(), "deadline");
  EXPECT_TRUE(sub.ok()) << sub.status().message();
  return std::move(sub).value();
}

// Waits until w completes, re-arming the deadline a few times (the op is
// still posted after a timeout).
Status wait_patiently(Work& w) {
  Status st;
  for (int i = 0; i < 8; i++) {
    st = w.wait();
    if (st.code() != StatusCode::kUnavailable) return st;
  }
  return st;
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

TEST(MpiDeadline, CollectiveWithALatePeerTimesOutNamingIt) {
  auto c = short_deadline_world();
  ASSERT_TRUE(c != nullptr);
  const int r = c->rank(), n = c->size();
  std::vector<float> data(1009);
  for (int i = 0; i < 1009; i++) data[i] = float(r + i % 3);
  // Rank 1 posts late: 1.5 s past rank 0's 1 s deadline, so rank 0 still
  // times out when it reaches this line later than rank 1 (a loaded machine).
  if (r == 1) std::this_thread::sleep_for(std::chrono::milliseconds(2500));
  const auto t0 = Clock::now();
  auto w = c->all_reduce_async(data.data(), data.data(), 1009, ElemType::kF32, ReduceOp::kSum);
  Status first = w->wait();
  const double waited = std::chrono::duration<double>(Clock::now() - t0).count();
  if (r == 0) {
    ASSERT_EQ(first.code(), StatusCode::kUnavailable) << first.message();
    EXPECT_GE(waited, 0.9);
    EXPECT_LE(waited, 3.0);
    const std::string& m = first.message();
    EXPECT_TRUE(contains(m, "all_reduce #")) << m;
    EXPECT_TRUE(contains(m, "(1009 x float)")) << m;
    EXPECT_TRUE(contains(m, "communicator 'deadline'")) << m;
    EXPECT_TRUE(contains(m, fmt::format("[world ranks 0-{}]", n - 1))) << m;
    EXPECT_TRUE(contains(m, "timed out after 1.0 s")) << m;
    EXPECT_TRUE(contains(m, "waiting on peers [1")) << m;
    EXPECT_TRUE(contains(m, "(rank 0 on ")) << m;
    EXPECT_TRUE(contains(m, " on host")) << m;  // the peers' host names
  }
  // The late rank arrives: the same Work completes with the right sum.
  Status done = first.ok() ? first : wait_patiently(*w);
  ASSERT_TRUE(done.ok()) << done.message();
  int expect_sum_of_ranks = n * (n - 1) / 2;
  for (int i = 0; i < 1009; i++) ASSERT_EQ(data[i], float(expect_sum_of_ranks + n * (i % 3))) << i;
  EXPECT_TRUE(c->barrier().ok());
}

TEST(MpiDeadline, RecvFromALateSenderNamesExactlyThatPeer) {
  auto c = short_deadline_world();
  ASSERT_TRUE(c != nullptr);
  const int r = c->rank();
  int64_t value = 0;
  if (r == 0) {
    const auto t0 = Clock::now();
    auto w = c->recv_async(&value, 8, 1, 5);
    Status st = w->wait();
    const double waited = std::chrono::duration<double>(Clock::now() - t0).count();
    ASSERT_EQ(st.code(), StatusCode::kUnavailable) << st.message();
    EXPECT_GE(waited, 0.9);
    EXPECT_LE(waited, 3.0);
    EXPECT_TRUE(contains(st.message(), "recv #")) << st.message();
    EXPECT_TRUE(contains(st.message(), "(8 bytes)")) << st.message();
    EXPECT_TRUE(contains(st.message(), "waiting on peers [1] on host ")) << st.message();
    EXPECT_TRUE(contains(st.message(), "(rank 0 on ")) << st.message();
    st = wait_patiently(*w);
    ASSERT_TRUE(st.ok()) << st.message();
    EXPECT_EQ(value, 4242);
  } else if (r == 1) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2500));  // well past rank 0's 1 s deadline
    value = 4242;
    ASSERT_TRUE(c->send(&value, 8, 0, 5).ok());
  }
  EXPECT_TRUE(wait_patiently(*c->barrier_async()).ok());
}

// A per-operation deadline (OpOptionsScope): the communicator waits 1 s,
// one receive issued in a scope waits 0.2 s; the next, outside it, 1 s again.
TEST(MpiDeadline, AScopeSetsOneOperationsDeadline) {
  auto c = short_deadline_world();
  ASSERT_TRUE(c != nullptr);
  const int r = c->rank();
  int64_t six = 0, seven = 0;
  std::unique_ptr<Work> w6, w7;
  if (r == 0) {
    {
      OpOptionsScope quick(*c, {.timeout = std::chrono::milliseconds(200)});
      w6 = c->recv_async(&six, 8, 1, 6);
    }
    for (int i = 0; i < 2; i++) {  // the deadline it was issued with, after the scope; re-armed alike
      const auto t0 = Clock::now();
      Status st = w6->wait();
      const double waited = std::chrono::duration<double>(Clock::now() - t0).count();
      ASSERT_EQ(st.code(), StatusCode::kUnavailable) << st.message();
      EXPECT_LT(waited, 0.8);
      EXPECT_TRUE(contains(st.message(), "timed out after 0.2 s")) << st.message();
    }
    w7 = c->recv_async(&seven, 8, 1, 7);  // outside the scope: the communicator's 1 s
    const auto t0 = Clock::now();
    Status st = w7->wait();
    ASSERT_EQ(st.code(), StatusCode::kUnavailable) << st.message();
    EXPECT_GE(std::chrono::duration<double>(Clock::now() - t0).count(), 0.9);
  }
  // Rank 1 sends both once rank 0 is done waiting; the Works then complete.
  EXPECT_TRUE(wait_patiently(*c->barrier_async()).ok());
  if (r == 1) {
    const int64_t v = 11;
    ASSERT_TRUE(c->send(&v, 8, 0, 6).ok());
    ASSERT_TRUE(c->send(&v, 8, 0, 7).ok());
  } else if (r == 0) {
    ASSERT_TRUE(wait_patiently(*w6).ok());
    ASSERT_TRUE(wait_patiently(*w7).ok());
    EXPECT_EQ(six, 11);
    EXPECT_EQ(seven, 11);
  }
  EXPECT_TRUE(wait_patiently(*c->barrier_async()).ok());
}

TEST(MpiErrors, TruncatedMessageIsAStatusNotAnAbort) {
  Communicator& c = test_world();
  if (c.rank() == 1) {
    const int64_t big[1] = {7};
    ASSERT_TRUE(c.send(big, 8, 0, 11).ok());
  } else if (c.rank() == 0) {
    int32_t small = 0;
    Status st = c.recv(&small, 4, 1, 11);
    EXPECT_FALSE(st.ok());
    EXPECT_TRUE(contains(st.message(), "recv #")) << st.message();
    EXPECT_TRUE(contains(st.message(), "MPI_ERR_TRUNCATE")) << st.message();
  }
  EXPECT_TRUE(c.barrier().ok());
}

TEST(MpiErrors, BadArgumentsFailLocally) {
  Communicator& c = test_world();
  float x = 0;
  EXPECT_EQ(c.send(&x, 4, c.size(), 0).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(c.recv(&x, 4, -1, 0).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(c.send(&x, 4, 0, -3).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(c.broadcast(&x, 1, ElemType::kF32, c.size()).code(), StatusCode::kInvalidArgument);
  Status st = c.all_reduce(&x, &x, -1, ElemType::kF32);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(contains(st.message(), "all_reduce #")) << st.message();
  EXPECT_TRUE(c.barrier().ok());
}

}  // namespace
}  // namespace tessera::comm
