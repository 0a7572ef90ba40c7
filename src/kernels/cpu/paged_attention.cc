// The ragged-batch kernels of ops.inc on the CPU: the encoder with explicit
// positions, the KV-cache write, and attention over a paged cache.
//
// Attention walks each row's blocks in position order, once (flash
// decoding): a block's scores for the heads at hand, their exponentials
// against the block's own largest score, the block's weighted values, and
// the block joined to each head's running softmax (combine), every path in
// the same order, so a row's bits do not depend on the threads or on the
// other rows. Two ways to share the work:
// - Rows at least as many as the threads (prefill, decode of many
//   sequences): one item per OpenMP iteration, dealt round-robin (a row's
//   work grows with its position), a row's heads whole, or in pieces when
//   the rows and their blocks are both fewer than the threads.
// - Fewer rows than threads with enough blocks (a decode step):
//   attention_split, the threads split the blocks, every head of them, and
//   pass each row's running softmax down a chain of the threads.
// Scratch lives in per-thread buffers that grow and are then reused
// (decode steps allocate nothing).
//
// A decode step finds its cache in memory (the weights' stream has evicted
// it since the last step). Split by heads, a thread read a slice of every
// row (GPT-2, 2 threads: 768 of each 1536 bytes), which Zen 2's prefetchers
// follow at 11-14 GB/s against 26-31 for runs of whole rows; a block's rows
// are contiguous, so split by blocks a thread reads runs of whole rows, and
// scores_rows_avx2 reads each key row from its start. While a block's keys
// are read its values are prefetched into L2, and while its values are
// read the next block's keys, one line for each line read, so the requests
// spread over the block's work. (All of a next block's lines at once, at a
// block's start, did not help: the requests queue behind each other.)
// BM_PagedAttentionDecode, fp16 cache, Zen 2, 2 threads, interleaved with
// the three-pass head-split code it replaced (docs/performance.md): GPT-2's
// shape 1.2-1.3x, TinyLlama's 1.4-1.5x.
//
// Grouped-query attention (more query heads than key/value heads: 8 a
// key/value head in TinyLlama) made the per-head kernels compute-bound, a
// key row loaded, converted and reduced once for each query head: an item
// with 2 or more query heads a key/value head takes the group kernels,
// which convert and transpose a block's keys once and load its values once
// for all of them, with the same bits (scores_group_avx512).
//
// The cache holds fp32 or fp16 (KvDtype::kF16): every kernel below is a
// template on the element type, whose loads convert fp16 to fp32 exactly,
// so the two compute the same sums in the same order.
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "core/cpu_features.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/vec_math.h"
#include "kernels/q4.h"

namespace tessera::cpu {

namespace {

// One item: heads g + r * KV for g in [g0, g1), r in [r0, r1) of one row
// (q: the row's queries, head h at h * hs) over the row's blocks [b0, b1)
// (all of them, but where the threads split a row's blocks:
// attention_split). kcache/vcache rows hold KV * hs elements; position t
// sits at pool row blocks[t / bs] * bs + t % bs, and the row attends to
// positions 0..n_keys-1. The item's head e (index(g, r)) scores a block
// into s + e * bs and stores its weighted values (the block's partial
// output) at p + e * hs.
template <class T>
struct Item {
  const float* q;
  const T* kcache;
  const T* vcache;
  const int* blocks;
  int n_keys, bs, hs, KV, g0, g1, r0, r1, b0, b1;
  float scale;

