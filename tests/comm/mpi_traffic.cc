// comm/traffic.h over real MPI ranks: a send and a receive are counted
// exactly per peer; an all-reduce by the ring model (the bus bytes to the
// next rank, from the previous); every operation seen complete closes its
// busy interval.
#include <vector>

#include <gtest/gtest.h>

#include "comm/traffic.h"
#include "mpi_test_env.h"

namespace tessera::comm {
namespace {

using mpi_test::test_world;

Traffic::PeerBytes bytes_of(const Traffic::Snapshot& s, int peer) {
  for (const Traffic::PeerBytes& p : s.peers)
    if (p.peer == peer) return p;
  return {peer, 0, 0};
}

TEST(MpiTraffic, SendRecvIsExactPerPeer) {
  Communicator& c = test_world();
  const int n = c.size(), r = c.rank();
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  const int64_t bytes = 12345;
  std::vector<char> out(bytes, 1), in(bytes);
  const Traffic::Snapshot before = traffic().snapshot();
  auto rw = c.recv_async(in.data(), bytes, prev, 77);
  auto sw = c.send_async(out.data(), bytes, next, 77);
  ASSERT_TRUE(sw->wait().ok());
  ASSERT_TRUE(rw->wait().ok());
  const Traffic::Snapshot after = traffic().snapshot();
  EXPECT_EQ(bytes_of(after, next).sent - bytes_of(before, next).sent, static_cast<uint64_t>(bytes));
  EXPECT_EQ(bytes_of(after, prev).received - bytes_of(before, prev).received, static_cast<uint64_t>(bytes));
  const TrafficDelta d = traffic_delta(before, after);
  EXPECT_DOUBLE_EQ(d.bus_bytes[static_cast<int>(OpKind::kSendRecv)], 2.0 * bytes);
  EXPECT_GT(d.busy_seconds[static_cast<int>(OpKind::kSendRecv)], 0.0);
  ASSERT_TRUE(c.barrier().ok());
}

TEST(MpiTraffic, AllReduceIsModelledAsARing) {
  Communicator& c = test_world();
  const int n = c.size(), r = c.rank();
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  const int64_t count = 1 << 16;
  std::vector<float> x(count, 1.0f);
  const Traffic::Snapshot before = traffic().snapshot();
  ASSERT_TRUE(c.all_reduce(x.data(), count).ok());
  const Traffic::Snapshot after = traffic().snapshot();
  const uint64_t bus = static_cast<uint64_t>(4.0 * count * 2 * (n - 1) / n);
  EXPECT_EQ(bytes_of(after, next).sent - bytes_of(before, next).sent, bus);
  EXPECT_EQ(bytes_of(after, prev).received - bytes_of(before, prev).received, bus);
  const TrafficDelta d = traffic_delta(before, after);
  const int k = static_cast<int>(OpKind::kAllReduce);
  EXPECT_DOUBLE_EQ(d.bus_bytes[k], static_cast<double>(bus));
  EXPECT_GT(d.busbw[k], 0.0);
  // Nothing stays in flight: the busy time no longer grows.
  const double busy = traffic().snapshot().kinds[k].busy_seconds;
  EXPECT_DOUBLE_EQ(traffic().snapshot().kinds[k].busy_seconds, busy);
}

}  // namespace
}  // namespace tessera::comm
