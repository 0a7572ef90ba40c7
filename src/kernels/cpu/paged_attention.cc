// The ragged-batch kernels of ops.inc on the CPU: the encoder with explicit
// positions, the KV-cache write, and attention over a paged cache.
//
// Attention: one item per OpenMP iteration, dealt round-robin (a row's work
// grows with its position): a row's heads, whole, or in as many pieces as
// it takes to give every thread one when the rows are fewer than the
// threads (a decode step). Each item walks its sequence's blocks in
// position order, reading its heads' slice of each key row at once (a
// block's rows are contiguous, stride KV * hs). Scores live in a
// per-thread buffer that grows to the longest sequence seen and is then
// reused (decode steps allocate nothing).
//
// A decode step finds its cache in memory (the weights' stream has evicted
// it since the last step), and an item's slices, a few hundred bytes a
// row, a row apart, are a pattern the hardware prefetcher does not follow
// far enough: while a head reads a block, the same head's slice of the next
// block (after the last key block, the first value block) is prefetched
// into L2, one line for each line read, so the requests spread over the
// block's work. BM_PagedAttentionDecode on Zen 4 (2 threads, the cache from
// memory): GPT-2's shape 24.5-25 -> 27.6-28.6 GB/s, TinyLlama's 8.6-9.0 ->
// 10.3-10.7.
// (All of a next block's lines at once, at a block's start, did not help:
// the requests queue behind each other.)
//
// Grouped-query attention (more query heads than key/value heads: 8 a
// key/value head in TinyLlama) made the per-head kernels compute-bound, a
// key row loaded, converted and reduced once for each query head: an item
// with 2 or more query heads a key/value head now takes the group kernels,
// which convert and transpose a block's keys once and load its values once
// for all of them, with the same bits (scores_group_avx512).
// BM_PagedAttentionDecode, TinyLlama's shape, 512 positions, Zen 4: 2 ->
// 1.3 ms (fp32 cache), 1.9 -> 1.5 (fp16); one thread 1.5-1.6x.
//
// The cache holds fp32 or fp16 (KvDtype::kF16): every kernel below is a
// template on the element type, whose loads convert fp16 to fp32 exactly,
// so the two compute the same sums in the same order.
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/cpu_features.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/vec_math.h"
#include "kernels/q4.h"

namespace tessera::cpu {

namespace {

// One item: heads g + r * KV for g in [g0, g1), r in [r0, r1) of one row
// (q: the row's queries, head h at h * hs; out: its output, the same
// layout). kcache/vcache rows hold KV * hs floats; position t sits at pool
// row blocks[t / bs] * bs + t % bs. For each head, out (hs) = softmax(scale
// q.k) v over keys 0..n_keys-1. scores: (r1 - r0) * (g1 - g0) * n_keys floats
// of scratch.
template <class T>
struct Item {
  float* out;
  const float* q;
  const T* kcache;
  const T* vcache;
  const int* blocks;
  int n_keys, bs, hs, KV, g0, g1, r0, r1;
  float scale;
  float* scores;

  int64_t row_floats() const { return static_cast<int64_t>(KV) * hs; }
  int heads() const { return (r1 - r0) * (g1 - g0); }
  // Head e of the item (e = (r - r0) * (g1 - g0) + g - g0): its scores.
  float* head_scores(int e) const { return scores + static_cast<int64_t>(e) * n_keys; }

