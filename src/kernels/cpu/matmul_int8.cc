// The INT8 matmul (ops.inc) on the CPU: exact int32 products on every x86-64
// CPU with AVX2, then the oracle's dequantization (docs/formats/int8.md,
// "Kernels").
//
// Three kernels, chosen at run time (int8_kernel_info says which, and why;
// a fourth, plain loops, keeps CPUs without AVX2 correct):
// - avx2: our own, for CPUs without VNNI. The only unsigned x signed 8-bit
//   multiply there is vpmaddubsw, whose int16 pair sums saturate once an s8
//   source is shifted to u8, which is what oneDNN does there: its results
//   are wrong by up to 20% (the bug this file fixes). Ours multiplies
//   |x| (unsigned, <= 127) by sign(x) * w (|.| <= 127), llama.cpp's trick
//   for Q8_0 dot products: every pair sum is at most 2 x 127 x 127 = 32258
//   and nothing saturates. Codes are never -128 (the quantizer and the file
//   reader guarantee it), which the trick needs.
// - vnni: the same loop with vpdpbusd (AVX512-VNNI on 256-bit registers),
//   which sums four products into int32 without saturating.
// - onednn: oneDNN's s8 x s8 -> s32 matmul, exact only where its ISA has
//   VNNI or AMX; picked for larger batches there (AMX is far faster than
//   anything here), never where it would be inexact unless forced (tests).
//
// The dequantization is the same expression as kernels/ref's, compiled
// without FMA contraction, so every kernel's output equals the oracle's bit
// for bit.
//
// oneDNN primitives are compiled per exact shape and kept per thread (with
// the thread's scratchpad), so concurrent calls share no oneDNN state; each
// thread keeps at most kMaxPerThread shapes.
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <map>
#include <tuple>
#include <vector>

#include <oneapi/dnnl/dnnl.h>
#include <oneapi/dnnl/dnnl.hpp>

#include "core/cpu_features.h"
#include "kernels/cpu/act_quant.h"
#include "kernels/cpu/int8_kernel.h"
#include "kernels/cpu/onednn_info.h"
#include "kernels/cpu/ops.h"

