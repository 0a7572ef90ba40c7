#include "kernels/q4.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include <fmt/format.h>

#include "core/check.h"

namespace tessera::q4 {

namespace {

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint16_t load16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
void store16(uint8_t* p, uint16_t v) { std::memcpy(p, &v, 2); }
// Round half to even (the default rounding mode), as an int.
int nearest_int(float x) { return static_cast<int>(std::nearbyint(x)); }

void quantize_block_q4_0(uint8_t* y, const float* x) {
  float amax = 0.0f, max = 0.0f;  // the value of the largest magnitude, with its sign
  for (int j = 0; j < kQ4_0Elems; j++) {
    if (amax < std::fabs(x[j])) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  const float d = max / -8.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
  store16(y, f32_to_fp16(d));
  for (int j = 0; j < kQ4_0Elems / 2; j++) {
    // x * id is in [-8, 8]: +8.5 and truncation round it into 0..16, 16
    // (the largest magnitude's opposite sign) clamped to 15.
    const int q0 = std::min(15, static_cast<int>(x[j] * id + 8.5f));
    const int q1 = std::min(15, static_cast<int>(x[j + 16] * id + 8.5f));
    y[2 + j] = static_cast<uint8_t>(std::max(0, q0) | (std::max(0, q1) << 4));
  }
}

// The scale and min of n values as levels 0..nmax, minimizing the weighted
// squared error: a first guess from the range, then nstep + 1 candidate
// scales around it, each refined by the weighted least-squares fit of scale
// and min to its levels (llama.cpp's make_qkx2_quants). Returns the scale;
// *neg_min gets -min (>= 0: the min is never above 0); L the levels.
float fit_scale_min(int n, int nmax, const float* x, const float* w, uint8_t* L, float* neg_min, float rmin,
                    float rdelta, int nstep) {
  float min = x[0], max = x[0], sum_w = 0.0f, sum_x = 0.0f;
  for (int i = 0; i < n; i++) {
    min = std::min(min, x[i]);
    max = std::max(max, x[i]);
    sum_w += w[i];
    sum_x += w[i] * x[i];
  }
  if (min > 0.0f) min = 0.0f;
  if (max == min) {
    std::fill(L, L + n, 0);
    *neg_min = -min;
    return 0.0f;
  }
  float iscale = nmax / (max - min), scale = 1.0f / iscale, best = 0.0f;
  for (int i = 0; i < n; i++) {
    L[i] = static_cast<uint8_t>(std::clamp(nearest_int(iscale * (x[i] - min)), 0, nmax));
    const float diff = scale * L[i] + min - x[i];
    best += w[i] * diff * diff;
  }
  uint8_t aux[kSubBlock];
  for (int is = 0; is <= nstep; is++) {
    iscale = (rmin + rdelta * is + nmax) / (max - min);
    float sum_l = 0.0f, sum_l2 = 0.0f, sum_xl = 0.0f;
    for (int i = 0; i < n; i++) {
      const int l = std::clamp(nearest_int(iscale * (x[i] - min)), 0, nmax);
      aux[i] = static_cast<uint8_t>(l);
      sum_l += w[i] * l;
      sum_l2 += w[i] * l * l;
      sum_xl += w[i] * l * x[i];
    }
    const float D = sum_w * sum_l2 - sum_l * sum_l;
    if (D <= 0.0f) continue;
    float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
    float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
    if (this_min > 0.0f) {
      this_min = 0.0f;
      this_scale = sum_xl / sum_l2;
    }
    float err = 0.0f;
    for (int i = 0; i < n; i++) {
      const float diff = this_scale * aux[i] + this_min - x[i];
      err += w[i] * diff * diff;
    }
    if (err < best) {
      std::copy(aux, aux + n, L);
      best = err;
      scale = this_scale;
      min = this_min;
    }
  }
  *neg_min = -min;
  return scale;
}

void quantize_block_q4_k(uint8_t* y, const float* x) {
  uint8_t L[kQ4_KElems];
  float scales[8], mins[8], weights[kSubBlock];
  float max_scale = 0.0f, max_min = 0.0f;
  for (int j = 0; j < 8; j++) {
    const float* xs = x + kSubBlock * j;
    float sum_x2 = 0.0f;
    for (int l = 0; l < kSubBlock; l++) sum_x2 += xs[l] * xs[l];
    const float av_x = std::sqrt(sum_x2 / kSubBlock);
    for (int l = 0; l < kSubBlock; l++) weights[l] = av_x + std::fabs(xs[l]);
    scales[j] = fit_scale_min(kSubBlock, 15, xs, weights, L + kSubBlock * j, &mins[j], -1.0f, 0.1f, 20);
    max_scale = std::max(max_scale, scales[j]);
    max_min = std::max(max_min, mins[j]);
  }
  const float inv_scale = max_scale > 0.0f ? 63.0f / max_scale : 0.0f;
  const float inv_min = max_min > 0.0f ? 63.0f / max_min : 0.0f;
  uint8_t* s = y + 4;
  std::memset(s, 0, 12);
  for (int j = 0; j < 8; j++) {
    const int ls = std::clamp(nearest_int(inv_scale * scales[j]), 0, 63);
    const int lm = std::clamp(nearest_int(inv_min * mins[j]), 0, 63);
    if (j < 4) {
      s[j] = static_cast<uint8_t>(ls);
      s[j + 4] = static_cast<uint8_t>(lm);
    } else {
      s[j + 4] = static_cast<uint8_t>((ls & 0xF) | ((lm & 0xF) << 4));
      s[j - 4] |= static_cast<uint8_t>((ls >> 4) << 6);
      s[j] |= static_cast<uint8_t>((lm >> 4) << 6);
    }
  }
  const uint16_t dh = f32_to_fp16(max_scale / 63.0f), mh = f32_to_fp16(max_min / 63.0f);
  store16(y, dh);
  store16(y + 2, mh);
  // The levels again, against the scales as stored.
  const float d = fp16_to_f32(dh), dmin = fp16_to_f32(mh);
  for (int j = 0; j < 8; j++) {
    int sc, m;
    scale_min(j, s, &sc, &m);
    const float dj = d * sc, dm = dmin * m;
    for (int l = 0; l < kSubBlock; l++) {
      const int i = kSubBlock * j + l;
      L[i] = dj != 0.0f ? static_cast<uint8_t>(std::clamp(nearest_int((x[i] + dm) / dj), 0, 15)) : 0;
    }
  }
  uint8_t* qs = y + 16;
  for (int p = 0; p < 4; p++)
    for (int l = 0; l < kSubBlock; l++)
      qs[kSubBlock * p + l] = static_cast<uint8_t>(L[64 * p + l] | (L[64 * p + 32 + l] << 4));
}

}  // namespace

const char* type_name(Type t) {
  switch (t) {
    case Type::kQ4_0: return "q4_0";
    case Type::kQ4_K: return "q4_k";
    case Type::kQ4_0x16: return "q4_0x16";
    case Type::kQ4_Kx16: return "q4_kx16";
  }
  return "?";
}

namespace {

// Where each byte of a group's block goes: the rows' block bytes (row r's
// byte i, 0 <= i < block_bytes) at packed offset x16_offset(t, r, i).
int x16_offset(Type t, int r, int i) {
  if (t == Type::kQ4_0) {
    if (i < 2) return 2 * r + i;
    const int q = (i - 2) / 4, j = (i - 2) % 4;  // y[2 + i]: weights i and 16 + i, i = 4q + j
    return 32 + 64 * q + 4 * r + j;
  }
  if (i < 2) return 2 * r + i;                  // d
  if (i < 4) return 32 + 2 * r + (i - 2);       // dmin
  if (i < 16) return 64 + 64 * ((i - 4) / 4) + 4 * r + (i - 4) % 4;  // scale words
  const int q = i - 16;                         // code byte 32p + 4c + j
  return 256 + 64 * (q / 4) + 4 * r + q % 4;    // chunk (p, c) = q / 4
}

// A group's bytes are the same range in both layouts (16 rows' blocks), so
// each group is copied aside and moved back: dst may be src.
template <bool kPack>
void move_x16(Type t, uint8_t* dst, const uint8_t* src, int64_t OC, int64_t C) {
  const int eb = block_bytes(t), gb = 16 * eb;
  const int64_t nb = C / block_elems(t), rb = nb * eb;
  std::vector<int> at(gb);
  for (int r = 0; r < 16; r++)
    for (int i = 0; i < eb; i++) at[r * eb + i] = x16_offset(t, r, i);
  std::vector<uint8_t> group(16 * rb);
  for (int64_t g = 0; g < OC / 16; g++) {
    std::memcpy(group.data(), src + g * 16 * rb, 16 * rb);
    uint8_t* out = dst + g * 16 * rb;
    for (int64_t b = 0; b < nb; b++) {
      const int64_t blocks = b * gb;  // the group's block b in the interleaved layout
      for (int r = 0; r < 16; r++) {
        const int64_t row = r * rb + b * eb;  // row r's block b in the rows' layout
        for (int i = 0; i < eb; i++) {
          if (kPack) out[blocks + at[r * eb + i]] = group[row + i];
          else out[row + i] = group[blocks + at[r * eb + i]];
        }
      }
    }
  }
}

}  // namespace

void pack_x16(Type t, uint8_t* dst, const uint8_t* src, int64_t OC, int64_t C) {
  CHECK(!interleaved(t) && fits_x16(t, OC, C));
  move_x16<true>(t, dst, src, OC, C);
}

void unpack_x16(Type t, uint8_t* dst, const uint8_t* src, int64_t OC, int64_t C) {
  CHECK(interleaved(t) && fits_x16(t, OC, C));
  move_x16<false>(rows_type(t), dst, src, OC, C);
}

float fp16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  if (exp == 0) {
    const float v = static_cast<float>(mant) * 5.9604644775390625e-8f;  // mant x 2^-24, exact
    return sign ? -v : v;
  }
  if (exp == 31) return float_of(sign | 0x7f800000u | (mant << 13));
  return float_of(sign | ((exp + 112) << 23) | (mant << 13));
}

uint16_t f32_to_fp16(float f) {
  uint32_t x = bits_of(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000);
  x &= 0x7fffffffu;
  if (x >= 0x7f800000u) return sign | 0x7c00 | (x > 0x7f800000u ? 0x200 : 0);  // inf, nan
  if (x >= 0x477ff000u) return sign | 0x7c00;  // rounds to 65536 or more: infinity
  if (x < 0x38800000u) {  // below 2^-14: a subnormal half (or zero)
    const int e = static_cast<int>(x >> 23);
    if (e < 102) return sign;  // below 2^-25: rounds to zero
    const uint32_t m = (x & 0x7fffffu) | 0x800000u;
    const int shift = 126 - e;
    uint32_t r = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1))) r++;
    return static_cast<uint16_t>(sign | r);
  }
  uint32_t h = (((x >> 23) - 112) << 10) | ((x & 0x7fffffu) >> 13);
  const uint32_t rem = x & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1))) h++;  // a carry into the exponent is right
  return static_cast<uint16_t>(sign | h);
}

