// collapse_to_huge_pages() (core/huge_pages.h): the values stay, only whole
// 2 MiB pages inside the range move, the kernel's own accounting
// (/proc/self/smaps) shows them, blocks less than a huge page apart move as
// one range, and set_huge_pages(false) (the CLI's TESSERA_HUGE_PAGES=0)
// leaves the memory alone. A kernel without MADV_COLLAPSE (before 6.1) or
// with THP "never" returns 0, which is allowed: then only the values are
// checked.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cstdint>
#include <fstream>
#include <span>
#include <sstream>
#include <string>

#include "core/huge_pages.h"

namespace tessera {
namespace {

constexpr size_t kHuge = size_t{2} << 20;

// kB of AnonHugePages in the mapping of /proc/self/smaps that holds p.
int64_t anon_huge_kb_at(const void* p) {
  std::ifstream f("/proc/self/smaps");
  std::string line;
  const uintptr_t at = reinterpret_cast<uintptr_t>(p);
  bool inside = false;
  while (std::getline(f, line)) {
    uintptr_t lo = 0, hi = 0;
    char dash = 0;
    std::istringstream head(line);
    if (head >> std::hex >> lo >> dash >> hi && dash == '-' && line.find(':') > line.find(' ')) {
      inside = lo <= at && at < hi;
      continue;
    }
    if (inside && line.rfind("AnonHugePages:", 0) == 0) return std::stoll(line.substr(14));
  }
  return -1;
}

class HugePages : public ::testing::Test {
 protected:
  void SetUp() override {
    // 7.25 huge pages of data starting half a huge page into one: 6 whole
    // huge pages inside.
    map_ = mmap(nullptr, kMapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(map_, MAP_FAILED);
    const uintptr_t base = (reinterpret_cast<uintptr_t>(map_) + kHuge - 1) / kHuge * kHuge;
    data_ = reinterpret_cast<uint8_t*>(base + kHuge / 2);
    for (size_t i = 0; i < kBytes; i++) data_[i] = static_cast<uint8_t>(i * 131 + (i >> 12));
  }
  void TearDown() override {
    if (map_ != MAP_FAILED) munmap(map_, kMapped);
    set_huge_pages(true);
  }
  bool values_kept() const {
    for (size_t i = 0; i < kBytes; i++)
      if (data_[i] != static_cast<uint8_t>(i * 131 + (i >> 12))) return false;
    return true;
  }
  static constexpr size_t kBytes = 7 * kHuge + kHuge / 4;
  static constexpr size_t kMapped = 10 * kHuge;
  void* map_ = MAP_FAILED;
  uint8_t* data_ = nullptr;
};

TEST_F(HugePages, WholePagesInsideMoveAndValuesStay) {
  const int64_t moved = collapse_to_huge_pages(data_, kBytes);
  EXPECT_TRUE(values_kept());
  // From data_ (half a huge page in) to data_ + 7.25 huge pages: the 6
  // whole huge pages inside, or none where the kernel cannot.
  EXPECT_TRUE(moved == 0 || moved == static_cast<int64_t>(6 * kHuge)) << moved;
  RecordProperty("moved_bytes", std::to_string(moved));
  RecordProperty("anon_huge_kb", std::to_string(anon_huge_kb_at(data_ + kHuge)));
  if (moved > 0) {
    EXPECT_GE(anon_huge_kb_at(data_ + kHuge), moved / 1024);
  }
}

TEST_F(HugePages, LessThanAWholePageMovesNothing) {
  EXPECT_EQ(collapse_to_huge_pages(data_, kHuge), 0);  // half of two huge pages
  EXPECT_EQ(collapse_to_huge_pages(data_, 0), 0);
  EXPECT_EQ(collapse_to_huge_pages(nullptr, static_cast<int64_t>(kHuge)), 0);
  EXPECT_TRUE(values_kept());
}

// Two blocks under a huge page apart: [0.5, 2) and [2.75, 7) huge pages
// from a huge page boundary. Apart, 1 and 4 whole huge pages would move; as
// one range, the 6 of [1, 7), the gap's included, counted as the blocks'
// own bytes: 1.5 + 4.25 huge pages.
TEST_F(HugePages, BlocksCloseTogetherMoveAsOneRange) {
  const std::span<const uint8_t> a(data_, 3 * kHuge / 2);
  const std::span<const uint8_t> b(data_ + 9 * kHuge / 4, 17 * kHuge / 4);
  const int64_t moved = collapse_to_huge_pages({b, a});
  EXPECT_TRUE(values_kept());
  EXPECT_TRUE(moved == 0 || moved == static_cast<int64_t>(23 * kHuge / 4)) << moved;
  RecordProperty("moved_bytes", std::to_string(moved));
  if (moved > 0) {
    EXPECT_GE(anon_huge_kb_at(data_ + kHuge), 6 * static_cast<int64_t>(kHuge) / 1024);
  }
}

TEST_F(HugePages, ZeroLeavesThePagesAlone) {
  set_huge_pages(false);
  EXPECT_FALSE(huge_pages_wanted());
  EXPECT_EQ(collapse_to_huge_pages(data_, kBytes), 0);
  EXPECT_EQ(collapse_to_huge_pages({std::span<const uint8_t>(data_, kBytes)}), 0);
  EXPECT_TRUE(values_kept());
  set_huge_pages(true);
  EXPECT_TRUE(huge_pages_wanted());
}

}  // namespace
}  // namespace tessera
