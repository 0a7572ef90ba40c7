// The NCCL communicator against serial results, inside tessera_mpi_tests
// (every rank runs every test in order). Each rank fills device buffers with
// a pattern of (element, rank), so every rank can compute the whole expected
// result locally: every collective, in place and out of place, for each
// element type and reduce op; counts 0, 1, primes, counts the rank count
// doesn't divide, ~2^20; send/recv around a ring; split; a producer stream;
// and a peer that never posts (deadline, abort, message).
//
// Whether to run is decided once for all ranks together (one rank skipping
// alone would leave the others waiting in a collective): every test skips,
// with the reason, when Tessera was built without NCCL, or some rank has no
// CUDA device, or a host has more ranks than devices (NCCL needs one device
// per rank; so on one GPU run this at -np 1).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "comm/mpi/local_device.h"
#include "comm/mpi/mpi_communicator.h"
#include "comm/nccl/nccl_factory.h"
#include "runtime/cuda_device.h"
#include "mpi_test_env.h"
#ifdef TESSERA_HAVE_NCCL
#include <cuda_runtime_api.h>

#include "comm/nccl/nccl_communicator.h"
#endif

namespace tessera::comm {
namespace {

using mpi_test::test_world;

// ---- Set-up, once per run, collectively --------------------------------------

struct NcclEnv {
  std::string skip;                    // non-empty: why every test skips
  Status made;                         // make_nccl_communicator's outcome
  std::unique_ptr<Communicator> comm;  // over test_world(), named "nccl"
};

NcclEnv* g_nccl_env = nullptr;  // set once nccl_env() has run

NcclEnv& nccl_env() {
  static NcclEnv env = [] {
    NcclEnv e;
    Communicator& world = test_world();
    std::string mine;
    if (!nccl_compiled()) {
      mine = "Tessera was built without NCCL";
    } else if (Result<int> device = select_local_device(); !device.ok()) {
      mine = device.status().message();
    }
    int32_t ok = mine.empty();
    std::vector<int32_t> all(world.size());
    Status st = world.all_gather(&ok, all.data(), 1, ElemType::kI32);
    if (!st.ok()) {
      e.skip = "could not agree on running: " + st.message();
      return e;
    }
    std::vector<int> without;
    for (int r = 0; r < world.size(); r++)
      if (!all[r]) without.push_back(r);
    if (!without.empty()) {
      e.skip = !mine.empty() ? mine
                             : fmt::format("rank(s) {} cannot run NCCL (see their reason)", format_peer_list(without));
      return e;
    }
    CommOptions options;
    options.timeout = mpi_test::kTestTimeout;
    auto made = make_nccl_communicator(world, "nccl", options);
    if (made.ok()) e.comm = std::move(made).value();
    else e.made = made.status();
    return e;
  }();
  g_nccl_env = &env;
  return env;
}

// Destroys the communicator at the end of RUN_ALL_TESTS, on every rank
// together (not at exit, after MPI and maybe the CUDA runtime are gone).
class NcclTeardown : public ::testing::Environment {
 public:
  void TearDown() override {
    if (g_nccl_env != nullptr) g_nccl_env->comm.reset();
  }
};
::testing::Environment* const kNcclTeardown = ::testing::AddGlobalTestEnvironment(new NcclTeardown);

#define NCCL_TEST_SETUP()                                          \
  NcclEnv& env = nccl_env();                                       \
  if (!env.skip.empty()) GTEST_SKIP() << env.skip;                 \
  ASSERT_TRUE(env.made.ok()) << env.made.message();                \
  Communicator& c = *env.comm

// Device memory of n elements of T, filled and read through host vectors.
template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(int64_t n) : n_(n) {
    Result<void*> p = cuda::device_malloc(std::max<int64_t>(n, 1) * sizeof(T));
    EXPECT_TRUE(p.ok()) << p.status().message();
    if (p.ok()) ptr_ = static_cast<T*>(p.value());
  }
  ~DeviceBuffer() { (void)cuda::device_free(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  T* get() { return ptr_; }
  void upload(const std::vector<T>& host) {
    ASSERT_EQ(static_cast<int64_t>(host.size()), n_);
    Status st = cuda::memcpy_h2d(ptr_, host.data(), n_ * sizeof(T));
    ASSERT_TRUE(st.ok()) << st.message();
  }
  std::vector<T> download() {
    std::vector<T> host(n_);
    Status st = cuda::memcpy_d2h(host.data(), ptr_, n_ * sizeof(T));
    EXPECT_TRUE(st.ok()) << st.message();
    return host;
  }

 private:
  int64_t n_;
  T* ptr_ = nullptr;
};

// Rank r's element i. Floats: small integers (sums exact); signed: mixed
// sign; uint64: above 2^53 (a path through double would show); uint8: sums
// wrap, as NCCL's do.
template <typename T>
T pattern(int64_t i, int r) {
  if constexpr (std::is_floating_point_v<T>) {
    return static_cast<T>((i * 7 + r * 13) % 61 - 30);
  } else if constexpr (std::is_same_v<T, uint64_t>) {
    return (static_cast<uint64_t>((i + r) % 5) << 58) + ((static_cast<uint64_t>(i) * 0x9E3779B97F4A7C15ull) >> 24) +
           static_cast<uint64_t>(r);
  } else if constexpr (std::is_same_v<T, uint8_t>) {
    return static_cast<uint8_t>((i * 37 + r * 101) % 256);
  } else {
    return static_cast<T>((i * 104729 + r * 7919) % 1000003 - 500000);
  }
}

template <typename T>
constexpr ElemType elem_type() {
  if constexpr (std::is_same_v<T, float>) return ElemType::kF32;
  if constexpr (std::is_same_v<T, double>) return ElemType::kF64;
  if constexpr (std::is_same_v<T, int32_t>) return ElemType::kI32;
  if constexpr (std::is_same_v<T, int64_t>) return ElemType::kI64;
  if constexpr (std::is_same_v<T, uint64_t>) return ElemType::kU64;
  return ElemType::kU8;
}

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

template <typename T, typename Want>
void expect_all(const std::vector<T>& got, int64_t n, Want want) {
  int64_t wrong = 0, first = -1;
  for (int64_t i = 0; i < n; i++)
    if (got[i] != want(i)) wrong++, first = first < 0 ? i : first;
  EXPECT_EQ(wrong, 0) << "first wrong element " << first << ": got " << +got[first] << ", want " << +want(first);
}

std::vector<int64_t> counts_for(int n) { return {0, 1, 7, 1009, int64_t{37} * n + 1, int64_t{1} << 20}; }

template <typename T>
std::vector<T> filled(int64_t n, int r, int64_t offset = 0) {
  std::vector<T> v(n);
  for (int64_t i = 0; i < n; i++) v[i] = pattern<T>(offset + i, r);
  return v;
}

// ---- Tests ---------------------------------------------------------------------

TEST(NcclFactory, ReportsWhyWhenNotCompiled) {
  if (nccl_compiled()) GTEST_SKIP() << "NCCL is compiled in (version " << nccl_version() << ")";
  auto made = make_nccl_communicator(test_world(), "x");
  ASSERT_FALSE(made.ok());
  EXPECT_EQ(made.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(made.status().message().find("built without NCCL"), std::string::npos) << made.status().message();
}

TEST(NcclCollectives, CommunicatorMirrorsItsBootstrap) {
  NCCL_TEST_SETUP();
  EXPECT_EQ(c.rank(), test_world().rank());
  EXPECT_EQ(c.size(), test_world().size());
  EXPECT_EQ(c.name(), "nccl");
  for (int r = 0; r < c.size(); r++) EXPECT_EQ(c.world_rank_of(r), test_world().world_rank_of(r));
}

template <typename T>
void check_all_reduce(Communicator& c, int64_t count, ReduceOp op, bool in_place) {
  SCOPED_TRACE(fmt::format("all_reduce {} x {} {} {}", count, elem_name(elem_type<T>()), op_name(op),
                           in_place ? "in place" : "out of place"));
  DeviceBuffer<T> send(count), recv(count);
  send.upload(filled<T>(count, c.rank()));
  recv.upload(std::vector<T>(count, T(3)));
  T* out = in_place ? send.get() : recv.get();
  Status st = c.all_reduce(send.get(), out, count, elem_type<T>(), op);
  ASSERT_TRUE(st.ok()) << st.message();
  const std::vector<T> got = in_place ? send.download() : recv.download();
  expect_all(got, count, [&](int64_t i) { return reduce_all_ranks<T>(i, c.size(), op); });
}

TEST(NcclCollectives, AllReduceMatchesSerial) {
  NCCL_TEST_SETUP();
  for (int64_t count : counts_for(c.size())) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin}) {
      for (bool in_place : {false, true}) {
        check_all_reduce<float>(c, count, op, in_place);
        check_all_reduce<int32_t>(c, count, op, in_place);
        check_all_reduce<uint64_t>(c, count, op, in_place);
      }
    }
  }
  // The other element types, once each way.
  for (bool in_place : {false, true}) {
    check_all_reduce<double>(c, 1009, ReduceOp::kSum, in_place);
    check_all_reduce<int64_t>(c, 1009, ReduceOp::kMin, in_place);
    check_all_reduce<uint8_t>(c, 1009, ReduceOp::kSum, in_place);
    check_all_reduce<uint8_t>(c, 1009, ReduceOp::kMax, in_place);
  }
}

template <typename T>
void check_reduce_scatter(Communicator& c, int64_t recv_count, ReduceOp op, bool in_place) {
  SCOPED_TRACE(fmt::format("reduce_scatter {} x {} {} {}", recv_count, elem_name(elem_type<T>()), op_name(op),
                           in_place ? "in place" : "out of place"));
  const int n = c.size(), r = c.rank();
  DeviceBuffer<T> send(recv_count * n), recv(recv_count);
  send.upload(filled<T>(recv_count * n, r));
  recv.upload(std::vector<T>(recv_count, T(3)));
  Status st = c.reduce_scatter(send.get(), in_place ? send.get() : recv.get(), recv_count, elem_type<T>(), op);
  ASSERT_TRUE(st.ok()) << st.message();
  // In place, rank r's block lands at the start of the buffer.
  std::vector<T> got = in_place ? send.download() : recv.download();
  got.resize(recv_count);
  expect_all(got, recv_count, [&](int64_t i) { return reduce_all_ranks<T>(r * recv_count + i, n, op); });
}

TEST(NcclCollectives, ReduceScatterMatchesSerial) {
  NCCL_TEST_SETUP();
  for (int64_t count : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{1009}, int64_t{1} << 18}) {
    for (bool in_place : {false, true}) {
      check_reduce_scatter<float>(c, count, ReduceOp::kSum, in_place);
      check_reduce_scatter<int32_t>(c, count, ReduceOp::kMax, in_place);
      check_reduce_scatter<uint64_t>(c, count, ReduceOp::kMin, in_place);
    }
  }
  check_reduce_scatter<double>(c, 1009, ReduceOp::kSum, true);
  check_reduce_scatter<int64_t>(c, 1009, ReduceOp::kSum, false);
  check_reduce_scatter<uint8_t>(c, 1009, ReduceOp::kSum, true);
}