void quantize_rows(Type t, uint8_t* dst, const float* src, int64_t rows, int64_t C) {
  CHECK(!interleaved(t));  // rows; pack_x16 moves them
  const int64_t blocks = C / block_elems(t), rb = row_bytes(t, C);
#pragma omp parallel for schedule(static) if (rows * C > 65536)
  for (int64_t r = 0; r < rows; r++)
    for (int64_t b = 0; b < blocks; b++) {
      uint8_t* y = dst + r * rb + b * block_bytes(t);
      const float* x = src + r * C + b * block_elems(t);
      if (t == Type::kQ4_0) quantize_block_q4_0(y, x);
      else quantize_block_q4_k(y, x);
    }
}

void dequantize_row(Type t, float* dst, const uint8_t* src, int64_t C) {
  CHECK(!interleaved(t));
  const int64_t blocks = C / block_elems(t);
  for (int64_t b = 0; b < blocks; b++) {
    const uint8_t* y = src + b * block_bytes(t);
    float* out = dst + b * block_elems(t);
    if (t == Type::kQ4_0) {
      const float d = fp16_to_f32(load16(y));
      for (int j = 0; j < 16; j++) {
        out[j] = static_cast<float>((y[2 + j] & 0xF) - 8) * d;
        out[j + 16] = static_cast<float>((y[2 + j] >> 4) - 8) * d;
      }
      continue;
    }
    const float d = fp16_to_f32(load16(y)), dmin = fp16_to_f32(load16(y + 2));
    const uint8_t* qs = y + 16;
    for (int j = 0; j < 8; j++) {
      int sc, m;
      scale_min(j, y + 4, &sc, &m);
      const float dj = d * sc, dm = dmin * m;
      const uint8_t* q = qs + kSubBlock * (j / 2);
      for (int l = 0; l < kSubBlock; l++) {
        const int v = j % 2 == 0 ? q[l] & 0xF : q[l] >> 4;
        out[kSubBlock * j + l] = dj * v - dm;
      }
    }
  }
}

