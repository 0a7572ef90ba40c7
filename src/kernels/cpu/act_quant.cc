#include "kernels/cpu/act_quant.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "core/cpu_features.h"

namespace tessera::cpu {

namespace {

inline int8_t code_of(float q) {
  if (std::isnan(q)) return 0;
  return static_cast<int8_t>(std::clamp(std::round(q), -127.0f, 127.0f));
}

#define TESSERA_TARGET_AVX2 __attribute__((target("avx2,fma")))

// Eight codes of p / vs: trunc, then away from zero when the fraction is at
// least a half (exact: q - trunc(q) is exact), clamped; NaN -> 0.
TESSERA_TARGET_AVX2 inline __m256i codes8_avx2(const float* p, __m256 vs) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  const __m256 sign_mask = _mm256_castsi256_ps(_mm256_set1_epi32(static_cast<int>(0x80000000u)));
  const __m256 q = _mm256_div_ps(_mm256_loadu_ps(p), vs);
  const __m256 t = _mm256_round_ps(q, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
  const __m256 away = _mm256_cmp_ps(_mm256_and_ps(_mm256_sub_ps(q, t), abs_mask), _mm256_set1_ps(0.5f), _CMP_GE_OQ);
  const __m256 step = _mm256_and_ps(away, _mm256_or_ps(_mm256_set1_ps(1.0f), _mm256_and_ps(q, sign_mask)));
  __m256 r = _mm256_min_ps(_mm256_max_ps(_mm256_add_ps(t, step), _mm256_set1_ps(-127.0f)), _mm256_set1_ps(127.0f));
  r = _mm256_and_ps(r, _mm256_cmp_ps(q, q, _CMP_ORD_Q));  // NaN -> 0
  return _mm256_cvtps_epi32(r);
}

TESSERA_TARGET_AVX2 float quantize_avx2(const float* x, int n, int8_t* codes) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  const int n8 = n / 8 * 8;
  // max(|x|, acc): the second operand wins when the first is NaN, so a NaN
  // input is skipped as std::max(acc, NaN) skips it.
  __m256 vmax = _mm256_setzero_ps();
  for (int i = 0; i < n8; i += 8) vmax = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(x + i), abs_mask), vmax);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, vmax);
  float amax = 0.0f;
  for (float v : lanes) amax = std::max(amax, v);
  for (int i = n8; i < n; i++) amax = std::max(amax, std::fabs(x[i]));
  const float scale = amax > 0.0f ? amax / 127.0f : 1.0f;

  const __m256 vs = _mm256_set1_ps(scale);
  int i = 0;
  // 32 at a time: int32 -> int16 -> int8 packs work within 128-bit lanes;
  // the permute puts the four groups of 8 back in order.
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (; i + 32 <= n8; i += 32) {
    const __m256i a = codes8_avx2(x + i, vs), b = codes8_avx2(x + i + 8, vs);
    const __m256i c = codes8_avx2(x + i + 16, vs), d = codes8_avx2(x + i + 24, vs);
    const __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(a, b), _mm256_packs_epi32(c, d));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes + i), _mm256_permutevar8x32_epi32(packed, order));
  }
  for (; i < n8; i += 8) {
    alignas(32) int32_t v[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(v), codes8_avx2(x + i, vs));
    for (int k = 0; k < 8; k++) codes[i + k] = static_cast<int8_t>(v[k]);
  }
  for (; i < n; i++) codes[i] = code_of(x[i] / scale);
  return scale;
}

}  // namespace

float quantize_symmetric_scalar(const float* x, int n, int8_t* codes) {
  float amax = 0.0f;
  for (int i = 0; i < n; i++) amax = std::max(amax, std::fabs(x[i]));
  const float scale = amax > 0.0f ? amax / 127.0f : 1.0f;
  for (int i = 0; i < n; i++) codes[i] = code_of(x[i] / scale);
  return scale;
}

float quantize_symmetric(const float* x, int n, int8_t* codes) {
  static const bool avx2 = cpu_features().avx2 && cpu_features().fma;
  return avx2 ? quantize_avx2(x, n, codes) : quantize_symmetric_scalar(x, n, codes);
}

}  // namespace tessera::cpu
