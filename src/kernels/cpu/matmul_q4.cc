// The 4-bit matmul (ops.inc, matmul_q4_forward) on the CPU: llama.cpp's
// Q4_0 x Q8_0 and Q4_K x Q8_K dot products, exact int32 per block, scaled
// and summed in fp32 vector lanes.
//
// - Q4_0, avx2: the 4-bit codes minus 8 (-8..7) times the activation codes
//   with vpmaddubsw on |w| and sign(w) * a (pair sums <= 2 x 8 x 127: no
//   saturation), pairs into int32 with vpmaddwd.
// - Q4_0, vnni: vpdpbusd on the unsigned codes (0..15) and the activation
//   codes, then 8 x the block's code sum subtracted, in int32.
// - Q4_K: vpmaddubsw on the unsigned codes and the activation codes (pair
//   sums <= 2 x 15 x 127), then vpmaddwd by the sub-block's 6-bit scale:
//   the super-block's sum_j sc_j sum q a in int32 lanes; the mins' term
//   from the activations' sums of 32, in scalar int32.
// - generic: the oracle's loops (CPUs without AVX2).
//
// A tile is R activation rows x K weight rows; every block of the K weight
// rows is unpacked once for the R rows. One row (a decode step) takes 4
// weight rows at a time; more rows take 2.
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include <fmt/format.h>

#include "core/cpu_features.h"
#include "kernels/cpu/act_quant.h"
#include "kernels/cpu/int8_kernel.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/vec_math.h"
#include "kernels/q4.h"

namespace tessera::cpu {

namespace {

constexpr int kColumnBlock = 16;
constexpr int kRowBlock = 64;

struct Operands {
  const int8_t* a;     // (N, C) activation codes
  const float* xs;     // (N, C / act_block) their scales
  const int32_t* sums; // (N, C / 32) their sums
  const uint8_t* wq;   // (OC, row_bytes)
  const float* bias;
  float* out;
  int C, OC;
  int64_t rb;  // bytes of a weight row
};

uint16_t load16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

#define TESSERA_TARGET_AVX2 __attribute__((target("avx2,fma,f16c")))
#define TESSERA_TARGET_VNNI __attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512vnni")))

// 32 codes of a Q4_0 block (low nibbles then high), unsigned 0..15.
TESSERA_TARGET_AVX2 inline __m256i unpack_q4_0(const uint8_t* qs) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m256i both = _mm256_set_m128i(_mm_srli_epi16(raw, 4), raw);
  return _mm256_and_si256(both, _mm256_set1_epi8(0x0F));
}

// Q4_0 dot products of one block: AVX2 with signed codes, VNNI with
// unsigned codes and the block's activation sum.
TESSERA_TARGET_AVX2 inline __m256i q4_0_dot_avx2(__m256i wu, __m256i a, int32_t /*asum*/) {
  const __m256i w = _mm256_sub_epi8(wu, _mm256_set1_epi8(8));
  const __m256i p16 = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(a, w));
  return _mm256_madd_epi16(p16, _mm256_set1_epi16(1));
}
TESSERA_TARGET_VNNI inline __m256i q4_0_dot_vnni(__m256i wu, __m256i a, int32_t asum) {
  const __m256i p = _mm256_dpbusd_epi32(_mm256_setzero_si256(), wu, a);
  return _mm256_sub_epi32(p, _mm256_setr_epi32(8 * asum, 0, 0, 0, 0, 0, 0, 0));
}

#define TESSERA_Q4_0_TILE(NAME, TARGET, DOT)                                                              \
  template <int R, int K>                                                                               \
  TARGET void NAME(const Operands& p, int i0, int o0) {                                                 \
    const int nb = p.C / 32;                                                                            \
    __m256 acc[R][K];                                                                                   \
    for (int r = 0; r < R; r++)                                                                         \
      for (int k = 0; k < K; k++) acc[r][k] = _mm256_setzero_ps();                                      \
    for (int b = 0; b < nb; b++) {                                                                      \
      __m256i w[K];                                                                                     \
      float d[K];                                                                                       \
      for (int k = 0; k < K; k++) {                                                                     \
        const uint8_t* y = p.wq + (o0 + k) * p.rb + static_cast<int64_t>(b) * q4::kQ4_0Bytes;           \
        d[k] = _cvtsh_ss(load16(y));                                                                    \
        w[k] = unpack_q4_0(y + 2);                                                                      \
      }                                                                                                 \
      for (int r = 0; r < R; r++) {                                                                     \
        const int64_t i = i0 + r;                                                                       \
        const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p.a + i * p.C + b * 32)); \
        const float xs = p.xs[i * nb + b];                                                              \
        const int32_t asum = p.sums[i * nb + b];                                                        \
        for (int k = 0; k < K; k++)                                                                     \
          acc[r][k] = _mm256_fmadd_ps(_mm256_set1_ps(d[k] * xs), _mm256_cvtepi32_ps(DOT(w[k], a, asum)), \
                                      acc[r][k]);                                                       \
      }                                                                                                 \
    }                                                                                                   \
    for (int r = 0; r < R; r++)                                                                         \
      for (int k = 0; k < K; k++)                                                                       \
        p.out[(i0 + r) * static_cast<int64_t>(p.OC) + o0 + k] =                                         \
            hsum256_ps(acc[r][k]) + (p.bias ? p.bias[o0 + k] : 0.0f);                                      \
  }

TESSERA_Q4_0_TILE(q4_0_avx2, TESSERA_TARGET_AVX2, q4_0_dot_avx2)
TESSERA_Q4_0_TILE(q4_0_vnni, TESSERA_TARGET_VNNI, q4_0_dot_vnni)

// A Q4_K super-block's 12 packed bytes of 6-bit scales and mins as 8 scale
// bytes then 8 min bytes (llama.cpp's kmask unpacking: q4::scale_min for
// all eight sub-blocks in a few 32-bit operations).
inline void unpack_scales_mins(const uint8_t* packed, uint64_t* scales, uint64_t* mins) {
  constexpr uint32_t kLow6 = 0x3f3f3f3f, kLow4 = 0x0f0f0f0f, kLow2 = 0x03030303;
  uint32_t u[3];
  std::memcpy(u, packed, 12);
  const uint32_t sc_lo = u[0] & kLow6, sc_hi = (u[2] & kLow4) | (((u[0] >> 6) & kLow2) << 4);
  const uint32_t m_lo = u[1] & kLow6, m_hi = ((u[2] >> 4) & kLow4) | (((u[1] >> 6) & kLow2) << 4);
  *scales = sc_lo | (uint64_t{sc_hi} << 32);
  *mins = m_lo | (uint64_t{m_hi} << 32);
}