  // f(g, k, n, t0, next) for every block of the pool (kcache or vcache) in
  // position order and every key/value head g of the item: k is head g's
  // slice of the block's first row (row j at k + j * row_floats()), n the
  // rows in use, t0 the block's first position; next the same slice of the
  // block to prefetch (the next block, or after the last one the first
  // block of `then`, the pool read next; null past that). The query heads
  // that share g come one after the other, inside f, so the slice is read
  // from memory once and then from L1 (TinyLlama's 8 a key/value head: +9%
  // in BM_PagedAttentionDecode against key/value heads in the inner loop).
  template <class F>
  void each_block_group(const T* pool, const T* then, F&& f) const {
    const int64_t C = row_floats();
    for (int t0 = 0; t0 < n_keys; t0 += bs) {
      const T* block = pool + static_cast<int64_t>(blocks[t0 / bs]) * bs * C;
      const T* next = t0 + bs < n_keys ? pool + static_cast<int64_t>(blocks[t0 / bs + 1]) * bs * C
                      : then           ? then + static_cast<int64_t>(blocks[0]) * bs * C
                                       : nullptr;
      const int n = std::min(bs, n_keys - t0);
      for (int g = g0; g < g1; g++)
        f(g, block + static_cast<int64_t>(g) * hs, n, t0, next ? next + static_cast<int64_t>(g) * hs : nullptr);
    }
  }
  // Query head r of key/value head g: its index in the model and its scores.
  int head(int g, int r) const { return g + r * KV; }
  float* group_scores(int g, int r) const { return head_scores((r - r0) * (g1 - g0) + g - g0); }
};

// Three passes over the item's blocks, in position order: the scores of
// every head, block by block (a block's rows are contiguous, and the item's
// heads read their slice of each row while the block is in cache), the
// softmax of each head, then the values, block by block. A head's sums do
// not depend on which other heads share its item, so the result does not
// depend on the number of threads. Three kernels of the first and last
// pass: avx512 (16 keys a reduction), avx2 (8), and plain loops.

#define TESSERA_TARGET_AVX2 __attribute__((target("avx2,fma,f16c")))
#define TESSERA_TARGET_AVX512 __attribute__((target("avx2,fma,f16c,avx512f")))

// Loads of a cache's elements as fp32 lanes: fp32 as is, fp16 through the
// exact half -> float conversion (vcvtph2ps; the zero-masking form with a
// full mask, without the undefined register GCC 12 warns about in the
// plain one). load16/load8: a whole vector;
// the _first forms: the first n lanes, the rest zero (an fp16 tail goes
// through a zeroed copy: a masked 16-bit load needs AVX512BW).
TESSERA_TARGET_AVX512 inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
TESSERA_TARGET_AVX512 inline __m512 load16(const uint16_t* p) {
  return _mm512_maskz_cvtph_ps(0xFFFF, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
TESSERA_TARGET_AVX512 inline __m512 load16_first(const float* p, int n) {
  return _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << n) - 1), p);
}
TESSERA_TARGET_AVX512 inline __m512 load16_first(const uint16_t* p, int n) {
  alignas(32) uint16_t part[16] = {};
  std::memcpy(part, p, sizeof(uint16_t) * n);
  return _mm512_maskz_cvtph_ps(0xFFFF, _mm256_load_si256(reinterpret_cast<const __m256i*>(part)));
}
TESSERA_TARGET_AVX2 inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
TESSERA_TARGET_AVX2 inline __m256 load8(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
TESSERA_TARGET_AVX2 inline __m256 load8_first(const float* p, __m256i mask, int /*n*/) {
  return _mm256_maskload_ps(p, mask);
}
TESSERA_TARGET_AVX2 inline __m256 load8_first(const uint16_t* p, __m256i /*mask*/, int n) {
  alignas(16) uint16_t part[8] = {};
  std::memcpy(part, p, sizeof(uint16_t) * n);
  return _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(part)));
}
// The line at p into L2 (a prefetch never faults) when p is the first
// element of a 64-byte line of the slice (every 64 / sizeof(T) elements
// from `col` 0), so one is issued for each line read. pf may be null.
template <class T>
inline void prefetch_line(const T* pf, int64_t row, int64_t C, int col) {
  if (pf && (col * sizeof(T)) % 64 == 0) _mm_prefetch(reinterpret_cast<const char*>(pf + row * C + col), _MM_HINT_T1);
}

inline float load1(float x) { return x; }
inline float load1(uint16_t h) { return q4::fp16_to_f32(h); }
// One element in a vector kernel's scalar tail, inline either way. The tail
// spells its FMAs out (std::fma): left to GCC, the fp32 tail was vectorised
// as separate multiplies and adds and the fp16 one contracted, two roundings
// against one.
TESSERA_TARGET_AVX2 inline float load1_f16c(float x) { return x; }
TESSERA_TARGET_AVX2 inline float load1_f16c(uint16_t h) { return _cvtsh_ss(h); }

// s[j] = scale q.k_j for the n rows of a block, k_j at k + j * C (one
// head's slice). Keys past n in the last group of 16 (8) repeat row n - 1:
// their lanes are computed and not stored.
template <class T>
TESSERA_TARGET_AVX512 void scores_block_avx512(float* s, const float* q, const T* k, int64_t C, int n, int hs,
                                               float scale, const T* pf) {
  const __mmask16 tail = static_cast<__mmask16>((1u << (hs % 16)) - 1);
  for (int j0 = 0; j0 < n; j0 += 16) {
    const T* rows[16];
    for (int j = 0; j < 16; j++) rows[j] = k + std::min(j0 + j, n - 1) * C;
    __m512 acc[16];
    for (int j = 0; j < 16; j++) acc[j] = _mm512_setzero_ps();
    int d = 0;
    for (; d + 16 <= hs; d += 16) {
      const __m512 qv = _mm512_loadu_ps(q + d);
      for (int j = 0; j < 16; j++) acc[j] = _mm512_fmadd_ps(qv, load16(rows[j] + d), acc[j]);
      for (int j = 0; j < 16; j++) prefetch_line(pf, j0 + j, C, d);
    }
    if (d < hs) {
      const __m512 qv = _mm512_maskz_loadu_ps(tail, q + d);
      for (int j = 0; j < 16; j++) acc[j] = _mm512_fmadd_ps(qv, load16_first(rows[j] + d, hs % 16), acc[j]);
    }
    const __mmask16 keep = static_cast<__mmask16>(n - j0 >= 16 ? 0xFFFF : (1u << (n - j0)) - 1);
    _mm512_mask_storeu_ps(s + j0, keep, _mm512_mul_ps(hsum512_x16(acc), _mm512_set1_ps(scale)));
  }
}