  int64_t row_floats() const { return static_cast<int64_t>(KV) * hs; }
  int heads() const { return (r1 - r0) * (g1 - g0); }
  // Query head r of key/value head g: its index in the model, in the item.
  int head(int g, int r) const { return g + r * KV; }
  int index(int g, int r) const { return (r - r0) * (g1 - g0) + g - g0; }
  // Block b of a pool: its first row; b past b1: null (nothing to prefetch).
  const T* block(const T* pool, int b) const {
    return b < b1 ? pool + static_cast<int64_t>(blocks[b]) * bs * row_floats() : nullptr;
  }
  int rows(int b) const { return std::min(bs, n_keys - b * bs); }
};

// One pass over the item's blocks, in position order (a flash-decoding
// walk): a block's scores for every head of the item (its rows are
// contiguous, and the heads read their slice of each row while the block
// is in cache), their exponentials against the block's own largest score,
// the block's weighted values, and the block joined to each head's running
// softmax (combine). A head's sums do not depend on which other heads
// share its item, nor on which thread took which block, so the result does
// not depend on the number of threads. Three kernels of the scores and the
// values: avx512 (16 keys a reduction), avx2 (8), and plain loops.

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
// The same for the lines that start in columns [col, col + n) of the
// slice: a kernel's loads of n columns of a row, past the loop over them
// (a branch in that loop kept GCC from holding its accumulators in
// registers: each FMA went through the stack).
template <class T>
inline void prefetch_lines(const T* pf, int64_t row, int64_t C, int col, int n) {
  if (!pf) return;
  constexpr int kPer = 64 / sizeof(T);
  for (int c = (col + kPer - 1) / kPer * kPer; c < col + n; c += kPer)
    _mm_prefetch(reinterpret_cast<const char*>(pf + row * C + c), _MM_HINT_T1);
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

// scores_block_avx2 for H heads side by side (key/value heads g0.. of
// one query head each: head i's slice of row j at k + j * C + i * hs, its
// scores to s[i]), walking each row once from its start: four rows at a
// time, head by head, each head's 8-lane sums kept in `part` until 8 rows
// have them, then reduced as scores_block_avx2 reduces its own, so the
// bits are the same. A head at a time, a block's rows are read a slice (a
// few hundred bytes) a row apart, a pattern Zen 2's prefetchers follow
// at about 2/3 of the rate of one that reads whole rows in order. pf: rows
// to prefetch (block_scores: the same block's values, read next), a row for
// each row read. hs % 8 == 0.
constexpr int kRowsMaxHeads = 64;

template <class T>
TESSERA_TARGET_AVX2 void scores_rows_avx2(float* const* s, const float* q, int H, const T* k, int64_t C, int n,
                                          int hs, float scale, const T* pf) {
  alignas(32) float part[kRowsMaxHeads * 8 * 8];  // [head][row of 8][lane]
  const int64_t span = static_cast<int64_t>(H) * hs;
  for (int j0 = 0; j0 < n; j0 += 8) {
    const int m = std::min(8, n - j0);
    for (int r0 = 0; r0 < m; r0 += 4) {
      const T* rows[4];
      for (int r = 0; r < 4; r++) rows[r] = k + (j0 + std::min(r0 + r, m - 1)) * C;
      for (int h = 0; h < H; h++) {
        const float* qh = q + static_cast<int64_t>(h) * hs;
        __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
        for (int d = 0; d < hs; d += 8) {
          const __m256 qv = _mm256_loadu_ps(qh + d);
#pragma GCC unroll 4
          for (int r = 0; r < 4; r++) acc[r] = _mm256_fmadd_ps(qv, load8(rows[r] + h * hs + d), acc[r]);
        }
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) _mm256_store_ps(part + (h * 8 + r0 + r) * 8, acc[r]);
      }
      if (pf)
        for (int r = r0; r < std::min(m, r0 + 4); r++) prefetch_lines(pf + (j0 + r) * C, 0, C, 0, static_cast<int>(span));
    }
    for (int h = 0; h < H; h++) {
      __m256 acc[8];
      for (int r = 0; r < 8; r++) acc[r] = _mm256_load_ps(part + (h * 8 + std::min(r, m - 1)) * 8);
      alignas(32) float sums[8];
      _mm256_store_ps(sums, _mm256_mul_ps(hsum256_x8(acc), _mm256_set1_ps(scale)));
      std::copy_n(sums, m, s[h] + j0);
    }
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

// A block's n scores of one head -> exp(s - m) in place, m the largest of
// them; *l_out: their sum. Plain loops (the generic kernels).
void block_softmax_generic(float* s, int n, float* m_out, float* l_out) {
  float m = -INFINITY;
  for (int j = 0; j < n; j++) m = std::max(m, s[j]);
  float l = 0.0f;
  for (int j = 0; j < n; j++) {
    s[j] = exp_approx(s[j] - m);
    l += s[j];
  }
  *m_out = m;
  *l_out = l;
}

// exp_approx's steps on 8 lanes, its polynomial in FMAs (so not its bits:
// the vector kernels' paths all take this one).
TESSERA_TARGET_AVX2 inline __m256 exp8(__m256 x) {
  const __m256 magic = _mm256_set1_ps(12582912.0f);  // 1.5 * 2^23
  const __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
  const __m256 low = _mm256_cmp_ps(x, _mm256_set1_ps(-87.3f), _CMP_LT_OQ);
  const __m256 xc = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.3f));
  const __m256 t = _mm256_fmadd_ps(xc, _mm256_set1_ps(1.44269504088896341f), magic);
  const __m256 n = _mm256_sub_ps(t, magic);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), xc);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  const __m256 e = _mm256_add_ps(_mm256_fmadd_ps(_mm256_mul_ps(p, r), r, r), _mm256_set1_ps(1.0f));
  const __m256i k = _mm256_sub_epi32(_mm256_castps_si256(t), _mm256_castps_si256(magic));
  const __m256 scale = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(k, _mm256_set1_epi32(127)), 23));
  const __m256 y = _mm256_andnot_ps(low, _mm256_mul_ps(e, scale));
  return _mm256_blendv_ps(y, x, nan);
}