namespace tessera::cpu {

namespace {

using dnnl::memory;

constexpr size_t kMaxPerThread = 128;
// Batches of at least this many rows go to oneDNN where it is exact (its
// VNNI/AMX GEMM beats our dot-product loop there; bench/int8_kernels.sh).
constexpr int kOneDnnMinRows = 16;
// Output columns and rows per OpenMP work item of our kernels.
constexpr int kColumnBlock = 16;
constexpr int kRowBlock = 64;

std::atomic<Int8Kernel> g_forced{Int8Kernel::kAuto};

dnnl::engine& int8_engine() {
  static dnnl::engine* e = new dnnl::engine(dnnl::engine::kind::cpu, 0);  // never destroyed
  return *e;
}

struct Int8Matmul {
  dnnl::matmul prim;
  memory::desc src, wei, dst, scratchpad;
};

Int8Matmul compile_int8(int64_t N, int64_t C, int64_t OC) {
  Int8Matmul m;
  m.src = memory::desc({N, C}, memory::data_type::s8, memory::format_tag::ab);
  m.wei = memory::desc({C, OC}, memory::data_type::s8, memory::format_tag::ba);  // wq stored (OC,C)
  m.dst = memory::desc({N, OC}, memory::data_type::s32, memory::format_tag::ab);
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(m.src, m.wei, m.dst), attr, int8_engine());
  m.prim = dnnl::matmul(pd);
  m.scratchpad = pd.scratchpad_desc();
  return m;
}

struct ThreadState {
  std::map<std::tuple<int, int, int>, Int8Matmul> prims;
  std::vector<int8_t> xq;
  std::vector<uint8_t> xa;  // |xq|, the unsigned operand of our kernels
  std::vector<float> xs;
  std::vector<int32_t> acc;
  std::vector<uint8_t> scratch;
  dnnl::stream stream{int8_engine()};
};

ThreadState& state() {
  thread_local ThreadState s;
  return s;
}

// As kernels/ref: scale max|x|/127 (1 for zeros), codes round(x/scale); the
// same bits, vectorised (kernels/cpu/act_quant.h).
float quantize_row(int8_t* q, const float* x, int n) { return quantize_symmetric(x, n, q); }

// The oracle's dequantization, in a function compiled for plain x86-64 (no
// FMA to contract into), called from the kernels below.
inline float dequantize_one(int32_t acc, float xs, const float* wscale, const float* bias, int o) {
  return static_cast<float>(acc) * xs * wscale[o] + (bias ? bias[o] : 0.0f);
}
__attribute__((noinline)) void dequantize(float* out, const int32_t* acc, int K, float xs, const float* wscale,
                                          const float* bias) {
  for (int k = 0; k < K; k++) out[k] = dequantize_one(acc[k], xs, wscale, bias, k);
}
// The same for the K columns cols[0..K) (a one-row stream group's).
__attribute__((noinline)) void dequantize_cols(float* out, const int* cols, const int32_t* acc, int K, float xs,
                                               const float* wscale, const float* bias) {
  for (int k = 0; k < K; k++) out[cols[k]] = dequantize_one(acc[k], xs, wscale, bias, cols[k]);
}

// ---- our kernels: a tile of R rows x K columns of int32 dot products,
// accumulated in R*K vector registers over C in 32-byte steps, the tail in
// scalar code. Then dequantized into out.
struct Operands {
  const int8_t* xq;   // (N,C) activation codes
  const uint8_t* xa;  // (N,C) their absolute values
  const float* xs;    // (N) activation scales
  const int8_t* wq;   // (OC,C) weight codes
  const float* wscale;
  const float* bias;
  float* out;  // (N,OC)
  int C, OC;
};

#define TESSERA_TARGET_AVX2 __attribute__((target("avx2")))
#define TESSERA_TARGET_VNNI __attribute__((target("avx2,avx512f,avx512vl,avx512vnni")))

TESSERA_TARGET_AVX2 inline int32_t hsum_avx2(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtsi128_si32(s);
}

// The lane sums of a, b, c and d, in that order (int32: exact in any order).
// A stream group's four sums in one reduction instead of four, and one
// dequantize_cols call for the group instead of one dequantize a column:
// at GPT-2's 768-wide rows (24 steps a column) the one-row kernel with the
// weights in cache runs 1.15-1.25x faster (BM_MatmulDecodeHot/1, 3
// interleaved pairs, Zen 2), GPT-2's int8 decode step went from 0.69-0.70
// to 0.72-0.73 of the roof read right after it (of_roof_paired) and
// TinyLlama's from 0.84 to 0.86.
TESSERA_TARGET_AVX2 inline __m128i hsum4_avx2(__m256i a, __m256i b, __m256i c, __m256i d) {
  const __m256i s = _mm256_hadd_epi32(_mm256_hadd_epi32(a, b), _mm256_hadd_epi32(c, d));
  return _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
}

// The scalar tail of one dot product, from c0 to C.
inline int32_t dot_tail(const int8_t* x, const int8_t* w, int c0, int C) {
  int32_t s = 0;
  for (int c = c0; c < C; c++) s += static_cast<int32_t>(x[c]) * w[c];
  return s;
}

// One tile, for one ISA: STEP(acc, a, x, w) adds the four-product sums of
// |x| (a) and sign(x) * w to acc's eight int32 lanes. While it runs, the
// next tile's weight rows (the K*C bytes after this tile's, as rows are
// contiguous) are prefetched, K/2 cache lines per 32-byte step, so that a
// few decode steps together stream weights at the memory's rate rather than
// waiting on each tile's first lines. One row takes TESSERA_INT8_ROW below.
#define TESSERA_INT8_TILE(NAME, TARGET, STEP)                                                                    \
  template <int R, int K>                                                                                      \
  TARGET void NAME(const Operands& p, int i0, int o0) {                                                        \
    const int C = p.C, C32 = C & ~31;                                                                          \
    [[maybe_unused]] const __m256i ones = _mm256_set1_epi16(1);                                                \
    __m256i s[R][K];                                                                                           \
    _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) _Pragma("GCC unroll 8") for (int k = 0; k < K; k++)   \
        s[r][k] = _mm256_setzero_si256();                                                                      \
    const int8_t* x0 = p.xq + static_cast<int64_t>(i0) * C;                                                    \
    const uint8_t* a0 = p.xa + static_cast<int64_t>(i0) * C;                                                   \
    const int8_t* w0 = p.wq + static_cast<int64_t>(o0) * C;                                                    \
    const char* next = reinterpret_cast<const char*>(w0 + static_cast<int64_t>(K) * C);                        \
    for (int c = 0; c < C32; c += 32) {                                                                        \
      _Pragma("GCC unroll 8") for (int q = 0; q < K / 2; q++)                                                  \
          _mm_prefetch(next + (static_cast<int64_t>(c) * K / 2 + q * 32) * 2, _MM_HINT_T0);                    \
      _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) {                                                    \
        const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x0 + static_cast<int64_t>(r) * C + c)); \
        const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a0 + static_cast<int64_t>(r) * C + c)); \
        _Pragma("GCC unroll 8") for (int k = 0; k < K; k++) {                                                  \
          const __m256i w =                                                                                    \
              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w0 + static_cast<int64_t>(k) * C + c));      \
          s[r][k] = STEP(s[r][k], a, x, w);                                                                    \
        }                                                                                                      \
      }                                                                                                        \
    }                                                                                                          \
    int32_t acc[R][K];                                                                                         \
    for (int r = 0; r < R; r++)                                                                                \
      for (int k = 0; k < K; k++)                                                                              \
        acc[r][k] = hsum_avx2(s[r][k]) +                                                                       \
                    dot_tail(x0 + static_cast<int64_t>(r) * C, w0 + static_cast<int64_t>(k) * C, C32, C);      \
    _mm256_zeroupper(); /* dequantize is SSE code: see TESSERA_INT8_ROW */                                     \
    for (int r = 0; r < R; r++) {                                                                              \
      const int i = i0 + r;                                                                                    \
      dequantize(p.out + static_cast<int64_t>(i) * p.OC + o0, acc[r], K, p.xs[i], p.wscale + o0,               \
                 p.bias ? p.bias + o0 : nullptr);                                                              \
    }                                                                                                          \
  }

