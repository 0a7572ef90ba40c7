// The 4-bit matmul (ops.inc, kernels/q4.h): the formats against
// independent oracles (fp16 against the CPU's own F16C conversions, Q4_0
// codes of values it represents exactly, Q4_K's error below Q4_0's), and
// every kernel this CPU runs against the plain-loop oracle: exactly where
// the scales are 1 and the sums integers below 2^24 (the int32 block sums
// are then the whole result, also checked against int64 sums here), within
// fp32 rounding of the scaled terms elsewhere; and against the fp32 matmul
// of the dequantized weights within the activations' quantization error.
// The isa.avx2 ctest runs these again with DNNL_MAX_CPU_ISA=AVX2.
#include <immintrin.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/cpu_features.h"
#include "kernels/cpu/int8_kernel.h"
#include "kernels/cpu/ops.h"
#include "kernels/q4.h"
#include "kernels/ref/ops.h"

namespace tessera {
namespace {

using q4::Type;

std::vector<float> gaussian(int64_t n, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

class ForcedKernel {
 public:
  explicit ForcedKernel(cpu::Int8Kernel k) { ok_ = cpu::set_int8_kernel(k).ok(); }
  ~ForcedKernel() { EXPECT_TRUE(cpu::set_int8_kernel(cpu::Int8Kernel::kAuto).ok()); }
  bool ok() const { return ok_; }

 private:
  bool ok_ = false;
};

const cpu::Int8Kernel kKernels[] = {cpu::Int8Kernel::kAuto, cpu::Int8Kernel::kGeneric, cpu::Int8Kernel::kAvx2,
                                    cpu::Int8Kernel::kVnni};

__attribute__((target("f16c"))) uint16_t hw_fp16(float f) {
  return static_cast<uint16_t>(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
__attribute__((target("f16c"))) float hw_f32(uint16_t h) { return _cvtsh_ss(h); }

TEST(Q4Format, Fp16ConversionsEqualTheCpusOwn) {
  if (!cpu_features().f16c) GTEST_SKIP() << "no F16C to compare with";
  for (uint32_t h = 0; h < 65536; h++) {
    const float f = q4::fp16_to_f32(static_cast<uint16_t>(h));
    const float want = hw_f32(static_cast<uint16_t>(h));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(f)) << h;
      continue;
    }
    ASSERT_EQ(std::memcmp(&f, &want, 4), 0) << "half " << h;
    ASSERT_EQ(q4::f32_to_fp16(f), h) << "round trip of half " << h;
  }
  std::mt19937_64 rng(7);
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 200000; i++) {
    uint32_t u = bits(rng);
    // Every exponent near the half range (subnormals, overflow, ties).
    u = (u & 0x807fffffu) | ((100 + u % 50) << 23);
    float f;
    std::memcpy(&f, &u, 4);
    ASSERT_EQ(q4::f32_to_fp16(f), hw_fp16(f)) << f;
  }
  for (float f : {0.0f, -0.0f, 65504.0f, 65519.99f, 65520.0f, 1e9f, -1e9f, 5.96e-8f, 2.98e-8f, 2.99e-8f})
    EXPECT_EQ(q4::f32_to_fp16(f), hw_fp16(f)) << f;
}

TEST(Q4Format, Q4_0HoldsValuesItRepresentsExactly) {
  // Integers -8..7 with a -8 in the block: d = 1, every code exact.
  std::vector<float> x(64);
  for (int i = 0; i < 64; i++) x[i] = static_cast<float>(i % 16 - 8);
  std::vector<uint8_t> q(q4::row_bytes(Type::kQ4_0, 64));
  q4::quantize_rows(Type::kQ4_0, q.data(), x.data(), 1, 64);
  std::vector<float> back(64);
  q4::dequantize_row(Type::kQ4_0, back.data(), q.data(), 64);
  EXPECT_EQ(back, x);
  uint16_t d;
  std::memcpy(&d, q.data(), 2);
  EXPECT_EQ(q4::fp16_to_f32(d), 1.0f);
  EXPECT_EQ(q[2] & 0xF, 0);   // x[0] = -8
  EXPECT_EQ(q[2] >> 4, 0);    // x[16] = -8
  EXPECT_EQ(q[3] & 0xF, 1);   // x[1] = -7
}

TEST(Q4Format, Q4_KErrorIsBelowQ4_0sAndBounded) {
  const int C = 4096, rows = 8;
  std::vector<float> x = gaussian(int64_t{rows} * C, 3);
  double err[2] = {0, 0}, sum2 = 0;
  for (Type t : {Type::kQ4_0, Type::kQ4_K}) {
    std::vector<uint8_t> q(rows * q4::row_bytes(t, C));
    q4::quantize_rows(t, q.data(), x.data(), rows, C);
    std::vector<float> back(C);
    for (int r = 0; r < rows; r++) {
      ASSERT_TRUE(q4::check_row(t, q.data() + r * q4::row_bytes(t, C), C).ok());
      q4::dequantize_row(t, back.data(), q.data() + r * q4::row_bytes(t, C), C);
      for (int c = 0; c < C; c++) {
        const double e = back[c] - x[int64_t{r} * C + c];
        err[t == Type::kQ4_K] += e * e;
        if (t == Type::kQ4_0) sum2 += double{x[int64_t{r} * C + c]} * x[int64_t{r} * C + c];
      }
    }
  }
  const double rel0 = std::sqrt(err[0] / sum2), relk = std::sqrt(err[1] / sum2);
  // 16 levels over a block's range: about 10% RMS for a Gaussian.
  EXPECT_LT(rel0, 0.13);
  EXPECT_LT(relk, rel0 * 0.95) << "q4_k " << relk << " vs q4_0 " << rel0;
  // A non-finite scale is refused with one line.
  std::vector<uint8_t> q(q4::row_bytes(Type::kQ4_0, 32), 0);
  const uint16_t inf = 0x7c00;
  std::memcpy(q.data(), &inf, 2);
  const Status st = q4::check_row(Type::kQ4_0, q.data(), 32);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("not finite"), std::string::npos) << st.message();
}

// Q4_K blocks with d = dmin = 1, random codes and 6-bit scales and mins
// (0..63: the high bits of sub-blocks 4-7 set too).
std::vector<uint8_t> q4_k_unit_blocks(int OC, int C, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> w(OC * q4::row_bytes(Type::kQ4_K, C));
  const uint16_t one = q4::f32_to_fp16(1.0f);
  for (size_t b = 0; b < w.size(); b += q4::kQ4_KBytes) {
    uint8_t* y = w.data() + b;
    std::memcpy(y, &one, 2);
    std::memcpy(y + 2, &one, 2);
    int sc[8], m[8];
    for (int j = 0; j < 8; j++) sc[j] = static_cast<int>(rng() % 64), m[j] = static_cast<int>(rng() % 64);
    uint8_t* s = y + 4;
    std::memset(s, 0, 12);
    for (int j = 0; j < 8; j++) {
      if (j < 4) {
        s[j] = static_cast<uint8_t>(sc[j]);
        s[j + 4] = static_cast<uint8_t>(m[j]);
      } else {
        s[j + 4] = static_cast<uint8_t>((sc[j] & 0xF) | ((m[j] & 0xF) << 4));
        s[j - 4] |= static_cast<uint8_t>((sc[j] >> 4) << 6);
        s[j] |= static_cast<uint8_t>((m[j] >> 4) << 6);
      }
    }
    for (int j = 0; j < 8; j++) {  // the packing read back
      int a, b2;
      q4::scale_min(j, s, &a, &b2);
      EXPECT_EQ(a, sc[j]);
      EXPECT_EQ(b2, m[j]);
    }
    for (int i = 0; i < 128; i++) y[16 + i] = static_cast<uint8_t>(rng());
  }
  return w;
}

// Activations that quantize to themselves: integers in [-127, 127] with a
// 127 in every 256 (so every scale is 1 for both block sizes).
std::vector<float> unit_activations(int N, int C, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<float> x(static_cast<size_t>(N) * C);
  for (size_t i = 0; i < x.size(); i++) x[i] = static_cast<float>(static_cast<int>(rng() % 255) - 127);
  for (size_t i = 0; i < x.size(); i += 32) x[i] = 127.0f;
  return x;
}

// The whole product in int64 from the dequantized integer weights.
std::vector<double> int64_oracle(Type t, const std::vector<float>& x, const std::vector<uint8_t>& w, int N, int C,
                                 int OC) {
  std::vector<double> out(static_cast<size_t>(N) * OC);
  std::vector<float> row(C);
  for (int o = 0; o < OC; o++) {
    q4::dequantize_row(t, row.data(), w.data() + o * q4::row_bytes(t, C), C);
    for (int i = 0; i < N; i++) {
      int64_t s = 0;
      for (int c = 0; c < C; c++) s += static_cast<int64_t>(row[c]) * static_cast<int64_t>(x[int64_t{i} * C + c]);
      out[int64_t{i} * OC + o] = static_cast<double>(s);
    }
  }
  return out;
}

TEST(MatmulQ4, IntegerPartsAreExactInEveryKernel) {
  for (Type t : {Type::kQ4_0, Type::kQ4_K}) {
    const int C = t == Type::kQ4_0 ? 1024 : 512;
    for (int N : {1, 2, 3, 4, 5, 9}) {
      const int OC = 13;
      std::vector<uint8_t> w;
      if (t == Type::kQ4_0) {
        std::vector<float> wf(static_cast<size_t>(OC) * C);
        std::mt19937_64 rng(N);
        for (size_t i = 0; i < wf.size(); i++) wf[i] = static_cast<float>(static_cast<int>(rng() % 16) - 8);
        for (size_t i = 0; i < wf.size(); i += 32) wf[i] = -8.0f;  // d = 1
        w.resize(OC * q4::row_bytes(t, C));
        q4::quantize_rows(t, w.data(), wf.data(), OC, C);
      } else {
        w = q4_k_unit_blocks(OC, C, N);
      }
      const std::vector<float> x = unit_activations(N, C, 100 + N);
      const std::vector<double> want = int64_oracle(t, x, w, N, C, OC);
      std::vector<float> ref(want.size());
      ref::matmul_q4_forward(ref.data(), x.data(), w.data(), t, nullptr, N, C, OC);
      for (size_t i = 0; i < want.size(); i++) ASSERT_EQ(ref[i], want[i]) << q4::type_name(t) << " ref " << i;
      for (cpu::Int8Kernel k : kKernels) {
        ForcedKernel f(k);
        if (!f.ok()) continue;
        std::vector<float> ours(want.size(), -1.0f);
        cpu::matmul_q4_forward(ours.data(), x.data(), w.data(), t, nullptr, N, C, OC);
        for (size_t i = 0; i < want.size(); i++)
          ASSERT_EQ(ours[i], want[i]) << q4::type_name(t) << " N=" << N << " " << cpu::q4_kernel_summary() << " at "
                                      << i;
      }
    }
  }
}

TEST(MatmulQ4, EveryKernelMatchesTheOracleOnEveryShape) {
  for (Type t : {Type::kQ4_0, Type::kQ4_K}) {
    for (int C : {32, 64, 256, 768}) {
      if (!q4::fits(t, C)) continue;
      for (int OC : {1, 3, 4, 5, 17, 33}) {
        std::vector<float> wf = gaussian(int64_t{OC} * C, C * 7 + OC, 0.05f);
        std::vector<uint8_t> w(OC * q4::row_bytes(t, C));
        q4::quantize_rows(t, w.data(), wf.data(), OC, C);
        std::vector<float> deq(static_cast<size_t>(OC) * C);
        for (int o = 0; o < OC; o++)
          q4::dequantize_row(t, deq.data() + int64_t{o} * C, w.data() + o * q4::row_bytes(t, C), C);
        const std::vector<float> bias = gaussian(OC, 5);
        for (int N : {1, 2, 3, 4, 7, 65}) {
          const std::vector<float> x = gaussian(int64_t{N} * C, N + C);
          std::vector<float> want(static_cast<size_t>(N) * OC);
          ref::matmul_q4_forward(want.data(), x.data(), w.data(), t, bias.data(), N, C, OC);
          for (cpu::Int8Kernel k : kKernels) {
            ForcedKernel f(k);
            if (!f.ok()) continue;
            std::vector<float> ours(want.size(), -1.0f);
            cpu::matmul_q4_forward(ours.data(), x.data(), w.data(), t, bias.data(), N, C, OC);
            for (int i = 0; i < N; i++)
              for (int o = 0; o < OC; o++) {
                // fp32 rounding of the blocks' scaled terms: a bound from
                // the sum of |x| |w|.
                double mag = std::fabs(bias[o]);
                for (int c = 0; c < C; c++) mag += std::fabs(x[int64_t{i} * C + c] * deq[int64_t{o} * C + c]);
                const int64_t at = int64_t{i} * OC + o;
                ASSERT_NEAR(ours[at], want[at], 1e-5 * mag + 1e-7)
                    << q4::type_name(t) << " N=" << N << " C=" << C << " OC=" << OC << " "
                    << cpu::q4_kernel_summary();
              }
          }
        }
      }
    }
  }
}

// The interleaved layouts (q4::pack_x16) hold the same bytes: unpack gives
// the rows back, and every kernel's products from them are the rows' own,
// the integer parts exactly.
TEST(MatmulQ4, InterleavedLayoutIsTheSameBlocks) {
  const int OC = 48;
  for (Type t : {Type::kQ4_0, Type::kQ4_K}) {
    const int C = t == Type::kQ4_0 ? 96 : 768;
    std::vector<float> wf = gaussian(int64_t{OC} * C, 3, 0.05f);
    std::vector<uint8_t> rows(OC * q4::row_bytes(t, C)), packed(rows.size()), back(rows.size());
    q4::quantize_rows(t, rows.data(), wf.data(), OC, C);
    q4::pack_x16(t, packed.data(), rows.data(), OC, C);
    EXPECT_NE(packed, rows);
    q4::unpack_x16(q4::x16_of(t), back.data(), packed.data(), OC, C);
    EXPECT_EQ(back, rows) << q4::type_name(t);
    // In place, both ways.
    q4::pack_x16(t, back.data(), back.data(), OC, C);
    EXPECT_EQ(back, packed) << q4::type_name(t);
    q4::unpack_x16(q4::x16_of(t), back.data(), back.data(), OC, C);
    EXPECT_EQ(back, rows) << q4::type_name(t);
    EXPECT_FALSE(q4::fits_x16(t, 40, C));
    EXPECT_FALSE(q4::fits_x16(t, 48, 48));
  }
  // Q4_0: row 17's block 1 scale sits at group 1, block 1, slot 1.
  {
    const int C = 96;
    std::vector<float> wf = gaussian(int64_t{OC} * C, 3, 0.05f);
    std::vector<uint8_t> rows(OC * q4::row_bytes(Type::kQ4_0, C)), packed(rows.size());
    q4::quantize_rows(Type::kQ4_0, rows.data(), wf.data(), OC, C);
    q4::pack_x16(Type::kQ4_0, packed.data(), rows.data(), OC, C);
    EXPECT_EQ(std::memcmp(packed.data() + (1 * 3 + 1) * 288 + 2, rows.data() + 17 * 54 + 18, 2), 0);
  }
  // Q4_K, written out by hand (q4.h): row 21 = group 1 slot 5, super-block 2 of 3.
  {
    const int C = 768;
    std::vector<float> wf = gaussian(int64_t{OC} * C, 4, 0.05f);
    std::vector<uint8_t> rows(OC * q4::row_bytes(Type::kQ4_K, C)), packed(rows.size());
    q4::quantize_rows(Type::kQ4_K, rows.data(), wf.data(), OC, C);
    q4::pack_x16(Type::kQ4_K, packed.data(), rows.data(), OC, C);
    const uint8_t* y = rows.data() + 21 * 3 * 144 + 2 * 144;
    const uint8_t* g = packed.data() + (1 * 3 + 2) * 2304;
    EXPECT_EQ(std::memcmp(g + 2 * 5, y, 2), 0);             // d
    EXPECT_EQ(std::memcmp(g + 32 + 2 * 5, y + 2, 2), 0);    // dmin
    for (int w = 0; w < 3; w++) EXPECT_EQ(std::memcmp(g + 64 + 64 * w + 4 * 5, y + 4 + 4 * w, 4), 0) << w;
    for (int pc = 0; pc < 32; pc++)  // codes of pair pc / 8, chunk pc % 8
      EXPECT_EQ(std::memcmp(g + 256 + 64 * pc + 4 * 5, y + 16 + 4 * pc, 4), 0) << pc;
  }
}

// Random Q4_0 or Q4_K rows whose scales are 1: integer products.
std::vector<uint8_t> unit_rows(Type t, int OC, int C, uint64_t seed) {
  if (t == Type::kQ4_K) return q4_k_unit_blocks(OC, C, seed);
  std::vector<float> wf(static_cast<size_t>(OC) * C);
  std::mt19937_64 rng(seed);
  for (size_t i = 0; i < wf.size(); i++) wf[i] = static_cast<float>(static_cast<int>(rng() % 16) - 8);
  for (size_t i = 0; i < wf.size(); i += 32) wf[i] = -8.0f;  // d = 1
  std::vector<uint8_t> w(OC * q4::row_bytes(t, C));
  q4::quantize_rows(t, w.data(), wf.data(), OC, C);
  return w;
}

TEST(MatmulQ4, InterleavedKernelsAreExact) {
  // OC = 176: 11 groups, a threaded decode step whose threads' groups do
  // not split evenly into the one-row kernel's streams.
  const int C = 1024;
  for (int OC : {48, 176}) {
    for (Type t : {Type::kQ4_0, Type::kQ4_K}) {
      const std::vector<uint8_t> w = unit_rows(t, OC, C, 5);
      std::vector<uint8_t> packed(w.size());
      q4::pack_x16(t, packed.data(), w.data(), OC, C);
      for (int N : {1, 2, 3, 4, 5, 8, 9, 13, 70}) {
        const std::vector<float> x = unit_activations(N, C, 200 + N);
        const std::vector<double> want = int64_oracle(t, x, w, N, C, OC);
        std::vector<float> ref(want.size());
        ref::matmul_q4_forward(ref.data(), x.data(), packed.data(), q4::x16_of(t), nullptr, N, C, OC);
        for (size_t i = 0; i < want.size(); i++) ASSERT_EQ(ref[i], want[i]) << q4::type_name(t) << " ref " << i;
        for (cpu::Int8Kernel k : kKernels) {
          ForcedKernel f(k);
          if (!f.ok()) continue;
          std::vector<float> ours(want.size(), -1.0f);
          cpu::matmul_q4_forward(ours.data(), x.data(), packed.data(), q4::x16_of(t), nullptr, N, C, OC);
          for (size_t i = 0; i < want.size(); i++)
            ASSERT_EQ(ours[i], want[i]) << q4::type_name(t) << " N=" << N << " " << cpu::q4_kernel_summary() << " at "
                                        << i;
        }
      }
    }
  }
}

// Extreme codes and scales: every weight code 15, scales and mins 63,
// activations all 127 or all -127: the int32 sums' largest magnitudes.
TEST(MatmulQ4, InterleavedQ4_KSumsAtTheirLimits) {
  const int C = 2048, OC = 16;
  std::vector<uint8_t> w = q4_k_unit_blocks(OC, C, 9);
  for (size_t b = 0; b < w.size(); b += q4::kQ4_KBytes) {
    std::memset(w.data() + b + 4, 0xFF, 12);  // every 6-bit scale and min 63
    std::memset(w.data() + b + 16, 0xFF, 128);
  }
  std::vector<uint8_t> packed(w.size());
  q4::pack_x16(Type::kQ4_K, packed.data(), w.data(), OC, C);
  for (float v : {127.0f, -127.0f}) {
    const int N = 2;
    std::vector<float> x(static_cast<size_t>(N) * C, v);
    std::vector<float> want(static_cast<size_t>(N) * OC);
    ref::matmul_q4_forward(want.data(), x.data(), w.data(), Type::kQ4_K, nullptr, N, C, OC);
    for (cpu::Int8Kernel k : kKernels) {
      ForcedKernel f(k);
      if (!f.ok()) continue;
      std::vector<float> ours(want.size(), -1.0f);
      cpu::matmul_q4_forward(ours.data(), x.data(), packed.data(), Type::kQ4_Kx16, nullptr, N, C, OC);
      for (size_t i = 0; i < want.size(); i++)
        ASSERT_NEAR(ours[i], want[i], 1e-6 * std::fabs(want[i])) << v << " " << cpu::q4_kernel_summary();
    }
  }
}

TEST(MatmulQ4, InterleavedKernelsMatchTheOracle) {
  for (Type t : {Type::kQ4_0, Type::kQ4_K}) {
    for (int C : {32, 96, 256, 768}) {
      if (!q4::fits(t, C)) continue;
      for (int OC : {16, 64}) {
        std::vector<float> wf = gaussian(int64_t{OC} * C, C + OC, 0.05f);
        std::vector<uint8_t> w(OC * q4::row_bytes(t, C)), packed(w.size());
        q4::quantize_rows(t, w.data(), wf.data(), OC, C);
        q4::pack_x16(t, packed.data(), w.data(), OC, C);
        const std::vector<float> bias = gaussian(OC, 6);
        for (int N : {1, 3, 4, 8, 65}) {
          const std::vector<float> x = gaussian(int64_t{N} * C, N * 3 + C);
          std::vector<float> want(static_cast<size_t>(N) * OC);
          ref::matmul_q4_forward(want.data(), x.data(), w.data(), t, bias.data(), N, C, OC);
          for (cpu::Int8Kernel k : kKernels) {
            ForcedKernel f(k);
            if (!f.ok()) continue;
            std::vector<float> ours(want.size(), -1.0f);
            cpu::matmul_q4_forward(ours.data(), x.data(), packed.data(), q4::x16_of(t), bias.data(), N, C, OC);
            for (size_t i = 0; i < want.size(); i++)
              ASSERT_NEAR(ours[i], want[i], 1e-5 * (std::fabs(want[i]) + 1.0))
                  << q4::type_name(t) << " N=" << N << " C=" << C << " OC=" << OC << " "
                  << cpu::q4_kernel_summary();
          }
        }
      }
    }
  }
}

TEST(MatmulQ4, ComputesTheMatmulOfTheDequantizedWeights) {
  const int N = 3, C = 768, OC = 40;
  for (Type t : {Type::kQ4_0, Type::kQ4_K}) {
    std::vector<float> wf = gaussian(int64_t{OC} * C, 11, 0.05f);
    std::vector<uint8_t> w(OC * q4::row_bytes(t, C));
    q4::quantize_rows(t, w.data(), wf.data(), OC, C);
    std::vector<float> deq(static_cast<size_t>(OC) * C);
    for (int o = 0; o < OC; o++)
      q4::dequantize_row(t, deq.data() + int64_t{o} * C, w.data() + o * q4::row_bytes(t, C), C);
    const std::vector<float> x = gaussian(int64_t{N} * C, 12);
    std::vector<float> ours(N * OC), fp32(N * OC);
    cpu::matmul_q4_forward(ours.data(), x.data(), w.data(), t, nullptr, N, C, OC);
    ref::matmul_forward(fp32.data(), x.data(), deq.data(), nullptr, N, C, OC, MatmulPrecision::kF32);
    double err = 0, norm = 0;
    for (int i = 0; i < N * OC; i++) err += (ours[i] - fp32[i]) * (ours[i] - fp32[i]), norm += fp32[i] * fp32[i];
    // The activations' int8 codes: about 0.5/127 of a block's range.
    EXPECT_LT(std::sqrt(err / norm), 0.01) << q4::type_name(t);
  }
}

}  // namespace
}  // namespace tessera