TESSERA_TARGET_AVX2 inline int32_t hsum_epi32(__m256i v) {
  __m128i x = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  x = _mm_add_epi32(x, _mm_shuffle_epi32(x, 0x4E));
  x = _mm_add_epi32(x, _mm_shuffle_epi32(x, 0xB1));
  return _mm_cvtsi128_si32(x);
}

// Per super-block and weight row: the scales as int16 lanes (sub-block j's
// broadcast by one byte shuffle, for the tile's R rows), the mins' term sum_j m_j * sums_j with
// one vpmaddwd on the activations' int32 sums (|sum| <= 32 x 127 fits the
// low int16; the mins' high halves are zero) and an int32 horizontal sum:
// the same integers, scaled and added in the same order as the scalar
// unpacking did (q4::scale_min per sub-block: 3.5x slower on a decode row).
template <int R, int K>
TESSERA_TARGET_AVX2 void q4_k_avx2(const Operands& p, int i0, int o0) {
  const int nb = p.C / 256, ns = p.C / 32;
  const __m256i low = _mm256_set1_epi8(0x0F);
  __m256 acc[R][K];
  float macc[R][K];
  for (int r = 0; r < R; r++)
    for (int k = 0; k < K; k++) acc[r][k] = _mm256_setzero_ps(), macc[r][k] = 0.0f;
  for (int b = 0; b < nb; b++) {
    const uint8_t* y[K];
    float d[K], dmin[K];
    __m256i scale[K][8], m32[K];  // sub-block j's scale in every int16 lane; the mins as int32
    for (int k = 0; k < K; k++) {
      y[k] = p.wq + (o0 + k) * p.rb + static_cast<int64_t>(b) * q4::kQ4_KBytes;
      d[k] = _cvtsh_ss(load16(y[k]));
      dmin[k] = _cvtsh_ss(load16(y[k] + 2));
      uint64_t scales, mins;
      unpack_scales_mins(y[k] + 4, &scales, &mins);
      const __m256i sc16 =
          _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(static_cast<int64_t>(scales))));
      // Byte pairs (2j, 2j + 1) in every 16-bit lane: int16 scale j broadcast.
      for (int j = 0; j < 8; j++)
        scale[k][j] = _mm256_shuffle_epi8(sc16, _mm256_set1_epi16(static_cast<int16_t>((2 * j) | ((2 * j + 1) << 8))));
      m32[k] = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<int64_t>(mins)));
    }
    for (int r = 0; r < R; r++) {
      const int64_t i = i0 + r;
      const int8_t* a = p.a + i * p.C + b * 256;
      const __m256i sums = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p.sums + i * ns + 8 * b));
      const float xs = p.xs[i * nb + b];
      for (int k = 0; k < K; k++) {
        __m256i isum = _mm256_setzero_si256();
        for (int q = 0; q < 4; q++) {
          const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[k] + 16 + 32 * q));
          const __m256i lo = _mm256_and_si256(raw, low), hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low);
          const __m256i alo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + 64 * q));
          const __m256i ahi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + 64 * q + 32));
          isum = _mm256_add_epi32(isum, _mm256_madd_epi16(_mm256_maddubs_epi16(lo, alo), scale[k][2 * q]));
          isum = _mm256_add_epi32(isum, _mm256_madd_epi16(_mm256_maddubs_epi16(hi, ahi), scale[k][2 * q + 1]));
        }
        const int32_t msum = hsum_epi32(_mm256_madd_epi16(sums, m32[k]));
        acc[r][k] = _mm256_fmadd_ps(_mm256_set1_ps(d[k] * xs), _mm256_cvtepi32_ps(isum), acc[r][k]);
        macc[r][k] += (dmin[k] * xs) * static_cast<float>(msum);
      }
    }
  }
  for (int r = 0; r < R; r++)
    for (int k = 0; k < K; k++)
      p.out[(i0 + r) * static_cast<int64_t>(p.OC) + o0 + k] =
          hsum256_ps(acc[r][k]) - macc[r][k] + (p.bias ? p.bias[o0 + k] : 0.0f);
}

// Plain loops: the oracle's sums, for CPUs without AVX2.
template <int R, int K>
void generic_tile(const Operands& p, q4::Type t, int i0, int o0) {
  for (int r = 0; r < R; r++)
    for (int k = 0; k < K; k++) {
      const int64_t i = i0 + r;
      const int o = o0 + k;
      const uint8_t* row = p.wq + o * p.rb;
      float acc = 0.0f;
      if (t == q4::Type::kQ4_0) {
        for (int b = 0; b < p.C / 32; b++) {
          const uint8_t* y = row + static_cast<int64_t>(b) * q4::kQ4_0Bytes;
          const int8_t* a = p.a + i * p.C + b * 32;
          int32_t isum = 0;
          for (int j = 0; j < 16; j++) isum += ((y[2 + j] & 0xF) - 8) * a[j] + ((y[2 + j] >> 4) - 8) * a[j + 16];
          acc += (q4::fp16_to_f32(load16(y)) * p.xs[i * (p.C / 32) + b]) * static_cast<float>(isum);
        }
      } else {
        for (int b = 0; b < p.C / 256; b++) {
          const uint8_t* y = row + static_cast<int64_t>(b) * q4::kQ4_KBytes;
          const int8_t* a = p.a + i * p.C + b * 256;
          int32_t isum = 0, msum = 0;
          for (int j = 0; j < 8; j++) {
            int sc, m;
            q4::scale_min(j, y + 4, &sc, &m);
            const uint8_t* q = y + 16 + 32 * (j / 2);
            int32_t s = 0;
            for (int l = 0; l < 32; l++) s += (j % 2 == 0 ? q[l] & 0xF : q[l] >> 4) * a[32 * j + l];
            isum += sc * s;
            msum += m * p.sums[i * (p.C / 32) + 8 * b + j];
          }
          const float xs = p.xs[i * (p.C / 256) + b];
          acc += (q4::fp16_to_f32(load16(y)) * xs) * static_cast<float>(isum) -
                 (q4::fp16_to_f32(load16(y + 2)) * xs) * static_cast<float>(msum);
        }
      }
      p.out[i * p.OC + o] = acc + (p.bias ? p.bias[o] : 0.0f);
    }
}

// ---- Q4_0x16 (q4::pack_x16): 16 weight rows a vector, no horizontal
// sums. Per block and activation row: the 4-bit codes of 16 rows x 4
// inputs in a register, times 4 activation codes broadcast, 8 times
// (32 inputs); the -8 offset enters as 8 x the block's activation sum,
// the start of the int32 sums; then one scale multiply for 16 rows.