// AVX2: |x| * (sign(x) * w) as u8 x s8 products, int16 pair sums <= 32258,
// then pairs of those into int32.
#define TESSERA_STEP_AVX2(acc, a, x, w) \
  _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(a, _mm256_sign_epi8(w, x)), ones))
// AVX512-VNNI: four products straight into int32, no intermediate rounding.
#define TESSERA_STEP_VNNI(acc, a, x, w) _mm256_dpbusd_epi32(acc, a, _mm256_sign_epi8(w, x))

TESSERA_INT8_TILE(tile_avx2, TESSERA_TARGET_AVX2, TESSERA_STEP_AVX2)
TESSERA_INT8_TILE(tile_vnni, TESSERA_TARGET_VNNI, TESSERA_STEP_VNNI)

// dequantize is compiled for plain x86-64 (SSE encodings, so that nothing
// contracts into an FMA); the kernels clear the vector registers' upper
// halves (vzeroupper) before they call it, which GCC 12 leaves out there.
// Without it, SSE code after 256-bit code stalls on Zen 3: dequantize took
// 31% of a 32-row product's time, nearly all on its first instruction, and
// the AVX2 tile ran at 24 GOP/s a core (BM_MatmulInt8/32/768/2304/1).
// One row (a decode step) against K weight rows, one weight row after the
// other: the tile's K * C bytes are read in address order, one stream the
// hardware prefetcher follows, instead of K streams a row apart. Two
// accumulators a row (64-byte steps) hide the multiply's latency. int32
// sums are exact, so the result is the tile's, bit for bit. GPT-2's int8
// decode of one sequence went 287-328 -> 354-363 tokens/s with it (the
// tile read the weights at about 40 GB/s; docs/performance.md).
#define TESSERA_INT8_ROW(NAME, TARGET, STEP)                                                                     \
  template <int K>                                                                                             \
  TARGET void NAME(const Operands& p, int i0, int o0) {                                                        \
    const int C = p.C, C32 = C & ~31;                                                                          \
    [[maybe_unused]] const __m256i ones = _mm256_set1_epi16(1);                                                \
    const int8_t* x0 = p.xq + static_cast<int64_t>(i0) * C;                                                    \
    const uint8_t* a0 = p.xa + static_cast<int64_t>(i0) * C;                                                   \
    int32_t acc[K];                                                                                            \
    for (int k = 0; k < K; k++) {                                                                              \
      const int8_t* w = p.wq + static_cast<int64_t>(o0 + k) * C;                                               \
      __m256i s0 = _mm256_setzero_si256(), s1 = _mm256_setzero_si256();                                        \
      int c = 0;                                                                                               \
      for (; c + 64 <= C32; c += 64) {                                                                         \
        s0 = STEP(s0, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a0 + c)),                            \
                  _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x0 + c)),                                \
                  _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + c)));                                \
        s1 = STEP(s1, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a0 + c + 32)),                       \
                  _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x0 + c + 32)),                           \
                  _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + c + 32)));                           \
      }                                                                                                        \
      if (c < C32)                                                                                             \
        s0 = STEP(s0, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a0 + c)),                            \
                  _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x0 + c)),                                \
                  _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + c)));                                \
      acc[k] = hsum_avx2(_mm256_add_epi32(s0, s1)) + dot_tail(x0, w, C32, C);                                   \
    }                                                                                                          \
    _mm256_zeroupper();                                                                                        \
    dequantize(p.out + static_cast<int64_t>(i0) * p.OC + o0, acc, K, p.xs[i0], p.wscale + o0,                  \
               p.bias ? p.bias + o0 : nullptr);                                                                \
  }

