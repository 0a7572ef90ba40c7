// Every collective and send/recv of the MPI communicator against a serial
// computation: each rank fills its input with a pattern of (element, rank),
// so every rank can compute the whole expected result locally. Counts 0, 1,
// primes, counts the rank count doesn't divide, and ~2^22 floats; in place
// and out of place; f32, i32 and u64; sum, max and min.
#include <algorithm>
#include <cstdint>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "comm/mpi/mpi_communicator.h"
#include "mpi_test_env.h"

namespace tessera::comm {
namespace {

using mpi_test::test_world;

constexpr int64_t kLarge = int64_t{1} << 22;

// Rank r's element i. float: small integers (sums exact); int32: mixed sign;
// uint64: above 2^53, so a path through double would show.
template <typename T>
T pattern(int64_t i, int r);
template <>
float pattern<float>(int64_t i, int r) {
  return static_cast<float>((i * 7 + r * 13) % 61 - 30);
}
template <>
int32_t pattern<int32_t>(int64_t i, int r) {
  return static_cast<int32_t>((i * 104729 + r * 7919) % 1000003 - 500000);
}
template <>
uint64_t pattern<uint64_t>(int64_t i, int r) {
  return (static_cast<uint64_t>((i + r) % 5) << 58) + ((static_cast<uint64_t>(i) * 0x9E3779B97F4A7C15ull) >> 24) +
         static_cast<uint64_t>(r);
}

template <typename T>
constexpr ElemType elem_type();
template <>
constexpr ElemType elem_type<float>() { return ElemType::kF32; }
template <>
constexpr ElemType elem_type<int32_t>() { return ElemType::kI32; }
template <>
constexpr ElemType elem_type<uint64_t>() { return ElemType::kU64; }

template <typename T>
T reduce_all_ranks(int64_t i, int n, ReduceOp op) {
  T acc = pattern<T>(i, 0);
  for (int q = 1; q < n; q++) {
    const T v = pattern<T>(i, q);
    acc = op == ReduceOp::kSum ? static_cast<T>(acc + v) : op == ReduceOp::kMax ? std::max(acc, v) : std::min(acc, v);
  }
  return acc;
}

const char* op_name(ReduceOp op) { return op == ReduceOp::kSum ? "sum" : op == ReduceOp::kMax ? "max" : "min"; }

// Mismatches of got against want(i), with the first one described.
template <typename T, typename Want>
void expect_all(const std::vector<T>& got, int64_t n, Want want) {
  int64_t wrong = 0, first = -1;
  for (int64_t i = 0; i < n; i++) {
    if (got[i] != want(i)) {
      wrong++;
      if (first < 0) first = i;
    }
  }
  EXPECT_EQ(wrong, 0) << "first wrong element " << first << ": got " << +got[first] << ", want " << +want(first);
}

std::vector<int64_t> counts_for(int n) { return {0, 1, 7, 1009, int64_t{37} * n + 1}; }

template <typename T>
void check_all_reduce(int64_t count, ReduceOp op, bool in_place) {
  Communicator& c = test_world();
  SCOPED_TRACE(fmt::format("all_reduce {} x {} {} {}", count, elem_name(elem_type<T>()), op_name(op),
                           in_place ? "in place" : "out of place"));
  std::vector<T> send(count), recv(count, T(0));
  for (int64_t i = 0; i < count; i++) send[i] = pattern<T>(i, c.rank());
  if (in_place) recv = send;
  Status st = c.all_reduce(in_place ? recv.data() : send.data(), recv.data(), count, elem_type<T>(), op);
  ASSERT_TRUE(st.ok()) << st.message();
  expect_all(recv, count, [&](int64_t i) { return reduce_all_ranks<T>(i, c.size(), op); });
  if (!in_place) expect_all(send, count, [&](int64_t i) { return pattern<T>(i, c.rank()); });
}

template <typename T>
void check_reduce_scatter(int64_t recv_count, ReduceOp op, bool in_place) {
  Communicator& c = test_world();
  const int n = c.size(), r = c.rank();
  SCOPED_TRACE(fmt::format("reduce_scatter {} x {} {} {}", recv_count, elem_name(elem_type<T>()), op_name(op),
                           in_place ? "in place" : "out of place"));
  std::vector<T> send(n * recv_count), recv(in_place ? n * recv_count : recv_count, T(0));
  for (int64_t i = 0; i < n * recv_count; i++) send[i] = pattern<T>(i, r);
  if (in_place) recv = send;
  Status st = c.reduce_scatter(in_place ? recv.data() : send.data(), recv.data(), recv_count, elem_type<T>(), op);
  ASSERT_TRUE(st.ok()) << st.message();
  expect_all(recv, recv_count, [&](int64_t i) { return reduce_all_ranks<T>(r * recv_count + i, n, op); });
}

template <typename T>
void check_all_gather(int64_t send_count, bool in_place) {
  Communicator& c = test_world();
  const int n = c.size(), r = c.rank();
  SCOPED_TRACE(fmt::format("all_gather {} x {} {}", send_count, elem_name(elem_type<T>()),
                           in_place ? "in place" : "out of place"));
  std::vector<T> send(send_count), recv(n * send_count, T(0));
  for (int64_t i = 0; i < send_count; i++) send[i] = pattern<T>(i, r);
  if (in_place) std::copy(send.begin(), send.end(), recv.begin() + r * send_count);
  Status st = c.all_gather(in_place ? recv.data() + r * send_count : send.data(), recv.data(), send_count,
                           elem_type<T>());
  ASSERT_TRUE(st.ok()) << st.message();
  expect_all(recv, n * send_count,
             [&](int64_t i) { return pattern<T>(i % send_count, static_cast<int>(i / send_count)); });
}

template <typename T>
void check_broadcast(int64_t count, int root) {
  Communicator& c = test_world();
  SCOPED_TRACE(fmt::format("broadcast {} x {} from {}", count, elem_name(elem_type<T>()), root));
  std::vector<T> data(count, T(0));
  if (c.rank() == root)
    for (int64_t i = 0; i < count; i++) data[i] = pattern<T>(i, root);
  Status st = c.broadcast(data.data(), count, elem_type<T>(), root);
  ASSERT_TRUE(st.ok()) << st.message();
  expect_all(data, count, [&](int64_t i) { return pattern<T>(i, root); });
}

// Every rank sends to the next and receives from the previous.
void check_ring(int64_t bytes, int tag) {
  Communicator& c = test_world();
  const int n = c.size(), r = c.rank(), prev = (r + n - 1) % n;
  SCOPED_TRACE(fmt::format("send/recv ring of {} bytes, tag {}", bytes, tag));
  std::vector<uint8_t> send(bytes), recv(bytes, 0);
  for (int64_t i = 0; i < bytes; i++) send[i] = static_cast<uint8_t>(i * 31 + r);
  auto rw = c.recv_async(recv.data(), bytes, prev, tag);
  auto sw = c.send_async(send.data(), bytes, (r + 1) % n, tag);
  Status ss = sw->wait(), rs = rw->wait();
  ASSERT_TRUE(ss.ok()) << ss.message();
  ASSERT_TRUE(rs.ok()) << rs.message();
  expect_all(recv, bytes, [&](int64_t i) { return static_cast<uint8_t>(i * 31 + prev); });
}

TEST(MpiWorld, IsTheWholeJob) {
  Communicator& c = test_world();
  EXPECT_TRUE(launched_under_mpi());
  EXPECT_EQ(c.name(), "world");
  EXPECT_GE(c.size(), 2);
  for (int r = 0; r < c.size(); r++) EXPECT_EQ(c.world_rank_of(r), r);
  EXPECT_TRUE(c.barrier().ok());
}

TEST(MpiAllReduce, SumMaxMinEveryTypeAndCount) {
  for (int64_t count : counts_for(test_world().size()))
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin})
      for (bool in_place : {false, true}) {
        check_all_reduce<float>(count, op, in_place);
        check_all_reduce<int32_t>(count, op, in_place);
        check_all_reduce<uint64_t>(count, op, in_place);
      }
}