constexpr int kX16Bytes = 16 * q4::kQ4_0Bytes;  // one block of a group of 16 rows

int32_t load32(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

#define TESSERA_TARGET_VNNI512 __attribute__((target("avx2,fma,f16c,avx512f,avx512vnni")))

// R activation rows from i0, the 16 G weight rows of groups g .. g + G - 1.
// With G = 2 each broadcast of 4 activation codes feeds two vpdpbusd, half
// the broadcasts a product of G = 1; every output's sums are the same, in
// the same order, for any G.
template <int G, int R>
TESSERA_TARGET_VNNI512 void x16_vnni(const Operands& p, int i0, int g) {
  const int nb = p.C / 32;
  const uint8_t* base = p.wq + static_cast<int64_t>(g) * nb * kX16Bytes;
  const __m512i low = _mm512_set1_epi32(0x0F0F0F0F);
  __m512 acc[G][R];
  for (int k = 0; k < G; k++)
    for (int r = 0; r < R; r++) acc[k][r] = _mm512_setzero_ps();
  for (int b = 0; b < nb; b++) {
    __m512 d[G];
    __m512i w[G][8];
    for (int k = 0; k < G; k++) {
      const uint8_t* y = base + (static_cast<int64_t>(k) * nb + b) * kX16Bytes;
      // Zero-masking forms with full masks throughout: the same instructions,
      // without the undefined register GCC 12 warns about in the plain ones.
      d[k] = _mm512_maskz_cvtph_ps(0xFFFF, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y)));
      for (int q = 0; q < 4; q++) {
        const __m512i raw = _mm512_loadu_si512(y + 32 + 64 * q);
        w[k][q] = _mm512_and_si512(raw, low);
        w[k][q + 4] = _mm512_and_si512(_mm512_maskz_srli_epi32(0xFFFF, raw, 4), low);
      }
    }
    for (int r = 0; r < R; r++) {
      const int64_t i = i0 + r;
      const int8_t* a = p.a + i * p.C + b * 32;
      __m512i sum[G];
      for (int k = 0; k < G; k++) sum[k] = _mm512_set1_epi32(-8 * p.sums[i * nb + b]);
      for (int q = 0; q < 8; q++) {
        const __m512i av = _mm512_set1_epi32(load32(a + (q < 4 ? 4 * q : 16 + 4 * (q - 4))));
        for (int k = 0; k < G; k++) sum[k] = _mm512_dpbusd_epi32(sum[k], w[k][q], av);
      }
      const __m512 xs = _mm512_set1_ps(p.xs[i * nb + b]);
      for (int k = 0; k < G; k++)
        acc[k][r] = _mm512_fmadd_ps(_mm512_maskz_cvtepi32_ps(0xFFFF, sum[k]), _mm512_mul_ps(d[k], xs), acc[k][r]);
    }
  }
  for (int k = 0; k < G; k++) {
    const __m512 bias = p.bias ? _mm512_loadu_ps(p.bias + (g + k) * 16) : _mm512_setzero_ps();
    for (int r = 0; r < R; r++)
      _mm512_storeu_ps(p.out + (i0 + r) * static_cast<int64_t>(p.OC) + (g + k) * 16, _mm512_add_ps(acc[k][r], bias));
  }
}

// AVX2: each half of the group (8 rows) on its own, vpmaddubsw in place of
// vpdpbusd: a pair sum is at most 2 x 15 x 128 = 3840 in magnitude, so the
// 8 of a block (its 32 inputs) add in int16 exactly (|sum| <= 30720), and
// one vpmaddwd by ones widens them to int32: the same integers as widening
// each pair sum, with 7 adds in place of 8 vpmaddwd and 8 adds.
// Block b (at y) of halves h0 .. h0 + H - 1 for R rows from i0, into acc.
template <int R, int H>
TESSERA_TARGET_AVX2 inline void x16_avx2_block(const Operands& p, int i0, int h0, const uint8_t* y, int b,
                                               __m256 (*acc)[R]) {
  const int nb = p.C / 32;
  const __m256i low = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  for (int e = 0; e < H; e++) {
    const int h = h0 + e;
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(y + 16 * h)));
    __m256i w[8];
    for (int q = 0; q < 4; q++) {
      const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y + 32 + 64 * q + 32 * h));
      w[q] = _mm256_and_si256(raw, low);
      w[q + 4] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low);
    }
    for (int r = 0; r < R; r++) {
      const int64_t i = i0 + r;
      const int8_t* a = p.a + i * p.C + b * 32;
      __m256i pairs = _mm256_maddubs_epi16(w[0], _mm256_set1_epi32(load32(a)));
      for (int q = 1; q < 8; q++) {
        const __m256i av = _mm256_set1_epi32(load32(a + (q < 4 ? 4 * q : 16 + 4 * (q - 4))));
        pairs = _mm256_add_epi16(pairs, _mm256_maddubs_epi16(w[q], av));
      }
      const __m256i sum = _mm256_add_epi32(_mm256_set1_epi32(-8 * p.sums[i * nb + b]), _mm256_madd_epi16(pairs, ones));
      acc[e][r] =
          _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_mul_ps(d, _mm256_set1_ps(p.xs[i * nb + b])), acc[e][r]);
    }
  }
}

// Halves h0 .. h0 + H - 1 of group g's outputs for R rows from i0, plus the bias.
template <int R, int H>
TESSERA_TARGET_AVX2 inline void x16_avx2_store(const Operands& p, int i0, int h0, int g, __m256 (*acc)[R]) {
  for (int e = 0; e < H; e++) {
    const int h = h0 + e;
    const __m256 bias = p.bias ? _mm256_loadu_ps(p.bias + g * 16 + 8 * h) : _mm256_setzero_ps();
    for (int r = 0; r < R; r++)
      _mm256_storeu_ps(p.out + (i0 + r) * static_cast<int64_t>(p.OC) + g * 16 + 8 * h, _mm256_add_ps(acc[e][r], bias));
  }
}

