// Small vector-friendly math shared by the CPU kernels, and the attribute
// that compiles a hot loop for several ISA levels (picked at load time), so
// the binary stays generic x86-64 and still uses AVX-512 where present.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#if defined(__GNUC__) && !defined(__clang__)
#define TESSERA_CPU_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define TESSERA_CPU_CLONES
#endif

namespace tessera::cpu {

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

}  // namespace tessera::cpu