TESSERA_INT8_ROW(row_avx2, TESSERA_TARGET_AVX2, TESSERA_STEP_AVX2)
TESSERA_INT8_ROW(row_vnni, TESSERA_TARGET_VNNI, TESSERA_STEP_VNNI)

// One row (a decode step) against kStreams weight rows far apart (each a
// column of its own part of the thread's columns), their 32-byte steps taken
// together: the memory sees kStreams streams a core, not one. On a 2-core
// Zen 3 one stream a core read 31-36 GB/s, 8 far apart 50-52, 8 adjacent
// rows 27 (a read loop, same minutes); cold one-row products there went
// from 24.6-27.9 to 30.1-36.4 GB/s (BM_MatmulDecodeCold/1) and GPT-2's int8
// one-sequence decode from 180 to 210 tokens/s (docs/performance.md). int32
// sums are exact: the row kernel's result, bit for bit.
//
// On the 2-core Zen 2 of session 28 the AVX2 kernel's arithmetic alone
// reads 51-61 GB/s (BM_MatmulDecodeHot/1), about the 50-54 of the read
// roof, so a cold product is as fast as its reads overlap its arithmetic:
// 4 streams a core, each prefetching the line PF ahead of the one it reads
// (past a row's end: the stream's next row, which it takes next), beat 8
// streams without (BM_MatmulDecodeCold/1, every one-row shape, 3
// interleaved runs: 26.5-39.2 -> 30.9-41.4 GB/s, each shape faster in 20
// of 21 pairs; 8 streams with the prefetch: slower than without; 4
// without: between). VNNI, whose arithmetic is several times faster, keeps
// 8 streams and no prefetch (neither way measured on a VNNI host yet).
// 5 streams, not 4 (the Zen 2 of session 31, with stream_starts): GPT-2's
// int8 one-sequence decode 0.733-0.736 -> 0.753-0.770 of the paired roof (6
// interleaved pairs), TinyLlama's 0.910-0.913 -> 0.953-0.960 (2 pairs); 6
// or 7 streams, and 5 with the prefetch 4 or 12 lines ahead, fell between
// (docs/performance.md, "Session 31").
constexpr int kStreamsAvx2 = 5, kPrefetchLinesAvx2 = 8;
constexpr int kStreamsVnni = 8, kPrefetchLinesVnni = 0;
#define TESSERA_INT8_STREAMS(NAME, TARGET, STEP, STREAMS, PF)                                                    \
  TARGET void NAME(const Operands& p, const int* cols) {                                                       \
    constexpr int kStreams = STREAMS;                                                                          \
    const int C = p.C, C32 = C & ~31;                                                                          \
    [[maybe_unused]] const __m256i ones = _mm256_set1_epi16(1);                                                \
    const int8_t* w[kStreams];                                                                                 \
    __m256i s[kStreams];                                                                                       \
    for (int k = 0; k < kStreams; k++) {                                                                       \
      w[k] = p.wq + static_cast<int64_t>(cols[k]) * C;                                                         \
      s[k] = _mm256_setzero_si256();                                                                           \
    }                                                                                                          \
    for (int c = 0; c < C32; c += 32) {                                                                        \
      if (PF > 0 && c % 64 == 0) /* an integer address: it may lie past the weights; a prefetch never faults */ \
        for (int k = 0; k < kStreams; k++)                                                                     \
          _mm_prefetch(reinterpret_cast<const char*>(reinterpret_cast<uintptr_t>(w[k] + c) + (PF) * 64), _MM_HINT_T0); \
      const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p.xq + c));                        \
      const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p.xa + c));                        \
      _Pragma("GCC unroll 8") for (int k = 0; k < kStreams; k++) s[k] =                                        \
          STEP(s[k], a, x, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[k] + c)));                    \
    }                                                                                                          \
    alignas(16) int32_t acc[(kStreams + 3) / 4 * 4]; /* groups of 4 reduced together, the rest one by one */   \
    int k4 = 0;                                                                                                \
    for (; k4 + 4 <= kStreams; k4 += 4)                                                                        \
      _mm_store_si128(reinterpret_cast<__m128i*>(acc + k4), hsum4_avx2(s[k4], s[k4 + 1], s[k4 + 2], s[k4 + 3])); \
    for (; k4 < kStreams; k4++) acc[k4] = hsum_avx2(s[k4]);                                                    \
    if (C32 < C)                                                                                               \
      for (int k = 0; k < kStreams; k++) acc[k] += dot_tail(p.xq, w[k], C32, C);                               \
    _mm256_zeroupper();                                                                                        \
    dequantize_cols(p.out, cols, acc, kStreams, p.xs[0], p.wscale, p.bias);                                   \
  }

