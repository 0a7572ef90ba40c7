#include "comm/traffic.h"

#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace tessera::comm {
namespace {

uint64_t sent_to(const Traffic::Snapshot& s, int peer) {
  for (const auto& p : s.peers)
    if (p.peer == peer) return p.sent;
  return 0;
}
uint64_t received_from(const Traffic::Snapshot& s, int peer) {
  for (const auto& p : s.peers)
    if (p.peer == peer) return p.received;
  return 0;
}

TEST(Traffic, BusFactorsFollowNcclTests) {
  EXPECT_DOUBLE_EQ(bus_factor(OpKind::kAllReduce, 4), 1.5);
  EXPECT_DOUBLE_EQ(bus_factor(OpKind::kAllReduce, 2), 1.0);
  EXPECT_DOUBLE_EQ(bus_factor(OpKind::kReduceScatter, 4), 0.75);
  EXPECT_DOUBLE_EQ(bus_factor(OpKind::kAllGather, 4), 0.75);
  EXPECT_DOUBLE_EQ(bus_factor(OpKind::kBroadcast, 4), 1.0);
  EXPECT_DOUBLE_EQ(bus_factor(OpKind::kSendRecv, 2), 1.0);
  EXPECT_DOUBLE_EQ(bus_factor(OpKind::kAllReduce, 1), 0.0);
  EXPECT_STREQ(op_kind_name(OpKind::kReduceScatter), "reduce_scatter");
}

TEST(Traffic, RingAllReduceSendsToTheNextAndReceivesFromThePrevious) {
  Traffic t;
  t.set_world_size(8);
  // Rank 1 of a communicator over world ranks {2, 4, 6, 0}: next 6, previous 2.
  t.account_collective(OpKind::kAllReduce, 4000, 1, {2, 4, 6, 0});
  t.op_finished(OpKind::kAllReduce);
  const Traffic::Snapshot s = t.snapshot();
  EXPECT_EQ(sent_to(s, 6), 6000u);  // 2(n-1)/n * S
  EXPECT_EQ(received_from(s, 2), 6000u);
  EXPECT_EQ(sent_to(s, 2), 0u);
  EXPECT_EQ(s.peers.size(), 2u);
  EXPECT_EQ(s.kinds[0].ops, 1u);
  EXPECT_DOUBLE_EQ(s.kinds[0].bus_bytes, 6000.0);
}

TEST(Traffic, TwoRanksExchangeWithTheOtherOnly) {
  Traffic t;
  t.set_world_size(2);
  t.account_collective(OpKind::kAllGather, 1000, 0, {0, 1});
  t.op_finished(OpKind::kAllGather);
  const Traffic::Snapshot s = t.snapshot();
  EXPECT_EQ(sent_to(s, 1), 500u);
  EXPECT_EQ(received_from(s, 1), 500u);
}

TEST(Traffic, BroadcastIsAChainFromTheRoot) {
  Traffic t;
  t.set_world_size(3);
  // Root 2: the chain is 2 -> 0 -> 1; rank 0 receives from 2 and sends to 1.
  t.account_collective(OpKind::kBroadcast, 100, 0, {0, 1, 2}, /*root=*/2);
  t.op_finished(OpKind::kBroadcast);
  Traffic::Snapshot s = t.snapshot();
  EXPECT_EQ(received_from(s, 2), 100u);
  EXPECT_EQ(sent_to(s, 1), 100u);
  // The last of the chain only receives.
  Traffic last;
  last.set_world_size(3);
  last.account_collective(OpKind::kBroadcast, 100, 1, {0, 1, 2}, 2);
  last.op_finished(OpKind::kBroadcast);
  s = last.snapshot();
  EXPECT_EQ(received_from(s, 0), 100u);
  EXPECT_EQ(sent_to(s, 2), 0u);
}

TEST(Traffic, SingleRankMovesNothing) {
  Traffic t;
  t.set_world_size(1);
  t.account_collective(OpKind::kAllReduce, 1 << 20, 0, {0});
  t.op_finished(OpKind::kAllReduce);
  const Traffic::Snapshot s = t.snapshot();
  EXPECT_TRUE(s.peers.empty());
  EXPECT_DOUBLE_EQ(s.kinds[0].bus_bytes, 0.0);
}

TEST(Traffic, PeersOutsideTheWorldAreIgnored) {
  Traffic t;
  t.set_world_size(2);
  t.add_peer_bytes(5, 10, 10);
  t.add_peer_bytes(-1, 10, 10);
  EXPECT_TRUE(t.snapshot().peers.empty());
}

TEST(Traffic, OverlappingOperationsCountTheirBusyTimeOnce) {
  Traffic t;
  t.op_posted(OpKind::kAllReduce, 1000);
  t.op_posted(OpKind::kAllReduce, 1000);  // queued behind the first
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  t.op_finished(OpKind::kAllReduce);
  t.op_finished(OpKind::kAllReduce);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // idle: not busy
  const Traffic::Snapshot s = t.snapshot();
  EXPECT_GE(s.kinds[0].busy_seconds, 0.045);
  EXPECT_LT(s.kinds[0].busy_seconds, 0.095);  // not 2 x 50 ms, nor the idle time after
}

TEST(Traffic, DeltaGivesBusBandwidthOverBusyTime) {
  Traffic t;
  const Traffic::Snapshot before = t.snapshot();
  t.op_posted(OpKind::kAllReduce, 2e6);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  t.op_finished(OpKind::kAllReduce);
  const TrafficDelta d = traffic_delta(before, t.snapshot());
  EXPECT_DOUBLE_EQ(d.bus_bytes[0], 2e6);
  EXPECT_GT(d.busbw[0], 0.0);
  EXPECT_LE(d.busbw[0], 2e6 / 0.02);
  EXPECT_DOUBLE_EQ(d.busbw[1], 0.0);  // no reduce_scatter: no figure
}

TEST(Traffic, AnOpenIntervalCountsUpToTheSnapshot) {
  Traffic t;
  t.op_posted(OpKind::kSendRecv, 10);
  std::this_thread::sleep_for(std::chrono::milliseconds(10));
  const double open = t.snapshot().kinds[4].busy_seconds;
  EXPECT_GT(open, 0.005);
  t.op_finished(OpKind::kSendRecv);
  EXPECT_GE(t.snapshot().kinds[4].busy_seconds, open);
}

// The hot path's cost: what an all-reduce of a gradient bucket adds to its
// posting and completion (docs/performance.md, "Network accounting").
TEST(Traffic, AccountingAnOperationCostsUnderAMicrosecond) {
  constexpr int kOps = 200'000;
  Traffic t;
  t.set_world_size(4);
  const std::vector<int> ranks = {0, 1, 2, 3};
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < kOps; i++) {
    t.account_collective(OpKind::kAllReduce, 1 << 20, 1, ranks);
    t.op_finished(OpKind::kAllReduce);
  }
  const double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() / kOps;
  std::printf("accounting an all-reduce (post and completion): %.1f ns\n", ns);
  EXPECT_LT(ns, 5000.0);  // generous: a loaded machine
  EXPECT_EQ(t.snapshot().kinds[0].ops, static_cast<uint64_t>(kOps));
}

}  // namespace
}  // namespace tessera::comm
