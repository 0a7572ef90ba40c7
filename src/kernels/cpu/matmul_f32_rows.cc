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
// - avx2: tiles of up to 2 input rows x 4 weight rows, 8 ymm accumulators;
//   1 x 8 at one row, the next tile prefetched.
// A tile's weight rows come from 8 (one row) or 4 parts of the thread's
// share, 8 or 4 streams a core (weight_range).
// - generic: plain loops (CPUs without AVX2).
// A width that is not a multiple of the vector length ends in masked loads
// (avx512) or a scalar tail (avx2). Each output is one dot product summed in
// vector lanes, so the result does not depend on how many rows came along.
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cstdint>

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
    // line: every other step. The one-row tile too: its half-line loads keep
    // half as many lines in flight as avx512's (without a prefetch the GPT-2
    // head read at 42-45 GB/s, 58-60 with one, on the machine of the time);
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
    for (int k = 0; k < K; k++) {
      float s = hsum256_ps(acc[r][k]);
      for (int64_t t = c; t < C; t++) s += x[r * C + t] * w[k * S + t];
      a.out[(i + r) * int64_t{a.OC} + o + k * stride] = s + (a.bias ? a.bias[o + k * stride] : 0.0f);
    }
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
// avx512 and avx2: 8 independent accumulators hide the FMA latency. A tile's
// (a block's) weight rows come one from each eighth (quarter) of the range,
// so that the memory sees 8 (4) streams a core. On a 2-core Zen 3 one
// stream a core read 31-36 GB/s, 8 adjacent rows walked together 27-38 and
// 8 far-apart streams 50-52 (a read loop, same minutes; docs/performance.md).
// More rows than one walk far-apart blocks only where a row is a multiple
// of 4 KiB (its lines share cache sets with its neighbours' anyway): 8 rows
// x 2048 x 11264 cold 5.3-5.4 -> 4.4-4.5 ms there, while 8 x 768 x 3072,
// whose adjacent rows spread over the sets, went 448-467 -> 595-604 us
// (BM_MatmulDecodeCold/0/*/8, Zen 3).
void weight_range(Kind kind, const Args& a, int o_begin, int o_end) {
  int o = o_begin;
  if (kind != Kind::kGeneric && (a.N == 1 || a.C % 1024 == 0)) {
    const int K = a.N == 1 ? 8 : kWeightRows, part = (o_end - o_begin) / K;
    for (int j = 0; j < part; j++) {
      if (a.N == 1)
        tile<1, 8>(kind, a, 0, o_begin + j, part);
      else
        weight_block<kWeightRows>(kind, a, o_begin + j, part);
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