// The lanes of 8 from j that are under n: all ones.
TESSERA_TARGET_AVX2 inline __m256i lanes_under(int n, int j) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(n - j), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// block_softmax_generic for the vector kernels, 8 scores at a time; s has
// room for `room` (>= n) floats. The lanes past n: -inf in the largest,
// 0 in the sum; stored as 0 where they fit in the room (a masked store,
// vmaskmovps, is microcoded on AMD: a fifth of this function's time on Zen
// 2), else left alone.
TESSERA_TARGET_AVX2 void block_softmax_avx2(float* s, int n, int room, float* m_out, float* l_out) {
  __m256 top = _mm256_set1_ps(-INFINITY);
  for (int j = 0; j < n; j += 8) {
    const __m256 keep = _mm256_castsi256_ps(lanes_under(n, j));
    const __m256 x = j + 8 <= room ? _mm256_loadu_ps(s + j) : _mm256_maskload_ps(s + j, _mm256_castps_si256(keep));
    top = _mm256_max_ps(top, _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), x, keep));
  }
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(top), _mm256_extractf128_ps(top, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  h = _mm_max_ss(h, _mm_movehdup_ps(h));
  const float m = _mm_cvtss_f32(h);
  __m256 sum = _mm256_setzero_ps();
  for (int j = 0; j < n; j += 8) {
    const __m256 keep = _mm256_castsi256_ps(lanes_under(n, j));
    const bool whole = j + 8 <= room;
    const __m256 x = whole ? _mm256_loadu_ps(s + j) : _mm256_maskload_ps(s + j, _mm256_castps_si256(keep));
    const __m256 e = _mm256_and_ps(exp8(_mm256_sub_ps(x, _mm256_set1_ps(m))), keep);
    if (whole) {
      _mm256_storeu_ps(s + j, e);
    } else {
      alignas(32) float part[8];
      _mm256_store_ps(part, e);
      std::copy_n(part, n - j, s + j);
    }
    sum = _mm256_add_ps(sum, e);
  }
  *m_out = m;
  *l_out = hsum256_ps(sum);
}

// One head's running softmax over its blocks so far, in position order: M
// the largest score, L the sum of exp(s - M), O (hs) the sum of exp(s - M)
// v. A block's (m, l, P: block_softmax's and the values') joins it; the
// first block sets it. Every path of this file goes through here in block
// order, so their bits are the same.
void combine_generic(float* M, float* L, float* O, float m, float l, const float* P, int hs, bool first) {
  if (first) {
    *M = m;
    *L = l;
    std::copy_n(P, hs, O);
    return;
  }
  const float top = std::max(*M, m);
  const float a = *M == top ? 1.0f : exp_approx(*M - top), c = m == top ? 1.0f : exp_approx(m - top);
  *M = top;
  *L = *L * a + l * c;
  for (int d = 0; d < hs; d++) O[d] = O[d] * a + P[d] * c;
}

TESSERA_TARGET_AVX2 void combine_avx2(float* M, float* L, float* O, float m, float l, const float* P, int hs,
                                      bool first) {
  if (first) {
    *M = m;
    *L = l;
    std::copy_n(P, hs, O);
    return;
  }
  const float top = std::max(*M, m);
  alignas(32) float ex[8];
  _mm256_store_ps(ex, exp8(_mm256_setr_ps(*M - top, m - top, 0, 0, 0, 0, 0, 0)));
  const float a = *M == top ? 1.0f : ex[0], c = m == top ? 1.0f : ex[1];
  *M = top;
  *L = std::fma(*L, a, l * c);
  const __m256 va = _mm256_set1_ps(a), vc = _mm256_set1_ps(c);
  int d = 0;
  for (; d + 8 <= hs; d += 8)
    _mm256_storeu_ps(O + d, _mm256_fmadd_ps(_mm256_loadu_ps(O + d), va, _mm256_mul_ps(_mm256_loadu_ps(P + d), vc)));
  for (; d < hs; d++) O[d] = std::fma(O[d], a, P[d] * c);
}

