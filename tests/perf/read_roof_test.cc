// The read roof over memory already there (perf::read_gb_per_s_over) and
// what tessera bench decode gives it: a model's stored weights
// (GPT::stored_weights), whose bytes are those the decode step streams.
// Speeds are not asserted (a timed test would be a benchmark); what is:
// which bytes are read, and that nothing is read past a block.
#include <gtest/gtest.h>

#include <cstdint>
#include <numeric>
#include <vector>

#include "nn/forward_util.h"
#include "perf/cpu_checks.h"

namespace tessera {
namespace {

TEST(ReadRoof, ReadsWholeWordsOfEachBlockAndNothingForNone) {
  EXPECT_EQ(perf::read_gb_per_s_over({}, 3), 0.0);
  std::vector<uint8_t> a(4096 + 5), b(64);
  // Blocks of no whole aligned word and a null one count for nothing.
  EXPECT_EQ(perf::read_gb_per_s_over({{a.data() + 1, 6}, {nullptr, 100}}, 3), 0.0);
  // Unaligned edges: only the whole words inside are read (ASan would see a
  // read past either block).
  EXPECT_GT(perf::read_gb_per_s_over({{a.data() + 3, a.size() - 3}, {b.data(), b.size()}}, 3), 0.0);
}

TEST(ReadRoof, LastLevelCacheIsSysfsLargest) {
  const int64_t llc = perf::last_level_cache_bytes();
  EXPECT_GE(llc, int64_t{256} << 10);
  EXPECT_LE(llc, int64_t{4} << 30);
}

int64_t total(const std::vector<std::span<const uint8_t>>& spans) {
  int64_t n = 0;
  for (const auto& s : spans) n += static_cast<int64_t>(s.size());
  return n;
}

TEST(ReadRoof, StoredWeightsAreTheTiersBytes) {
  auto fp = testing_util::tiny_gpt2();
  ASSERT_NE(fp, nullptr);
  EXPECT_EQ(total(fp->stored_weights()), static_cast<int64_t>(fp->params().bytes()));
  auto i8 = testing_util::tiny_gpt2();
  ASSERT_TRUE(i8->quantize_int8().ok());
  EXPECT_EQ(total(i8->stored_weights()), i8->int8_bytes());
  auto i4 = testing_util::tiny_gpt2();
  ASSERT_TRUE(i4->quantize_q4(q4::Type::kQ4_0).ok());
  EXPECT_EQ(total(i4->stored_weights()), i4->q4_bytes());
  EXPECT_GT(i4->q4_bytes(), 0);
}

}  // namespace
}  // namespace tessera