TESSERA_INT8_STREAMS(streams_avx2, TESSERA_TARGET_AVX2, TESSERA_STEP_AVX2, kStreamsAvx2, kPrefetchLinesAvx2)
TESSERA_INT8_STREAMS(streams_vnni, TESSERA_TARGET_VNNI, TESSERA_STEP_VNNI, kStreamsVnni, kPrefetchLinesVnni)

template <int R, int K>
void tile_generic(const Operands& p, int i0, int o0) {
  for (int r = 0; r < R; r++) {
    const int i = i0 + r;
    int32_t acc[K];
    for (int k = 0; k < K; k++)
      acc[k] = dot_tail(p.xq + static_cast<int64_t>(i) * p.C, p.wq + static_cast<int64_t>(o0 + k) * p.C, 0, p.C);
    dequantize(p.out + static_cast<int64_t>(i) * p.OC + o0, acc, K, p.xs[i], p.wscale + o0,
               p.bias ? p.bias + o0 : nullptr);
  }
}

template <int R, int K>
struct GenericTile {
  static void run(const Operands& p, int i, int o) { tile_generic<R, K>(p, i, o); }
};
template <int R, int K>
struct Avx2Tile {
  static constexpr int kStreams = kStreamsAvx2;
  static void streams(const Operands& p, const int* cols) { streams_avx2(p, cols); }
  static void run(const Operands& p, int i, int o) {
    if constexpr (R == 1 && K > 1)
      row_avx2<K>(p, i, o);
    else
      tile_avx2<R, K>(p, i, o);
  }
};
template <int R, int K>
struct VnniTile {
  static constexpr int kStreams = kStreamsVnni;
  static void streams(const Operands& p, const int* cols) { streams_vnni(p, cols); }
  static void run(const Operands& p, int i, int o) {
    if constexpr (R == 1 && K > 1)
      row_vnni<K>(p, i, o);
    else
      tile_vnni<R, K>(p, i, o);
  }
};

// The tiles one column block is covered with: one row (a decode step) 8
// columns at a time, walked one weight row after the other (the row
// kernels); two rows 4 columns at a time; then 4-row groups 2 columns at a
// time (16 vector registers on AVX2), with 3 rows 2 columns and single
// columns at the edges.
template <template <int, int> class Tile>
void column_block(const Operands& p, int i_begin, int i_end, int o_begin, int o_end) {
  auto cover = [&](int i, auto wide, auto one, int K) {
    int o = o_begin;
    for (; o + K <= o_end; o += K) wide(p, i, o);
    for (; o < o_end; o++) one(p, i, o);
  };
  int i = i_begin;
  for (; i + 4 <= i_end; i += 4) cover(i, Tile<4, 2>::run, Tile<4, 1>::run, 2);
  switch (i_end - i) {
    case 1: cover(i, Tile<1, 8>::run, Tile<1, 1>::run, 8); break;
    case 2: cover(i, Tile<2, 4>::run, Tile<2, 1>::run, 4); break;
    case 3: cover(i, Tile<3, 2>::run, Tile<3, 1>::run, 2); break;
    default: break;
  }
}