// The lines of a Q4_0x16 block (kX16Bytes = 288: 5 or 6 lines) into L1:
// the block kPrefetchBlocks ahead of the one at y that a walk takes. Past
// a group's end that is the next group's, which the one-row streams take
// next and the row walks soon after (a 4-row tile's next walk may be the
// same group again). The address is computed as an integer: it may lie
// past the weights, and a prefetch never faults.
// On the 2-core Zen 2 the x16 kernels' arithmetic alone reads 45-49 GB/s
// (BM_MatmulDecodeHot/2), about the 50-54 of the read roof, so a cold
// product is as fast as its reads overlap its arithmetic.
// BM_MatmulDecodeCold/2, 3 interleaved runs against the previous binary:
// one row 12-25% faster on every shape (GPT-2's qkv 26.9-29.1 -> 33.6-34.6
// GB/s, TinyLlama's gate/up 32.2-33.9 -> 37.2-38.0), 8 rows 7-12%. A first
// try that stopped at each group's end lost 10-15% on 768-wide rows (a
// quarter of each group's blocks unprefetched). Q4_K's walks lost 5-10%
// with whole 2.3 KB super-blocks ahead and have none (the int8 streams
// have their own, matmul_int8.cc).
constexpr int kPrefetchBlocks = 6;
TESSERA_TARGET_AVX2 inline void prefetch_x16_block(const uint8_t* y) {
  const uintptr_t at = reinterpret_cast<uintptr_t>(y) + kPrefetchBlocks * kX16Bytes;
  for (uintptr_t line = at & ~uintptr_t{63}; line < at + kX16Bytes; line += 64)
    _mm_prefetch(reinterpret_cast<const char*>(line), _MM_HINT_T0);
}

// R rows from i0 against group g. H halves a walk over the group's blocks:
// one row takes both (each line of the group's blocks read once, in
// address order; the half-line walks of H = 1 read every line on the first
// and computed alone on the second), 4 rows one (their 8 accumulators a
// half in registers). Each output's sums are the same, in the same order,
// either way.
template <int R, int H = (R == 1 ? 2 : 1)>
TESSERA_TARGET_AVX2 void x16_avx2(const Operands& p, int i0, int g) {
  const int nb = p.C / 32;
  const uint8_t* base = p.wq + static_cast<int64_t>(g) * nb * kX16Bytes;
  for (int h0 = 0; h0 < 2; h0 += H) {
    __m256 acc[H][R];
    for (int e = 0; e < H; e++)
      for (int r = 0; r < R; r++) acc[e][r] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
      const uint8_t* y = base + static_cast<int64_t>(b) * kX16Bytes;
      if (h0 == 0) prefetch_x16_block(y);  // the second half's walk reads cache
      x16_avx2_block<R, H>(p, i0, h0, y, b, acc);
    }
    x16_avx2_store<R, H>(p, i0, h0, g, acc);
  }
}

// One row (a decode step) against kGroupStreams groups far apart (each from
// its own part of the thread's groups), block b of each in turn: the memory
// sees kGroupStreams streams a core, not one (kStreams in matmul_int8.cc:
// one stream a core read 31-36 GB/s on Zen 3, 8 far apart 50-52). Each
// group's sums are x16_avx2<1>'s, in its order.
// Each stream's block kPrefetchBlocks ahead is prefetched as its block is
// taken (prefetch_x16_block).
constexpr int kGroupStreams = 4;
TESSERA_TARGET_AVX2 void x16_avx2_streams(const Operands& p, int i, const int* groups) {
  const int nb = p.C / 32;
  __m256 acc[kGroupStreams][2][1];
  for (auto& a : acc) a[0][0] = a[1][0] = _mm256_setzero_ps();
  for (int b = 0; b < nb; b++)
    for (int k = 0; k < kGroupStreams; k++) {
      const uint8_t* y = p.wq + (static_cast<int64_t>(groups[k]) * nb + b) * kX16Bytes;
      prefetch_x16_block(y);
      x16_avx2_block<1, 2>(p, i, 0, y, b, acc[k]);
    }
  for (int k = 0; k < kGroupStreams; k++) x16_avx2_store<1, 2>(p, i, 0, groups[k], acc[k]);
}

// ---- Q4_Kx16 (q4::pack_x16): a super-block of 16 rows at a time. The
// packed 6-bit scales and mins of 16 rows are three registers of 32-bit
// words, unpacked with llama.cpp's kmasks once a super-block for the tile's
// rows. Per sub-block j (32 inputs) and activation row, 8 products of 4
// inputs for 16 rows (the codes of sub-block j are the low nibbles of pair
// j / 2's chunks for even j, the high for odd), then times sub-block j's 16
// scales into the super-block's int32 sums; the mins' term sum_j m_j sums_j
// from the activations' sums of 32 as int16 pairs (|sum| <= 32 x 127),
// 2 sub-blocks a multiply-add; then d and dmin times the activations'
// scale, 16 rows a lane. Exact int32 sums: |sum_j sc_j sum q a| <= 8 x 63
// x 32 x 15 x 127.

constexpr int kX16KBytes = 16 * q4::kQ4_KBytes;

// The super-block's 6-bit scales (sub-blocks 0-3 and 4-7, a byte each in
// every 32-bit lane) and mins, from the three words of packed bytes:
// q4::scale_min for 16 (or 8) rows at once.
struct ScalesMins512 {
  __m512i sc[2], m[2];
};
struct ScalesMins256 {
  __m256i sc[2], m[2];
};

// Bits 6-7 of each byte of u, moved to bits 4-5: the scales' and mins' high
// bits of sub-blocks 4-7.
TESSERA_TARGET_VNNI512 inline __m512i high2_512(__m512i u) {
  const __m512i two = _mm512_and_si512(_mm512_maskz_srli_epi32(0xFFFF, u, 6), _mm512_set1_epi32(0x03030303));
  return _mm512_maskz_slli_epi32(0xFFFF, two, 4);
}
TESSERA_TARGET_AVX2 inline __m256i high2_256(__m256i u) {
  return _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(u, 6), _mm256_set1_epi32(0x03030303)), 4);
}

TESSERA_TARGET_VNNI512 inline ScalesMins512 scales_mins_512(const uint8_t* words) {
  const __m512i u0 = _mm512_loadu_si512(words), u1 = _mm512_loadu_si512(words + 64),
                u2 = _mm512_loadu_si512(words + 128);
  const __m512i low6 = _mm512_set1_epi32(0x3f3f3f3f), low4 = _mm512_set1_epi32(0x0f0f0f0f);
  ScalesMins512 r;
  r.sc[0] = _mm512_and_si512(u0, low6);
  r.m[0] = _mm512_and_si512(u1, low6);
  r.sc[1] = _mm512_or_si512(_mm512_and_si512(u2, low4), high2_512(u0));
  r.m[1] = _mm512_or_si512(_mm512_and_si512(_mm512_maskz_srli_epi32(0xFFFF, u2, 4), low4), high2_512(u1));
  return r;
}

