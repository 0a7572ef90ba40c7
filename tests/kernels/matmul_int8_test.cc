// The INT8 matmul (ops.inc): every kernel this CPU can run that is meant to
// be exact (kernels/cpu/int8_kernel.h) against the plain-loop oracle, bit
// for bit (the same int32 products, the same dequantization), on shapes
// that hit every tile and tail and on codes that saturate 16-bit pair sums;
// oneDNN without VNNI shown wrong and refused by the self-check; and the
// result against the fp32 matmul within the quantization error. The isa.avx2
// ctest runs these again with DNNL_MAX_CPU_ISA=AVX2 (no VNNI, no AVX-512).
#include <cmath>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/cpu/int8_kernel.h"
#include "kernels/cpu/ops.h"
#include "kernels/ref/ops.h"
#include "nn/int8_check.h"
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

// Forces one kernel for a scope, then back to the automatic choice.
class ForcedKernel {
 public:
  explicit ForcedKernel(cpu::Int8Kernel k) { ok_ = cpu::set_int8_kernel(k).ok(); }
  ~ForcedKernel() { EXPECT_TRUE(cpu::set_int8_kernel(cpu::Int8Kernel::kAuto).ok()); }
  bool ok() const { return ok_; }  // false: this CPU cannot run it

 private:
  bool ok_ = false;
};

// The kernels this CPU runs that claim exactness: auto, and each forced one
// that runs here and (for oneDNN) is exact on this ISA.
std::vector<cpu::Int8Kernel> exact_kernels() {
  std::vector<cpu::Int8Kernel> out = {cpu::Int8Kernel::kAuto};
  for (cpu::Int8Kernel k : {cpu::Int8Kernel::kGeneric, cpu::Int8Kernel::kAvx2, cpu::Int8Kernel::kVnni,
                            cpu::Int8Kernel::kOneDnn}) {
    ForcedKernel f(k);
    if (f.ok() && cpu::int8_kernel_info().exact) out.push_back(k);
  }
  return out;
}

// cpu against ref, bit for bit.
void expect_exact(int N, int C, int OC, const std::vector<float>& x, const std::vector<int8_t>& wq,
                  const std::vector<float>& ws, const float* bias, const std::string& what) {
  std::vector<float> ours(static_cast<size_t>(N) * OC, -1.0f), want(ours.size());
  cpu::matmul_int8_forward(ours.data(), x.data(), wq.data(), ws.data(), bias, N, C, OC);
  ref::matmul_int8_forward(want.data(), x.data(), wq.data(), ws.data(), bias, N, C, OC);
  int bad = 0;
  for (size_t k = 0; k < ours.size(); k++) bad += ours[k] != want[k];
  EXPECT_EQ(bad, 0) << what << ": " << N << "x" << C << "x" << OC << ", normalised error "
                    << testing_util::normalised_error(ours.data(), want.data(), ours.size());
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
    if (o != 5) {
      EXPECT_EQ(top, 127) << "the largest weight of a row maps to +-127";
    }
  }
}

// Every exact kernel against ref at decode, prefill and odd shapes, with
// and without bias.
TEST(MatmulInt8, CpuMatchesTheOracle) {
  struct Shape {
    int N, C, OC;
  };
  for (cpu::Int8Kernel k : exact_kernels()) {
    ForcedKernel f(k);
    const std::string what = cpu::int8_kernel_info().summary;
    // {1, 300, 301}: a threaded decode step whose threads' columns do not
    // split evenly into the one-row kernel's streams.
    for (const Shape& s : {Shape{1, 768, 2304}, Shape{1, 300, 301}, Shape{7, 64, 96}, Shape{64, 768, 768},
                           Shape{130, 100, 50}}) {
      std::vector<float> x = gaussian(int64_t{s.N} * s.C, 2), w = gaussian(int64_t{s.OC} * s.C, 3, 0.05f),
                         b = gaussian(s.OC, 4);
      std::vector<int8_t> wq(w.size());
      std::vector<float> ws(s.OC);
      ref::quantize_weights_int8(wq.data(), ws.data(), w.data(), s.OC, s.C);
      for (const float* bias : {static_cast<const float*>(nullptr), static_cast<const float*>(b.data())})
        expect_exact(s.N, s.C, s.OC, x, wq, ws, bias, what);
    }
  }
}

