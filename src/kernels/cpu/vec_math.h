// Small vector-friendly math shared by the CPU kernels, and the attribute
// that compiles a hot loop for several ISA levels (picked at load time), so
// the binary stays generic x86-64 and still uses AVX-512 where present.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "core/cpu_features.h"

#if defined(__GNUC__) && !defined(__clang__)
#define TESSERA_CPU_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define TESSERA_CPU_CLONES
#endif

namespace tessera::cpu {

// The vector ISA of the fp32 kernels with three paths (matmul_f32_rows,
// paged attention): AVX-512F, AVX2 with FMA, or plain loops. cpu_features()
// applies the DNNL_MAX_CPU_ISA cap, so AVX2 can be tested on any machine.
enum class Fp32Isa { kGeneric, kAvx2, kAvx512 };

inline Fp32Isa fp32_isa() {
  const CpuFeatures& f = cpu_features();
  if (!f.avx2 || !f.fma) return Fp32Isa::kGeneric;
  return f.avx512f ? Fp32Isa::kAvx512 : Fp32Isa::kAvx2;
}

// exp(x) for fp32, within 1.5 ulp on [-87.3, 88.3]; 0 below -87.3 (and for
// -inf), saturates at exp(88.3) = 2.2e38 above (and for +inf), NaN stays
// NaN. x = n ln2 + r with |r| <= ln2/2; exp(r) by the Cephes expf
// polynomial; 2^n goes straight into the exponent bits, n being rounded by
// adding 1.5 * 2^23, which leaves it in the low mantissa bits.
//
// Written without a single branch or '?:' so that GCC vectorises loops
// calling it at every ISA level: a select whose arms differ lets PRE fold the
// constant arm and leave floating-point work on one path only, which
// -ftrapping-math then refuses to if-convert. The clamps are therefore bit
// masks on the integer image of x (fp32 bits order like int32 for positive
// values and like uint32 for negative ones).
inline float exp_approx(float x) {
  constexpr float kMagic = 12582912.0f;      // 1.5 * 2^23
  constexpr int32_t kHiBits = 0x42b0999a;    // 88.3f
  constexpr uint32_t kLoBits = 0xc2ae999au;  // -87.3f
  int32_t xi;
  std::memcpy(&xi, &x, 4);
  const int32_t nan_mask = -static_cast<int32_t>((xi & 0x7fffffff) > 0x7f800000);
  const int32_t hi_mask = -static_cast<int32_t>(xi > kHiBits);
  const int32_t lo_mask = -static_cast<int32_t>(static_cast<uint32_t>(xi) > kLoBits);
  xi = (xi & ~hi_mask) | (kHiBits & hi_mask);
  xi = (xi & ~lo_mask) | (static_cast<int32_t>(kLoBits) & lo_mask);
  float xc;
  std::memcpy(&xc, &xi, 4);
  const float t = xc * 1.44269504088896341f + kMagic;
  const float n = t - kMagic;
  float r = xc - n * 0.693359375f;  // ln2 in two parts, the first exact in n * it
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float e = p * r * r + r + 1.0f;
  int32_t t_bits, magic_bits;
  std::memcpy(&t_bits, &t, 4);
  std::memcpy(&magic_bits, &kMagic, 4);
  const int32_t scale_bits = (t_bits - magic_bits + 127) << 23;
  float scale;
  std::memcpy(&scale, &scale_bits, 4);
  const float y = e * scale;
  int32_t y_bits;
  std::memcpy(&y_bits, &y, 4);
  y_bits = (y_bits & ~lo_mask) | (nan_mask & 0x7fc00000);
  float out;
  std::memcpy(&out, &y_bits, 4);
  return out;
}

// The sum of a ymm register's 8 floats: the upper half onto the lower,
// then pairs. For kernels compiled for AVX2 or more (the attribute lets
// them inline it).
__attribute__((target("avx"))) inline float hsum256_ps(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Shuffles in zero-masking form with a full mask: the same instructions,
// but the plain forms (and _mm512_reduce_add_ps) start from an undefined
// register that GCC 12 warns about inside immintrin.h. The order of the
// sums is hsum512_x16's (inside each 128-bit lane: elements 0+2 and 1+3,
// then those two; then lanes 0+1 and 2+3, then those two), so a sum
// has the same bits whichever kernel computes it.
__attribute__((target("avx2,fma,avx512f"))) inline float hsum512(__m512 v) {
  const __mmask16 all = 0xFFFF;
  v = _mm512_add_ps(v, _mm512_maskz_permute_ps(all, v, 0x4E));        // elements 0+2, 1+3
  v = _mm512_add_ps(v, _mm512_maskz_permute_ps(all, v, 0xB1));        // then those two
  v = _mm512_add_ps(v, _mm512_maskz_shuffle_f32x4(all, v, v, 0xB1));  // lanes 0+1, 2+3
  v = _mm512_add_ps(v, _mm512_maskz_shuffle_f32x4(all, v, v, 0x4E));  // then those two
  return _mm512_cvtss_f32(v);
}

// The 16 sums of a 4 x 4 tile's accumulators at once, acc[r * 4 + k] ->
// lane r * 4 + k of the result: pairs interleaved and added (ps, then pd),
// then 128-bit lanes folded; 45 instructions instead of 16 x 8.
__attribute__((target("avx2,fma,avx512f"))) inline __m512 hsum512_x16(const __m512* acc) {
  const __mmask16 all = 0xFFFF;
  const __mmask8 all8 = 0xFF;
  __m512 t[8];
  for (int j = 0; j < 8; j++)
    t[j] = _mm512_add_ps(_mm512_maskz_unpacklo_ps(all, acc[2 * j], acc[2 * j + 1]),
                         _mm512_maskz_unpackhi_ps(all, acc[2 * j], acc[2 * j + 1]));
  __m512 u[4];
  for (int j = 0; j < 4; j++) {
    const __m512d a = _mm512_castps_pd(t[2 * j]), b = _mm512_castps_pd(t[2 * j + 1]);
    u[j] = _mm512_add_ps(_mm512_castpd_ps(_mm512_maskz_unpacklo_pd(all8, a, b)),
                         _mm512_castpd_ps(_mm512_maskz_unpackhi_pd(all8, a, b)));
  }
  // u[j], lane L: accumulators 4j..4j+3 summed over lane L's 4 floats.
  const __m512 v0 = _mm512_add_ps(_mm512_maskz_shuffle_f32x4(all, u[0], u[1], 0x88),
                                  _mm512_maskz_shuffle_f32x4(all, u[0], u[1], 0xDD));
  const __m512 v1 = _mm512_add_ps(_mm512_maskz_shuffle_f32x4(all, u[2], u[3], 0x88),
                                  _mm512_maskz_shuffle_f32x4(all, u[2], u[3], 0xDD));
  return _mm512_add_ps(_mm512_maskz_shuffle_f32x4(all, v0, v1, 0x88),
                       _mm512_maskz_shuffle_f32x4(all, v0, v1, 0xDD));
}

// The 8 sums of 8 ymm accumulators at once, acc[k] -> lane k of the
// result: pairs added horizontally twice, then the 128-bit halves.
__attribute__((target("avx2,fma"))) inline __m256 hsum256_x8(const __m256* acc) {
  const __m256 t0 = _mm256_hadd_ps(acc[0], acc[1]), t1 = _mm256_hadd_ps(acc[2], acc[3]);
  const __m256 t2 = _mm256_hadd_ps(acc[4], acc[5]), t3 = _mm256_hadd_ps(acc[6], acc[7]);
  const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
  return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

}  // namespace tessera::cpu
