#include "data/loader.h"

#include <algorithm>
#include <filesystem>
#include <numeric>

#include <gtest/gtest.h>

#include "data/shard.h"

namespace tessera::data {
namespace {

std::string make_shards(const std::string& name, int count, int tokens_each) {
  std::string dir = ::testing::TempDir() + "/" + name;
  std::filesystem::create_directories(dir);
  uint16_t next = 0;
  for (int s = 0; s < count; s++) {
    std::vector<uint16_t> tokens(tokens_each);
    for (auto& t : tokens) t = next++ % 1000;
    EXPECT_TRUE(write_shard(dir + "/train_" + std::to_string(s) + ".bin", tokens).ok());
  }
  return dir + "/train_*.bin";
}

TEST(TokenLoader, SameSequencesPerStepWhateverTheMicroBatchSplit) {
  std::string glob = make_shards("split", 3, 500);
  const int T = 16;
  auto a = TokenLoader::open(glob, T, 7);
  auto b = TokenLoader::open(glob, T, 7);
  ASSERT_TRUE(a.ok() && b.ok());
  for (int64_t step = 0; step < 20; step++) {  // several epochs (93 windows)
    // (micro_batch 4, grad_accum 2) against (micro_batch 8, grad_accum 1).
    std::vector<int> in_a(8 * T), tg_a(8 * T), in_b(8 * T), tg_b(8 * T);
    a->fill(step, 8, 0, 4, in_a.data(), tg_a.data());
    a->fill(step, 8, 4, 4, in_a.data() + 4 * T, tg_a.data() + 4 * T);
    b->fill(step, 8, 0, 8, in_b.data(), tg_b.data());
    ASSERT_EQ(in_a, in_b) << "step " << step;
    ASSERT_EQ(tg_a, tg_b) << "step " << step;
  }
}

TEST(TokenLoader, TargetsAreInputsShiftedByOne) {
  auto l = TokenLoader::open(make_shards("shift", 1, 200), 10, 1);
  ASSERT_TRUE(l.ok());
  std::vector<int> in(20), tg(20);
  l->fill(0, 2, 0, 2, in.data(), tg.data());
  for (int r = 0; r < 2; r++)
    for (int t = 0; t < 9; t++) EXPECT_EQ(tg[r * 10 + t], in[r * 10 + t + 1]);
}

TEST(TokenLoader, EpochVisitsEveryWindowOnceAndSeedChangesOrder) {
  auto l = TokenLoader::open(make_shards("epoch", 1, 1001), 10, 3);
  ASSERT_TRUE(l.ok());
  ASSERT_EQ(l->windows(), 100);
  std::vector<int> firsts;
  std::vector<int> in(10), tg(10);
  for (int64_t g = 0; g < 100; g++) {
    l->fill(g, 1, 0, 1, in.data(), tg.data());
    firsts.push_back(in[0]);
  }
  std::vector<int> sorted = firsts;
  std::sort(sorted.begin(), sorted.end());
  for (int w = 0; w < 100; w++) EXPECT_EQ(sorted[w], (w * 10) % 1000);
  auto other = TokenLoader::open(make_shards("epoch", 1, 1001), 10, 4);
  other->fill(0, 1, 0, 1, in.data(), tg.data());
  std::vector<int> in2(10);
  bool differs = false;
  for (int64_t g = 0; g < 5 && !differs; g++) {
    l->fill(g, 1, 0, 1, in.data(), tg.data());
    other->fill(g, 1, 0, 1, in2.data(), tg.data());
    differs = in != in2;
  }
  EXPECT_TRUE(differs);
}

TEST(TokenLoader, ResumeAtAStepReproducesTheSameBatches) {
  std::string glob = make_shards("resume", 1, 800);
  auto a = TokenLoader::open(glob, 8, 11);
  std::vector<int> in_a(32), tg(32), in_b(32);
  for (int s = 0; s < 30; s++) a->fill(s, 4, 0, 4, in_a.data(), tg.data());
  auto b = TokenLoader::open(glob, 8, 11);  // a fresh loader "resumed" at step 29
  b->fill(29, 4, 0, 4, in_b.data(), tg.data());
  EXPECT_EQ(in_a, in_b);
}

TEST(TokenLoader, Errors) {
  auto none = TokenLoader::open(::testing::TempDir() + "/nothing_here_*.bin", 8, 1);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("no token shard matches"), std::string::npos);
  auto tiny = TokenLoader::open(make_shards("tiny", 1, 5), 8, 1);
  ASSERT_FALSE(tiny.ok());
  EXPECT_NE(tiny.status().message().find("fewer than one sequence"), std::string::npos);
}

// A token id >= vocab late in the second shard is found when the shards
// are opened, named by that shard's file (not the glob) and its place in
// the file, not when (or if) its batch is drawn.
TEST(TokenLoader, TokenOutsideVocabularyNamesItsShardWhenOpened) {
  const std::string dir = ::testing::TempDir() + "/vocab_check";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::vector<uint16_t> good(100, 5), bad(3000, 5);
  bad[2999] = 256;
  ASSERT_TRUE(write_shard(dir + "/train_0.bin", good).ok());
  ASSERT_TRUE(write_shard(dir + "/train_1.bin", bad).ok());
  auto l = TokenLoader::open(dir + "/train_*.bin", 8, 1, 256);
  ASSERT_FALSE(l.ok());
  EXPECT_EQ(l.status().message(), dir + "/train_1.bin: token id 256 at token 2999 (byte offset 7022) is outside the "
                                        "vocabulary [0, 256)");
  EXPECT_TRUE(TokenLoader::open(dir + "/train_*.bin", 8, 1, 257).ok());
  EXPECT_TRUE(TokenLoader::open(dir + "/train_*.bin", 8, 1).ok());  // vocab 0: not checked
}

}  // namespace
}  // namespace tessera::data