template <typename T>
void check_all_gather(Communicator& c, int64_t send_count, bool in_place) {
  SCOPED_TRACE(fmt::format("all_gather {} x {} {}", send_count, elem_name(elem_type<T>()),
                           in_place ? "in place" : "out of place"));
  const int n = c.size(), r = c.rank();
  DeviceBuffer<T> send(send_count), recv(send_count * n);
  std::vector<T> recv_init(send_count * n, T(3));
  const std::vector<T> mine = filled<T>(send_count, r);
  if (in_place) std::copy(mine.begin(), mine.end(), recv_init.begin() + r * send_count);
  send.upload(mine);
  recv.upload(recv_init);
  const T* src = in_place ? recv.get() + r * send_count : send.get();
  Status st = c.all_gather(src, recv.get(), send_count, elem_type<T>());
  ASSERT_TRUE(st.ok()) << st.message();
  expect_all(recv.download(), send_count * n, [&](int64_t i) {
    return pattern<T>(i % std::max<int64_t>(send_count, 1), static_cast<int>(i / std::max<int64_t>(send_count, 1)));
  });
}

TEST(NcclCollectives, AllGatherMatchesSerial) {
  NCCL_TEST_SETUP();
  for (int64_t count : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{1009}, int64_t{1} << 18}) {
    for (bool in_place : {false, true}) {
      check_all_gather<float>(c, count, in_place);
      check_all_gather<uint64_t>(c, count, in_place);
    }
  }
  check_all_gather<double>(c, 1009, false);
  check_all_gather<int32_t>(c, 1009, true);
  check_all_gather<int64_t>(c, 1009, false);
  check_all_gather<uint8_t>(c, 1009, true);
}

