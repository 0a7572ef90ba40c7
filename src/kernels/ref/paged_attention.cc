// The ragged-batch kernels of ops.inc (encoder with explicit positions, the
// KV-cache write, attention over a paged cache) as plain loops: the oracle.
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/ref/ops.h"

namespace tessera::ref {

void encoder_forward_positions(float* out, const int* inp, const int* pos, const float* wte, const float* wpe,
                               int N, int C) {
  for (int i = 0; i < N; i++) {
    const float* e = wte + static_cast<int64_t>(inp[i]) * C;
    const float* p = wpe + static_cast<int64_t>(pos[i]) * C;
    for (int c = 0; c < C; c++) out[static_cast<int64_t>(i) * C + c] = e[c] + p[c];
  }
}

void kv_cache_write(float* kcache, float* vcache, const float* qkv, const int* slots, int N, int C) {
  for (int i = 0; i < N; i++) {
    const float* row = qkv + static_cast<int64_t>(i) * 3 * C;
    for (int c = 0; c < C; c++) {
      kcache[static_cast<int64_t>(slots[i]) * C + c] = row[C + c];
      vcache[static_cast<int64_t>(slots[i]) * C + c] = row[2 * C + c];
    }
  }
}

void paged_attention_forward(float* out, const float* qkv, const float* kcache, const float* vcache,
                             const int* block_table, const int* seq, const int* pos, int N, int C, int NH, int bs,
                             int W) {
  const int hs = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  std::vector<float> att;
  for (int i = 0; i < N; i++) {
    const int* blocks = block_table + static_cast<int64_t>(seq[i]) * W;
    const int n_keys = pos[i] + 1;
    att.assign(n_keys, 0.0f);
    for (int h = 0; h < NH; h++) {
      const float* q = qkv + static_cast<int64_t>(i) * 3 * C + h * hs;
      float maxval = -INFINITY;
      for (int t = 0; t < n_keys; t++) {
        const int64_t slot = static_cast<int64_t>(blocks[t / bs]) * bs + t % bs;
        const float* k = kcache + slot * C + h * hs;
        float v = 0.0f;
        for (int d = 0; d < hs; d++) v += q[d] * k[d];
        att[t] = v * scale;
        if (att[t] > maxval) maxval = att[t];
      }
      float sum = 0.0f;
      for (int t = 0; t < n_keys; t++) {
        att[t] = std::exp(att[t] - maxval);
        sum += att[t];
      }
      float* o = out + static_cast<int64_t>(i) * C + h * hs;
      for (int d = 0; d < hs; d++) o[d] = 0.0f;
      for (int t = 0; t < n_keys; t++) {
        const int64_t slot = static_cast<int64_t>(blocks[t / bs]) * bs + t % bs;
        const float* v = vcache + slot * C + h * hs;
        const float w = att[t] / sum;
        for (int d = 0; d < hs; d++) o[d] += w * v[d];
      }
    }
  }
}

}  // namespace tessera::ref
