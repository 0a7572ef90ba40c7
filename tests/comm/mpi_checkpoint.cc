// Sharded checkpoints across MPI ranks (src/ckpt): every rank saves its
// pieces of a layout that depends on the rank count, rank 0 publishes, and
// every rank reads back its pieces of another layout. Also: one rank's disk
// failing is reported on all ranks, and nothing is published before the
// slowest rank is durable. All ranks share the folder (one machine).
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "ckpt/checkpoint.h"
#include "ckpt/checkpointer.h"
#include "mpi_test_env.h"

namespace tessera::ckpt {
namespace {

namespace fs = std::filesystem;
using comm::mpi_test::test_world;

std::vector<float> tensor_data(const Shape& s, int seed) {
  std::vector<float> v(s.numel());
  for (size_t i = 0; i < v.size(); i++) v[i] = seed * 1000.0f + static_cast<float>(i) * 0.25f;
  return v;
}

TensorSlice slice(Shape g, std::vector<int64_t> begin, std::vector<int64_t> size, int64_t fb = 0, int64_t fe = -1) {
  TensorSlice s;
  s.global = g;
  s.view = g;
  s.begin = std::move(begin);
  s.size = std::move(size);
  s.flat_begin = fb;
  s.flat_end = fe;
  return s;
}

std::vector<float> stored_part(const std::vector<float>& whole, const TensorSlice& s) {
  std::vector<float> block(s.block_numel());
  gather_block(whole.data(), s, block.data());
  const int64_t end = s.flat_end < 0 ? s.block_numel() : s.flat_end;
  return std::vector<float>(block.begin() + s.flat_begin, block.begin() + end);
}

// [part * n / parts, (part + 1) * n / parts): uneven when parts does not divide n.
int64_t cut(int64_t n, int part, int parts) { return n * part / parts; }

// A folder every rank agrees on (rank 0's pid), emptied by rank 0.
class MpiCheckpoint : public testing::Test {
 protected:
  void SetUp() override {
    comm::Communicator& w = test_world();
    int64_t pid = ::getpid();
    ASSERT_TRUE(w.broadcast(&pid, 1, comm::ElemType::kI64, 0).ok());
    const auto* info = testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::path(testing::TempDir()) / fmt::format("tessera_mpi_ckpt_{}_{}", info->name(), pid);
    if (w.rank() == 0) {
      fs::remove_all(dir_);
      fs::create_directories(dir_);
    }
    ASSERT_TRUE(w.barrier().ok());
  }
  void TearDown() override {
    EXPECT_TRUE(test_world().barrier().ok());
    if (test_world().rank() == 0) fs::remove_all(dir_);
  }
  CheckpointerOptions options(Env* env = nullptr) const {
    CheckpointerOptions o;
    o.dir = dir_.string();
    o.env = env;
    o.layout = {{"ranks", test_world().size()}};
    return o;
  }
  fs::path dir_;
};

TEST_F(MpiCheckpoint, SavedAsRowBlocksReadBackAsColumnsAndFlatRanges) {
  comm::Communicator& w = test_world();
  const int r = w.rank(), n = w.size();
  const Shape a{13, 10}, m{7, 9}, b{5};
  {
    Checkpointer c(options());
    std::vector<std::vector<float>> data;
    std::vector<SavePiece> pieces;
    auto add = [&](const char* name, const TensorSlice& s, const std::vector<float>& whole) {
      data.push_back(stored_part(whole, s));
      pieces.push_back({name, s, data.back().data()});
    };
    add("param/a", slice(a, {cut(13, r, n), 0}, {cut(13, r + 1, n) - cut(13, r, n), 10}), tensor_data(a, 1));
    add("adam_m/m", slice(m, {0, 0}, {7, 9}, cut(63, r, n), cut(63, r + 1, n)), tensor_data(m, 2));  // ZeRO
    if (r == 0) add("param/b", TensorSlice::whole(b), tensor_data(b, 3));  // replicated: one rank saves it
    Result<bool> started = c.save(w, 40, pieces, fmt::format("{{\"rank\":{}}}", r));
    ASSERT_TRUE(started.ok() && *started) << started.status().message();
    Result<PollResult> res = c.poll(w, true);
    ASSERT_TRUE(res.ok()) << res.status().message();
    ASSERT_EQ(res->state, SaveState::kPublished) << res->error.message();
    EXPECT_GT(res->stats.bytes_total, res->stats.bytes_rank);
  }
  Result<Checkpoint> ck = Checkpoint::open(dir_.string());
  ASSERT_TRUE(ck.ok()) << ck.status().message();
  EXPECT_EQ(ck->world_size(), n);
  EXPECT_EQ(ck->layout()["ranks"], n);
  EXPECT_EQ(*ck->state(n - 1 - r), fmt::format("{{\"rank\":{}}}", n - 1 - r));
  if (r == 0) {
    EXPECT_TRUE(ck->verify().ok());
  }
  // Another layout: rank r reads column block r of a, row block r of m, all of b.
  const TensorSlice a_cols = slice(a, {0, cut(10, r, n)}, {13, cut(10, r + 1, n) - cut(10, r, n)});
  const TensorSlice m_rows = slice(m, {cut(7, r, n), 0}, {cut(7, r + 1, n) - cut(7, r, n), 9});
  const TensorSlice a_flat = slice(a, {0, 0}, {13, 10}, cut(130, r, n + 1), cut(130, r + 2, n + 1));
  for (const auto& [name, want, seed] : {std::tuple{"param/a", a_cols, 1}, std::tuple{"adam_m/m", m_rows, 2},
                                         std::tuple{"param/a", a_flat, 1}, std::tuple{"param/b", TensorSlice::whole(b), 3}}) {
    std::vector<float> out(want.numel(), -1.0f);
    Status st = ck->read(name, want, out);
    ASSERT_TRUE(st.ok()) << st.message();
    EXPECT_EQ(out, stored_part(tensor_data(want.global, seed), want)) << name;
  }
}

TEST_F(MpiCheckpoint, OneRanksFailingDiskIsReportedOnEveryRank) {
  comm::Communicator& w = test_world();
  const int r = w.rank(), n = w.size();
  FaultEnv full(posix_env(), ENOSPC);
  Checkpointer c(options(r == n - 1 ? static_cast<Env*>(&full) : &posix_env()));
  std::vector<float> data(64, 1.0f);
  std::vector<SavePiece> pieces = {{"w", slice(Shape{64 * n}, {64 * r}, {64}), data.data()}};
  ASSERT_TRUE(c.save(w, 10, pieces, "{}").ok());
  Result<PollResult> res = c.poll(w, true);
  ASSERT_TRUE(res.ok()) << res.status().message();
  EXPECT_EQ(res->state, SaveState::kFailed);
  EXPECT_NE(res->error.message().find(fmt::format("rank {}: ", n - 1)), std::string::npos) << res->error.message();
  EXPECT_NE(res->error.message().find("No space left on device"), std::string::npos) << res->error.message();
  EXPECT_FALSE(fs::exists(dir_ / ".tmp-step-00000010"));
  EXPECT_FALSE(fs::exists(dir_ / "latest"));
}

// The last rank's disk is slow: every poll before it is durable says pending
// on every rank, and no rank sees a published folder.
class SlowEnv : public Env {
 public:
  Status write_file(const std::string& path, std::span<const std::span<const std::byte>> pieces) override {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    return posix_env().write_file(path, pieces);
  }
};

TEST_F(MpiCheckpoint, NothingIsPublishedBeforeTheSlowestRankIsDurable) {
  comm::Communicator& w = test_world();
  const int r = w.rank(), n = w.size();
  SlowEnv slow;
  Checkpointer c(options(r == n - 1 ? static_cast<Env*>(&slow) : &posix_env()));
  std::vector<float> data(1000, float(r));
  std::vector<SavePiece> pieces = {{"w", slice(Shape{1000 * n}, {1000 * r}, {1000}), data.data()}};
  ASSERT_TRUE(c.save(w, 10, pieces, "{}").ok());
  int pending_polls = 0;
  while (true) {
    Result<PollResult> res = c.poll(w, false);
    ASSERT_TRUE(res.ok()) << res.status().message();
    if (res->state != SaveState::kPending) {
      EXPECT_EQ(res->state, SaveState::kPublished) << res->error.message();
      break;
    }
    pending_polls++;
    // No rank can have published: that takes a poll this rank has not made yet.
    EXPECT_FALSE(fs::exists(dir_ / "step-00000010"));
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_GT(pending_polls, 0);
  int64_t polls[2] = {pending_polls, -pending_polls};  // every rank made the same number of polls
  ASSERT_TRUE(w.all_reduce(polls, polls, 2, comm::ElemType::kI64, comm::ReduceOp::kMax).ok());
  EXPECT_EQ(polls[0], -polls[1]);
  EXPECT_TRUE(fs::exists(dir_ / "step-00000010" / fmt::format("shard-{:05d}.safetensors", n - 1)));
}

}  // namespace
}  // namespace tessera::ckpt
