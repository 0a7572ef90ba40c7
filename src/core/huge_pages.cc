#include "core/huge_pages.h"

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <utility>

#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25  // Linux 6.1; glibc 2.36's headers predate it
#endif

namespace tessera {

namespace {
constexpr uintptr_t kHuge = uintptr_t{2} << 20;
std::atomic<bool> g_huge_pages{true};
}  // namespace

bool huge_pages_wanted() { return g_huge_pages.load(std::memory_order_relaxed); }
void set_huge_pages(bool on) { g_huge_pages.store(on, std::memory_order_relaxed); }

int64_t collapse_to_huge_pages(const void* p, int64_t bytes) {
  if (p == nullptr || bytes <= 0 || !huge_pages_wanted()) return 0;
  const uintptr_t begin = reinterpret_cast<uintptr_t>(p);
  const uintptr_t first = (begin + kHuge - 1) / kHuge * kHuge;
  const uintptr_t last = (begin + static_cast<uintptr_t>(bytes)) / kHuge * kHuge;
  if (last <= first) return 0;
  void* at = reinterpret_cast<void*>(first);
  const size_t n = last - first;
  // MADV_HUGEPAGE first: khugepaged and later faults keep the range huge
  // (and "madvise", this host's THP mode, needs it); MADV_COLLAPSE then
  // moves what is there now. The range may span several mappings and the
  // holes between them: the advice applies to what is mapped (ENOMEM says
  // some was not), and each huge page is collapsed on its own, so a hole or
  // a page the kernel cannot find loses that page only.
  if (madvise(at, n, MADV_HUGEPAGE) != 0 && errno != ENOMEM) return 0;
  int64_t done = 0;
  for (size_t off = 0; off < n; off += kHuge) {
    if (madvise(static_cast<char*>(at) + off, kHuge, MADV_COLLAPSE) == 0) done += static_cast<int64_t>(kHuge);
    else if (off == 0 && errno == EINVAL) return 0;  // no MADV_COLLAPSE in this kernel
  }
  return done;
}

int64_t collapse_to_huge_pages(const std::vector<std::span<const uint8_t>>& blocks) {
  if (!huge_pages_wanted()) return 0;
  std::vector<std::pair<uintptr_t, uintptr_t>> spans;
  for (std::span<const uint8_t> b : blocks)
    if (!b.empty()) spans.push_back({reinterpret_cast<uintptr_t>(b.data()), reinterpret_cast<uintptr_t>(b.data()) + b.size()});
  std::sort(spans.begin(), spans.end());
  int64_t done = 0;
  for (size_t i = 0; i < spans.size();) {
    const uintptr_t begin = spans[i].first;
    uintptr_t end = spans[i].second, own = end - begin;
    for (i++; i < spans.size() && spans[i].first < end + kHuge; i++) {
      own += spans[i].second - spans[i].first;
      end = std::max(end, spans[i].second);
    }
    const int64_t moved = collapse_to_huge_pages(reinterpret_cast<const void*>(begin), static_cast<int64_t>(end - begin));
    done += std::min(moved, static_cast<int64_t>(own));  // the blocks' bytes, not the gaps'
  }
  return done;
}

}  // namespace tessera