TEST(NcclCollectives, BroadcastFromEveryRoot) {
  NCCL_TEST_SETUP();
  for (int root = 0; root < c.size(); root++) {
    for (int64_t count : counts_for(c.size())) {
      SCOPED_TRACE(fmt::format("broadcast {} floats from {}", count, root));
      DeviceBuffer<float> data(count);
      data.upload(c.rank() == root ? filled<float>(count, root) : std::vector<float>(count, -1.0f));
      Status st = c.broadcast(data.get(), count, ElemType::kF32, root);
      ASSERT_TRUE(st.ok()) << st.message();
      expect_all(data.download(), count, [&](int64_t i) { return pattern<float>(i, root); });
    }
  }
}

// Recv from the previous rank posted before the send to the next: the
// queued p2p ops go out as one group when waited on, so this doesn't
// deadlock (it would as two separate NCCL calls).
TEST(NcclPointToPoint, RingRecvBeforeSend) {
  NCCL_TEST_SETUP();
  const int n = c.size(), r = c.rank();
  for (int64_t count : {int64_t{0}, int64_t{1}, int64_t{1009}, int64_t{1} << 20}) {
    SCOPED_TRACE(fmt::format("ring of {} int32", count));
    DeviceBuffer<int32_t> out(count), in(count);
    out.upload(filled<int32_t>(count, r));
    in.upload(std::vector<int32_t>(count, 0));
    const int64_t bytes = count * 4;
    auto recv = c.recv_async(in.get(), bytes, (r + n - 1) % n, 5);
    auto send = c.send_async(out.get(), bytes, (r + 1) % n, 5);
    Status ss = send->wait(), rs = recv->wait();
    ASSERT_TRUE(ss.ok()) << ss.message();
    ASSERT_TRUE(rs.ok()) << rs.message();
    expect_all(in.download(), count, [&](int64_t i) { return pattern<int32_t>(i, (r + n - 1) % n); });
  }
}