// Where each of a thread's `streams` parts (of `part` weight rows of
// row_bytes each) starts its walk: row start[k] of part k, then on to the
// part's end and round from its start. Part k begins k * part rows into
// the share, and where part * row_bytes is a multiple of 64 KiB (the span
// after which the sets of a 512 KiB 8-way L2 repeat: Zen 2 and Zen 3) all
// the streams read lines of the same sets at each step: TinyLlama's 2048-
// byte rows make every one of its matrices so. The starts move stream k's
// lines to about k / streams of the way through that span. On the Zen 2
// of 2026-12-07, 4 streams: cold one-row products 1.08-1.12x faster where
// the parts lined up (BM_MatmulDecodeCold/1: TinyLlama's 2048 x 11264 and
// 5632 x 2048, GPT-2's 3072 x 768), the others alike, and TinyLlama's int8
// decode 0.88 -> 0.92-0.94 of the paired roof (docs/performance.md). Each
// output is still its own column's sum: the order of the columns changes,
// not a bit of any. (The fp32 kernel's 7 streams, and Q4's 4 groups of 16
// rows, gained nothing from the same starts.)
// Along a part, stream k's offset in the span moves row_bytes a row, so the
// row nearest its target is one of: the part's first, the rows on either
// side of the target, or the last within one sweep of the span.
constexpr int64_t kSetSpan = int64_t{64} << 10;
void stream_starts(int streams, int part, int64_t row_bytes, int* start) {
  for (int k = 0; k < streams; k++) {
    start[k] = 0;
    if (part <= 1) continue;
    const int64_t target = kSetSpan * k / streams, base = int64_t{k} * part * row_bytes % kSetSpan;
    const auto dist = [&](int64_t d) {
      const int64_t gap = std::abs((base + d * row_bytes) % kSetSpan - target);
      return std::min(gap, kSetSpan - gap);
    };
    const int64_t last = std::min<int64_t>(part - 1, kSetSpan / row_bytes);
    const int64_t ahead = ((target - base) % kSetSpan + kSetSpan) % kSetSpan;  // bytes forward to the target
    int64_t best = 0;
    for (int64_t d : {ahead / row_bytes, ahead / row_bytes + 1, last}) {
      d = std::min(d, last);
      if (dist(d) < dist(best)) best = d;
    }
    start[k] = static_cast<int>(best);
  }
}

// Work items of kRowBlock rows (their codes stay in L2 while every column
// block passes; a prefill of thousands of rows would otherwise stream all
// of them from L3 once per column block) by kColumnBlock columns.
template <template <int, int> class Tile>
void ours(const Operands& p, int N) {
  if constexpr (requires(const Operands& q, const int* c) { Tile<1, 1>::streams(q, c); }) {
    if (N == 1) {  // a decode step: each thread's columns as kStreams parts walked together
#pragma omp parallel if (int64_t{p.OC} * p.C > 65536)
      {
        const int t = omp_get_thread_num(), T = omp_get_num_threads();
        const int o0 = static_cast<int>(int64_t{p.OC} * t / T), o1 = static_cast<int>(int64_t{p.OC} * (t + 1) / T);
        constexpr int kStreams = Tile<1, 1>::kStreams;
        const int part = (o1 - o0) / kStreams;
        int cols[kStreams], start[kStreams];
        stream_starts(kStreams, part, p.C, start);
        for (int j = 0; j < part; j++) {
          for (int k = 0; k < kStreams; k++) {
            const int r = start[k] + j;
            cols[k] = o0 + k * part + (r < part ? r : r - part);
          }
          Tile<1, 1>::streams(p, cols);
        }
        if (o0 + kStreams * part < o1) column_block<Tile>(p, 0, 1, o0 + kStreams * part, o1);
      }
      return;
    }
  }
  const int cblocks = (p.OC + kColumnBlock - 1) / kColumnBlock;
  const int rblocks = (N + kRowBlock - 1) / kRowBlock;
#pragma omp parallel for collapse(2) schedule(static) if (int64_t{N} * p.OC * p.C > 65536)
  for (int rb = 0; rb < rblocks; rb++)
    for (int b = 0; b < cblocks; b++)
      column_block<Tile>(p, rb * kRowBlock, std::min(N, (rb + 1) * kRowBlock), b * kColumnBlock,
                         std::min(p.OC, (b + 1) * kColumnBlock));
}

