// DLRM checkpoints (train/dlrm_checkpointing.h, docs/formats/dlrm-checkpoint.md):
// a save loads back bit for bit and trains on identically; tables stored by
// row ranges from 2 ranks load into 1, and any row range reads back
// (resharding); another model or a missing Adagrad state is refused.
#include "train/dlrm_checkpointing.h"

#include <filesystem>
#include <random>

#include <gtest/gtest.h>

#include "comm/local/thread_communicator.h"
#include "parallel/dlrm_parallel.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using comm::run_ranks;

DlrmConfig small_config() {
  DlrmConfig c;
  c.num_dense = 3;
  c.dim = 4;
  c.bottom = {8, 4};
  c.top = {8};
  c.table_rows = {11, 7, 5};
  return c;
}

// A random batch of B samples, one id per table.
struct Batch {
  std::vector<float> dense, labels;
  std::vector<std::vector<int>> ids;
  std::vector<int> offsets;
  DlrmBatch b;
  Batch(const DlrmConfig& c, int B, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> g;
    for (int i = 0; i < B * c.num_dense; i++) dense.push_back(g(rng));
    for (int i = 0; i < B; i++) labels.push_back(static_cast<float>(rng() % 2));
    for (int i = 0; i <= B; i++) offsets.push_back(i);
    for (int e : c.table_rows) {
      ids.emplace_back();
      for (int i = 0; i < B; i++) ids.back().push_back(static_cast<int>(rng() % e));
    }
    b.B = B;
    b.dense = dense.data();
    b.labels = labels.data();
    for (auto& t : ids) {
      b.ids.push_back(t.data());
      b.offsets.push_back(offsets.data());
    }
  }
};

std::unique_ptr<DlrmParallel> engine(uint64_t seed, const std::string& opt = "adagrad") {
  DlrmParallelOptions o;
  o.table_optimizer = opt;
  auto e = DlrmParallel::create(small_config(), o, nullptr, seed);
  EXPECT_TRUE(e.ok()) << e.status().message();
  return std::move(e).value();
}

// Saves pieces_of(rank) from `ranks` thread ranks as step `step` into dir.
void save(const std::string& dir, int ranks, int64_t step,
          const std::function<std::vector<ckpt::SavePiece>(int)>& pieces_of) {
  run_ranks(ranks, [&](comm::Communicator& world) {
    ckpt::CheckpointerOptions o;
    o.dir = dir;
    o.config = {{"kind", "dlrm"}, {"model", dlrm_config_json(small_config())}};
    ckpt::Checkpointer cp(o);
    const std::string state =
        nlohmann::json{{"step", step}, {"adam_t", step}, {"data_row", 0}, {"epoch", 0}}.dump();
    std::vector<ckpt::SavePiece> p = pieces_of(world.rank());
    ASSERT_TRUE(cp.save(world, step, p, state).ok());
    auto r = cp.poll(world, true);
    ASSERT_TRUE(r.ok());
    ASSERT_EQ(r->state, ckpt::SaveState::kPublished) << r->error.message();
  });
}

void expect_same(DlrmParallel& a, DlrmParallel& b) {
  EXPECT_EQ(a.dense_params(), b.dense_params());
  EXPECT_EQ(a.adam_m(), b.adam_m());
  EXPECT_EQ(a.adam_v(), b.adam_v());
  EXPECT_EQ(a.adam_step(), b.adam_step());
  auto sa = a.owned_shards(), sb = b.owned_shards();
  ASSERT_EQ(sa.size(), sb.size());
  const int D = a.config().dim;
  for (size_t t = 0; t < sa.size(); t++) {
    const int64_t n = sa[t].row_end - sa[t].row_begin;
    EXPECT_EQ(std::vector<float>(sa[t].values, sa[t].values + n * D),
              std::vector<float>(sb[t].values, sb[t].values + n * D)) << "table " << t;
    if (sa[t].accum) {
      EXPECT_EQ(std::vector<float>(sa[t].accum, sa[t].accum + n), std::vector<float>(sb[t].accum, sb[t].accum + n));
    }
  }
}

class DlrmCheckpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = (fs::path(::testing::TempDir()) /
            ("dlrm_ckpt_" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name())))
               .string();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    trained_ = engine(1);
    for (int s = 0; s < 3; s++) ASSERT_TRUE(trained_->train_step(Batch(small_config(), 16, 10 + s).b).ok());
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string dir_;
  std::unique_ptr<DlrmParallel> trained_;
};

