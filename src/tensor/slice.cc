#include "tensor/slice.h"

#include <cstring>

namespace tessera {

namespace {

// Visits the block's rows (runs contiguous in both the global view and the
// local buffer): fn(global_offset, local_offset, run_length).
template <typename Fn>
void for_each_run(const TensorSlice& s, Fn fn) {
  const int r = s.view.rank;
  CHECK(r >= 1 && static_cast<int>(s.begin.size()) == r && static_cast<int>(s.size.size()) == r);
  for (int d = 0; d < r; d++) CHECK(s.begin[d] >= 0 && s.size[d] >= 0 && s.begin[d] + s.size[d] <= s.view[d]);
  if (s.block_numel() == 0) return;
  std::vector<int64_t> stride(r, 1);
  for (int d = r - 2; d >= 0; d--) stride[d] = stride[d + 1] * s.view[d + 1];
  const int64_t run = s.size[r - 1];
  std::vector<int64_t> idx(r, 0);  // position inside the block, last dim fixed at 0
  int64_t local = 0;
  while (true) {
    int64_t g = 0;
    for (int d = 0; d < r; d++) g += (s.begin[d] + idx[d]) * stride[d];
    fn(g, local, run);
    local += run;
    int d = r - 2;
    for (; d >= 0; d--) {
      if (++idx[d] < s.size[d]) break;
      idx[d] = 0;
    }
    if (d < 0) return;
  }
}

}  // namespace

void gather_block(const float* global, const TensorSlice& s, float* local) {
  for_each_run(s, [&](int64_t g, int64_t l, int64_t n) { std::memcpy(local + l, global + g, n * sizeof(float)); });
}

void scatter_block(const float* local, const TensorSlice& s, float* global) {
  for_each_run(s, [&](int64_t g, int64_t l, int64_t n) { std::memcpy(global + g, local + l, n * sizeof(float)); });
}

}  // namespace tessera