// oneDNN's ISA as it dispatches now (DNNL_MAX_CPU_ISA included): its s8 x s8
// matmul is exact where that ISA has VNNI (avx2_vnni, avx512_core_vnni and
// everything above it, AMX included).
bool onednn_exact() {
  const unsigned isa = static_cast<unsigned>(dnnl_get_effective_cpu_isa());
  return (isa & static_cast<unsigned>(dnnl_cpu_isa_avx512_core_vnni & ~dnnl_cpu_isa_avx512_core)) != 0 ||
         (isa & static_cast<unsigned>(dnnl_cpu_isa_avx2_vnni & ~dnnl_cpu_isa_avx2)) != 0;
}
bool onednn_amx() {
  const unsigned isa = static_cast<unsigned>(dnnl_get_effective_cpu_isa());
  const unsigned amx = dnnl_cpu_isa_avx512_core_amx & ~dnnl_cpu_isa_avx512_core_bf16;
  return (isa & amx) == amx;
}
bool have_vnni() {
  const CpuFeatures& f = cpu_features();
  return f.avx512_vnni && f.avx512vl;
}

// The kernel a call of N rows runs.
Int8Kernel pick(int N) {
  const Int8Kernel forced = g_forced.load(std::memory_order_relaxed);
  if (forced != Int8Kernel::kAuto) return forced;
  // Below kOneDnnMinRows the weights' bytes bound the time, and our loops
  // stream them faster than oneDNN's GEMM (BM_MatmulInt8: 3.5x on the
  // GPT-2 head at one row, this Zen 4).
  if (onednn_exact() && N >= kOneDnnMinRows) return Int8Kernel::kOneDnn;
  if (have_vnni()) return Int8Kernel::kVnni;
  return cpu_features().avx2 ? Int8Kernel::kAvx2 : Int8Kernel::kGeneric;
}

void onednn_matmul(ThreadState& st, const Operands& p, int N) {
  st.acc.resize(static_cast<size_t>(N) * p.OC);
  const auto key = std::make_tuple(N, p.C, p.OC);
  auto it = st.prims.find(key);
  if (it == st.prims.end()) {
    if (st.prims.size() >= kMaxPerThread) st.prims.clear();
    it = st.prims.emplace(key, compile_int8(N, p.C, p.OC)).first;
  }
  const Int8Matmul& m = it->second;
  st.scratch.resize(std::max<size_t>(1, m.scratchpad.get_size()));
  memory src(m.src, int8_engine(), const_cast<int8_t*>(p.xq));
  memory wei(m.wei, int8_engine(), const_cast<int8_t*>(p.wq));
  memory dst(m.dst, int8_engine(), st.acc.data());
  memory scratch(m.scratchpad, int8_engine(), st.scratch.data());
  m.prim.execute(st.stream, {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wei}, {DNNL_ARG_DST, dst},
                             {DNNL_ARG_SCRATCHPAD, scratch}});
  st.stream.wait();
  // Dequantize, threaded over column blocks (a decode step has one row).
  const int32_t* acc = st.acc.data();
  const int blocks = (p.OC + kColumnBlock - 1) / kColumnBlock;
#pragma omp parallel for schedule(static) collapse(2) if (int64_t{N} * p.OC > 4096)
  for (int i = 0; i < N; i++)
    for (int b = 0; b < blocks; b++) {
      const int o = b * kColumnBlock, K = std::min(p.OC - o, kColumnBlock);
      dequantize(p.out + static_cast<int64_t>(i) * p.OC + o, acc + static_cast<int64_t>(i) * p.OC + o, K, p.xs[i],
                 p.wscale + o, p.bias ? p.bias + o : nullptr);
    }
}

const char* kernel_name(Int8Kernel k) {
  switch (k) {
    case Int8Kernel::kGeneric: return "generic";
    case Int8Kernel::kAvx2: return "avx2";
    case Int8Kernel::kVnni: return "vnni";
    case Int8Kernel::kOneDnn: return "onednn";
    case Int8Kernel::kAuto: break;
  }
  return "auto";
}

}  // namespace