TESSERA_TARGET_AVX2 inline ScalesMins256 scales_mins_256(const uint8_t* words, int h) {
  const __m256i u0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(words + 32 * h));
  const __m256i u1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(words + 64 + 32 * h));
  const __m256i u2 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(words + 128 + 32 * h));
  const __m256i low6 = _mm256_set1_epi32(0x3f3f3f3f), low4 = _mm256_set1_epi32(0x0f0f0f0f);
  ScalesMins256 r;
  r.sc[0] = _mm256_and_si256(u0, low6);
  r.m[0] = _mm256_and_si256(u1, low6);
  r.sc[1] = _mm256_or_si256(_mm256_and_si256(u2, low4), high2_256(u0));
  r.m[1] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(u2, 4), low4), high2_256(u1));
  return r;
}

// Byte j % 4 of each lane of v (scales or mins of sub-block j) as int32,
// and the byte pair (2k, 2k + 1) % 4 as two int16 in each lane.
TESSERA_TARGET_VNNI512 inline __m512i byte_512(__m512i v, int j) {
  return _mm512_and_si512(_mm512_maskz_srli_epi32(0xFFFF, v, 8 * (j % 4)), _mm512_set1_epi32(0xFF));
}
TESSERA_TARGET_VNNI512 inline __m512i pair_512(__m512i v, int k) {
  const __m512i two = _mm512_maskz_srli_epi32(0xFFFF, v, 16 * (k % 2));  // bytes (2k, 2k + 1) % 4 low
  return _mm512_or_si512(_mm512_and_si512(two, _mm512_set1_epi32(0xFF)),
                         _mm512_and_si512(_mm512_maskz_slli_epi32(0xFFFF, two, 8), _mm512_set1_epi32(0xFF0000)));
}
TESSERA_TARGET_AVX2 inline __m256i byte_256(__m256i v, int j) {
  return _mm256_and_si256(_mm256_srli_epi32(v, 8 * (j % 4)), _mm256_set1_epi32(0xFF));
}
TESSERA_TARGET_AVX2 inline __m256i pair_256(__m256i v, int k) {
  const __m256i two = _mm256_srli_epi32(v, 16 * (k % 2));
  return _mm256_or_si256(_mm256_and_si256(two, _mm256_set1_epi32(0xFF)),
                         _mm256_and_si256(_mm256_slli_epi32(two, 8), _mm256_set1_epi32(0xFF0000)));
}

// The activations' sums of sub-blocks 2k and 2k + 1 of super-block b as
// two int16 in one int32 (each |sum| <= 32 x 127).
inline int32_t sum_pair(const int32_t* sums, int k) {
  return static_cast<int32_t>((static_cast<uint32_t>(sums[2 * k]) & 0xFFFF) | (static_cast<uint32_t>(sums[2 * k + 1]) << 16));
}

// R activation rows from i0, the 16 weight rows of group g.
template <int R>
TESSERA_TARGET_VNNI512 void x16k_vnni(const Operands& p, int i0, int g) {
  const int nb = p.C / 256, ns = p.C / 32;
  const uint8_t* base = p.wq + static_cast<int64_t>(g) * nb * kX16KBytes;
  const __m512i low = _mm512_set1_epi32(0x0F0F0F0F);
  __m512 acc[R];
  for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
  for (int b = 0; b < nb; b++) {
    const uint8_t* y = base + static_cast<int64_t>(b) * kX16KBytes;
    const ScalesMins512 sm = scales_mins_512(y + 64);
    __m512i isum[R];
    for (int r = 0; r < R; r++) isum[r] = _mm512_setzero_si512();
    // Unrolled: each sub-block's nibble half, scale byte and registers are
    // then constants (GCC 12 kept a loop with a branch and a shift by a
    // register): a 2048 x 11264 decode row 148 -> 121 us hot, 272 -> 225 on
    // AVX2; 32 rows within the noise (two sets of interleaved runs disagreed).
#pragma GCC unroll 8
    for (int j = 0; j < 8; j++) {
      const uint8_t* chunks = y + 256 + 512 * (j / 2);
      __m512i w[8];
      for (int c = 0; c < 8; c++) {
        const __m512i raw = _mm512_loadu_si512(chunks + 64 * c);
        w[c] = _mm512_and_si512(j % 2 ? _mm512_maskz_srli_epi32(0xFFFF, raw, 4) : raw, low);
      }
      const __m512i sc = byte_512(sm.sc[j / 4], j);
      for (int r = 0; r < R; r++) {
        const int8_t* a = p.a + (i0 + r) * static_cast<int64_t>(p.C) + 256 * b + 32 * j;
        __m512i s = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[0], _mm512_set1_epi32(load32(a)));
        for (int c = 1; c < 8; c++) s = _mm512_dpbusd_epi32(s, w[c], _mm512_set1_epi32(load32(a + 4 * c)));
        isum[r] = _mm512_add_epi32(isum[r], _mm512_mullo_epi32(s, sc));
      }
    }
    const __m512 d = _mm512_maskz_cvtph_ps(0xFFFF, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y)));
    const __m512 dmin = _mm512_maskz_cvtph_ps(0xFFFF, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y + 32)));
    __m512i mp[4];
    for (int k = 0; k < 4; k++) mp[k] = pair_512(sm.m[k / 2], k);
    for (int r = 0; r < R; r++) {
      const int64_t i = i0 + r;
      const int32_t* sums = p.sums + i * ns + 8 * b;
      __m512i msum = _mm512_setzero_si512();
      for (int k = 0; k < 4; k++) msum = _mm512_dpwssd_epi32(msum, mp[k], _mm512_set1_epi32(sum_pair(sums, k)));
      const __m512 xs = _mm512_set1_ps(p.xs[i * nb + b]);
      // The mins' term subtracted block by block: one accumulator a row.
      acc[r] = _mm512_fmadd_ps(_mm512_maskz_cvtepi32_ps(0xFFFF, isum[r]), _mm512_mul_ps(d, xs), acc[r]);
      acc[r] = _mm512_fnmadd_ps(_mm512_maskz_cvtepi32_ps(0xFFFF, msum), _mm512_mul_ps(dmin, xs), acc[r]);
    }
  }
  const __m512 bias = p.bias ? _mm512_loadu_ps(p.bias + g * 16) : _mm512_setzero_ps();
  for (int r = 0; r < R; r++)
    _mm512_storeu_ps(p.out + (i0 + r) * static_cast<int64_t>(p.OC) + g * 16, _mm512_add_ps(acc[r], bias));
}

