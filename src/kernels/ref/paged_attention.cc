// The ragged-batch kernels of ops.inc (encoder with explicit positions, the
// KV-cache write, attention over a paged cache, fp32 or fp16) as plain
// loops: the oracle.
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/q4.h"
#include "kernels/ref/ops.h"

namespace tessera::ref {

void encoder_forward_positions(float* out, const int* inp, const int* pos, const float* wte, const float* wpe,
                               int N, int C) {
  for (int i = 0; i < N; i++) {
    const float* e = wte + static_cast<int64_t>(inp[i]) * C;
    const float* p = wpe ? wpe + static_cast<int64_t>(pos[i]) * C : nullptr;
    for (int c = 0; c < C; c++) out[static_cast<int64_t>(i) * C + c] = p ? e[c] + p[c] : e[c];
  }
}

namespace {

// The cache's element: fp32 as is, fp16 (IEEE half) rounded to nearest even.
float load(float x) { return x; }
float load(uint16_t h) { return q4::fp16_to_f32(h); }
void store(float* p, float x) { *p = x; }
void store(uint16_t* p, float x) { *p = q4::f32_to_fp16(x); }

template <class T>
void write_rows(T* kcache, T* vcache, const float* qkv, const int* slots, int N, int NH, int KV, int hs) {
  const int64_t W = static_cast<int64_t>(NH + 2 * KV) * hs, Ck = static_cast<int64_t>(KV) * hs;
  for (int i = 0; i < N; i++) {
    const float* row = qkv + i * W;
    for (int64_t c = 0; c < Ck; c++) {
      store(&kcache[slots[i] * Ck + c], row[NH * hs + c]);
      store(&vcache[slots[i] * Ck + c], row[NH * hs + Ck + c]);
    }
  }
}

template <class T>
void attend_rows(float* out, const float* qkv, const T* kcache, const T* vcache, const int* block_table,
                 const int* seq, const int* pos, int N, int NH, int KV, int hs, int bs, int W) {
  const int64_t Wq = static_cast<int64_t>(NH + 2 * KV) * hs, Ck = static_cast<int64_t>(KV) * hs;
  const int64_t Co = static_cast<int64_t>(NH) * hs;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  std::vector<float> att;
  for (int i = 0; i < N; i++) {
    const int* blocks = block_table + static_cast<int64_t>(seq[i]) * W;
    const int n_keys = pos[i] + 1;
    att.assign(n_keys, 0.0f);
    for (int h = 0; h < NH; h++) {
      const int g = h % KV;
      const float* q = qkv + i * Wq + h * hs;
      float maxval = -INFINITY;
      for (int t = 0; t < n_keys; t++) {
        const int64_t slot = static_cast<int64_t>(blocks[t / bs]) * bs + t % bs;
        const T* k = kcache + slot * Ck + g * hs;
        float v = 0.0f;
        for (int d = 0; d < hs; d++) v += q[d] * load(k[d]);
        att[t] = v * scale;
        if (att[t] > maxval) maxval = att[t];
      }
      float sum = 0.0f;
      for (int t = 0; t < n_keys; t++) {
        att[t] = std::exp(att[t] - maxval);
        sum += att[t];
      }
      float* o = out + i * Co + h * hs;
      for (int d = 0; d < hs; d++) o[d] = 0.0f;
      for (int t = 0; t < n_keys; t++) {
        const int64_t slot = static_cast<int64_t>(blocks[t / bs]) * bs + t % bs;
        const T* v = vcache + slot * Ck + g * hs;
        const float w = att[t] / sum;
        for (int d = 0; d < hs; d++) o[d] += w * load(v[d]);
      }
    }
  }
}

}  // namespace

void kv_cache_write_gqa(float* kcache, float* vcache, const float* qkv, const int* slots, int N, int NH, int KV,
                        int hs) {
  write_rows(kcache, vcache, qkv, slots, N, NH, KV, hs);
}

void kv_cache_write_gqa_f16(uint16_t* kcache, uint16_t* vcache, const float* qkv, const int* slots, int N, int NH,
                            int KV, int hs) {
  write_rows(kcache, vcache, qkv, slots, N, NH, KV, hs);
}

void kv_cache_write(float* kcache, float* vcache, const float* qkv, const int* slots, int N, int C) {
  // C = NH * hs for any split: the layout is the same.
  kv_cache_write_gqa(kcache, vcache, qkv, slots, N, 1, 1, C);
}

void paged_attention_gqa_forward(float* out, const float* qkv, const float* kcache, const float* vcache,
                                 const int* block_table, const int* seq, const int* pos, int N, int NH, int KV,
                                 int hs, int bs, int W) {
  attend_rows(out, qkv, kcache, vcache, block_table, seq, pos, N, NH, KV, hs, bs, W);
}

void paged_attention_gqa_f16_forward(float* out, const float* qkv, const uint16_t* kcache, const uint16_t* vcache,
                                     const int* block_table, const int* seq, const int* pos, int N, int NH, int KV,
                                     int hs, int bs, int W) {
  attend_rows(out, qkv, kcache, vcache, block_table, seq, pos, N, NH, KV, hs, bs, W);
}

void paged_attention_forward(float* out, const float* qkv, const float* kcache, const float* vcache,
                             const int* block_table, const int* seq, const int* pos, int N, int C, int NH, int bs,
                             int W) {
  paged_attention_gqa_forward(out, qkv, kcache, vcache, block_table, seq, pos, N, NH, NH, C / NH, bs, W);
}

}  // namespace tessera::ref
