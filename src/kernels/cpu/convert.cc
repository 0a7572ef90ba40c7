#include "kernels/cpu/convert.h"

#include <algorithm>
#include <cstring>

#include <omp.h>

namespace tessera::cpu {

namespace {
inline bf16 round_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  // Round to nearest even; inputs here are finite activations and weights
  // (a NaN would become +-Inf-ish garbage, but the loss check catches NaN).
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<bf16>(u >> 16);
}
}  // namespace

const bf16* to_bf16(const float* x, int64_t n, std::vector<bf16>& buf) {
  if (static_cast<int64_t>(buf.size()) < n) buf.resize(n);
  bf16* out = buf.data();
#pragma omp parallel for simd schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; i++) out[i] = round_to_bf16(x[i]);
  return out;
}

const bf16* to_bf16_transposed(const float* x, int64_t rows, int64_t cols, std::vector<bf16>& buf) {
  int64_t n = rows * cols;
  if (static_cast<int64_t>(buf.size()) < n) buf.resize(n);
  bf16* out = buf.data();
  constexpr int64_t kTile = 64;  // tile so both sides stay in cache
#pragma omp parallel for collapse(2) schedule(static) if (n > 65536)
  for (int64_t c0 = 0; c0 < cols; c0 += kTile) {
    for (int64_t r0 = 0; r0 < rows; r0 += kTile) {
      int64_t c1 = std::min(cols, c0 + kTile), r1 = std::min(rows, r0 + kTile);
      for (int64_t c = c0; c < c1; c++)
        for (int64_t r = r0; r < r1; r++) out[c * rows + r] = round_to_bf16(x[r * cols + c]);
    }
  }
  return out;
}

void bias_backward(float* dbias, const float* dout, int N, int OC) {
  // Parallel over column blocks: each thread owns its columns, no reduction.
  constexpr int kBlock = 64;
  int nblocks = (OC + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (static_cast<int64_t>(N) * OC > 65536)
  for (int blk = 0; blk < nblocks; blk++) {
    int o0 = blk * kBlock, o1 = std::min(OC, o0 + kBlock);
    float acc[kBlock] = {};
    for (int i = 0; i < N; i++) {
      const float* row = dout + static_cast<int64_t>(i) * OC;
#pragma omp simd
      for (int o = o0; o < o1; o++) acc[o - o0] += row[o];
    }
    for (int o = o0; o < o1; o++) dbias[o] += acc[o - o0];
  }
}

}  // namespace tessera::cpu