// The end of super-block b for half h of the group (8 rows) and R
// activation rows from i0: each row's int32 sums times d x the row's scale,
// less the mins' term sum_j m_j sums_j times dmin x the scale, into its
// accumulator (the AVX2 tile's and one-row kernel's same steps).
template <int R>
TESSERA_TARGET_AVX2 inline void x16k_avx2_super_block(const Operands& p, const uint8_t* y, const ScalesMins256& sm,
                                                      int h, int i0, int b, const __m256i* isum, __m256* acc) {
  const int nb = p.C / 256, ns = p.C / 32;
  const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(y + 16 * h)));
  const __m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(y + 32 + 16 * h)));
  __m256i mp[4];
  for (int k = 0; k < 4; k++) mp[k] = pair_256(sm.m[k / 2], k);
  for (int r = 0; r < R; r++) {
    const int64_t i = i0 + r;
    const int32_t* sums = p.sums + i * ns + 8 * b;
    __m256i msum = _mm256_madd_epi16(mp[0], _mm256_set1_epi32(sum_pair(sums, 0)));
    for (int k = 1; k < 4; k++)
      msum = _mm256_add_epi32(msum, _mm256_madd_epi16(mp[k], _mm256_set1_epi32(sum_pair(sums, k))));
    const __m256 xs = _mm256_set1_ps(p.xs[i * nb + b]);
    // The mins' term subtracted block by block: one accumulator a row.
    acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r]), _mm256_mul_ps(d, xs), acc[r]);
    acc[r] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(msum), _mm256_mul_ps(dmin, xs), acc[r]);
  }
}

// Half h of group g's outputs for R rows from i0, plus the bias.
template <int R>
TESSERA_TARGET_AVX2 inline void x16k_avx2_store(const Operands& p, int g, int h, int i0, const __m256* acc) {
  const __m256 bias = p.bias ? _mm256_loadu_ps(p.bias + g * 16 + 8 * h) : _mm256_setzero_ps();
  for (int r = 0; r < R; r++)
    _mm256_storeu_ps(p.out + (i0 + r) * static_cast<int64_t>(p.OC) + g * 16 + 8 * h, _mm256_add_ps(acc[r], bias));
}

// AVX2, R activation rows (prefill): each half of the group (8 rows) on its
// own, as x16_avx2: per sub-block 8 vpmaddubsw add in int16 (|sum| <= 8 x 2
// x 15 x 127 = 30480) and one vpmaddwd by the sub-block's scale in both
// int16 halves of each lane gives scale x the sub-block's int32 sum.
template <int R>
TESSERA_TARGET_AVX2 void x16k_avx2(const Operands& p, int i0, int g) {
  const int nb = p.C / 256;
  const uint8_t* base = p.wq + static_cast<int64_t>(g) * nb * kX16KBytes;
  const __m256i low = _mm256_set1_epi8(0x0F);
  for (int h = 0; h < 2; h++) {
    __m256 acc[R];
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
      const uint8_t* y = base + static_cast<int64_t>(b) * kX16KBytes;
      const ScalesMins256 sm = scales_mins_256(y + 64, h);
      __m256i isum[R];
      for (int r = 0; r < R; r++) isum[r] = _mm256_setzero_si256();
#pragma GCC unroll 8
      for (int j = 0; j < 8; j++) {
        const uint8_t* chunks = y + 256 + 512 * (j / 2) + 32 * h;
        __m256i w[8];
        for (int c = 0; c < 8; c++) {
          const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(chunks + 64 * c));
          w[c] = _mm256_and_si256(j % 2 ? _mm256_srli_epi16(raw, 4) : raw, low);
        }
        const __m256i sc1 = byte_256(sm.sc[j / 4], j);
        const __m256i sc = _mm256_or_si256(sc1, _mm256_slli_epi32(sc1, 16));  // in both int16 halves
        for (int r = 0; r < R; r++) {
          const int8_t* a = p.a + (i0 + r) * static_cast<int64_t>(p.C) + 256 * b + 32 * j;
          __m256i pairs = _mm256_maddubs_epi16(w[0], _mm256_set1_epi32(load32(a)));
          for (int c = 1; c < 8; c++)
            pairs = _mm256_add_epi16(pairs, _mm256_maddubs_epi16(w[c], _mm256_set1_epi32(load32(a + 4 * c))));
          isum[r] = _mm256_add_epi32(isum[r], _mm256_madd_epi16(pairs, sc));
        }
      }
      x16k_avx2_super_block<R>(p, y, sm, h, i0, b, isum, acc);
    }
    x16k_avx2_store<R>(p, g, h, i0, acc);
  }
}

// One activation row (a decode step) under AVX2: both halves of the group
// in one walk over its super-blocks (each line read once, in address
// order), and within a sub-block the 8 chunks of 4 inputs the outer loop: a
// chunk's codes for the two halves feed the row's two int16 sums, then the
// next chunk's are loaded. Loading a sub-block's 8 code registers first, as
// the tile does, made GCC spill them and the 64 activation broadcasts of a
// super-block (the same for both halves) to a 2.3 KB stack frame: 1 x 768 x
// 2304 in L2, one thread, 37.6 -> 32.3 us (BM_MatmulQ4/1/768/2304/3/1; the
// same loop order for 4 rows was slower, 600 -> 745 us at 32 rows, so the
// tile keeps its own). The int16 and int32 sums are the same integers in
// any order; the fp32 steps are the tile's, in its order.
// Super-block b (at y) of both halves for row i, into acc (a half each).
TESSERA_TARGET_AVX2 inline void x16k_avx2_row_block(const Operands& p, int i, const uint8_t* y, int b, __m256* acc) {
  const __m256i low = _mm256_set1_epi8(0x0F);
  // Sub-block j's scales of each half, in both int16 halves of each lane.
  __m256i sc[2][8];
  for (int h = 0; h < 2; h++) {
    const ScalesMins256 sm = scales_mins_256(y + 64, h);
    for (int j = 0; j < 8; j++) {
      const __m256i sc1 = byte_256(sm.sc[j / 4], j);
      sc[h][j] = _mm256_or_si256(sc1, _mm256_slli_epi32(sc1, 16));
    }
  }
  __m256i isum[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
#pragma GCC unroll 8
  for (int j = 0; j < 8; j++) {
    const uint8_t* chunks = y + 256 + 512 * (j / 2);
    const int8_t* a = p.a + static_cast<int64_t>(i) * p.C + 256 * b + 32 * j;
    __m256i pairs[2];
    for (int c = 0; c < 8; c++) {
      const __m256i av = _mm256_set1_epi32(load32(a + 4 * c));
      for (int h = 0; h < 2; h++) {
        const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(chunks + 64 * c + 32 * h));
        const __m256i m = _mm256_maddubs_epi16(_mm256_and_si256(j % 2 ? _mm256_srli_epi16(raw, 4) : raw, low), av);
        pairs[h] = c == 0 ? m : _mm256_add_epi16(pairs[h], m);
      }
    }
    for (int h = 0; h < 2; h++) isum[h] = _mm256_add_epi32(isum[h], _mm256_madd_epi16(pairs[h], sc[h][j]));
  }
  for (int h = 0; h < 2; h++) x16k_avx2_super_block<1>(p, y, scales_mins_256(y + 64, h), h, i, b, &isum[h], &acc[h]);
}

