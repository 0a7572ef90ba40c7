// The INT8 matmul (ops.inc): the oneDNN kernel against the plain-loop oracle
// (the same int32 products, so equal to float rounding), and both against
// the fp32 matmul within the quantization error.
#include <cmath>
#include <random>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/cpu/ops.h"
#include "kernels/ref/ops.h"
#include "test_util.h"

namespace tessera {
namespace {

std::vector<float> gaussian(int64_t n, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

TEST(MatmulInt8, QuantizeWeightsMatchesTheOracle) {
  const int OC = 37, C = 300;
  std::vector<float> w = gaussian(int64_t{OC} * C, 1, 0.02f);
  for (int c = 0; c < C; c++) w[5 * C + c] = 0.0f;  // a zero row: scale 1, codes 0
  std::vector<int8_t> q_ref(w.size()), q_cpu(w.size());
  std::vector<float> s_ref(OC), s_cpu(OC);
  ref::quantize_weights_int8(q_ref.data(), s_ref.data(), w.data(), OC, C);
  cpu::quantize_weights_int8(q_cpu.data(), s_cpu.data(), w.data(), OC, C);
  EXPECT_EQ(q_ref, q_cpu);
  EXPECT_EQ(s_ref, s_cpu);
  EXPECT_EQ(s_ref[5], 1.0f);
  for (int o = 0; o < OC; o++) {
    int top = 0;
    for (int c = 0; c < C; c++) {
      const int8_t q = q_ref[static_cast<size_t>(o) * C + c];
      ASSERT_GE(q, -127);
      top = std::max(top, std::abs(static_cast<int>(q)));
      // Round to nearest: within half a step of the weight.
      ASSERT_LE(std::fabs(q * s_ref[o] - w[static_cast<size_t>(o) * C + c]), 0.5f * s_ref[o] * 1.0001f);
    }
    if (o != 5) EXPECT_EQ(top, 127) << "the largest weight of a row maps to +-127";
  }
}

// cpu against ref at decode, prefill and odd shapes, with and without bias.
TEST(MatmulInt8, CpuMatchesTheOracle) {
  struct Shape {
    int N, C, OC;
  };
  for (const Shape& s : {Shape{1, 768, 2304}, Shape{7, 64, 96}, Shape{64, 768, 768}, Shape{130, 100, 50}}) {
    std::vector<float> x = gaussian(int64_t{s.N} * s.C, 2), w = gaussian(int64_t{s.OC} * s.C, 3, 0.05f),
                       b = gaussian(s.OC, 4);
    std::vector<int8_t> wq(w.size());
    std::vector<float> ws(s.OC);
    ref::quantize_weights_int8(wq.data(), ws.data(), w.data(), s.OC, s.C);
    for (const float* bias : {static_cast<const float*>(nullptr), static_cast<const float*>(b.data())}) {
      std::vector<float> ours(int64_t{s.N} * s.OC), want(ours.size());
      cpu::matmul_int8_forward(ours.data(), x.data(), wq.data(), ws.data(), bias, s.N, s.C, s.OC);
      ref::matmul_int8_forward(want.data(), x.data(), wq.data(), ws.data(), bias, s.N, s.C, s.OC);
      EXPECT_LE(testing_util::normalised_error(ours.data(), want.data(), ours.size()), 1e-6)
          << s.N << "x" << s.C << "x" << s.OC;
    }
  }
}

// Against the fp32 matmul: the error dynamic quantization is known for
// (a few tenths of a percent of the output's range with 8-bit codes).
TEST(MatmulInt8, CloseToTheFp32Matmul) {
  const int N = 16, C = 768, OC = 512;
  std::vector<float> x = gaussian(int64_t{N} * C, 5), w = gaussian(int64_t{OC} * C, 6, 0.02f), b = gaussian(OC, 7);
  std::vector<int8_t> wq(w.size());
  std::vector<float> ws(OC);
  cpu::quantize_weights_int8(wq.data(), ws.data(), w.data(), OC, C);
  std::vector<float> q(int64_t{N} * OC), f(q.size());
  cpu::matmul_int8_forward(q.data(), x.data(), wq.data(), ws.data(), b.data(), N, C, OC);
  ref::matmul_forward(f.data(), x.data(), w.data(), b.data(), N, C, OC, MatmulPrecision::kF32);
  const double err = testing_util::normalised_error(q.data(), f.data(), q.size());
  EXPECT_LE(err, 2e-2);
  EXPECT_GT(err, 0.0);  // it is quantized
}

// Per-thread primitives: two threads with different shapes at once.
TEST(MatmulInt8, ConcurrentCallsAreCorrect) {
  auto run = [](int N, int C, int OC, uint64_t seed, double* err) {
    std::vector<float> x = gaussian(int64_t{N} * C, seed), w = gaussian(int64_t{OC} * C, seed + 1, 0.05f);
    std::vector<int8_t> wq(w.size());
    std::vector<float> ws(OC), ours(int64_t{N} * OC), want(ours.size());
    ref::quantize_weights_int8(wq.data(), ws.data(), w.data(), OC, C);
    ref::matmul_int8_forward(want.data(), x.data(), wq.data(), ws.data(), nullptr, N, C, OC);
    *err = 0.0;
    for (int k = 0; k < 20; k++) {
      cpu::matmul_int8_forward(ours.data(), x.data(), wq.data(), ws.data(), nullptr, N, C, OC);
      *err = std::max(*err, testing_util::normalised_error(ours.data(), want.data(), ours.size()));
    }
  };
  double e1 = 1, e2 = 1;
  std::thread a(run, 9, 256, 384, 10, &e1), b(run, 33, 128, 64, 20, &e2);
  a.join();
  b.join();
  EXPECT_LE(e1, 1e-6);
  EXPECT_LE(e2, 1e-6);
}

}  // namespace
}  // namespace tessera