void quantize_activations(Type t, const float* x, int64_t C, int8_t* codes, float* scales, int32_t* sums) {
  const int n = act_block(t);
  for (int64_t b = 0; b < C / n; b++) {
    const float* xb = x + b * n;
    float amax = 0.0f;
    for (int i = 0; i < n; i++) amax = std::max(amax, std::fabs(xb[i]));
    const float scale = amax > 0.0f ? amax / 127.0f : 1.0f;
    scales[b] = scale;
    for (int i = 0; i < n; i++)
      codes[b * n + i] = static_cast<int8_t>(std::clamp(std::round(xb[i] / scale), -127.0f, 127.0f));
  }
  for (int64_t s = 0; s < C / kSubBlock; s++) {
    int32_t sum = 0;
    for (int i = 0; i < kSubBlock; i++) sum += codes[s * kSubBlock + i];
    sums[s] = sum;
  }
}

Status check_row(Type t, const uint8_t* row, int64_t C) {
  CHECK(!interleaved(t));
  const int64_t blocks = C / block_elems(t);
  for (int64_t b = 0; b < blocks; b++) {
    const uint8_t* y = row + b * block_bytes(t);
    const float d = fp16_to_f32(load16(y)), dmin = t == Type::kQ4_K ? fp16_to_f32(load16(y + 2)) : 0.0f;
    if (!std::isfinite(d) || !std::isfinite(dmin))
      return Status::Corruption(fmt::format("{} block {} has a scale that is not finite ({}, {})", type_name(t), b,
                                            d, dmin));
  }
  return Status::OK();
}

}  // namespace tessera::q4
