// Communicator::all_to_all_v on the MPI communicator (MPI_Ialltoallv) and
// the base class's default (send/recv), at 2-4 ranks: uneven splits, zero
// counts, a rank that sends nothing, nobody sending, f32/i32/u64, large
// blocks, the count-limit path, the traffic it accounts, bad arguments.
#include <cstdint>

#include <gtest/gtest.h>

#include "all_to_all_cases.h"
#include "comm/mpi/mpi_communicator.h"
#include "comm/traffic.h"
#include "mpi_test_env.h"

namespace tessera::comm {
namespace {

using mpi_test::test_world;
namespace a2a = a2a_test;

void check_every_layout(bool use_default) {
  Communicator& c = test_world();
  for (int64_t gap : {0, 3}) {
    a2a::check<float>(c, ElemType::kF32, a2a::uneven, gap, use_default, "uneven f32");
    a2a::check<int32_t>(c, ElemType::kI32, a2a::rank1_silent, gap, use_default, "rank 1 silent i32");
    a2a::check<uint64_t>(c, ElemType::kU64, a2a::all_empty, gap, use_default, "empty u64");
  }
  a2a::check<float>(c, ElemType::kF32, a2a::large, 1, use_default, "large f32");
}

TEST(MpiAllToAll, UnevenEmptyAndLarge) { check_every_layout(false); }

TEST(MpiAllToAll, DefaultFromSendRecv) { check_every_layout(true); }

TEST(MpiAllToAll, OverTheCountLimit) {
  // Counts and displacements beyond the limit of one MPI call (int) take the
  // chunked path; lowered here so small buffers exercise it.
  const int64_t saved = mpi_chunk_limit();
  set_mpi_chunk_limit_for_testing(5);
  Communicator& c = test_world();
  a2a::check<float>(c, ElemType::kF32, a2a::uneven, 4, false, "uneven over the limit");
  a2a::check<int32_t>(c, ElemType::kI32, a2a::rank1_silent, 0, false, "rank 1 silent over the limit");
  a2a::check<float>(c, ElemType::kF32, a2a::all_empty, 0, false, "empty over the limit");
  set_mpi_chunk_limit_for_testing(saved);
}

TEST(MpiAllToAll, AsyncOpsInFlightTogether) {
  Communicator& c = test_world();
  const int n = c.size(), me = c.rank();
  std::vector<int64_t> counts(n, 3), displs(n);
  for (int p = 0; p < n; p++) displs[p] = 3 * p;
  std::vector<float> a(3 * n), b(3 * n), ra(3 * n), rb(3 * n);
  for (int i = 0; i < 3 * n; i++) a[i] = static_cast<float>(me * 100 + i), b[i] = -a[i];
  auto wa = c.all_to_all_v_async(a.data(), counts, displs, ra.data(), counts, displs, ElemType::kF32);
  auto wb = c.all_to_all_v_async(b.data(), counts, displs, rb.data(), counts, displs, ElemType::kF32);
  Status sb = wb->wait(), sa = wa->wait();
  ASSERT_TRUE(sa.ok()) << sa.message();
  ASSERT_TRUE(sb.ok()) << sb.message();
  for (int p = 0; p < n; p++)
    for (int j = 0; j < 3; j++) {
      EXPECT_EQ(ra[3 * p + j], static_cast<float>(p * 100 + 3 * me + j));
      EXPECT_EQ(rb[3 * p + j], -static_cast<float>(p * 100 + 3 * me + j));
    }
}

TEST(MpiAllToAll, TrafficIsExactPerPeer) {
  Communicator& c = test_world();
  const int n = c.size(), me = c.rank();
  const Traffic::Snapshot before = traffic().snapshot();
  a2a::check<float>(c, ElemType::kF32, a2a::uneven, 0, false, "uneven f32 (traffic)");
  const Traffic::Snapshot after = traffic().snapshot();
  const auto& kb = before.kinds[static_cast<int>(OpKind::kAllToAll)];
  const auto& ka = after.kinds[static_cast<int>(OpKind::kAllToAll)];
  EXPECT_EQ(ka.ops - kb.ops, 1u);
  double bus = 0;
  for (int p = 0; p < n; p++)
    if (p != me) bus += 4.0 * a2a::uneven(me, p);
  EXPECT_EQ(ka.bus_bytes - kb.bus_bytes, bus);
  auto bytes_of = [](const Traffic::Snapshot& s, int peer) {
    for (const Traffic::PeerBytes& b : s.peers)
      if (b.peer == peer) return b;
    return Traffic::PeerBytes{peer, 0, 0};
  };
  for (int p = 0; p < n; p++) {
    if (p == me) continue;
    SCOPED_TRACE(fmt::format("peer {}", p));
    EXPECT_EQ(bytes_of(after, p).sent - bytes_of(before, p).sent, 4u * a2a::uneven(me, p));
    EXPECT_EQ(bytes_of(after, p).received - bytes_of(before, p).received, 4u * a2a::uneven(p, me));
  }
}

TEST(MpiAllToAll, BadArgumentsAreErrors) {
  a2a::check_bad_arguments(test_world());
  // The communicator still works afterwards.
  a2a::check<float>(test_world(), ElemType::kF32, a2a::uneven, 1, false, "after the errors");
}

}  // namespace
}  // namespace tessera::comm