TEST_F(DlrmCheckpoint, LoadsBitForBitAndTrainsOnAlike) {
  save(dir_, 1, 3, [&](int rank) { return dlrm_checkpoint_pieces(*trained_, rank); });
  auto ck = ckpt::Checkpoint::open(dir_);
  ASSERT_TRUE(ck.ok()) << ck.status().message();
  auto fresh = engine(99);
  auto rs = load_dlrm_checkpoint(*ck, *fresh);
  ASSERT_TRUE(rs.ok()) << rs.status().message();
  EXPECT_EQ(rs->step, 3);
  expect_same(*trained_, *fresh);
  Batch next(small_config(), 16, 77);
  auto la = trained_->train_step(next.b), lb = fresh->train_step(next.b);
  ASSERT_TRUE(la.ok() && lb.ok());
  EXPECT_EQ(*la, *lb);
  expect_same(*trained_, *fresh);
}

TEST_F(DlrmCheckpoint, RowRangesOfTwoRanksLoadIntoOneAndReadAnyRange) {
  // Two ranks: rank 0 the dense tensors and the first rows of each table,
  // rank 1 the rest (row-wise placement).
  const DlrmConfig c = small_config();
  save(dir_, 2, 3, [&](int rank) {
    std::vector<ckpt::SavePiece> all = dlrm_checkpoint_pieces(*trained_, 0), mine;
    for (ckpt::SavePiece p : all) {
      if (p.name.rfind("table/", 0) != 0 && p.name.rfind("adagrad/", 0) != 0) {
        if (rank == 0) mine.push_back(p);
        continue;
      }
      const int64_t E = p.slice.global[0], half = E / 2, width = p.slice.global.rank == 2 ? c.dim : 1;
      const int64_t r0 = rank == 0 ? 0 : half, r1 = rank == 0 ? half : E;
      p.slice.begin[0] = r0;
      p.slice.size[0] = r1 - r0;
      p.data += r0 * width;
      mine.push_back(p);
    }
    return mine;
  });
  auto ck = ckpt::Checkpoint::open(dir_);
  ASSERT_TRUE(ck.ok()) << ck.status().message();
  EXPECT_EQ(ck->world_size(), 2);
  auto one = engine(5);
  ASSERT_TRUE(load_dlrm_checkpoint(*ck, *one).ok());
  expect_same(*trained_, *one);
  // A third of table 0's rows, as a rank of a 3-way split would read them.
  const int64_t E = c.table_rows[0], r0 = E / 3, r1 = 2 * E / 3;
  TensorSlice want;
  want.global = want.view = Shape{E, c.dim};
  want.begin = {r0, 0};
  want.size = {r1 - r0, c.dim};
  std::vector<float> rows((r1 - r0) * c.dim);
  ASSERT_TRUE(ck->read("table/0", want, rows).ok());
  const float* t0 = trained_->owned_shards()[0].values;
  EXPECT_EQ(rows, std::vector<float>(t0 + r0 * c.dim, t0 + r1 * c.dim));
}

TEST_F(DlrmCheckpoint, RefusesAnotherModelAndMissingAdagradState) {
  auto sgd = engine(1, "sgd");
  save(dir_, 1, 2, [&](int rank) { return dlrm_checkpoint_pieces(*sgd, rank); });
  auto ck = ckpt::Checkpoint::open(dir_);
  ASSERT_TRUE(ck.ok());
  auto st = load_dlrm_checkpoint(*ck, *trained_);  // adagrad: no accumulators saved
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.status().message().find("no row-wise Adagrad state"), std::string::npos) << st.status().message();

  DlrmConfig other = small_config();
  other.table_rows[1] = 8;
  auto e = DlrmParallel::create(other, DlrmParallelOptions{}, nullptr, 1);
  ASSERT_TRUE(e.ok());
  st = load_dlrm_checkpoint(*ck, **e);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.status().message().find("table_rows"), std::string::npos) << st.status().message();
}

TEST(DlrmParallel, RefusesBadOptions) {
  DlrmParallelOptions o;
  o.table_optimizer = "adam";
  auto e = DlrmParallel::create(small_config(), o, nullptr, 1);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("adagrad"), std::string::npos);
  o = DlrmParallelOptions{};
  o.placement = "column";
  EXPECT_FALSE(DlrmParallel::create(small_config(), o, nullptr, 1).ok());
}

}  // namespace
}  // namespace tessera