TEST(MpiAllReduce, LargeFloatSum) {
  check_all_reduce<float>(kLarge, ReduceOp::kSum, false);
  check_all_reduce<float>(kLarge, ReduceOp::kSum, true);
}

TEST(MpiAllReduce, AsyncOpsInFlightTogether) {
  Communicator& c = test_world();
  std::vector<float> a(1009), b(4099);
  for (int64_t i = 0; i < 1009; i++) a[i] = pattern<float>(i, c.rank());
  for (int64_t i = 0; i < 4099; i++) b[i] = pattern<float>(i, c.rank());
  auto wa = c.all_reduce_async(a.data(), a.data(), 1009, ElemType::kF32, ReduceOp::kSum);
  auto wb = c.all_reduce_async(b.data(), b.data(), 4099, ElemType::kF32, ReduceOp::kMax);
  while (!wa->test() || !wb->test()) {
  }
  ASSERT_TRUE(wb->wait().ok());
  ASSERT_TRUE(wa->wait().ok());
  expect_all(a, 1009, [&](int64_t i) { return reduce_all_ranks<float>(i, c.size(), ReduceOp::kSum); });
  expect_all(b, 4099, [&](int64_t i) { return reduce_all_ranks<float>(i, c.size(), ReduceOp::kMax); });
}

