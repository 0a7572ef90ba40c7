// The fp32 matmul of a few rows (cpu::matmul_f32_rows, matmul.h): a decode
// step, or a few sequences decoding together. With so few rows the product
// is bound by reading the weights, so each thread streams one contiguous
// share of the weight rows, once, and multiplies every input row against a
// block of them while that block is in cache (the inputs, at most
// kFewRowsMax x C floats, stay in L1/L2). oneDNN's matmul reaches about 0.75
// of the machine's read bandwidth at one row (docs/performance.md); this
// loop is what llama.cpp's F32 path does, one weight row a dot product.
//
// - avx512: tiles of up to 4 input rows x 4 weight rows, 16 zmm accumulators
//   (a full tile's 16 sums in one transposing reduction), 1 x 8 at one row.
// - avx2: 1 x 7 at one row (a line of each of 7 streams a step); from 2 rows on,
//   tiles of 2 input rows x 6 weight rows (12 ymm accumulators) walked over
//   the width in chunks that stay in L1 (many_rows_avx2).
// A tile's weight rows come from 8 (avx512, one row), 7 (avx2, one row),
// 6 (avx2, more rows) or 4 parts of the thread's share, as many streams a
// core (weight_range).
// - generic: plain loops (CPUs without AVX2).
// A width that is not a multiple of the vector length ends in masked loads
// (avx512) or a scalar tail (avx2). Each output is one dot product summed in
// vector lanes, so the result does not depend on how many rows came along.
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels/cpu/matmul.h"
#include "kernels/cpu/vec_math.h"

