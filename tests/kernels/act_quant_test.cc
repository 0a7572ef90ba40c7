// The vector activation quantizer (kernels/cpu/act_quant.h) against the
// oracle's plain loops, bit for bit: the codes and the scale, for lengths
// that leave every tail, exact halves (round away from zero), zeros,
// subnormals, huge values, infinities and NaNs; and per block as
// q4::quantize_activations (kernels/ref's matmul_q4) computes them.
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/cpu/act_quant.h"
#include "kernels/q4.h"

namespace tessera {
namespace {

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

void expect_same(const std::vector<float>& x, const char* what) {
  const int n = static_cast<int>(x.size());
  std::vector<int8_t> fast(n), slow(n);
  const float sf = cpu::quantize_symmetric(x.data(), n, fast.data());
  const float ss = cpu::quantize_symmetric_scalar(x.data(), n, slow.data());
  ASSERT_EQ(bits(sf), bits(ss)) << what << " n=" << n;
  for (int i = 0; i < n; i++) ASSERT_EQ(fast[i], slow[i]) << what << " n=" << n << " i=" << i << " x=" << x[i];
}

TEST(ActQuant, VectorEqualsThePlainLoopBitForBit) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (int n = 1; n <= 300; n++) {
    std::vector<float> x(n);
    for (float& v : x) v = normal(rng);
    expect_same(x, "normal");
  }
  // Exact halves: with max |x| = 127 the scale is 1 and x / scale = x.
  std::vector<float> halves = {127.0f};
  for (int k = -126; k <= 126; k++) halves.push_back(k + 0.5f);
  halves.push_back(-0.5f);
  halves.push_back(0.49999997f);
  halves.push_back(-0.49999997f);
  expect_same(halves, "halves");
  std::vector<int8_t> codes(halves.size());
  cpu::quantize_symmetric(halves.data(), static_cast<int>(halves.size()), codes.data());
  EXPECT_EQ(codes[1], -126);  // -125.5 away from zero
  EXPECT_EQ(codes[2], -125);  // -124.5
  EXPECT_EQ(codes[128], 2);   // 1.5
  EXPECT_EQ(codes[127], 1);   // 0.5
  EXPECT_EQ(codes[254], -1);  // -0.5

  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const float sub = std::numeric_limits<float>::denorm_min();
  expect_same(std::vector<float>(64, 0.0f), "zeros");
  expect_same(std::vector<float>(40, sub), "subnormals");
  std::vector<float> mixed(70);
  for (int i = 0; i < 70; i++) mixed[i] = (i % 3 == 0 ? 1e30f : -3e-39f) * (i % 2 ? 1.0f : -1.0f);
  expect_same(mixed, "huge and subnormal");
  for (float special : {inf, -inf, nan}) {
    for (int at : {0, 5, 8, 31, 33}) {
      std::vector<float> x(40);
      for (float& v : x) v = normal(rng);
      x[at] = special;
      expect_same(x, std::isnan(special) ? "nan" : "inf");
    }
  }
  std::vector<float> x(16, 2.0f);
  x[3] = nan;
  cpu::quantize_symmetric(x.data(), 16, codes.data());
  EXPECT_EQ(codes[3], 0);
  EXPECT_EQ(codes[0], 127);
}

TEST(ActQuant, BlocksAreTheOraclesQ4Activations) {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int C = 768;
  std::vector<float> x(C);
  for (float& v : x) v = normal(rng);
  for (q4::Type t : {q4::Type::kQ4_0, q4::Type::kQ4_K}) {
    const int n = q4::act_block(t);
    std::vector<int8_t> want(C), got(C);
    std::vector<float> scales(C / n);
    std::vector<int32_t> sums(C / q4::kSubBlock);
    q4::quantize_activations(t, x.data(), C, want.data(), scales.data(), sums.data());
    for (int b = 0; b < C / n; b++) {
      const float s = cpu::quantize_symmetric(x.data() + b * n, n, got.data() + b * n);
      EXPECT_EQ(bits(s), bits(scales[b])) << q4::type_name(t) << " block " << b;
    }
    EXPECT_EQ(want, got) << q4::type_name(t);
  }
}

}  // namespace
}  // namespace tessera
