// The few-row fp32 matmul (cpu::matmul_f32_rows, kernels/cpu/matmul_f32_rows.cc)
// against the plain-loop oracle (kernels/ref), within the error bound of an
// fp32 dot product, on widths that are and are not a multiple of the vector
// length and on row and output counts that leave every tile's remainder. The
// isa.avx2 ctest runs these with AVX-512 hidden (DNNL_MAX_CPU_ISA=AVX2).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/cpu/matmul.h"
#include "kernels/ref/ops.h"
#include "test_util.h"

namespace tessera {
namespace {

using Vec = std::vector<float>;

using testing_util::uniform;

void expect_matches_oracle(int N, int C, int OC, bool with_bias) {
  SCOPED_TRACE(::testing::Message() << "N=" << N << " C=" << C << " OC=" << OC << " bias=" << with_bias);
  const Vec x = uniform(size_t(N) * C, 1 + N), w = uniform(size_t(OC) * C, 2 + C), b = uniform(OC, 3 + OC);
  const float* bias = with_bias ? b.data() : nullptr;
  Vec got(size_t(N) * OC, NAN), want(size_t(N) * OC);
  cpu::matmul_f32_rows(got.data(), x.data(), w.data(), bias, N, C, OC);
  ref::matmul_forward(want.data(), x.data(), w.data(), bias, N, C, OC, MatmulPrecision::kF32);
  for (int i = 0; i < N; i++)
    for (int o = 0; o < OC; o++) {
      // Any order of an fp32 sum of C products: |error| <= C u sum |x w| (u = 2^-24), times 2 for both sides.
      double mag = with_bias ? std::fabs(b[o]) : 0.0;
      for (int c = 0; c < C; c++) mag += std::fabs(double{x[size_t(i) * C + c]} * w[size_t(o) * C + c]);
      const double bound = 2.0 * (C + 1) * std::ldexp(1.0, -24) * mag;
      ASSERT_LE(std::fabs(double{got[size_t(i) * OC + o]} - want[size_t(i) * OC + o]), bound)
          << "row " << i << ", output " << o;
    }
}

TEST(MatmulF32Rows, MatchesThePlainLoopOracle) {
  for (int N : {1, 2, 3, 4, 5, 7, 8, 9, 32, 33})
    for (int C : {1, 7, 8, 15, 16, 17, 33, 768})
      for (int OC : {1, 3, 4, 5, 9, 64}) expect_matches_oracle(N, C, OC, (N + C + OC) % 2 == 0);
}

// Large enough to run on every thread, with a share boundary inside a block.
TEST(MatmulF32Rows, ThreadedShapesMatchTheOracle) {
  expect_matches_oracle(1, 768, 2304, true);
  expect_matches_oracle(8, 768, 2305, false);
  expect_matches_oracle(8, 2053, 1001, true);  // many chunks, a tail, rows after the tiles
  expect_matches_oracle(2, 5632, 130, false);
  expect_matches_oracle(3, 3072, 771, true);
  expect_matches_oracle(1, 100, 50257, false);
}

// Each output is one dot product whatever else is in the batch: a sequence
// decodes the same alone and among others (the header's promise).
// Shapes: one chunk of the many-row kernel (C = 200 at 11 rows), many
// chunks and a scalar tail (2051 at 8 and 3 rows), a width under its
// minimum (40); output counts that leave rows after the 6-row tiles.
TEST(MatmulF32Rows, ARowsResultDoesNotDependOnTheOtherRows) {
  struct Shape {
    int N, C, OC;
  };
  for (const Shape& sh : {Shape{11, 200, 131}, Shape{8, 2051, 389}, Shape{3, 2051, 50}, Shape{2, 40, 77}}) {
    const int N = sh.N, C = sh.C, OC = sh.OC;
    SCOPED_TRACE(::testing::Message() << "N=" << N << " C=" << C << " OC=" << OC);
    const Vec x = uniform(size_t(N) * C, 5), w = uniform(size_t(OC) * C, 6), b = uniform(OC, 7);
    Vec all(size_t(N) * OC);
    cpu::matmul_f32_rows(all.data(), x.data(), w.data(), b.data(), N, C, OC);
    for (int i = 0; i < N; i++) {
      Vec one(OC);
      cpu::matmul_f32_rows(one.data(), x.data() + size_t(i) * C, w.data(), b.data(), 1, C, OC);
      for (int o = 0; o < OC; o++) ASSERT_EQ(one[o], all[size_t(i) * OC + o]) << "row " << i << ", output " << o;
    }
  }
}

TEST(MatmulF32Rows, NoRowsOrNoOutputsWriteNothing) {
  Vec out(4, 7.0f);
  const Vec x(8, 1.0f), w(8, 1.0f);
  cpu::matmul_f32_rows(out.data(), x.data(), w.data(), nullptr, 0, 8, 1);
  cpu::matmul_f32_rows(out.data(), x.data(), w.data(), nullptr, 1, 8, 0);
  for (float v : out) EXPECT_EQ(v, 7.0f);
}

}  // namespace
}  // namespace tessera