// combine_avx2 for one block's heads 0..H-1 together (head h: M[h], L[h],
// O + h * hs; the block's m[h], l[h], P + h * hs): the same operations
// lane by lane, so the same bits, with 8 heads' exponentials in each exp8
// (a head at a time, each join waited for its own exp8's chain of
// dependent FMAs: 25 ns a head, TinyLlama's 32 heads at 160 keys a third
// of a layer's attention).
TESSERA_TARGET_AVX2 void combine_heads_avx2(float* M, float* L, float* O, const float* m, const float* l,
                                            const float* P, int H, int hs, bool first) {
  if (first) {
    std::copy_n(m, H, M);
    std::copy_n(l, H, L);
    std::copy_n(P, static_cast<int64_t>(H) * hs, O);
    return;
  }
  for (int h0 = 0; h0 < H; h0 += 8) {
    const int k = std::min(8, H - h0);
    alignas(32) float tM[8] = {}, tm[8] = {}, tL[8] = {}, tl[8] = {}, ta[8], tc[8];
    std::copy_n(M + h0, k, tM);
    std::copy_n(m + h0, k, tm);
    std::copy_n(L + h0, k, tL);
    std::copy_n(l + h0, k, tl);
    const __m256 Mv = _mm256_load_ps(tM), mv = _mm256_load_ps(tm);
    // std::max(M, m): M unless M < m, NaNs included.
    const __m256 top = _mm256_max_ps(mv, Mv);
    const __m256 one = _mm256_set1_ps(1.0f);
    const __m256 a = _mm256_blendv_ps(exp8(_mm256_sub_ps(Mv, top)), one, _mm256_cmp_ps(Mv, top, _CMP_EQ_OQ));
    const __m256 c = _mm256_blendv_ps(exp8(_mm256_sub_ps(mv, top)), one, _mm256_cmp_ps(mv, top, _CMP_EQ_OQ));
    _mm256_store_ps(tM, top);
    _mm256_store_ps(tL, _mm256_fmadd_ps(_mm256_load_ps(tL), a, _mm256_mul_ps(_mm256_load_ps(tl), c)));
    _mm256_store_ps(ta, a);
    _mm256_store_ps(tc, c);
    std::copy_n(tM, k, M + h0);
    std::copy_n(tL, k, L + h0);
    for (int e = 0; e < k; e++) {
      float* o = O + static_cast<int64_t>(h0 + e) * hs;
      const float* pe = P + static_cast<int64_t>(h0 + e) * hs;
      const __m256 va = _mm256_set1_ps(ta[e]), vc = _mm256_set1_ps(tc[e]);
      int d = 0;
      for (; d + 8 <= hs; d += 8)
        _mm256_storeu_ps(o + d, _mm256_fmadd_ps(_mm256_loadu_ps(o + d), va, _mm256_mul_ps(_mm256_loadu_ps(pe + d), vc)));
      for (; d < hs; d++) o[d] = std::fma(o[d], ta[e], pe[d] * tc[e]);
    }
  }
}

// O /= L: the head's output.
void finish(float* O, float L, int hs) {
  const float inv = 1.0f / L;
  for (int d = 0; d < hs; d++) O[d] *= inv;
}

// Vector u of U: the last one masked when kTail.
template <int U, bool kTail, class T>
TESSERA_TARGET_AVX512 inline __m512 load_part(const T* p, int u, __mmask16 last) {
  return kTail && u == U - 1 ? load16_first(p, __builtin_popcount(last)) : load16(p);
}

// out (U vectors of a head's partial output) = sum over a block's n rows
// of w[j] * v[j], v row j at v + j * C: even and odd rows in two sets of
// accumulators (two FMA chains), added at the block's end. U is a template
// argument so that the accumulators stay in registers. The last vector
// takes the lanes of `last` when kTail (avx512; avx2 has whole vectors
// only).
template <int U, bool kTail, class T>
TESSERA_TARGET_AVX512 void values_avx512(float* out, const float* w, const T* v, int64_t C, int n,
                                         __mmask16 last, const T* pf, int col) {
  __m512 even[U], odd[U];
#pragma GCC unroll 4
  for (int u = 0; u < U; u++) even[u] = odd[u] = _mm512_setzero_ps();
  int j = 0;
  for (; j + 2 <= n; j += 2) {
    const __m512 w0 = _mm512_set1_ps(w[j]), w1 = _mm512_set1_ps(w[j + 1]);
    const T* v0 = v + j * C;
#pragma GCC unroll 4
    for (int u = 0; u < U; u++) {
      even[u] = _mm512_fmadd_ps(w0, load_part<U, kTail>(v0 + 16 * u, u, last), even[u]);
      odd[u] = _mm512_fmadd_ps(w1, load_part<U, kTail>(v0 + C + 16 * u, u, last), odd[u]);
    }
    prefetch_lines(pf, j, C, col, 16 * U);
    prefetch_lines(pf, j + 1, C, col, 16 * U);
  }
  if (j < n) {
    const __m512 w0 = _mm512_set1_ps(w[j]);
#pragma GCC unroll 4
    for (int u = 0; u < U; u++)
      even[u] = _mm512_fmadd_ps(w0, load_part<U, kTail>(v + j * C + 16 * u, u, last), even[u]);
  }
#pragma GCC unroll 4
  for (int u = 0; u < U; u++) {
    const __m512 sum = _mm512_add_ps(even[u], odd[u]);
    if (kTail && u == U - 1)
      _mm512_mask_storeu_ps(out + 16 * u, last, sum);
    else
      _mm512_storeu_ps(out + 16 * u, sum);
  }
}

