#include "ckpt/reshard.h"

#include <algorithm>
#include <array>
#include <cstring>

#include "core/check.h"

namespace tessera::ckpt {
namespace {

using Index = std::array<int64_t, Shape::kMaxDims>;

// A box [lo, hi) per view dimension.
struct Box {
  int rank = 0;
  Index lo{}, hi{};
  bool empty() const {
    for (int d = 0; d < rank; d++)
      if (hi[d] <= lo[d]) return true;
    return false;
  }
};

Box block_box(const TensorSlice& s) {
  Box b;
  b.rank = s.view.rank;
  for (int d = 0; d < b.rank; d++) b.lo[d] = s.begin[d], b.hi[d] = s.begin[d] + s.size[d];
  return b;
}

Box intersect(const Box& a, const Box& b) {
  Box c;
  c.rank = a.rank;
  for (int d = 0; d < a.rank; d++) c.lo[d] = std::max(a.lo[d], b.lo[d]), c.hi[d] = std::min(a.hi[d], b.hi[d]);
  return c;
}

// Row-major position of view coordinate idx inside slice s's block.
int64_t block_offset(const TensorSlice& s, const Index& idx) {
  int64_t off = 0;
  for (int d = 0; d < s.view.rank; d++) off = off * s.size[d] + (idx[d] - s.begin[d]);
  return off;
}

int64_t flat_end(const TensorSlice& s) { return s.flat_end < 0 ? s.block_numel() : s.flat_end; }

// Calls fn(start, n) for each last-dimension run of a non-empty box, in
// row-major order: start is the run's first coordinate, n its length.
// fn returns false to stop early.
template <typename Fn>
void for_each_run(const Box& box, Fn fn) {
  if (box.empty()) return;
  const int r = box.rank;
  Index idx = box.lo;
  const int64_t n = box.hi[r - 1] - box.lo[r - 1];
  while (true) {
    if (!fn(idx, n)) return;
    int d = r - 2;
    for (; d >= 0; d--) {
      if (++idx[d] < box.hi[d]) break;
      idx[d] = box.lo[d];
    }
    if (d < 0) return;
  }
}

// Calls fn(have_offset, want_offset, n) for each run of elements the stored
// parts of have and want share; offsets index their stored data.
template <typename Fn>
void for_each_shared_run(const TensorSlice& have, const TensorSlice& want, Fn fn) {
  CHECK(have.view.rank == want.view.rank);
  const int64_t hb = have.flat_begin, he = flat_end(have), wb = want.flat_begin, we = flat_end(want);
  for_each_run(intersect(block_box(have), block_box(want)), [&](const Index& idx, int64_t n) {
    const int64_t hp = block_offset(have, idx), wp = block_offset(want, idx);
    // Both blocks are walked in row-major order, so offsets only grow.
    if (hp >= he || wp >= we) return false;
    const int64_t j0 = std::max({int64_t{0}, hb - hp, wb - wp});
    const int64_t j1 = std::min({n, he - hp, we - wp});
    if (j1 > j0) fn(hp + j0 - hb, wp + j0 - wb, j1 - j0);
    return true;
  });
}

}  // namespace

int64_t copy_intersection(const TensorSlice& have, std::span<const float> have_data, const TensorSlice& want,
                          std::span<float> out, std::span<uint8_t> covered) {
  CHECK(static_cast<int64_t>(have_data.size()) == have.numel() && static_cast<int64_t>(out.size()) == want.numel());
  int64_t copied = 0;
  for_each_shared_run(have, want, [&](int64_t h, int64_t w, int64_t n) {
    std::memcpy(out.data() + w, have_data.data() + h, n * sizeof(float));
    if (!covered.empty()) std::fill_n(covered.data() + w, n, uint8_t{1});
    copied += n;
  });
  return copied;
}

int64_t intersection_size(const TensorSlice& have, const TensorSlice& want) {
  int64_t shared = 0;
  for_each_shared_run(have, want, [&](int64_t, int64_t, int64_t n) { shared += n; });
  return shared;
}

int64_t zero_outside(const Shape& extent, const TensorSlice& want, std::span<float> out, std::span<uint8_t> covered) {
  CHECK(extent.rank == want.view.rank && static_cast<int64_t>(out.size()) == want.numel());
  const int64_t wb = want.flat_begin, we = flat_end(want);
  const Box block = block_box(want);
  int64_t zeroed = 0;
  // The outside is the disjoint union, over d, of the boxes inside the extent
  // in dimensions < d and beyond it in dimension d.
  for (int d = 0; d < extent.rank; d++) {
    Box outside = block;
    for (int e = 0; e < d; e++) outside.hi[e] = std::min(outside.hi[e], extent[e]);
    outside.lo[d] = std::max(outside.lo[d], extent[d]);
    for_each_run(outside, [&](const Index& idx, int64_t n) {
      const int64_t wp = block_offset(want, idx);
      if (wp >= we) return false;
      const int64_t j0 = std::max(int64_t{0}, wb - wp), j1 = std::min(n, we - wp);
      if (j1 > j0) {
        std::fill_n(out.data() + (wp + j0 - wb), j1 - j0, 0.0f);
        if (!covered.empty()) std::fill_n(covered.data() + (wp + j0 - wb), j1 - j0, uint8_t{1});
        zeroed += j1 - j0;
      }
      return true;
    });
  }
  return zeroed;
}

}  // namespace tessera::ckpt