template <class T>
TESSERA_TARGET_AVX2 void scores_block_avx2(float* s, const float* q, const T* k, int64_t C, int n, int hs,
                                           float scale, const T* pf) {
  alignas(32) int tail_bits[8];
  for (int j = 0; j < 8; j++) tail_bits[j] = j < hs % 8 ? -1 : 0;
  const __m256i tail = _mm256_load_si256(reinterpret_cast<const __m256i*>(tail_bits));
  for (int j0 = 0; j0 < n; j0 += 8) {
    const T* rows[8];
    for (int j = 0; j < 8; j++) rows[j] = k + std::min(j0 + j, n - 1) * C;
    __m256 acc[8];
    for (int j = 0; j < 8; j++) acc[j] = _mm256_setzero_ps();
    int d = 0;
    for (; d + 8 <= hs; d += 8) {
      const __m256 qv = _mm256_loadu_ps(q + d);
      for (int j = 0; j < 8; j++) acc[j] = _mm256_fmadd_ps(qv, load8(rows[j] + d), acc[j]);
      for (int j = 0; j < 8; j++) prefetch_line(pf, j0 + j, C, d);
    }
    if (d < hs) {
      const __m256 qv = _mm256_maskload_ps(q + d, tail);
      for (int j = 0; j < 8; j++) acc[j] = _mm256_fmadd_ps(qv, load8_first(rows[j] + d, tail, hs % 8), acc[j]);
    }
    alignas(32) float sums[8];
    _mm256_store_ps(sums, _mm256_mul_ps(hsum256_x8(acc), _mm256_set1_ps(scale)));
    std::copy_n(sums, std::min(8, n - j0), s + j0);
  }
}

template <class T>
void scores_block_generic(float* s, const float* q, const T* k, int64_t C, int n, int hs, float scale) {
  for (int j = 0; j < n; j++) {
    float dot = 0.0f;
    for (int d = 0; d < hs; d++) dot += q[d] * load1(k[j * C + d]);
    s[j] = dot * scale;
  }
}

// The query heads that share a key/value head, together (grouped-query
// attention: TinyLlama's 8 a key/value head). The kernels above read a key
// row, convert it and reduce 16 (8) dot products for every query head
// apart: with 8 heads a block is compute-bound (its cache read at 4-11
// GB/s). Here a group of 16 (8) keys is converted and transposed once into
// kt (kt[d * 16 + j]: element d of key j), and each query head's scores are
// FMAs of its elements, broadcast, with kt's rows: lane j is key j. A
// head's accumulator l sums the products of d = l, l + 16, ... in the
// order the per-head kernel's lane l does, and the 16 (8) accumulators add
// up in hsum512_x16's (hsum256_x8's) tree, so the scores have the same bits
// as the per-head kernel's and the path can be picked by anything (the
// heads an item has). Whole vectors of hs only (hs % 16, hs % 8 == 0) and
// hs <= kGroupMaxHs; other shapes take the per-head kernels.
constexpr int kGroupMaxHs = 256;