// Messages between a pair arrive in posting order (NCCL has no tags).
TEST(NcclPointToPoint, PairMessagesKeepOrder) {
  NCCL_TEST_SETUP();
  const int n = c.size(), r = c.rank();
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  DeviceBuffer<float> a(257), b(257), in_a(257), in_b(257);
  a.upload(filled<float>(257, r, 0));
  b.upload(filled<float>(257, r, 1000));
  std::vector<std::unique_ptr<Work>> works;
  works.push_back(c.send_async(a.get(), 257 * 4, next, 1));
  works.push_back(c.send_async(b.get(), 257 * 4, next, 2));
  works.push_back(c.recv_async(in_a.get(), 257 * 4, prev, 1));
  works.push_back(c.recv_async(in_b.get(), 257 * 4, prev, 2));
  for (auto& w : works) {
    Status st = w->wait();
    ASSERT_TRUE(st.ok()) << st.message();
  }
  expect_all(in_a.download(), 257, [&](int64_t i) { return pattern<float>(i, prev); });
  expect_all(in_b.download(), 257, [&](int64_t i) { return pattern<float>(1000 + i, prev); });
}

TEST(NcclCollectives, BarrierAndAsyncWorksComplete) {
  NCCL_TEST_SETUP();
  for (int i = 0; i < 5; i++) {
    Status st = c.barrier();
    ASSERT_TRUE(st.ok()) << st.message();
  }
  // Several in flight on the stream at once, waited out of order.
  DeviceBuffer<float> x(4096), y(4096);
  x.upload(filled<float>(4096, c.rank()));
  y.upload(filled<float>(4096, c.rank()));
  auto wx = c.all_reduce_async(x.get(), x.get(), 4096, ElemType::kF32, ReduceOp::kSum);
  auto wy = c.all_reduce_async(y.get(), y.get(), 4096, ElemType::kF32, ReduceOp::kMax);
  Status sy = wy->wait();
  ASSERT_TRUE(sy.ok()) << sy.message();
  EXPECT_TRUE(wx->test());  // same stream: x's finished before y's
  Status sx = wx->wait();
  ASSERT_TRUE(sx.ok()) << sx.message();
  expect_all(x.download(), 4096, [&](int64_t i) { return reduce_all_ranks<float>(i, c.size(), ReduceOp::kSum); });
  expect_all(y.download(), 4096, [&](int64_t i) { return reduce_all_ranks<float>(i, c.size(), ReduceOp::kMax); });
}