// Every tile and tail: rows 1..9 and 17 (4-row tiles and 1-3 left over),
// columns 1..17 and 37 (2- and 4-column tiles, single columns), C below,
// at and past one 32-byte step.
TEST(MatmulInt8, EveryTileAndTailShape) {
  for (cpu::Int8Kernel k : exact_kernels()) {
    ForcedKernel f(k);
    const std::string what = cpu::int8_kernel_info().summary;
    for (int N : {1, 2, 3, 4, 5, 6, 7, 8, 9, 17})
      for (int C : {1, 31, 32, 33, 64, 100})
        for (int OC : {1, 2, 3, 4, 5, 16, 17, 37}) {
          std::vector<float> x = gaussian(int64_t{N} * C, 100 + N), w = gaussian(int64_t{OC} * C, 200 + OC),
                             b = gaussian(OC, 300);
          std::vector<int8_t> wq(w.size());
          std::vector<float> ws(OC);
          ref::quantize_weights_int8(wq.data(), ws.data(), w.data(), OC, C);
          expect_exact(N, C, OC, x, wq, ws, b.data(), what);
        }
  }
}

// The inputs that break vpmaddubsw on an s8 source shifted to u8: every
// code +-127, so that each pair sum of (x + 128) * w is near 2 x 255 x 127.
TEST(MatmulInt8, SaturatingCodesAreExact) {
  const int C = 768, OC = 64;
  for (cpu::Int8Kernel k : exact_kernels()) {
    ForcedKernel f(k);
    for (int N : {1, 5, 32}) {
      std::vector<float> x(static_cast<size_t>(N) * C), w(static_cast<size_t>(OC) * C);
      for (size_t i = 0; i < x.size(); i++) x[i] = i % 11 == 4 ? -2.0f : 2.0f;
      for (size_t i = 0; i < w.size(); i++) w[i] = (i / C) % 2 ? -0.25f : (i % 13 == 0 ? -0.25f : 0.25f);
      std::vector<int8_t> wq(w.size());
      std::vector<float> ws(OC);
      ref::quantize_weights_int8(wq.data(), ws.data(), w.data(), OC, C);
      for (int8_t q : wq) ASSERT_EQ(std::abs(static_cast<int>(q)), 127);
      expect_exact(N, C, OC, x, wq, ws, nullptr, cpu::int8_kernel_info().summary);
    }
  }
}

// The automatic choice is exact on every CPU and ISA cap, and says which
// kernel it runs.
TEST(MatmulInt8, AutomaticKernelIsExactAndNamed) {
  const cpu::Int8KernelInfo info = cpu::int8_kernel_info();
  EXPECT_TRUE(info.exact) << info.summary;
  EXPECT_FALSE(info.summary.empty());
  EXPECT_NE(info.summary.find("exact"), std::string::npos) << info.summary;
  EXPECT_TRUE(check_int8_matmul().ok()) << check_int8_matmul().message();
  EXPECT_FALSE(cpu::parse_int8_kernel("avx3").ok());
  EXPECT_EQ(cpu::parse_int8_kernel("vnni").value(), cpu::Int8Kernel::kVnni);
}

// Where oneDNN has no VNNI (Zen 3, Haswell to Skylake client, or this test
// under DNNL_MAX_CPU_ISA=AVX2), its s8 matmul is wrong on saturating codes:
// forced, it is reported inexact and the self-check refuses it in one line.
TEST(MatmulInt8, OneDnnWithoutVnniIsRefusedByTheSelfCheck) {
  ForcedKernel f(cpu::Int8Kernel::kOneDnn);
  ASSERT_TRUE(f.ok());
  const cpu::Int8KernelInfo info = cpu::int8_kernel_info();
  const Status st = check_int8_matmul();
  if (info.exact) {
    EXPECT_TRUE(st.ok()) << st.message();
    GTEST_SKIP() << "oneDNN has VNNI or AMX here (" << info.summary << "); the isa.avx2 ctest runs this without";
  }
  EXPECT_NE(info.summary.find("INEXACT"), std::string::npos) << info.summary;
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("refusing to run in int8"), std::string::npos) << st.message();
  EXPECT_EQ(st.message().find('\n'), std::string::npos) << st.message();
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
    // 9 rows: the decode kernel; 33: the prefill one (oneDNN where exact).
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
  EXPECT_EQ(e1, 0.0);
  EXPECT_EQ(e2, 0.0);
}

}  // namespace
}  // namespace tessera