TEST(MpiReduceScatter, EveryTypeAndCount) {
  for (int64_t count : {0, 1, 7, 1009})
    for (bool in_place : {false, true}) {
      check_reduce_scatter<float>(count, ReduceOp::kSum, in_place);
      check_reduce_scatter<int32_t>(count, ReduceOp::kMax, in_place);
      check_reduce_scatter<uint64_t>(count, ReduceOp::kSum, in_place);
    }
  check_reduce_scatter<float>(kLarge / test_world().size(), ReduceOp::kSum, false);
  check_reduce_scatter<float>(kLarge / test_world().size(), ReduceOp::kSum, true);
}

TEST(MpiAllGather, EveryTypeAndCount) {
  for (int64_t count : {0, 1, 7, 1009})
    for (bool in_place : {false, true}) {
      check_all_gather<float>(count, in_place);
      check_all_gather<int32_t>(count, in_place);
      check_all_gather<uint64_t>(count, in_place);
    }
  check_all_gather<float>(kLarge / test_world().size(), false);
  check_all_gather<float>(kLarge / test_world().size(), true);
}

TEST(MpiBroadcast, FromEveryRoot) {
  for (int root = 0; root < test_world().size(); root++)
    for (int64_t count : counts_for(test_world().size())) {
      check_broadcast<float>(count, root);
      check_broadcast<int32_t>(count, root);
      check_broadcast<uint64_t>(count, root);
    }
  check_broadcast<float>(kLarge, test_world().size() - 1);
}

TEST(MpiSendRecv, Ring) {
  int tag = 0;
  for (int64_t bytes : {int64_t{0}, int64_t{1}, int64_t{1009}, int64_t{4} << 20}) check_ring(bytes, tag++);
}

TEST(MpiSendRecv, MatchesByTagWhateverThePostingOrder) {
  Communicator& c = test_world();
  const int n = c.size(), r = c.rank(), next = (r + 1) % n, prev = (r + n - 1) % n;
  int32_t one = 100 + r, two = 200 + r, got_one = 0, got_two = 0;
  auto r2 = c.recv_async(&got_two, 4, prev, 2);
  auto r1 = c.recv_async(&got_one, 4, prev, 1);
  auto s1 = c.send_async(&one, 4, next, 1);
  auto s2 = c.send_async(&two, 4, next, 2);
  for (Work* w : {s1.get(), s2.get(), r1.get(), r2.get()}) ASSERT_TRUE(w->wait().ok());
  EXPECT_EQ(got_one, 100 + prev);
  EXPECT_EQ(got_two, 200 + prev);
}

// Operations longer than the MPI count limit are split: lower the limit so
// small buffers take those paths.
class ChunkLimit {
 public:
  explicit ChunkLimit(int64_t limit) : saved_(mpi_chunk_limit()) { set_mpi_chunk_limit_for_testing(limit); }
  ~ChunkLimit() { set_mpi_chunk_limit_for_testing(saved_); }

 private:
  int64_t saved_;
};

TEST(MpiChunking, OpsOverTheCountLimitAreSplit) {
  ChunkLimit limit(1000);
  const int n = test_world().size();
  check_all_reduce<float>(4099, ReduceOp::kSum, false);
  check_all_reduce<uint64_t>(4099, ReduceOp::kMax, true);
  check_all_reduce<float>(1000, ReduceOp::kSum, true);  // exactly one chunk
  check_broadcast<int32_t>(2501, n - 1);
  check_all_gather<float>(1009, false);  // resized-datatype path
  check_all_gather<uint64_t>(1009, true);
  check_all_gather<float>(1000 / n + 1, false);  // total over the limit, each block under it
  check_reduce_scatter<float>(1000 / n, ReduceOp::kSum, false);
  check_ring(2500, 9);
}

TEST(MpiChunking, ReduceScatterOverTheLimitIsAClearError) {
  ChunkLimit limit(1000);
  Communicator& c = test_world();
  std::vector<float> buf(c.size() * 1009);
  Status st = c.reduce_scatter(buf.data(), buf.data(), 1009, ElemType::kF32);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("reduce_scatter #"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("smaller buckets"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace tessera::comm