// Group g for row i: x16k_avx2_row_block over its super-blocks.
TESSERA_TARGET_AVX2 void x16k_avx2_row(const Operands& p, int i, int g) {
  const int nb = p.C / 256;
  const uint8_t* base = p.wq + static_cast<int64_t>(g) * nb * kX16KBytes;
  __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};  // a half each
  for (int b = 0; b < nb; b++) x16k_avx2_row_block(p, i, base + static_cast<int64_t>(b) * kX16KBytes, b, acc);
  for (int h = 0; h < 2; h++) x16k_avx2_store<1>(p, g, h, i, &acc[h]);
}

// x16_avx2_streams for Q4_Kx16: super-block b of each group in turn.
TESSERA_TARGET_AVX2 void x16k_avx2_streams(const Operands& p, int i, const int* groups) {
  const int nb = p.C / 256;
  __m256 acc[kGroupStreams][2];
  for (auto& a : acc) a[0] = a[1] = _mm256_setzero_ps();
  for (int b = 0; b < nb; b++)
    for (int k = 0; k < kGroupStreams; k++)
      x16k_avx2_row_block(p, i, p.wq + (static_cast<int64_t>(groups[k]) * nb + b) * kX16KBytes, b, acc[k]);
  for (int k = 0; k < kGroupStreams; k++)
    for (int h = 0; h < 2; h++) x16k_avx2_store<1>(p, groups[k], h, i, &acc[k][h]);
}

enum class X16Kind { kGeneric, kAvx2, kVnni512 };

X16Kind pick_x16() {
  const CpuFeatures& f = cpu_features();
  const Int8Kernel forced = forced_int8_kernel();
  if (forced == Int8Kernel::kGeneric || !f.avx2 || !f.fma || !f.f16c) return X16Kind::kGeneric;
  if (forced == Int8Kernel::kAvx2 || !f.avx512f || !f.avx512_vnni) return X16Kind::kAvx2;
  return X16Kind::kVnni512;
}

// Rows [i_begin, i_end) of group g, R rows at a time.
void x16_rows(X16Kind kind, q4::Type t, const Operands& p, int i_begin, int i_end, int g) {
  int i = i_begin;
  if (t == q4::Type::kQ4_Kx16) {
    if (kind == X16Kind::kVnni512) {
      for (; i + 8 <= i_end; i += 8) x16k_vnni<8>(p, i, g);
      for (; i + 4 <= i_end; i += 4) x16k_vnni<4>(p, i, g);
      for (; i < i_end; i++) x16k_vnni<1>(p, i, g);
    } else {
      for (; i + 4 <= i_end; i += 4) x16k_avx2<4>(p, i, g);
      for (; i < i_end; i++) x16k_avx2_row(p, i, g);
    }
    return;
  }
  if (kind == X16Kind::kVnni512) {
    for (; i + 8 <= i_end; i += 8) x16_vnni<1, 8>(p, i, g);
    for (; i + 4 <= i_end; i += 4) x16_vnni<1, 4>(p, i, g);
    for (; i < i_end; i++) x16_vnni<1, 1>(p, i, g);
  } else {
    for (; i + 4 <= i_end; i += 4) x16_avx2<4>(p, i, g);
    for (; i < i_end; i++) x16_avx2<1>(p, i, g);
  }
}

// Rows [i_begin, i_end) of groups g and g + 1 (VNNI only), 4 rows a tile:
// 16 weight registers, 8 accumulators (3 rows were slower, 6 spill).
void pair_rows(const Operands& p, int i_begin, int i_end, int g) {
  int i = i_begin;
  for (; i + 4 <= i_end; i += 4) x16_vnni<2, 4>(p, i, g);
  for (; i < i_end; i++) x16_vnni<2, 1>(p, i, g);
}

enum class Kind { kGeneric, kQ4_0Avx2, kQ4_0Vnni, kQ4_KAvx2 };

Kind pick(q4::Type t) {
  const CpuFeatures& f = cpu_features();
  const Int8Kernel forced = forced_int8_kernel();
  if (forced == Int8Kernel::kGeneric || !f.avx2 || !f.fma || !f.f16c) return Kind::kGeneric;
  if (q4::is_k(t)) return Kind::kQ4_KAvx2;
  const bool vnni = f.avx512_vnni && f.avx512vl;
  if (forced == Int8Kernel::kAvx2 || !vnni) return Kind::kQ4_0Avx2;
  return Kind::kQ4_0Vnni;
}

template <int R, int K>
void run_tile(Kind kind, q4::Type t, const Operands& p, int i, int o) {
  switch (kind) {
    case Kind::kQ4_0Avx2: q4_0_avx2<R, K>(p, i, o); break;
    case Kind::kQ4_0Vnni: q4_0_vnni<R, K>(p, i, o); break;
    case Kind::kQ4_KAvx2: q4_k_avx2<R, K>(p, i, o); break;
    case Kind::kGeneric: generic_tile<R, K>(p, t, i, o); break;
  }
}

void column_block(Kind kind, q4::Type t, const Operands& p, int i_begin, int i_end, int o_begin, int o_end) {
  auto cover = [&](int i, auto wide, auto one, int K) {
    int o = o_begin;
    for (; o + K <= o_end; o += K) wide(kind, t, p, i, o);
    for (; o < o_end; o++) one(kind, t, p, i, o);
  };
  int i = i_begin;
  for (; i + 4 <= i_end; i += 4) cover(i, run_tile<4, 2>, run_tile<4, 1>, 2);
  switch (i_end - i) {
    case 1: cover(i, run_tile<1, 4>, run_tile<1, 1>, 4); break;
    case 2: cover(i, run_tile<2, 2>, run_tile<2, 1>, 2); break;
    case 3: cover(i, run_tile<3, 2>, run_tile<3, 1>, 2); break;
    default: break;
  }
}