// r[0..15] (16 rows of 16 floats) -> their transpose, in place.
TESSERA_TARGET_AVX512 inline void transpose16(__m512* r) {
  const __mmask16 all = 0xFFFF;
  const __mmask8 all8 = 0xFF;
  __m512 t[16], u[16];
  for (int i = 0; i < 8; i++) {
    t[2 * i] = _mm512_maskz_unpacklo_ps(all, r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_maskz_unpackhi_ps(all, r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; i++) {  // u[4i + m], 128-bit lane L: rows 4i..4i+3 of column 4L + m
    const __m512d a = _mm512_castps_pd(t[4 * i]), b = _mm512_castps_pd(t[4 * i + 1]);
    const __m512d c = _mm512_castps_pd(t[4 * i + 2]), d = _mm512_castps_pd(t[4 * i + 3]);
    u[4 * i] = _mm512_castpd_ps(_mm512_maskz_unpacklo_pd(all8, a, c));
    u[4 * i + 1] = _mm512_castpd_ps(_mm512_maskz_unpackhi_pd(all8, a, c));
    u[4 * i + 2] = _mm512_castpd_ps(_mm512_maskz_unpacklo_pd(all8, b, d));
    u[4 * i + 3] = _mm512_castpd_ps(_mm512_maskz_unpackhi_pd(all8, b, d));
  }
  for (int m = 0; m < 4; m++) {  // the 4 x 4 transpose of u[m], u[4 + m], u[8 + m], u[12 + m]'s lanes
    const __m512 v0 = _mm512_maskz_shuffle_f32x4(all, u[m], u[4 + m], 0x88);
    const __m512 v1 = _mm512_maskz_shuffle_f32x4(all, u[m], u[4 + m], 0xDD);
    const __m512 v2 = _mm512_maskz_shuffle_f32x4(all, u[8 + m], u[12 + m], 0x88);
    const __m512 v3 = _mm512_maskz_shuffle_f32x4(all, u[8 + m], u[12 + m], 0xDD);
    r[m] = _mm512_maskz_shuffle_f32x4(all, v0, v2, 0x88);
    r[8 + m] = _mm512_maskz_shuffle_f32x4(all, v0, v2, 0xDD);
    r[4 + m] = _mm512_maskz_shuffle_f32x4(all, v1, v3, 0x88);
    r[12 + m] = _mm512_maskz_shuffle_f32x4(all, v1, v3, 0xDD);
  }
}

// s[e][j] = scale q[e].k_j for the R heads e of a group and the n rows of
// a block (one key/value head's slice, k_j at k + j * C); hs % 16 == 0.
template <class T>
TESSERA_TARGET_AVX512 void scores_group_avx512(float* const* s, const float* const* q, int R, const T* k, int64_t C,
                                               int n, int hs, float scale, const T* pf) {
  alignas(64) float kt[16 * kGroupMaxHs];
  const __m512 vscale = _mm512_set1_ps(scale);
  for (int j0 = 0; j0 < n; j0 += 16) {
    const T* rows[16];
    for (int j = 0; j < 16; j++) rows[j] = k + std::min(j0 + j, n - 1) * C;
    for (int d = 0; d < hs; d += 16) {
      __m512 r[16];
      for (int j = 0; j < 16; j++) r[j] = load16(rows[j] + d);
      for (int j = 0; j < 16; j++) prefetch_line(pf, j0 + j, C, d);
      transpose16(r);
      for (int l = 0; l < 16; l++) _mm512_store_ps(kt + (d + l) * 16, r[l]);
    }
    const __mmask16 keep = static_cast<__mmask16>(n - j0 >= 16 ? 0xFFFF : (1u << (n - j0)) - 1);
    for (int e = 0; e < R; e++) {
      const float* qe = q[e];
      __m512 p[16];
      for (int l = 0; l < 16; l++) p[l] = _mm512_setzero_ps();
      for (int d = 0; d < hs; d += 16)
        for (int l = 0; l < 16; l++)
          p[l] = _mm512_fmadd_ps(_mm512_set1_ps(qe[d + l]), _mm512_load_ps(kt + (d + l) * 16), p[l]);
      // hsum512_x16's tree: in each 4: (0 + 2) + (1 + 3); then (0 + 1) + (2 + 3) of the fours.
      __m512 four[4];
      for (int L = 0; L < 4; L++)
        four[L] = _mm512_add_ps(_mm512_add_ps(p[4 * L], p[4 * L + 2]), _mm512_add_ps(p[4 * L + 1], p[4 * L + 3]));
      const __m512 sum = _mm512_add_ps(_mm512_add_ps(four[0], four[1]), _mm512_add_ps(four[2], four[3]));
      _mm512_mask_storeu_ps(s[e] + j0, keep, _mm512_mul_ps(sum, vscale));
    }
  }
}

// r[0..7] (8 rows of 8 floats) -> their transpose, in place.
TESSERA_TARGET_AVX2 inline void transpose8(__m256* r) {
  __m256 t[8], u[8];
  for (int i = 0; i < 4; i++) {
    t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 2; i++) {  // u[4i + m], half H: rows 4i..4i+3 of column 4H + m
    u[4 * i] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
    u[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
    u[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
    u[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
  }
  for (int m = 0; m < 4; m++) {
    r[m] = _mm256_permute2f128_ps(u[m], u[4 + m], 0x20);
    r[4 + m] = _mm256_permute2f128_ps(u[m], u[4 + m], 0x31);
  }
}

template <class T>
TESSERA_TARGET_AVX2 void scores_group_avx2(float* const* s, const float* const* q, int R, const T* k, int64_t C,
                                           int n, int hs, float scale, const T* pf) {
  alignas(32) float kt[8 * kGroupMaxHs];
  const __m256 vscale = _mm256_set1_ps(scale);
  for (int j0 = 0; j0 < n; j0 += 8) {
    const T* rows[8];
    for (int j = 0; j < 8; j++) rows[j] = k + std::min(j0 + j, n - 1) * C;
    for (int d = 0; d < hs; d += 8) {
      __m256 r[8];
      for (int j = 0; j < 8; j++) r[j] = load8(rows[j] + d);
      for (int j = 0; j < 8; j++) prefetch_line(pf, j0 + j, C, d);
      transpose8(r);
      for (int l = 0; l < 8; l++) _mm256_store_ps(kt + (d + l) * 8, r[l]);
    }
    const int keep = std::min(8, n - j0);
    for (int e = 0; e < R; e++) {
      const float* qe = q[e];
      __m256 p[8];
      for (int l = 0; l < 8; l++) p[l] = _mm256_setzero_ps();
      for (int d = 0; d < hs; d += 8)
        for (int l = 0; l < 8; l++)
          p[l] = _mm256_fmadd_ps(_mm256_broadcast_ss(qe + d + l), _mm256_load_ps(kt + (d + l) * 8), p[l]);
      // hsum256_x8's tree: ((0 + 1) + (2 + 3)) + ((4 + 5) + (6 + 7)).
      const __m256 sum = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(p[0], p[1]), _mm256_add_ps(p[2], p[3])),
                                       _mm256_add_ps(_mm256_add_ps(p[4], p[5]), _mm256_add_ps(p[6], p[7])));
      alignas(32) float sums[8];
      _mm256_store_ps(sums, _mm256_mul_ps(sum, vscale));
      std::copy_n(sums, keep, s[e] + j0);
    }
  }
}

// Each head's scores -> its softmax weights, in place.
template <class T>
TESSERA_CPU_CLONES void softmax_heads(const Item<T>& it) {
  for (int e = 0; e < it.heads(); e++) {
    float* s = it.head_scores(e);
    float maxval = -INFINITY;
    for (int t = 0; t < it.n_keys; t++) maxval = std::max(maxval, s[t]);
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int t = 0; t < it.n_keys; t++) {
      s[t] = exp_approx(s[t] - maxval);
      sum += s[t];
    }
    const float inv_sum = 1.0f / sum;
#pragma omp simd
    for (int t = 0; t < it.n_keys; t++) s[t] *= inv_sum;
  }
}

// Vector u of U: the last one masked when kTail.
template <int U, bool kTail, class T>
TESSERA_TARGET_AVX512 inline __m512 load_part(const T* p, int u, __mmask16 last) {
  return kTail && u == U - 1 ? load16_first(p, __builtin_popcount(last)) : load16(p);
}

// out (U vectors of a head's output) += sum over a block's n rows of
// w[j] * v[j], v row j at v + j * C: even and odd rows in two sets of
// accumulators (two FMA chains), added at the block's end. U is a template
// argument so that the accumulators stay in registers. The last vector
// takes the lanes of `last` when kTail (avx512; avx2 has whole vectors
// only).
template <int U, bool kTail, class T>
TESSERA_TARGET_AVX512 void values_avx512(float* out, const float* w, const T* v, int64_t C, int n,
                                         __mmask16 last, const T* pf, int col) {
  // Whole vectors load and store unmasked: a masked load of what a masked
  // store just wrote is not forwarded from the store buffer, and out is
  // read back at the next block.
  __m512 even[U], odd[U];
  for (int u = 0; u < U; u++) even[u] = odd[u] = _mm512_setzero_ps();
  int j = 0;
  for (; j + 2 <= n; j += 2) {
    const __m512 w0 = _mm512_set1_ps(w[j]), w1 = _mm512_set1_ps(w[j + 1]);
    const T* v0 = v + j * C;
    for (int u = 0; u < U; u++) {
      even[u] = _mm512_fmadd_ps(w0, load_part<U, kTail>(v0 + 16 * u, u, last), even[u]);
      odd[u] = _mm512_fmadd_ps(w1, load_part<U, kTail>(v0 + C + 16 * u, u, last), odd[u]);
      prefetch_line(pf, j, C, col + 16 * u);
      prefetch_line(pf, j + 1, C, col + 16 * u);
    }
  }
  if (j < n) {
    const __m512 w0 = _mm512_set1_ps(w[j]);
    for (int u = 0; u < U; u++)
      even[u] = _mm512_fmadd_ps(w0, load_part<U, kTail>(v + j * C + 16 * u, u, last), even[u]);
  }
  for (int u = 0; u < U; u++) {
    const __m512 sum = _mm512_add_ps(load_part<U, kTail>(out + 16 * u, u, last), _mm512_add_ps(even[u], odd[u]));
    if (kTail && u == U - 1)
      _mm512_mask_storeu_ps(out + 16 * u, last, sum);
    else
      _mm512_storeu_ps(out + 16 * u, sum);
  }
}

template <int U, class T>
TESSERA_TARGET_AVX2 void values_avx2(float* out, const float* w, const T* v, int64_t C, int n, const T* pf,
                                     int col) {
  __m256 even[U], odd[U];
  for (int u = 0; u < U; u++) even[u] = odd[u] = _mm256_setzero_ps();
  int j = 0;
  for (; j + 2 <= n; j += 2) {
    const __m256 w0 = _mm256_set1_ps(w[j]), w1 = _mm256_set1_ps(w[j + 1]);
    const T* v0 = v + j * C;
    for (int u = 0; u < U; u++) {
      even[u] = _mm256_fmadd_ps(w0, load8(v0 + 8 * u), even[u]);
      odd[u] = _mm256_fmadd_ps(w1, load8(v0 + C + 8 * u), odd[u]);
      prefetch_line(pf, j, C, col + 8 * u);
      prefetch_line(pf, j + 1, C, col + 8 * u);
    }
  }
  if (j < n) {
    const __m256 w0 = _mm256_set1_ps(w[j]);
    for (int u = 0; u < U; u++) even[u] = _mm256_fmadd_ps(w0, load8(v + j * C + 8 * u), even[u]);
  }
  for (int u = 0; u < U; u++)
    _mm256_storeu_ps(out + 8 * u, _mm256_add_ps(_mm256_loadu_ps(out + 8 * u), _mm256_add_ps(even[u], odd[u])));
}

// A head's whole output (hs floats) from one block: 64 columns at a time.
// pf: the head's slice of the block to prefetch (pf + d0 is passed down
// with d0, the lines counted from the slice's start).
template <class T>
TESSERA_TARGET_AVX512 void values_block_avx512(float* out, const float* w, const T* v, int64_t C, int n,
                                               int hs, const T* pf) {
  for (int d0 = 0; d0 < hs; d0 += 64) {
    const int width = std::min(64, hs - d0), U = (width + 15) / 16;
    const __mmask16 last = static_cast<__mmask16>((1u << (width % 16)) - 1);
    const bool tail = width % 16 != 0;
    switch (U * 2 + tail) {
      case 2: values_avx512<1, false, T>(out + d0, w, v + d0, C, n, last, pf, d0); break;
      case 3: values_avx512<1, true, T>(out + d0, w, v + d0, C, n, last, pf, d0); break;
      case 4: values_avx512<2, false, T>(out + d0, w, v + d0, C, n, last, pf, d0); break;
      case 5: values_avx512<2, true, T>(out + d0, w, v + d0, C, n, last, pf, d0); break;
      case 6: values_avx512<3, false, T>(out + d0, w, v + d0, C, n, last, pf, d0); break;
      case 7: values_avx512<3, true, T>(out + d0, w, v + d0, C, n, last, pf, d0); break;
      case 8: values_avx512<4, false, T>(out + d0, w, v + d0, C, n, last, pf, d0); break;
      default: values_avx512<4, true, T>(out + d0, w, v + d0, C, n, last, pf, d0); break;
    }
  }
}

template <class T>
TESSERA_TARGET_AVX2 void values_block_avx2(float* out, const float* w, const T* v, int64_t C, int n, int hs,
                                           const T* pf) {
  const int whole = hs - hs % 8;
  for (int d0 = 0; d0 < whole; d0 += 32) {
    switch (std::min(4, (whole - d0) / 8)) {
      case 1: values_avx2<1, T>(out + d0, w, v + d0, C, n, pf, d0); break;
      case 2: values_avx2<2, T>(out + d0, w, v + d0, C, n, pf, d0); break;
      case 3: values_avx2<3, T>(out + d0, w, v + d0, C, n, pf, d0); break;
      default: values_avx2<4, T>(out + d0, w, v + d0, C, n, pf, d0); break;
    }
  }
  for (int d = whole; d < hs; d++) {  // past the last whole ymm: the same sums, one column at a time
    float even = 0.0f, odd = 0.0f;
    int j = 0;
    for (; j + 2 <= n; j += 2) {
      even = std::fma(w[j], load1_f16c(v[j * C + d]), even);
      odd = std::fma(w[j + 1], load1_f16c(v[(j + 1) * C + d]), odd);
    }
    if (j < n) even = std::fma(w[j], load1_f16c(v[j * C + d]), even);
    out[d] += even + odd;
  }
}

template <class T>
void values_block_generic(float* out, const float* w, const T* v, int64_t C, int n, int hs) {
  for (int j = 0; j < n; j++)
    for (int d = 0; d < hs; d++) out[d] += w[j] * load1(v[j * C + d]);
}

// The values of a group of query heads (R of them, at most 8) that share
// a key/value head: a block's value rows are loaded and converted once for
// every head (the per-head kernels above load them once a head). Each
// head's lanes add the same products in the same order as values_avx512
// (values_avx2): even and odd rows apart, then out + (even + odd), so the
// bits are the same. One vector of columns at a time, 2R accumulators.
template <int R, class T>
TESSERA_TARGET_AVX512 void values_group_avx512(float* const* out, const float* const* w, const T* v, int64_t C,
                                               int n, int hs, const T* pf) {
  for (int c = 0; c < hs; c += 16) {
    __m512 even[R], odd[R];
    for (int e = 0; e < R; e++) even[e] = odd[e] = _mm512_setzero_ps();
    int j = 0;
    for (; j + 2 <= n; j += 2) {
      const __m512 v0 = load16(v + j * C + c), v1 = load16(v + (j + 1) * C + c);
      prefetch_line(pf, j, C, c);
      prefetch_line(pf, j + 1, C, c);
      for (int e = 0; e < R; e++) {
        even[e] = _mm512_fmadd_ps(_mm512_set1_ps(w[e][j]), v0, even[e]);
        odd[e] = _mm512_fmadd_ps(_mm512_set1_ps(w[e][j + 1]), v1, odd[e]);
      }
    }
    if (j < n) {
      const __m512 v0 = load16(v + j * C + c);
      for (int e = 0; e < R; e++) even[e] = _mm512_fmadd_ps(_mm512_set1_ps(w[e][j]), v0, even[e]);
    }
    for (int e = 0; e < R; e++)
      _mm512_storeu_ps(out[e] + c, _mm512_add_ps(_mm512_loadu_ps(out[e] + c), _mm512_add_ps(even[e], odd[e])));
  }
}

template <int R, class T>
TESSERA_TARGET_AVX2 void values_group_avx2(float* const* out, const float* const* w, const T* v, int64_t C, int n,
                                           int hs, const T* pf) {
  for (int c = 0; c < hs; c += 8) {
    __m256 even[R], odd[R];
    for (int e = 0; e < R; e++) even[e] = odd[e] = _mm256_setzero_ps();
    int j = 0;
    for (; j + 2 <= n; j += 2) {
      const __m256 v0 = load8(v + j * C + c), v1 = load8(v + (j + 1) * C + c);
      prefetch_line(pf, j, C, c);
      prefetch_line(pf, j + 1, C, c);
      for (int e = 0; e < R; e++) {
        even[e] = _mm256_fmadd_ps(_mm256_broadcast_ss(w[e] + j), v0, even[e]);
        odd[e] = _mm256_fmadd_ps(_mm256_broadcast_ss(w[e] + j + 1), v1, odd[e]);
      }
    }
    if (j < n) {
      const __m256 v0 = load8(v + j * C + c);
      for (int e = 0; e < R; e++) even[e] = _mm256_fmadd_ps(_mm256_broadcast_ss(w[e] + j), v0, even[e]);
    }
    for (int e = 0; e < R; e++)
      _mm256_storeu_ps(out[e] + c, _mm256_add_ps(_mm256_loadu_ps(out[e] + c), _mm256_add_ps(even[e], odd[e])));
  }
}

// values_group_* for R <= 8 heads.
template <class T>
void values_group(Fp32Isa kind, float* const* out, const float* const* w, int R, const T* v, int64_t C, int n,
                  int hs, const T* pf) {
#define TESSERA_VALUES_GROUP(M)                                 \
  case M:                                                       \
    if (kind == Fp32Isa::kAvx512)                               \
      values_group_avx512<M, T>(out, w, v, C, n, hs, pf);       \
    else                                                        \
      values_group_avx2<M, T>(out, w, v, C, n, hs, pf);         \
    break;
  switch (R) {
    TESSERA_VALUES_GROUP(1)
    TESSERA_VALUES_GROUP(2)
    TESSERA_VALUES_GROUP(3)
    TESSERA_VALUES_GROUP(4)
    TESSERA_VALUES_GROUP(5)
    TESSERA_VALUES_GROUP(6)
    TESSERA_VALUES_GROUP(7)
    default: TESSERA_VALUES_GROUP(8)
  }
#undef TESSERA_VALUES_GROUP
}

using Kind = Fp32Isa;

// Whether an item's query heads go through the group kernels: when at
// least kGroupMin share each key/value head (the bits are the same either
// way). BM_PagedAttentionDecode, TinyLlama's shape, with the threads that
// leave an item 8, 4 or 2 heads a key/value head: the group kernels 1.5x,
// 1.1x and 1.0-1.04x as fast as the per-head ones.
constexpr int kGroupMin = 2;

template <class T>
bool grouped(Kind kind, const Item<T>& it) {
  const int width = kind == Kind::kAvx512 ? 16 : 8;
  return kind != Kind::kGeneric && it.r1 - it.r0 >= kGroupMin && it.hs % width == 0 && it.hs <= kGroupMaxHs;
}

template <class T>
void attend(Kind kind, const Item<T>& it) {
  const int64_t C = it.row_floats();
  const int hs = it.hs, R = it.r1 - it.r0;
  const bool group = grouped(kind, it);
  // A group's query and score (output and weight) pointers, 8 heads at a
  // time (more share a key/value head in no model we know of).
  float* ps[8];
  float* po[8];
  const float* pq[8];
  it.each_block_group(it.kcache, it.vcache, [&](int g, const T* k, int n, int t0, const T* next) {
    if (group) {
      for (int e0 = 0; e0 < R; e0 += 8) {
        const int m = std::min(8, R - e0);
        for (int e = 0; e < m; e++) {
          pq[e] = it.q + static_cast<int64_t>(it.head(g, it.r0 + e0 + e)) * hs;
          ps[e] = it.group_scores(g, it.r0 + e0 + e) + t0;
        }
        const T* pf = e0 == 0 ? next : nullptr;
        if (kind == Kind::kAvx512)
          scores_group_avx512(ps, pq, m, k, C, n, hs, it.scale, pf);
        else
          scores_group_avx2(ps, pq, m, k, C, n, hs, it.scale, pf);
      }
      return;
    }
    for (int r = it.r0; r < it.r1; r++) {
      const float* q = it.q + static_cast<int64_t>(it.head(g, r)) * hs;
      float* s = it.group_scores(g, r) + t0;
      const T* pf = r == it.r0 ? next : nullptr;
      switch (kind) {
        case Kind::kAvx512: scores_block_avx512(s, q, k, C, n, hs, it.scale, pf); break;
        case Kind::kAvx2: scores_block_avx2(s, q, k, C, n, hs, it.scale, pf); break;
        case Kind::kGeneric: scores_block_generic(s, q, k, C, n, hs, it.scale); break;
      }
    }
  });
  softmax_heads(it);
  for (int r = it.r0; r < it.r1; r++)
    for (int g = it.g0; g < it.g1; g++) std::fill_n(it.out + static_cast<int64_t>(it.head(g, r)) * hs, hs, 0.0f);
  it.each_block_group(it.vcache, nullptr, [&](int g, const T* v, int n, int t0, const T* next) {
    if (group) {
      for (int e0 = 0; e0 < R; e0 += 8) {
        const int m = std::min(8, R - e0);
        for (int e = 0; e < m; e++) {
          po[e] = it.out + static_cast<int64_t>(it.head(g, it.r0 + e0 + e)) * hs;
          pq[e] = it.group_scores(g, it.r0 + e0 + e) + t0;
        }
        values_group(kind, po, pq, m, v, C, n, hs, e0 == 0 ? next : nullptr);
      }
      return;
    }
    for (int r = it.r0; r < it.r1; r++) {
      float* out = it.out + static_cast<int64_t>(it.head(g, r)) * hs;
      const float* w = it.group_scores(g, r) + t0;
      const T* pf = r == it.r0 ? next : nullptr;
      switch (kind) {
        case Kind::kAvx512: values_block_avx512(out, w, v, C, n, hs, pf); break;
        case Kind::kAvx2: values_block_avx2(out, w, v, C, n, hs, pf); break;
        case Kind::kGeneric: values_block_generic(out, w, v, C, n, hs); break;
      }
    }
  });
}

// [lo, hi) of piece p of n split into parts: the first n % parts get one more.
void split(int n, int parts, int p, int* lo, int* hi) {
  const int base = n / parts, extra = n % parts;
  *lo = p * base + std::min(p, extra);
  *hi = *lo + base + (p < extra ? 1 : 0);
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

namespace {

// n floats -> fp16, rounded to nearest even: 8 at a time with F16C, the
// rest (and CPUs without F16C) through q4::f32_to_fp16, the same rounding.
TESSERA_TARGET_AVX2 void to_f16_f16c(uint16_t* dst, const float* src, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  for (; i < n; i++) dst[i] = q4::f32_to_fp16(src[i]);
}

void to_f16(uint16_t* dst, const float* src, int64_t n) {
  if (cpu_features().f16c && cpu_features().avx2) return to_f16_f16c(dst, src, n);
  for (int64_t i = 0; i < n; i++) dst[i] = q4::f32_to_fp16(src[i]);
}

}  // namespace

void kv_cache_write_gqa_f16(uint16_t* kcache, uint16_t* vcache, const float* qkv, const int* slots, int N, int NH,
                            int KV, int hs) {
  const int64_t W = static_cast<int64_t>(NH + 2 * KV) * hs, Ck = static_cast<int64_t>(KV) * hs;
  for (int i = 0; i < N; i++) {
    const float* row = qkv + i * W + static_cast<int64_t>(NH) * hs;
    to_f16(kcache + slots[i] * Ck, row, Ck);
    to_f16(vcache + slots[i] * Ck, row + Ck, Ck);
  }
}

void kv_cache_write(float* kcache, float* vcache, const float* qkv, const int* slots, int N, int C) {
  kv_cache_write_gqa(kcache, vcache, qkv, slots, N, 1, 1, C);
}

namespace {

template <class T>
void attention_rows(Kind kind, float* out, const float* qkv, const T* kcache, const T* vcache,
                    const int* block_table, const int* seq, const int* pos, int N, int NH, int KV, int hs, int bs,
                    int W) {
  const int64_t Wq = static_cast<int64_t>(NH + 2 * KV) * hs, Co = static_cast<int64_t>(NH) * hs;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  // Items: a row's heads in pieces, enough for every thread when the rows
  // are few (a decode step): first the key/value heads are split (each
  // piece reads its own slice of the cache), then, if more pieces are
  // wanted, the query heads that share one.
  const int threads = omp_get_max_threads(), reps = NH / KV;
  const int want = std::min(NH, (threads + N - 1) / N);
  const int pg = std::min(KV, want), pr = std::min(reps, (want + pg - 1) / pg);
  const int pieces = pg * pr, items = N * pieces;
  const int Hmax = ((KV + pg - 1) / pg) * ((reps + pr - 1) / pr);
  int longest = 0;
  for (int i = 0; i < N; i++) longest = std::max(longest, pos[i] + 1);
#pragma omp parallel if (items > 1)
  {
    thread_local std::vector<float> scores;
    const size_t need = static_cast<size_t>(Hmax) * longest;
    if (scores.size() < need) scores.resize(need);
#pragma omp for schedule(static, 1)
    for (int item = 0; item < items; item++) {
      const int i = item / pieces, p = item % pieces;
      Item<T> it{out + i * Co, qkv + i * Wq, kcache, vcache, block_table + static_cast<int64_t>(seq[i]) * W,
              pos[i] + 1, bs, hs, KV, 0, 0, 0, 0, scale, scores.data()};
      split(KV, pg, p % pg, &it.g0, &it.g1);
      split(reps, pr, p / pg, &it.r0, &it.r1);
      attend(kind, it);
    }
  }
}

}  // namespace

void paged_attention_gqa_forward(float* out, const float* qkv, const float* kcache, const float* vcache,
                                 const int* block_table, const int* seq, const int* pos, int N, int NH, int KV,
                                 int hs, int bs, int W) {
  attention_rows(fp32_isa(), out, qkv, kcache, vcache, block_table, seq, pos, N, NH, KV, hs, bs, W);
}

void paged_attention_gqa_f16_forward(float* out, const float* qkv, const uint16_t* kcache, const uint16_t* vcache,
                                     const int* block_table, const int* seq, const int* pos, int N, int NH, int KV,
                                     int hs, int bs, int W) {
  // The vector kernels convert with F16C (AVX-512F has its own form).
  Kind kind = fp32_isa();
  if (kind == Kind::kAvx2 && !cpu_features().f16c) kind = Kind::kGeneric;
  attention_rows(kind, out, qkv, kcache, vcache, block_table, seq, pos, N, NH, KV, hs, bs, W);
}

void paged_attention_forward(float* out, const float* qkv, const float* kcache, const float* vcache,
                             const int* block_table, const int* seq, const int* pos, int N, int C, int NH, int bs,
                             int W) {
  paged_attention_gqa_forward(out, qkv, kcache, vcache, block_table, seq, pos, N, NH, NH, C / NH, bs, W);
}

}  // namespace tessera::cpu
