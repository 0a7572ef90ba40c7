// all_to_all_v cases shared by the MPI (tests/comm/mpi_all_to_all.cc, 2-4
// ranks under mpirun) and Gloo (threads over a store) tests. Every rank
// knows the whole exchange: rank s sends count(s, d) elements to rank d, the
// j-th being value(s, d, j), so each rank checks what it received and that
// the gaps between its receive blocks are untouched.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "comm/communicator.h"

namespace tessera::comm::a2a_test {

// How many elements rank s sends to rank d.
using CountFn = std::function<int64_t(int s, int d)>;

// Uneven (zeros included), every rank sending something.
inline int64_t uneven(int s, int d) { return (s * 3 + d * 5 + 1) % 7; }
// Like uneven, but rank 1 sends nothing to anyone (itself included).
inline int64_t rank1_silent(int s, int d) { return s == 1 ? 0 : (s * 3 + d * 5 + 2) % 6 + 1; }
// Nobody sends anything.
inline int64_t all_empty(int, int) { return 0; }
// Large and uneven: about 2^18-2^19 elements per pair.
inline int64_t large(int s, int d) { return (int64_t{1} << 18) + 4099 * (s + 2 * d); }

template <typename T>
T value(int s, int d, int64_t j) {
  return static_cast<T>(s * 1000003 + d * 10007 + j % 9973);  // below 2^24: exact in float
}

// Displacements: blocks in reverse peer order with a gap of `gap` elements
// before each, so displacements are neither packed nor increasing.
inline std::vector<int64_t> displs_for(const std::vector<int64_t>& counts, int64_t gap, int64_t* total) {
  std::vector<int64_t> d(counts.size());
  int64_t off = 0;
  for (size_t i = counts.size(); i-- > 0;) {
    off += gap;
    d[i] = off;
    off += counts[i];
  }
  *total = off + gap;
  return d;
}

// Runs one all_to_all_v (the backend's, or the base class's default when
// use_default) and checks it; every rank of c must call it.
template <typename T>
void check(Communicator& c, ElemType type, const CountFn& count, int64_t gap, bool use_default,
           const std::string& name) {
  const int n = c.size(), me = c.rank();
  SCOPED_TRACE(fmt::format("all_to_all_v {} ({} ranks, gap {}{})", name, n, gap, use_default ? ", default" : ""));
  std::vector<int64_t> sc(n), rc(n);
  for (int p = 0; p < n; p++) sc[p] = count(me, p), rc[p] = count(p, me);
  int64_t send_total = 0, recv_total = 0;
  const std::vector<int64_t> sd = displs_for(sc, gap, &send_total), rd = displs_for(rc, gap, &recv_total);
  const T kSentinel = static_cast<T>(-7);
  std::vector<T> send(send_total, kSentinel), recv(recv_total, kSentinel);
  for (int p = 0; p < n; p++)
    for (int64_t j = 0; j < sc[p]; j++) send[sd[p] + j] = value<T>(me, p, j);
  const void* sp = send_total ? send.data() : nullptr;
  void* rp = recv_total ? recv.data() : nullptr;
  Status st = use_default ? c.Communicator::all_to_all_v_async(sp, sc, sd, rp, rc, rd, type)->wait()
                          : c.all_to_all_v(sp, sc, sd, rp, rc, rd, type);
  ASSERT_TRUE(st.ok()) << st.message();
  std::vector<T> want(recv_total, kSentinel);
  for (int p = 0; p < n; p++)
    for (int64_t j = 0; j < rc[p]; j++) want[rd[p] + j] = value<T>(p, me, j);
  int64_t wrong = 0, first = -1;
  for (int64_t i = 0; i < recv_total; i++)
    if (recv[i] != want[i]) wrong++, first = first < 0 ? i : first;
  EXPECT_EQ(wrong, 0) << "first wrong element " << first << ": got " << +recv[first] << ", want " << +want[first];
}

// Every way of passing bad arguments that a rank can see by itself; every
// rank passes the same bad arguments, so nothing is posted anywhere.
inline void check_bad_arguments(Communicator& c) {
  const int n = c.size();
  std::vector<float> buf(4 * n, 0.0f);
  const std::vector<int64_t> ones(n, 1);
  std::vector<int64_t> displs(n);
  for (int p = 0; p < n; p++) displs[p] = p;
  const std::vector<int64_t> short_counts(n - 1, 1), long_displs(n + 1, 0);
  auto expect_error = [&](const Status& st, const std::string& names) {
    ASSERT_FALSE(st.ok()) << "wanted an error naming " << names;
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.message();
    EXPECT_NE(st.message().find(names), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("all_to_all_v"), std::string::npos) << st.message();
  };
  expect_error(c.all_to_all_v(buf.data(), short_counts, displs, buf.data() + 2 * n, ones, displs, ElemType::kF32),
               fmt::format("send_counts has {} entries, expected {}", n - 1, n));
  expect_error(c.all_to_all_v(buf.data(), ones, displs, buf.data() + 2 * n, ones, long_displs, ElemType::kF32),
               fmt::format("recv_displs has {} entries, expected {}", n + 1, n));
  std::vector<int64_t> negative = ones;
  negative[n - 1] = -3;
  expect_error(c.all_to_all_v(buf.data(), ones, displs, buf.data() + 2 * n, negative, displs, ElemType::kF32),
               fmt::format("recv_counts[{}] = -3 is negative", n - 1));
  expect_error(c.all_to_all_v(nullptr, ones, displs, buf.data(), ones, displs, ElemType::kF32),
               "send is null but send_counts[0] = 1");
}

}  // namespace tessera::comm::a2a_test