TEST(NcclCollectives, BadArgumentsAreInvalidArgument) {
  NCCL_TEST_SETUP();
  DeviceBuffer<float> x(4);
  Status st = c.all_reduce(x.get(), x.get(), -1, ElemType::kF32);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.message();
  EXPECT_NE(st.message().find("communicator 'nccl'"), std::string::npos) << st.message();
  st = c.broadcast(x.get(), 4, ElemType::kF32, c.size());
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.message();
  st = c.send(x.get(), 16, c.size(), 0);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.message();
  st = c.recv(x.get(), 16, 0, -1);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.message();
  EXPECT_FALSE(c.split(-1, 0, "bad").ok());
  // Still usable.
  st = c.barrier();
  EXPECT_TRUE(st.ok()) << st.message();
}

TEST(NcclCollectives, SplitByParityInReverseOrder) {
  NCCL_TEST_SETUP();
  const int n = c.size(), r = c.rank();
  auto sub = c.split(r % 2, -r, "parity");
  ASSERT_TRUE(sub.ok()) << sub.status().message();
  Communicator& s = **sub;
  std::vector<int> members;  // world ranks of my parity, highest first
  for (int q = n - 1; q >= 0; q--)
    if (q % 2 == r % 2) members.push_back(q);
  ASSERT_EQ(s.size(), static_cast<int>(members.size()));
  EXPECT_EQ(s.name(), "parity");
  for (int i = 0; i < s.size(); i++) EXPECT_EQ(s.world_rank_of(i), members[i]);
  EXPECT_EQ(s.world_rank_of(s.rank()), r);
  // A sum over the sub-communicator is the sum over its members only.
  DeviceBuffer<int64_t> x(1009);
  x.upload(filled<int64_t>(1009, r));
  Status st = s.all_reduce(x.get(), x.get(), 1009, ElemType::kI64, ReduceOp::kSum);
  ASSERT_TRUE(st.ok()) << st.message();
  expect_all(x.download(), 1009, [&](int64_t i) {
    int64_t sum = 0;
    for (int q : members) sum += pattern<int64_t>(i, q);
    return sum;
  });
  st = c.barrier();
  EXPECT_TRUE(st.ok()) << st.message();
}

