// The single-process communicator (runs without mpirun): every collective is
// a local copy, send/recv to self match by tag in posting order, and what
// cannot work on one rank fails with a clear Status instead of hanging.
#include <cstring>
#include <vector>

#include <gtest/gtest.h>

#include "all_to_all_cases.h"
#include "comm/local/self_communicator.h"
#include "comm/mpi/mpi_communicator.h"

namespace tessera::comm {
namespace {

TEST(SelfCommunicator, IsOneRank) {
  auto c = self_communicator();
  EXPECT_EQ(c->rank(), 0);
  EXPECT_EQ(c->size(), 1);
  EXPECT_EQ(c->name(), "self");
  EXPECT_EQ(c->world_rank_of(0), 0);
  EXPECT_TRUE(c->barrier().ok());
}

TEST(SelfCommunicator, CollectivesCopyOrLeaveInPlace) {
  auto c = self_communicator();
  std::vector<float> a = {1, 2, 3}, b(3, 0);
  ASSERT_TRUE(c->all_reduce(a.data(), b.data(), 3, ElemType::kF32, ReduceOp::kMax).ok());
  EXPECT_EQ(b, a);
  ASSERT_TRUE(c->all_reduce(a.data(), 3).ok());
  EXPECT_EQ(a, (std::vector<float>{1, 2, 3}));
  std::fill(b.begin(), b.end(), 0.0f);
  ASSERT_TRUE(c->reduce_scatter(a.data(), b.data(), 3, ElemType::kF32).ok());
  EXPECT_EQ(b, a);
  std::fill(b.begin(), b.end(), 0.0f);
  ASSERT_TRUE(c->all_gather(a.data(), b.data(), 3, ElemType::kF32).ok());
  EXPECT_EQ(b, a);
  ASSERT_TRUE(c->broadcast(a.data(), 3, ElemType::kF32, 0).ok());
  EXPECT_TRUE(c->all_reduce(nullptr, nullptr, 0, ElemType::kU64).ok());
}

TEST(SelfCommunicator, AllToAllVCopiesItsOwnBlock) {
  auto c = self_communicator();
  for (int64_t gap : {0, 2}) {
    a2a_test::check<float>(*c, ElemType::kF32, a2a_test::uneven, gap, false, "self");
    a2a_test::check<float>(*c, ElemType::kF32, a2a_test::all_empty, gap, false, "self, empty");
  }
  a2a_test::check_bad_arguments(*c);
  // Its own block must be received as sent.
  float x = 1, y = 0;
  Status st = c->all_to_all_v(&x, {1}, {0}, &y, {2}, {0}, ElemType::kF32);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("send_counts[0] = 1 but recv_counts[0] = 2"), std::string::npos) << st.message();
}

TEST(SelfCommunicator, SendRecvToSelfMatchByTag) {
  auto c = self_communicator();
  int32_t x = 5, y = 6, got_x = 0, got_y = 0;
  auto ry = c->recv_async(&got_y, 4, 0, 2);  // posted before its send
  EXPECT_FALSE(ry->test());
  ASSERT_TRUE(c->send(&x, 4, 0, 1).ok());  // queued until received
  ASSERT_TRUE(c->send(&y, 4, 0, 2).ok());
  ASSERT_TRUE(ry->wait().ok());
  ASSERT_TRUE(c->recv(&got_x, 4, 0, 1).ok());
  EXPECT_EQ(got_x, 5);
  EXPECT_EQ(got_y, 6);
}

TEST(SelfCommunicator, WhatNeedsAnotherRankFailsClearly) {
  auto c = self_communicator();
  int32_t v = 0;
  Status st = c->recv(&v, 4, 0, 3);
  EXPECT_EQ(st.code(), StatusCode::kUnavailable);
  EXPECT_NE(st.message().find("no matching send"), std::string::npos) << st.message();
  EXPECT_EQ(c->send(&v, 4, 1, 0).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(c->broadcast(&v, 1, ElemType::kI32, 1).code(), StatusCode::kInvalidArgument);
  int64_t big = 1;
  ASSERT_TRUE(c->send(&big, 8, 0, 4).ok());
  EXPECT_EQ(c->recv(&v, 4, 0, 4).code(), StatusCode::kInvalidArgument);  // truncated
}

TEST(SelfCommunicator, SplitGivesANamedSelf) {
  auto c = self_communicator();
  auto sub = c->split(3, 0, "tp");
  ASSERT_TRUE(sub.ok());
  EXPECT_EQ((*sub)->name(), "tp");
  EXPECT_EQ((*sub)->size(), 1);
  EXPECT_FALSE(c->split(-1, 0, "bad").ok());
}

TEST(WorldCommunicator, WithoutALauncherIsSelf) {
  if (launched_under_mpi()) GTEST_SKIP() << "running under an MPI launcher";
  auto w = world_communicator();
  ASSERT_TRUE(w.ok());
  EXPECT_EQ((*w)->size(), 1);
  EXPECT_EQ((*w)->name(), "self");
}

TEST(ElemType, SizesAndNames) {
  EXPECT_EQ(elem_size(ElemType::kF32), 4u);
  EXPECT_EQ(elem_size(ElemType::kF64), 8u);
  EXPECT_EQ(elem_size(ElemType::kI32), 4u);
  EXPECT_EQ(elem_size(ElemType::kI64), 8u);
  EXPECT_EQ(elem_size(ElemType::kU64), 8u);
  EXPECT_EQ(elem_size(ElemType::kU8), 1u);
  EXPECT_STREQ(elem_name(ElemType::kF32), "float");
  EXPECT_STREQ(elem_name(ElemType::kU64), "uint64");
}

}  // namespace
}  // namespace tessera::comm