namespace tessera::cpu {

namespace {

struct Args {
  const float* x;  // (N, C)
  const float* w;  // (OC, C)
  const float* bias;
  float* out;  // (N, OC)
  int N, C, OC;
};

constexpr int kWeightRows = 4;  // weight rows a tile

#define TESSERA_TARGET_AVX2 __attribute__((target("avx2,fma")))
#define TESSERA_TARGET_AVX512 __attribute__((target("avx2,fma,avx512f")))

template <int R, int K>
TESSERA_TARGET_AVX512 void tile_avx512(const Args& a, int i, int o, int64_t stride) {
  const int64_t C = a.C, S = stride * C;
  const float* x = a.x + i * C;
  const float* w = a.w + o * C;
  __m512 acc[R][K];
  for (int r = 0; r < R; r++)
    for (int k = 0; k < K; k++) acc[r][k] = _mm512_setzero_ps();
  int64_t c = 0;
  for (; c + 16 <= C; c += 16) {
    __m512 wv[K];
    for (int k = 0; k < K; k++) wv[k] = _mm512_loadu_ps(w + k * S + c);
    // The next tile's weight rows, at this column, on their way to L2 while
    // these are multiplied (twice the streams in flight). With the
    // hardware prefetcher alone, cold 8-row products read at 18-25 GB/s and
    // one-row products of short rows (C = 768, a row 3 KB) at 29-30; into
    // L1 (_MM_HINT_T0) helped short rows and cost long ones 5%, with L2
    // as the target all gain: +5-17% at one row, +34-75% at 8 rows on Zen 4
    // (BM_MatmulDecodeCold). A prefetch past the matrix's end does not fault.
    if (stride == 1)  // rows far apart are streams already (tile_avx2)
      for (int k = 0; k < K; k++) _mm_prefetch(reinterpret_cast<const char*>(w + (K + k) * C + c), _MM_HINT_T1);
    for (int r = 0; r < R; r++) {
      const __m512 xv = _mm512_loadu_ps(x + r * C + c);
      for (int k = 0; k < K; k++) acc[r][k] = _mm512_fmadd_ps(xv, wv[k], acc[r][k]);
    }
  }
  if (c < C) {
    const __mmask16 m = static_cast<__mmask16>((1u << (C - c)) - 1);
    __m512 wv[K];
    for (int k = 0; k < K; k++) wv[k] = _mm512_maskz_loadu_ps(m, w + k * S + c);
    for (int r = 0; r < R; r++) {
      const __m512 xv = _mm512_maskz_loadu_ps(m, x + r * C + c);
      for (int k = 0; k < K; k++) acc[r][k] = _mm512_fmadd_ps(xv, wv[k], acc[r][k]);
    }
  }
  if constexpr (R == 4 && K == 4) {
    alignas(64) float sums[16];
    _mm512_store_ps(sums, hsum512_x16(&acc[0][0]));
    for (int r = 0; r < R; r++)
      for (int k = 0; k < K; k++)
        a.out[(i + r) * int64_t{a.OC} + o + k * stride] =
            sums[r * 4 + k] + (a.bias ? a.bias[o + k * stride] : 0.0f);
  } else {
    for (int r = 0; r < R; r++)
      for (int k = 0; k < K; k++)
        a.out[(i + r) * int64_t{a.OC} + o + k * stride] =
            hsum512(acc[r][k]) + (a.bias ? a.bias[o + k * stride] : 0.0f);
  }
}

// One output of the avx2 kernels: the vector sum's lanes, then the scalar
// tail [c, C). One function for every avx2 kernel, so that an output has
// the same bits whichever computed it.
TESSERA_TARGET_AVX2 __attribute__((noinline)) float finish_avx2(__m256 acc, const float* x, const float* w, int64_t c,
                                                                int64_t C) {
  float s = hsum256_ps(acc);
  for (; c < C; c++) s += x[c] * w[c];
  return s;
}

template <int R, int K>
TESSERA_TARGET_AVX2 void tile_avx2(const Args& a, int i, int o, int64_t stride) {
  const int64_t C = a.C, S = stride * C;
  const float* x = a.x + i * C;
  const float* w = a.w + o * C;
  __m256 acc[R][K];
  for (int r = 0; r < R; r++)
    for (int k = 0; k < K; k++) acc[r][k] = _mm256_setzero_ps();
  int64_t c = 0;
  for (; c + 8 <= C; c += 8) {
    __m256 wv[K];
    for (int k = 0; k < K; k++) wv[k] = _mm256_loadu_ps(w + k * S + c);
    // The next tile's rows into L2, as avx512 does, one prefetch a 64-byte
    // line: every other step. The one-row tile too (now a share's last few
    // rows; one_row_avx2 takes the rest): its half-line loads keep half as
    // many lines in flight as avx512's (without a prefetch the GPT-2 head
    // read at 42-45 GB/s, 58-60 with one, on the machine of the time);
    // into L2 rather than L1: +13-34% at one row, +30-56% at 8 rows on Zen 4.
    // Not for rows far apart (stride > 1), which are 8 streams already: on
    // Zen 3 the prefetch held them to 0.78-0.86 of the read roof read right
    // after, 0.94-0.97 without (BM_MatmulDecodeCold/0/*/1, two runs each).
    if ((c & 15) == 0 && stride == 1)
      for (int k = 0; k < K; k++) _mm_prefetch(reinterpret_cast<const char*>(w + (K + k) * C + c), _MM_HINT_T1);
    for (int r = 0; r < R; r++) {
      const __m256 xv = _mm256_loadu_ps(x + r * C + c);
      for (int k = 0; k < K; k++) acc[r][k] = _mm256_fmadd_ps(xv, wv[k], acc[r][k]);
    }
  }
  for (int r = 0; r < R; r++)
    for (int k = 0; k < K; k++)
      a.out[(i + r) * int64_t{a.OC} + o + k * stride] =
          finish_avx2(acc[r][k], x + r * C, w + k * S, c, C) + (a.bias ? a.bias[o + k * stride] : 0.0f);
}

// One input row against K weight rows o, o + stride, ..., each a stream
// of its own (weight_range), a whole 64-byte line of each a step: the
// same FMAs into the same accumulators in the same order as tile_avx2<1,
// K>, so the same bits. Why a line a step and why 7 streams: kOneRowStreams.
template <int K>
TESSERA_TARGET_AVX2 void one_row_avx2(const Args& a, int o, int64_t stride) {
  const int64_t C = a.C, S = stride * C;
  const float* x = a.x;
  const float* w = a.w + o * C;
  __m256 acc[K];
  for (int k = 0; k < K; k++) acc[k] = _mm256_setzero_ps();
  int64_t c = 0;
  for (; c + 16 <= C; c += 16) {
    const __m256 x0 = _mm256_loadu_ps(x + c), x1 = _mm256_loadu_ps(x + c + 8);
    for (int k = 0; k < K; k++) {
      acc[k] = _mm256_fmadd_ps(x0, _mm256_loadu_ps(w + k * S + c), acc[k]);
      acc[k] = _mm256_fmadd_ps(x1, _mm256_loadu_ps(w + k * S + c + 8), acc[k]);
    }
  }
  if (c + 8 <= C) {
    const __m256 x0 = _mm256_loadu_ps(x + c);
    for (int k = 0; k < K; k++) acc[k] = _mm256_fmadd_ps(x0, _mm256_loadu_ps(w + k * S + c), acc[k]);
    c += 8;
  }
  for (int k = 0; k < K; k++)
    a.out[o + k * stride] = finish_avx2(acc[k], x, w + k * S, c, C) + (a.bias ? a.bias[o + k * stride] : 0.0f);
}

template <int R, int K>
void tile_generic(const Args& a, int i, int o, int64_t stride) {
  const int64_t C = a.C;
  for (int r = 0; r < R; r++)
    for (int k = 0; k < K; k++) {
      const float* x = a.x + (i + r) * C;
      const float* w = a.w + (o + k * stride) * C;
      float s = 0;
      for (int64_t c = 0; c < C; c++) s += x[c] * w[c];
      a.out[(i + r) * int64_t{a.OC} + o + k * stride] = s + (a.bias ? a.bias[o + k * stride] : 0.0f);
    }
}

// ---- more rows than one on avx2 (N >= 2, C >= 64). The 2 x 4 tile over
// whole rows (tile_avx2; avx512 walks its 4 x 4 the same way) ran at 0.61
// of a core's FMA peak with the
// weights in L2 (8 rows x 2048, 16.4 GB/s of weights, one thread; the
// peak: 6.7 G FMAs/s on the Zen 2 of 2026-12-07) and 21.4 GB/s from memory
// (8 x 2048 x 11264, 2 threads): 8 accumulators cannot cover the FMA
// latency (2 pipes x 5 cycles). Here a tile is 2 input rows x kManyK = 6
// weight rows, 12 accumulators, walked over C in chunks: the input rows'
// slices of a chunk (packed one after another, so rows 8 KB apart do not
// share cache sets) and the 6 weight rows' slices stay in L1 while every
// pair of input rows passes over them. The partial sums wait in memory
// between chunks; each lane still adds its products in column order and
// finish_avx2 ends every output, so its bits are the one-row kernel's.
// The 6 weight rows come one from each sixth of the thread's share: 6
// streams a core, each walking its sixth from start to end.
// With whole rows instead of chunks the same tile read 16.0 GB/s in L2 and
// 23.0 from memory; chunked 20.3 and 27.6 (0.76 of the FMA peak in L2).
// A software prefetch of the next chunk, into L1 or L2, one or two chunks
// ahead, with or without spreading it over the row pairs, gained nothing;
// 4 x 3, 3 x 4 and 2 x 5 tiles ran as 2 x 6 within the noise.
constexpr int kManyK = 6;
constexpr int kChunkFloats = 2048;  // of all input rows' slices of a chunk: 8 KB

template <int R>
TESSERA_TARGET_AVX2 void chunk_avx2(float* acc_mem, const float* xp, int64_t xstride, const float* const* w, int len,
                                    bool first) {
  __m256 acc[R][kManyK];
  for (int r = 0; r < R; r++)
    for (int k = 0; k < kManyK; k++)
      acc[r][k] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(acc_mem + (r * kManyK + k) * 8);
  for (int c = 0; c < len; c += 8) {
    __m256 xv[R];
    for (int r = 0; r < R; r++) xv[r] = _mm256_loadu_ps(xp + r * xstride + c);
    for (int k = 0; k < kManyK; k++) {
      __m256 wv = _mm256_loadu_ps(w[k] + c);
      // In a register: GCC folds the load into each row's FMA, two loads
      // where one does, and then loads, not FMAs, bound the loop (the
      // chunked tile ran at 16.4 GB/s in L2 that way, 19.8 with this).
      if constexpr (R > 1) __asm__("" : "+x"(wv));
      for (int r = 0; r < R; r++) acc[r][k] = _mm256_fmadd_ps(xv[r], wv, acc[r][k]);
    }
  }
  for (int r = 0; r < R; r++)
    for (int k = 0; k < kManyK; k++) _mm256_storeu_ps(acc_mem + (r * kManyK + k) * 8, acc[r][k]);
}

// Weight rows [o_begin, o_begin + kManyK * part) of a thread's share
// against every input row; the caller does the rows after them.
TESSERA_TARGET_AVX2 void many_rows_avx2(const Args& a, int o_begin, int part) {
  const int N = a.N;
  const int64_t C = a.C, C8 = C / 8 * 8;
  const int64_t cc = std::clamp<int64_t>(kChunkFloats / N / 8 * 8, 64, 1024);
  const int64_t chunks = (C8 + cc - 1) / cc;
  thread_local std::vector<float> xp, accs;
  xp.resize(static_cast<size_t>(chunks * N * cc));
  accs.resize(static_cast<size_t>(N) * kManyK * 8);
  // xp[chunk][row][column]: a chunk's slices of every row, one after the other.
  for (int64_t ch = 0; ch < chunks; ch++) {
    const int64_t c0 = ch * cc, len = std::min(cc, C8 - c0);
    for (int i = 0; i < N; i++)
      std::copy(a.x + i * C + c0, a.x + i * C + c0 + len, xp.data() + (ch * N + i) * cc);
  }
  for (int j = 0; j < part; j++) {
    const float* rows[kManyK];
    for (int k = 0; k < kManyK; k++) rows[k] = a.w + (o_begin + j + int64_t{k} * part) * C;
    for (int64_t ch = 0; ch < chunks; ch++) {
      const int64_t c0 = ch * cc;
      const int len = static_cast<int>(std::min(cc, C8 - c0));
      const float* w[kManyK];
      for (int k = 0; k < kManyK; k++) w[k] = rows[k] + c0;
      const float* xc = xp.data() + ch * N * cc;
      int i = 0;
      for (; i + 2 <= N; i += 2) chunk_avx2<2>(accs.data() + i * kManyK * 8, xc + i * cc, cc, w, len, ch == 0);
      if (i < N) chunk_avx2<1>(accs.data() + i * kManyK * 8, xc + i * cc, cc, w, len, ch == 0);
    }
    for (int i = 0; i < N; i++)
      for (int k = 0; k < kManyK; k++) {
        const int o = o_begin + j + k * part;
        a.out[i * int64_t{a.OC} + o] = finish_avx2(_mm256_loadu_ps(accs.data() + (i * kManyK + k) * 8),
                                                   a.x + i * C, rows[k], C8, C) +
                                       (a.bias ? a.bias[o] : 0.0f);
      }
  }
}

using Kind = Fp32Isa;

// Input rows [i, i + R) against the K weight rows o, o + stride, ..., o +
// (K - 1) * stride.
template <int R, int K>
void tile(Kind kind, const Args& a, int i, int o, int64_t stride = 1) {
  switch (kind) {
    case Kind::kAvx512: tile_avx512<R, K>(a, i, o, stride); break;
    case Kind::kAvx2: tile_avx2<R, K>(a, i, o, stride); break;
    case Kind::kGeneric: tile_generic<R, K>(a, i, o, stride); break;
  }
}

// Every input row against weight rows o, o + stride, ..., o + (K - 1) * stride.
template <int K>
void weight_block(Kind kind, const Args& a, int o, int64_t stride = 1) {
  int i = 0;
  if (kind == Kind::kAvx512) {
    for (; i + 4 <= a.N; i += 4) tile<4, K>(kind, a, i, o, stride);
    switch (a.N - i) {
      case 3: tile<3, K>(kind, a, i, o, stride); break;
      case 2: tile<2, K>(kind, a, i, o, stride); break;
      case 1: tile<1, K>(kind, a, i, o, stride); break;
      default: break;
    }
  } else {
    for (; i + 2 <= a.N; i += 2) tile<2, K>(kind, a, i, o, stride);
    if (i < a.N) tile<1, K>(kind, a, i, o, stride);
  }
}

// Weight rows [o_begin, o_end): blocks of kWeightRows, then one at a time.
// One input row (a single decode step) takes 8 weight rows a tile on
// avx512, 7 on avx2 (kOneRowStreams): as many independent accumulators hide
// the FMA latency. A tile's (a block's) weight rows come one from each
// eighth (seventh, quarter) of the range, so that the memory sees 8 (7, 4)
// streams a core. On a 2-core Zen 3 one
// stream a core read 31-36 GB/s, 8 adjacent rows walked together 27-38 and
// 8 far-apart streams 50-52 (a read loop, same minutes; docs/performance.md).
// On avx2 more rows than one take many_rows_avx2. On avx512 they walk
// far-apart blocks only where a row is a multiple of 4 KiB (its lines
// share cache sets with its neighbours' anyway): 8 rows x 2048 x 11264
// cold 5.3-5.4 -> 4.4-4.5 ms there, while 8 x 768 x 3072,
// whose adjacent rows spread over the sets, went 448-467 -> 595-604 us
// (BM_MatmulDecodeCold/0/*/8, Zen 3).
// One input row on avx2 walks 7 streams a thread, a 64-byte line of each a
// step (one_row_avx2), not 8 (tile_avx2<1, 8>, 32 bytes a step). On the
// 2-core Zen 2 of 2026-12-07, a bare loop of that shape over GPT-2's
// matrices (12 layers and the head, one fork a matrix) read 0.86-0.88 of
// what an XOR loop over the same bytes reads; 64-byte steps made it
// 0.92-0.94, and with them 7 streams read 1.00-1.03, 5 0.99-1.02, 6 0.95-0.97
// and 4 0.95 (TinyLlama's shapes alike). In the kernel, 8 streams with
// 64-byte steps gained nothing, 7 with 32-byte steps most of the gain:
// cold products 1.01-1.20x faster (BM_MatmulDecodeCold/0/*/1), GPT-2's
// fp32 decode 0.83 -> 0.89 of the paired roof, TinyLlama's 0.85 -> 0.92
// (docs/performance.md). Each stream is one part of the thread's share,
// so the streams sit (share / 7) rows apart; the odd count keeps them off
// the same L2 sets where power-of-two rows and shares line up (6 streams
// of GPT-2's qkv share are 9 x 64 KiB apart: one set for all).
constexpr int kOneRowStreams = 7;
void weight_range(Kind kind, const Args& a, int o_begin, int o_end) {
  int o = o_begin;
  if (kind == Kind::kAvx2 && a.N > 1 && a.C >= 64) {
    const int part = (o_end - o_begin) / kManyK;
    if (part > 0) many_rows_avx2(a, o_begin, part);
    o = o_begin + kManyK * part;
  } else if (kind != Kind::kGeneric && (a.N == 1 || a.C % 1024 == 0)) {
    const int K = a.N > 1 ? kWeightRows : kind == Kind::kAvx2 ? kOneRowStreams : 8;
    const int part = (o_end - o_begin) / K;
    for (int j = 0; j < part; j++) {
      if (a.N > 1)
        weight_block<kWeightRows>(kind, a, o_begin + j, part);
      else if (kind == Kind::kAvx2)
        one_row_avx2<kOneRowStreams>(a, o_begin + j, part);
      else
        tile<1, 8>(kind, a, 0, o_begin + j, part);
    }
    o = o_begin + K * part;
  }
  for (; o + kWeightRows <= o_end; o += kWeightRows) weight_block<kWeightRows>(kind, a, o);
  for (; o < o_end; o++) weight_block<1>(kind, a, o);
}

}  // namespace

void matmul_f32_rows(float* out, const float* inp, const float* weight, const float* bias, int N, int C, int OC) {
  if (N <= 0 || OC <= 0) return;
  const Kind kind = fp32_isa();
  const Args a{inp, weight, bias, out, N, C, OC};
  // Contiguous shares of whole blocks, one a thread: each thread's reads are
  // one stream the hardware prefetcher follows.
  const int blocks = (OC + kWeightRows - 1) / kWeightRows;
  const bool parallel = int64_t{OC} * C >= (int64_t{1} << 16) && omp_get_max_threads() > 1;
#pragma omp parallel if (parallel)
  {
    const int nt = omp_get_num_threads(), t = omp_get_thread_num();
    const int b0 = static_cast<int>(int64_t{blocks} * t / nt), b1 = static_cast<int>(int64_t{blocks} * (t + 1) / nt);
    weight_range(kind, a, b0 * kWeightRows, std::min(OC, b1 * kWeightRows));
  }
}

}  // namespace tessera::cpu