#ifdef TESSERA_HAVE_NCCL
// An all_reduce posted right after a copy queued on another stream reads
// the copy's result: set_producer_stream orders the comm stream after it.
TEST(NcclStreams, ProducerStreamOrdersTheReduction) {
  NCCL_TEST_SETUP();
  auto* nc = dynamic_cast<NcclCommunicator*>(&c);
  ASSERT_NE(nc, nullptr);
  constexpr int64_t kCount = int64_t{1} << 22;  // 16 MiB: the copy takes long enough to matter
  DeviceBuffer<float> src(kCount), dst(kCount);
  src.upload(filled<float>(kCount, c.rank()));
  dst.upload(std::vector<float>(kCount, 0.0f));
  cudaStream_t compute = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking), cudaSuccess);
  nc->set_producer_stream(compute);
  ASSERT_EQ(cudaMemcpyAsync(dst.get(), src.get(), kCount * sizeof(float), cudaMemcpyDeviceToDevice, compute),
            cudaSuccess);
  Status st = c.all_reduce(dst.get(), dst.get(), kCount, ElemType::kF32, ReduceOp::kSum);
  nc->set_producer_stream(nullptr);
  ASSERT_TRUE(st.ok()) << st.message();
  // And the other way: the compute stream waits for the comm stream.
  ASSERT_TRUE(nc->consumers_wait(compute).ok());
  ASSERT_EQ(cudaStreamSynchronize(compute), cudaSuccess);
  cudaStreamDestroy(compute);
  expect_all(dst.download(), kCount,
             [&](int64_t i) { return reduce_all_ranks<float>(i, c.size(), ReduceOp::kSum); });
}
#endif

// Rank 0 never posts its half: the others' wait ends at the deadline with
// an Unavailable naming the operation, the communicator and rank 0; the
// NCCL communicator is aborted, so the next operation fails at once.
TEST(NcclDeadline, MissingPeerTimesOutAndAborts) {
  NCCL_TEST_SETUP();
  if (c.size() < 2) GTEST_SKIP() << "needs 2 ranks";
  CommOptions options;
  options.timeout = std::chrono::milliseconds(2000);
  auto made = make_nccl_communicator(test_world(), "deadline", options);
  ASSERT_TRUE(made.ok()) << made.status().message();
  Communicator& d = **made;
  DeviceBuffer<float> x(1009);
  x.upload(filled<float>(1009, d.rank()));
  // Once with everyone, so NCCL's connections exist before the stall.
  Status st = d.all_reduce(x.get(), x.get(), 1009, ElemType::kF32, ReduceOp::kSum);
  ASSERT_TRUE(st.ok()) << st.message();
  if (d.rank() != 0) {
    st = d.all_reduce(x.get(), x.get(), 1009, ElemType::kF32, ReduceOp::kSum);
    ASSERT_EQ(st.code(), StatusCode::kUnavailable) << st.message();
    const std::string& m = st.message();
    EXPECT_NE(m.find("all_reduce #2 (1009 x float)"), std::string::npos) << m;
    EXPECT_NE(m.find("communicator 'deadline'"), std::string::npos) << m;
    EXPECT_NE(m.find("2.0 s"), std::string::npos) << m;
    EXPECT_NE(m.find("peers [0"), std::string::npos) << m;
    EXPECT_NE(m.find("aborted"), std::string::npos) << m;
    Status later = d.barrier();
    EXPECT_EQ(later.code(), StatusCode::kUnavailable);
    EXPECT_NE(later.message().find("was aborted earlier"), std::string::npos) << later.message();
  }
#ifdef TESSERA_HAVE_NCCL
  if (d.rank() == 0) {
    // Its peers are aborting; so does rank 0 (NCCL may make each abort wait
    // for the others on the host).
    auto* nd = dynamic_cast<NcclCommunicator*>(&d);
    ASSERT_NE(nd, nullptr);
    nd->abort("test: the other ranks time out");
    Status later = d.barrier();
    EXPECT_NE(later.message().find("aborted by this rank"), std::string::npos) << later.message();
  }
#endif
  made->reset();
  EXPECT_TRUE(test_world().barrier().ok());
}

}  // namespace
}  // namespace tessera::comm