// q4::quantize_activations' codes, scales and sums (the oracle's), with the
// vector quantizer: one scale per act_block(t) inputs, a sum per 32.
void quantize_activations(q4::Type t, const float* x, int C, int8_t* codes, float* scales, int32_t* sums) {
  const int n = q4::act_block(t);
  for (int b = 0; b < C / n; b++) scales[b] = quantize_symmetric(x + b * n, n, codes + b * n);
  for (int s = 0; s < C / q4::kSubBlock; s++) {
    int32_t sum = 0;
    for (int i = 0; i < q4::kSubBlock; i++) sum += codes[s * q4::kSubBlock + i];
    sums[s] = sum;
  }
}

struct ThreadState {
  std::vector<int8_t> a;
  std::vector<float> xs;
  std::vector<int32_t> sums;
};

}  // namespace

std::string q4_kernel_summary() {
  auto name = [](Kind k) {
    switch (k) {
      case Kind::kQ4_0Avx2: return "avx2 (vpmaddubsw on |w| and sign(w)*a)";
      case Kind::kQ4_0Vnni: return "vnni (vpdpbusd, less 8 x the block's code sum)";
      case Kind::kQ4_KAvx2: return "avx2 (vpmaddubsw, then vpmaddwd by the 6-bit scales)";
      case Kind::kGeneric: break;
    }
    return "generic (plain loops; no AVX2)";
  };
  const char* x16 = pick_x16() == X16Kind::kVnni512 ? "avx512-vnni (vpdpbusd, 16 rows a register)"
                    : pick_x16() == X16Kind::kAvx2   ? "avx2 (vpmaddubsw, 8 rows a register)"
                                                     : "generic";
  return fmt::format("q4_0 and q4_k (rows interleaved by 16) {}; q4_0 {}; q4_k {}; exact int32 block sums", x16,
                     name(pick(q4::Type::kQ4_0)), name(pick(q4::Type::kQ4_K)));
}

bool q4_prefers_x16() { return pick_x16() != X16Kind::kGeneric; }

void matmul_q4_forward(float* out, const float* inp, const uint8_t* wq, q4::Type type, const float* bias, int N,
                       int C, int OC) {
  if (N <= 0 || OC <= 0) return;
  if (q4::interleaved(type) && pick_x16() == X16Kind::kGeneric) {
    // Without AVX2: the blocks in their rows again, through the loops below.
    thread_local std::vector<uint8_t> rows;
    rows.resize(static_cast<size_t>(OC) * q4::row_bytes(type, C));
    q4::unpack_x16(type, rows.data(), wq, OC, C);
    return matmul_q4_forward(out, inp, rows.data(), q4::rows_type(type), bias, N, C, OC);
  }
  thread_local ThreadState st;
  const int na = C / q4::act_block(type), ns = C / q4::kSubBlock;
  st.a.resize(static_cast<size_t>(N) * C);
  st.xs.resize(static_cast<size_t>(N) * na);
  st.sums.resize(static_cast<size_t>(N) * ns);
  int8_t* a = st.a.data();
  float* xs = st.xs.data();
  int32_t* sums = st.sums.data();
#pragma omp parallel for schedule(static) if (N > 1)
  for (int i = 0; i < N; i++)
    quantize_activations(type, inp + static_cast<int64_t>(i) * C, C, a + static_cast<int64_t>(i) * C,
                             xs + static_cast<int64_t>(i) * na, sums + static_cast<int64_t>(i) * ns);
  const Operands p{a, xs, sums, wq, bias, out, C, OC, q4::row_bytes(type, C)};
  if (q4::interleaved(type)) {
    const X16Kind kind = pick_x16();
    const int groups = OC / 16, rblocks = (N + kRowBlock - 1) / kRowBlock;
    // From 4 rows, VNNI takes two groups a tile (x16_vnni<2, R>): 128 rows x 2304 x
    // 768 in 0.54 ms instead of 0.70-0.75, 8 rows of the GPT-2 head in 0.76-0.82
    // ms instead of 0.95-1.14 (BM_MatmulQ4, 2 threads). One row stays on
    // one group: it reads the weights once either way, and half the work
    // items balance worse (the head: 0.24 ms against 0.28-0.34).
    if (kind == X16Kind::kVnni512 && N >= 4 && type == q4::Type::kQ4_0x16) {
      const int pairs = groups / 2;
#pragma omp parallel for collapse(2) schedule(static)
      for (int rb = 0; rb < rblocks; rb++)
        for (int gp = 0; gp < pairs; gp++) pair_rows(p, rb * kRowBlock, std::min(N, (rb + 1) * kRowBlock), 2 * gp);
      if (groups % 2)
        for (int rb = 0; rb < rblocks; rb++)
          x16_rows(kind, type, p, rb * kRowBlock, std::min(N, (rb + 1) * kRowBlock), groups - 1);
      return;
    }
    if (kind == X16Kind::kAvx2 && N == 1) {
      // A decode step: each thread's groups as kGroupStreams parts walked
      // together (x16_avx2_streams).
#pragma omp parallel if (int64_t{OC} * C > 65536)
      {
        const int t = omp_get_thread_num(), T = omp_get_num_threads();
        const int g0 = static_cast<int>(int64_t{groups} * t / T), g1 = static_cast<int>(int64_t{groups} * (t + 1) / T);
        const int part = (g1 - g0) / kGroupStreams;
        int gs[kGroupStreams];
        for (int j = 0; j < part; j++) {
          for (int k = 0; k < kGroupStreams; k++) gs[k] = g0 + k * part + j;
          if (type == q4::Type::kQ4_Kx16)
            x16k_avx2_streams(p, 0, gs);
          else
            x16_avx2_streams(p, 0, gs);
        }
        for (int g = g0 + kGroupStreams * part; g < g1; g++) x16_rows(kind, type, p, 0, 1, g);
      }
      return;
    }
#pragma omp parallel for collapse(2) schedule(static) if (int64_t{N} * OC * C > 65536)
    for (int rb = 0; rb < rblocks; rb++)
      for (int g = 0; g < groups; g++) x16_rows(kind, type, p, rb * kRowBlock, std::min(N, (rb + 1) * kRowBlock), g);
    return;
  }
  const Kind kind = pick(type);
  const int cblocks = (OC + kColumnBlock - 1) / kColumnBlock;
  const int rblocks = (N + kRowBlock - 1) / kRowBlock;
#pragma omp parallel for collapse(2) schedule(static) if (int64_t{N} * OC * C > 65536)
  for (int rb = 0; rb < rblocks; rb++)
    for (int b = 0; b < cblocks; b++)
      column_block(kind, type, p, rb * kRowBlock, std::min(N, (rb + 1) * kRowBlock), b * kColumnBlock,
                   std::min(OC, (b + 1) * kColumnBlock));
}

}  // namespace tessera::cpu