// values_avx512's sums with one chain a column (avx2): the block's rows in
// order from zero. Eight vectors of columns are eight chains, enough for
// both FMA pipes; avx512's even and odd sets (it has 32 registers for
// them) spilled the group kernel's 2R accumulators out of AVX2's 16
// (BM_PagedAttentionDecode, TinyLlama's shape, Zen 2: the group values
// kernel was half of the time).
template <int U, class T>
TESSERA_TARGET_AVX2 void values_avx2(float* out, const float* w, const T* v, int64_t C, int n, const T* pf,
                                     int col) {
  __m256 acc[U];
#pragma GCC unroll 8
  for (int u = 0; u < U; u++) acc[u] = _mm256_setzero_ps();
  for (int j = 0; j < n; j++) {
    const __m256 wj = _mm256_broadcast_ss(w + j);
    const T* vj = v + j * C;
#pragma GCC unroll 8
    for (int u = 0; u < U; u++) acc[u] = _mm256_fmadd_ps(wj, load8(vj + 8 * u), acc[u]);
    prefetch_lines(pf, j, C, col, 8 * U);
  }
#pragma GCC unroll 8
  for (int u = 0; u < U; u++) _mm256_storeu_ps(out + 8 * u, acc[u]);
}

// A head's partial output (hs floats) from one block, 64 columns at a time.
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
  for (int d0 = 0; d0 < whole; d0 += 64) {
    switch (std::min(8, (whole - d0) / 8)) {
      case 1: values_avx2<1, T>(out + d0, w, v + d0, C, n, pf, d0); break;
      case 2: values_avx2<2, T>(out + d0, w, v + d0, C, n, pf, d0); break;
      case 3: values_avx2<3, T>(out + d0, w, v + d0, C, n, pf, d0); break;
      case 4: values_avx2<4, T>(out + d0, w, v + d0, C, n, pf, d0); break;
      case 5: values_avx2<5, T>(out + d0, w, v + d0, C, n, pf, d0); break;
      case 6: values_avx2<6, T>(out + d0, w, v + d0, C, n, pf, d0); break;
      case 7: values_avx2<7, T>(out + d0, w, v + d0, C, n, pf, d0); break;
      default: values_avx2<8, T>(out + d0, w, v + d0, C, n, pf, d0); break;
    }
  }
  for (int d = whole; d < hs; d++) {  // past the last whole ymm: the same sums, one column at a time
    float acc = 0.0f;
    for (int j = 0; j < n; j++) acc = std::fma(w[j], load1_f16c(v[j * C + d]), acc);
    out[d] = acc;
  }
}

template <class T>
void values_block_generic(float* out, const float* w, const T* v, int64_t C, int n, int hs) {
  for (int d = 0; d < hs; d++) {  // one column at a time (the plain loops' order is their own)
    float acc = 0.0f;
    for (int j = 0; j < n; j++) acc += w[j] * load1(v[j * C + d]);
    out[d] = acc;
  }
}

// The values of a group of query heads (R of them, at most 8) that share
// a key/value head: a block's value rows are loaded and converted once for
// every head (the per-head kernels above load them once a head). Each
// head's lanes add the same products in the same order as values_avx512
// (values_avx2), so the bits are the same: one vector of columns at a
// time, 2R accumulators (even and odd rows) on avx512, R on avx2.
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
      _mm512_storeu_ps(out[e] + c, _mm512_add_ps(even[e], odd[e]));
  }
}

