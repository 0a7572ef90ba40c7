// The ragged-batch kernels of ops.inc on the CPU: the encoder with explicit
// positions, the KV-cache write, and attention over a paged cache.
//
// Attention: one (row, head) item per OpenMP iteration, dealt round-robin
// (a row's work grows with its position). Each item walks its sequence's
// blocks in position order; inside a block the keys are contiguous with
// stride C. Scores live in a per-thread buffer that grows to the longest
// sequence seen and is then reused (decode steps allocate nothing).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/ops.h"
#include "kernels/cpu/vec_math.h"

namespace tessera::cpu {

namespace {

// out (hs) = softmax(scale q.k) v over keys 0..n_keys-1 of one head, whose
// position t sits at pool row blocks[t / bs] * bs + t % bs (head columns at
// offset 0 of kcache/vcache as passed). scores (n_keys) is scratch.
TESSERA_CPU_CLONES void attend_paged(float* out, const float* q, const float* kcache, const float* vcache,
                                     const int* blocks, int n_keys, int bs, int hs, int64_t C, float scale,
                                     float* scores) {
  float maxval = -INFINITY;
  for (int t0 = 0; t0 < n_keys; t0 += bs) {
    const int n = std::min(bs, n_keys - t0);
    const float* k = kcache + static_cast<int64_t>(blocks[t0 / bs]) * bs * C;
    for (int j = 0; j < n; j++) {
      const float* kj = k + j * C;
      float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
      for (int d = 0; d < hs; d++) dot += q[d] * kj[d];
      scores[t0 + j] = dot * scale;
      maxval = std::max(maxval, scores[t0 + j]);
    }
  }
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int t = 0; t < n_keys; t++) {
    scores[t] = exp_approx(scores[t] - maxval);
    sum += scores[t];
  }
  const float inv_sum = 1.0f / sum;
  std::fill(out, out + hs, 0.0f);
  for (int t0 = 0; t0 < n_keys; t0 += bs) {
    const int n = std::min(bs, n_keys - t0);
    const float* v = vcache + static_cast<int64_t>(blocks[t0 / bs]) * bs * C;
    for (int j = 0; j < n; j++) {
      const float* vj = v + j * C;
      const float w = scores[t0 + j] * inv_sum;
#pragma omp simd
      for (int d = 0; d < hs; d++) out[d] += w * vj[d];
    }
  }
}

}  // namespace

void encoder_forward_positions(float* out, const int* inp, const int* pos, const float* wte, const float* wpe,
                               int N, int C) {
#pragma omp parallel for if (static_cast<int64_t>(N) * C > (1 << 16))
  for (int i = 0; i < N; i++) {
    const float* e = wte + static_cast<int64_t>(inp[i]) * C;
    float* o = out + static_cast<int64_t>(i) * C;
    if (!wpe) {
      std::memcpy(o, e, sizeof(float) * C);
      continue;
    }
    const float* p = wpe + static_cast<int64_t>(pos[i]) * C;
#pragma omp simd
    for (int c = 0; c < C; c++) o[c] = e[c] + p[c];
  }
}

void kv_cache_write_gqa(float* kcache, float* vcache, const float* qkv, const int* slots, int N, int NH, int KV,
                        int hs) {
  const int64_t W = static_cast<int64_t>(NH + 2 * KV) * hs, Ck = static_cast<int64_t>(KV) * hs;
  for (int i = 0; i < N; i++) {
    const float* row = qkv + i * W + static_cast<int64_t>(NH) * hs;
    std::memcpy(kcache + slots[i] * Ck, row, sizeof(float) * Ck);
    std::memcpy(vcache + slots[i] * Ck, row + Ck, sizeof(float) * Ck);
  }
}

void kv_cache_write(float* kcache, float* vcache, const float* qkv, const int* slots, int N, int C) {
  kv_cache_write_gqa(kcache, vcache, qkv, slots, N, 1, 1, C);
}

void paged_attention_gqa_forward(float* out, const float* qkv, const float* kcache, const float* vcache,
                                 const int* block_table, const int* seq, const int* pos, int N, int NH, int KV,
                                 int hs, int bs, int W) {
  const int64_t Wq = static_cast<int64_t>(NH + 2 * KV) * hs, Ck = static_cast<int64_t>(KV) * hs;
  const int64_t Co = static_cast<int64_t>(NH) * hs;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const int items = N * NH;
  int longest = 0;
  for (int i = 0; i < N; i++) longest = std::max(longest, pos[i] + 1);
#pragma omp parallel if (items > 1)
  {
    thread_local std::vector<float> scores;
    if (static_cast<int>(scores.size()) < longest) scores.resize(longest);
#pragma omp for schedule(static, 1)
    for (int item = 0; item < items; item++) {
      const int i = item / NH, h = item % NH, g = h % KV;
      attend_paged(out + i * Co + h * hs, qkv + i * Wq + h * hs, kcache + g * hs, vcache + g * hs,
                   block_table + static_cast<int64_t>(seq[i]) * W, pos[i] + 1, bs, hs, Ck, scale, scores.data());
    }
  }
}

void paged_attention_forward(float* out, const float* qkv, const float* kcache, const float* vcache,
                             const int* block_table, const int* seq, const int* pos, int N, int C, int NH, int bs,
                             int W) {
  paged_attention_gqa_forward(out, qkv, kcache, vcache, block_table, seq, pos, N, NH, NH, C / NH, bs, W);
}

}  // namespace tessera::cpu