Status set_int8_kernel(Int8Kernel k) {
  const CpuFeatures& f = cpu_features();
  if (k == Int8Kernel::kAvx2 && !f.avx2) return Status::InvalidArgument("the avx2 INT8 kernel needs AVX2");
  if (k == Int8Kernel::kVnni && !have_vnni())
    return Status::InvalidArgument("the vnni INT8 kernel needs AVX512-VNNI with AVX512-VL");
  g_forced.store(k, std::memory_order_relaxed);
  return Status::OK();
}

Int8Kernel forced_int8_kernel() { return g_forced.load(std::memory_order_relaxed); }

Result<Int8Kernel> parse_int8_kernel(std::string_view name) {
  for (Int8Kernel k : {Int8Kernel::kAuto, Int8Kernel::kGeneric, Int8Kernel::kAvx2, Int8Kernel::kVnni,
                       Int8Kernel::kOneDnn})
    if (name == kernel_name(k)) return k;
  return Status::InvalidArgument(
      fmt::format("unknown INT8 kernel '{}' (auto, generic, avx2, vnni or onednn)", std::string(name)));
}

Int8KernelInfo int8_kernel_info() {
  Int8KernelInfo info;
  const Int8Kernel small = pick(1), large = pick(kOneDnnMinRows);
  auto describe = [](Int8Kernel k) -> std::string {
    switch (k) {
      case Int8Kernel::kGeneric: return "generic (plain loops, exact; no AVX2)";
      case Int8Kernel::kAvx2: return "avx2 (vpmaddubsw on |x| and sign(x)*w, exact)";
      case Int8Kernel::kVnni: return "vnni (vpdpbusd on |x| and sign(x)*w, exact)";
      case Int8Kernel::kOneDnn:
        return onednn_exact() ? fmt::format("onednn on {} ({}, exact)", onednn_isa(), onednn_amx() ? "AMX-INT8" : "VNNI")
                              : fmt::format("onednn on {} (INEXACT: its int16 pair sums saturate without VNNI)",
                                            onednn_isa());
      case Int8Kernel::kAuto: break;
    }
    return "auto";
  };
  info.exact = (small != Int8Kernel::kOneDnn || onednn_exact()) && (large != Int8Kernel::kOneDnn || onednn_exact());
  info.small = kernel_name(small);
  info.large = kernel_name(large);
  info.summary = small == large ? describe(small)
                                : fmt::format("{} below {} rows, {} from {}", describe(small), kOneDnnMinRows,
                                              describe(large), kOneDnnMinRows);
  if (g_forced.load(std::memory_order_relaxed) != Int8Kernel::kAuto) info.summary += " [forced]";
  return info;
}

void quantize_weights_int8(int8_t* wq, float* wscale, const float* weight, int OC, int C) {
#pragma omp parallel for schedule(static)
  for (int o = 0; o < OC; o++)
    wscale[o] = quantize_row(wq + static_cast<int64_t>(o) * C, weight + static_cast<int64_t>(o) * C, C);
}

void matmul_int8_forward(float* out, const float* inp, const int8_t* wq, const float* wscale, const float* bias,
                         int N, int C, int OC) {
  if (N <= 0 || OC <= 0) return;
  ThreadState& st = state();
  st.xq.resize(static_cast<size_t>(N) * C);
  st.xa.resize(static_cast<size_t>(N) * C);
  st.xs.resize(N);
  int8_t* xq = st.xq.data();
  uint8_t* xa = st.xa.data();
  float* xs = st.xs.data();
#pragma omp parallel for schedule(static) if (N > 1)
  for (int i = 0; i < N; i++) {
    const int64_t r = static_cast<int64_t>(i) * C;
    xs[i] = quantize_row(xq + r, inp + r, C);
    for (int c = 0; c < C; c++) xa[r + c] = static_cast<uint8_t>(std::abs(static_cast<int>(xq[r + c])));
  }
  const Operands p{xq, xa, xs, wq, wscale, bias, out, C, OC};
  switch (pick(N)) {
    case Int8Kernel::kGeneric: ours<GenericTile>(p, N); break;
    case Int8Kernel::kVnni: ours<VnniTile>(p, N); break;
    case Int8Kernel::kOneDnn: onednn_matmul(st, p, N); break;
    case Int8Kernel::kAvx2:
    case Int8Kernel::kAuto: ours<Avx2Tile>(p, N); break;
  }
}

}  // namespace tessera::cpu