template <int R, class T>
TESSERA_TARGET_AVX2 void values_group_avx2(float* const* out, const float* const* w, const T* v, int64_t C, int n,
                                           int hs, const T* pf) {
  for (int c = 0; c < hs; c += 8) {
    __m256 acc[R];
#pragma GCC unroll 8
    for (int e = 0; e < R; e++) acc[e] = _mm256_setzero_ps();
    for (int j = 0; j < n; j++) {
      const __m256 vj = load8(v + j * C + c);
#pragma GCC unroll 8
      for (int e = 0; e < R; e++) acc[e] = _mm256_fmadd_ps(_mm256_broadcast_ss(w[e] + j), vj, acc[e]);
      prefetch_line(pf, j, C, c);
    }
#pragma GCC unroll 8
    for (int e = 0; e < R; e++)
      _mm256_storeu_ps(out[e] + c, acc[e]);
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

// Block b's scores of the item's heads into s (head e at s + e * bs),
// prefetching the same block's values (read next).
template <class T>
void block_scores(Kind kind, const Item<T>& it, int b, float* s) {
  const int64_t C = it.row_floats();
  const int hs = it.hs, R = it.r1 - it.r0, n = it.rows(b);
  const bool group = grouped(kind, it);
  const T* kb = it.block(it.kcache, b);
  const T* next = it.block(it.vcache, b);
  // A group's query and score pointers, 8 heads at a time (more share a
  // key/value head in no model we know of).
  float* ps[8];
  const float* pq[8];
  if (kind == Kind::kAvx2 && !group && R == 1 && hs % 8 == 0 && it.g1 - it.g0 <= kRowsMaxHeads) {
    float* pr[kRowsMaxHeads];
    for (int g = it.g0; g < it.g1; g++) pr[g - it.g0] = s + static_cast<int64_t>(it.index(g, it.r0)) * it.bs;
    const int64_t first = static_cast<int64_t>(it.g0) * hs;
    scores_rows_avx2(pr, it.q + static_cast<int64_t>(it.head(it.g0, it.r0)) * hs, it.g1 - it.g0, kb + first, C, n, hs,
                     it.scale, next + first);
    return;
  }
  for (int g = it.g0; g < it.g1; g++) {
    const T* k = kb + static_cast<int64_t>(g) * hs;
    const T* pf = next + static_cast<int64_t>(g) * hs;
    if (group) {
      for (int e0 = 0; e0 < R; e0 += 8) {
        const int m = std::min(8, R - e0);
        for (int e = 0; e < m; e++) {
          pq[e] = it.q + static_cast<int64_t>(it.head(g, it.r0 + e0 + e)) * hs;
          ps[e] = s + static_cast<int64_t>(it.index(g, it.r0 + e0 + e)) * it.bs;
        }
        if (kind == Kind::kAvx512)
          scores_group_avx512(ps, pq, m, k, C, n, hs, it.scale, e0 == 0 ? pf : nullptr);
        else
          scores_group_avx2(ps, pq, m, k, C, n, hs, it.scale, e0 == 0 ? pf : nullptr);
      }
      continue;
    }
    for (int r = it.r0; r < it.r1; r++) {
      const float* q = it.q + static_cast<int64_t>(it.head(g, r)) * hs;
      float* sr = s + static_cast<int64_t>(it.index(g, r)) * it.bs;
      const T* pfr = r == it.r0 ? pf : nullptr;
      switch (kind) {
        case Kind::kAvx512: scores_block_avx512(sr, q, k, C, n, hs, it.scale, pfr); break;
        case Kind::kAvx2: scores_block_avx2(sr, q, k, C, n, hs, it.scale, pfr); break;
        case Kind::kGeneric: scores_block_generic(sr, q, k, C, n, hs, it.scale); break;
      }
    }
  }
}

// Block b's values weighted by w (head e's at w + e * bs), stored at p (head
// e's at p + e * hs), prefetching the next block's keys.
template <class T>
void block_values(Kind kind, const Item<T>& it, int b, const float* w, float* p) {
  const int64_t C = it.row_floats();
  const int hs = it.hs, R = it.r1 - it.r0, n = it.rows(b);
  const bool group = grouped(kind, it);
  const T* vb = it.block(it.vcache, b);
  const T* next = it.block(it.kcache, b + 1);
  float* po[8];
  const float* pw[8];
  for (int g = it.g0; g < it.g1; g++) {
    const T* v = vb + static_cast<int64_t>(g) * hs;
    const T* pf = next ? next + static_cast<int64_t>(g) * hs : nullptr;
    if (group) {
      for (int e0 = 0; e0 < R; e0 += 8) {
        const int m = std::min(8, R - e0);
        for (int e = 0; e < m; e++) {
          const int64_t i = it.index(g, it.r0 + e0 + e);
          po[e] = p + i * hs;
          pw[e] = w + i * it.bs;
        }
        values_group(kind, po, pw, m, v, C, n, hs, e0 == 0 ? pf : nullptr);
      }
      continue;
    }
    for (int r = it.r0; r < it.r1; r++) {
      const int64_t i = it.index(g, r);
      const T* pfr = r == it.r0 ? pf : nullptr;
      switch (kind) {
        case Kind::kAvx512: values_block_avx512(p + i * hs, w + i * it.bs, v, C, n, hs, pfr); break;
        case Kind::kAvx2: values_block_avx2(p + i * hs, w + i * it.bs, v, C, n, hs, pfr); break;
        case Kind::kGeneric: values_block_generic(p + i * hs, w + i * it.bs, v, C, n, hs); break;
      }
    }
  }
}

// One block of an item: its scores, exponentials and weighted values (into
// p); m, l: each head's block_softmax.
template <class T>
void attend_block(Kind kind, const Item<T>& it, int b, float* s, float* p, float* m, float* l) {
  block_scores(kind, it, b, s);
  const int H = it.heads(), n = it.rows(b);
  for (int e = 0; e < H; e++) {
    float* se = s + static_cast<int64_t>(e) * it.bs;
    if (kind == Kind::kGeneric)
      block_softmax_generic(se, n, m + e, l + e);
    else
      block_softmax_avx2(se, n, it.bs, m + e, l + e);
  }
  block_values(kind, it, b, s, p);
}

// Floats of attend's scratch for an item of H heads.
int64_t attend_scratch(int H, int bs, int hs) { return static_cast<int64_t>(H) * (bs + hs + 4); }

// An item whole, into out (the row's output, head h at h * hs).
template <class T>
void attend(Kind kind, const Item<T>& it, float* out, float* scratch) {
  const int H = it.heads(), hs = it.hs;
  auto* join = kind == Kind::kGeneric ? combine_generic : combine_avx2;
  float* s = scratch;
  float* p = s + static_cast<int64_t>(H) * it.bs;
  float* m = p + static_cast<int64_t>(H) * hs;
  float* l = m + H;
  float* M = l + H;
  float* L = M + H;
  for (int b = it.b0; b < it.b1; b++) {
    attend_block(kind, it, b, s, p, m, l);
    for (int r = it.r0; r < it.r1; r++)
      for (int g = it.g0; g < it.g1; g++) {
        const int e = it.index(g, r);
        join(M + e, L + e, out + static_cast<int64_t>(it.head(g, r)) * hs, m[e], l[e], p + static_cast<int64_t>(e) * hs,
             hs, b == it.b0);
      }
  }
  for (int r = it.r0; r < it.r1; r++)
    for (int g = it.g0; g < it.g1; g++) finish(out + static_cast<int64_t>(it.head(g, r)) * hs, L[it.index(g, r)], hs);
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

// Fewer rows than threads (a decode step): the threads split each row's
// blocks, not its heads. Split by heads, a thread read its heads' slice of
// every cache row (GPT-2: 768 of 1536 bytes), a pattern that stayed at
// 11-14 GB/s on Zen 2 (2 threads) with or without software prefetch,
// where the same bytes read as each thread's own run of whole rows come at
// 26-31 GB/s. Here each thread takes a run of blocks (every head of them)
// through attend_block, and each head's blocks join its running softmax
// in block order, as in attend, so the bits are attend's whatever the
// threads. The joins go down a chain of the threads: a thread joins the
// blocks of a row that starts in its run as it computes them, and keeps
// those of the row that an earlier thread began (their partial values and
// (m, l)) until that thread has passed it the row's running softmax, then
// joins them and passes its own on. So each thread's partial values are
// read by itself alone, in its own cache. (The threads met, and each then
// joined the blocks of all of its heads, half of them from the other
// core's cache, whose next writes to them then had to take them back:
// GPT-2's shape at 160 keys spent 7.6 of its 21.4 us a layer so
// (BM_PagedAttentionDecodeHot, Zen 2, 2 threads).)
struct alignas(64) Turn {
  std::atomic<int> done{0};
};

template <class T>
void attention_split(Kind kind, float* out, const float* qkv, const T* kcache, const T* vcache,
                     const int* block_table, const int* seq, const int* pos, int N, int NH, int KV, int hs, int bs,
                     int W) {
  const int64_t Wq = static_cast<int64_t>(NH + 2 * KV) * hs, Co = static_cast<int64_t>(NH) * hs;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  // first[i]: row i's first block among all rows' (first[N]: the count);
  // keys[u]: the positions in blocks before block u (keys[units]: all).
  thread_local std::vector<int> first, keys;
  thread_local std::vector<float> partial, stats;
  thread_local std::unique_ptr<Turn[]> turns;
  thread_local int turns_size = 0;
  first.assign(N + 1, 0);
  for (int i = 0; i < N; i++) first[i + 1] = first[i] + (pos[i] + bs) / bs;
  const int units = first[N];
  keys.assign(units + 1, 0);
  for (int i = 0; i < N; i++)
    for (int u = first[i]; u < first[i + 1]; u++) keys[u + 1] = keys[u] + std::min(bs, pos[i] + 1 - (u - first[i]) * bs);
  const int* ku = keys.data();
  if (partial.size() < static_cast<size_t>(units) * Co) partial.resize(static_cast<size_t>(units) * Co);
  // Each block's (m, l), then each row's running (M, L) a head.
  const size_t stats_size = (static_cast<size_t>(units) + N) * NH * 2;
  if (stats.size() < stats_size) stats.resize(stats_size);
  const int max_team = omp_get_max_threads();
  if (turns_size < max_team) {
    turns = std::make_unique<Turn[]>(max_team);
    turns_size = max_team;
  }
  for (int t = 0; t < max_team; t++) turns[t].done.store(0, std::memory_order_relaxed);
  const int* fi = first.data();
  float* pa = partial.data();
  float* ms = stats.data();
  float* ls = ms + static_cast<int64_t>(units) * NH;
  float* run_m = ls + static_cast<int64_t>(units) * NH;
  float* run_l = run_m + static_cast<int64_t>(N) * NH;
  Turn* turn = turns.get();
  // Block u of row i (its partial values P, head h's at P + h * hs, and
  // its m, l) into the row's running softmax; the row's output once u is
  // its last block.
  auto fold = [&](int i, int u, const float* P, const float* m, const float* l) {
    if (kind != Kind::kGeneric) {
      float* o = out + i * Co;
      float* L = run_l + static_cast<int64_t>(i) * NH;
      combine_heads_avx2(run_m + static_cast<int64_t>(i) * NH, L, o, m, l, P, NH, hs, u == fi[i]);
      if (u == fi[i + 1] - 1)
        for (int h = 0; h < NH; h++) finish(o + static_cast<int64_t>(h) * hs, L[h], hs);
      return;
    }
    for (int h = 0; h < NH; h++) {
      float* o = out + i * Co + static_cast<int64_t>(h) * hs;
      float* M = run_m + static_cast<int64_t>(i) * NH + h;
      float* L = run_l + static_cast<int64_t>(i) * NH + h;
      combine_generic(M, L, o, m[h], l[h], P + static_cast<int64_t>(h) * hs, hs, u == fi[i]);
      if (u == fi[i + 1] - 1) finish(o, *L, hs);
    }
  };
#pragma omp parallel
  {
    // Scores (NH x bs), then a block's partial values (NH x hs) and (m, l).
    thread_local std::vector<float> scratch;
    const size_t need = static_cast<size_t>(NH) * (bs + hs + 2);
    if (scratch.size() < need) scratch.resize(need);
    float* s = scratch.data();
    float* own_p = s + static_cast<int64_t>(NH) * bs;
    float* own_m = own_p + Co;
    float* own_l = own_m + NH;
    // Thread t's blocks: those that start in its share of the positions
    // (blocks alike, a row's short last block left one thread 15 of 16
    // positions behind the other).
    const int64_t me = omp_get_thread_num(), team = omp_get_num_threads();
    auto start = [&](int64_t part) {
      return static_cast<int>(std::lower_bound(ku, ku + units, static_cast<int>(ku[units] * part / team)) - ku);
    };
    const int lo = start(me), hi = start(me + 1);
    // Row `kept` began before this thread's run: its blocks here wait.
    int kept = -1;
    for (int i = static_cast<int>(std::upper_bound(fi, fi + N + 1, lo) - fi) - 1; i < N && fi[i] < hi; i++) {
      const Item<T> it{qkv + i * Wq, kcache, vcache, block_table + static_cast<int64_t>(seq[i]) * W, pos[i] + 1, bs,
                       hs, KV, 0, KV, 0, NH / KV, std::max(lo, fi[i]) - fi[i], std::min(hi, fi[i + 1]) - fi[i],
                       scale};
      if (fi[i] < lo) kept = i;
      for (int b = it.b0; b < it.b1; b++) {
        const int u = fi[i] + b;
        if (i == kept) {
          attend_block(kind, it, b, s, pa + u * Co, ms + u * NH, ls + u * NH);
        } else {
          attend_block(kind, it, b, s, own_p, own_m, own_l);
          fold(i, u, own_p, own_m, own_l);
        }
      }
    }
    // The chain: thread t - 1 has joined every block before this run (of
    // every row) once its turn is done.
    if (me > 0) {
      for (int spins = 0; turn[me - 1].done.load(std::memory_order_acquire) == 0; spins++) {
        if (spins < (1 << 14))
          _mm_pause();
        else
          std::this_thread::yield();
      }
    }
    if (kept >= 0)
      for (int u = lo; u < std::min(hi, fi[kept + 1]); u++) fold(kept, u, pa + u * Co, ms + u * NH, ls + u * NH);
    turn[me].done.store(1, std::memory_order_release);
  }
}

template <class T>
void attention_rows(Kind kind, float* out, const float* qkv, const T* kcache, const T* vcache,
                    const int* block_table, const int* seq, const int* pos, int N, int NH, int KV, int hs, int bs,
                    int W) {
  const int64_t Wq = static_cast<int64_t>(NH + 2 * KV) * hs, Co = static_cast<int64_t>(NH) * hs;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  if (N <= 0) return;
  const int threads = omp_get_max_threads();
  int blocks = 0;
  for (int i = 0; i < N; i++) blocks += (pos[i] + bs) / bs;
  if (N < threads && blocks >= threads)
    return attention_split(kind, out, qkv, kcache, vcache, block_table, seq, pos, N, NH, KV, hs, bs, W);
  // Items: a row's heads in pieces, enough for every thread when the rows
  // are few (and their blocks fewer than the threads): first the key/value
  // heads are split (each piece reads its own slice of the cache), then, if
  // more pieces are wanted, the query heads that share one.
  const int reps = NH / KV;
  const int want = std::min(NH, (threads + N - 1) / N);
  const int pg = std::min(KV, want), pr = std::min(reps, (want + pg - 1) / pg);
  const int pieces = pg * pr, items = N * pieces;
  const int Hmax = ((KV + pg - 1) / pg) * ((reps + pr - 1) / pr);
#pragma omp parallel if (items > 1)
  {
    thread_local std::vector<float> scratch;
    const size_t need = static_cast<size_t>(attend_scratch(Hmax, bs, hs));
    if (scratch.size() < need) scratch.resize(need);
#pragma omp for schedule(static, 1)
    for (int item = 0; item < items; item++) {
      const int i = item / pieces, p = item % pieces;
      Item<T> it{qkv + i * Wq, kcache, vcache, block_table + static_cast<int64_t>(seq[i]) * W, pos[i] + 1, bs, hs, KV,
                 0, 0, 0, 0, 0, (pos[i] + bs) / bs, scale};
      split(KV, pg, p % pg, &it.g0, &it.g1);
      split(reps, pr, p / pg, &it.r0, &it.r1);
      attend(kind, it, out + i * Co, scratch.data());
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
