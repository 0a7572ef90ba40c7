// The cpu backend against the reference oracle: every case of the shared op
// table (op_table.h, the same table the cuda backend runs), plus properties
// only the cpu backend promises.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "core/cpu_features.h"
#include "kernels/cpu/ops.h"
#include "kernels/op_table.h"

namespace tessera {
namespace {

using op_table::Backend;
using op_table::OpCase;
using op_table::Tol;
using op_table::Vec;
using testing_util::uniform;

// fp32 ops: the backends differ only in summation order (vectorised and
// per-thread partial sums, gemm blocking), a vectorised exp within 1.5 ulp
// and a Newton sqrt within 3 ulp; measured errors are below 1e-6.
constexpr double kF32Tolerance = 1e-5;
// bf16 matmuls on a CPU with native bf16 (AVX512-BF16 or AMX): both
// backends multiply the same bf16-rounded inputs (ops.inc) and accumulate in
// fp32 (oneDNN) or double (ref), so this is as tight as fp32; measured 3e-7.
constexpr double kBF16Tolerance = 1e-5;
// Without native bf16 the cpu backend runs bf16 matmuls in fp32 (matmul.cc
// says so once), so it differs from the bf16 oracle by the input rounding,
// up to 2^-9 relative per input; measured up to 3e-3 on these shapes.
constexpr double kBF16FallbackTolerance = 1e-2;

Backend cpu_backend() {
  Backend b = TESSERA_OP_BACKEND(cpu);
  b.tolerance[static_cast<int>(Tol::kF32)] = kF32Tolerance;
  b.tolerance[static_cast<int>(Tol::kMatmul)] = kF32Tolerance;
  b.tolerance[static_cast<int>(Tol::kAttention)] = kF32Tolerance;
  b.tolerance[static_cast<int>(Tol::kBF16)] =
      cpu_features().has_bf16_matmul() ? kBF16Tolerance : kBF16FallbackTolerance;
  b.tolerance[static_cast<int>(Tol::kReduction)] = 1e-4;  // a sum over N rows in another order
  b.tolerance[static_cast<int>(Tol::kExact)] = 0.0;
  b.tolerance[static_cast<int>(Tol::kTight)] = 1e-6;
  b.writes_preatt = false;  // the cpu attention may leave preatt unwritten
  return b;
}

const Backend kRef = op_table::ref_backend();
const Backend kCpu = cpu_backend();

class CpuMatchesRef : public ::testing::TestWithParam<OpCase> {};

TEST_P(CpuMatchesRef, WithinTolerance) { op_table::expect_matches_ref(GetParam(), kCpu); }

INSTANTIATE_TEST_SUITE_P(AllOps, CpuMatchesRef, ::testing::ValuesIn(op_table::all_cases()), op_table::case_name);

// matmul_gelu_forward on the CPU backends is exactly matmul_forward then
// gelu_forward (the CPU model relies on it being bitwise unchanged).
TEST(CpuMatmulGelu, EqualsMatmulThenGeluBitwise) {
  const int N = 33, C = 100, OC = 96;
  const Vec inp = uniform(static_cast<size_t>(N) * C, 111), weight = uniform(static_cast<size_t>(OC) * C, 112);
  const Vec bias = uniform(OC, 113);
  const size_t n_out = static_cast<size_t>(N) * OC;
  for (const Backend& be : {kRef, kCpu}) {
    for (const MatmulPrecision prec : {MatmulPrecision::kF32, MatmulPrecision::kBF16}) {
      for (const bool with_bias : {true, false}) {
        SCOPED_TRACE(std::string(be.name) + (prec == MatmulPrecision::kF32 ? " f32" : " bf16") +
                     (with_bias ? " bias" : " nobias"));
        const float* b = with_bias ? bias.data() : nullptr;
        Vec want_pre(n_out), want_out(n_out), pre(n_out), out(n_out);
        be.matmul_forward(want_pre.data(), inp.data(), weight.data(), b, N, C, OC, prec);
        be.gelu_forward(want_out.data(), want_pre.data(), static_cast<int64_t>(n_out));
        be.matmul_gelu_forward(pre.data(), out.data(), inp.data(), weight.data(), b, N, C, OC, prec);
        EXPECT_EQ(0, std::memcmp(pre.data(), want_pre.data(), n_out * sizeof(float)));
        EXPECT_EQ(0, std::memcmp(out.data(), want_out.data(), n_out * sizeof(float)));
      }
    }
  }
}

// Many positions with one token id: each contribution must land in the same
// dwte row exactly once (no lost updates between threads). Large enough to
// take the threaded path.
TEST(CpuEncoder, BackwardSumsRepeatedTokenIds) {
  const int B = 4, T = 64, C = 160, V = 6;
  std::vector<int> ids(static_cast<size_t>(B) * T);
  for (size_t i = 0; i < ids.size(); i++) ids[i] = i % 5 == 0 ? 2 : 4;  // only rows 2 and 4 are hit
  const Vec dout = uniform(ids.size() * C, 101);
  const Vec dwte0 = uniform(static_cast<size_t>(V) * C, 102), dwpe0 = uniform(static_cast<size_t>(T) * C, 103);
  Vec dwte = dwte0, dwpe = dwpe0;
  cpu::encoder_backward(dwte.data(), dwpe.data(), dout.data(), ids.data(), B, T, C);

  for (int row = 0; row < V; row++) {
    for (int c = 0; c < C; c++) {
      double want = dwte0[static_cast<size_t>(row) * C + c];
      for (size_t i = 0; i < ids.size(); i++)
        if (ids[i] == row) want += dout[i * C + c];
      EXPECT_NEAR(dwte[static_cast<size_t>(row) * C + c], want, 1e-4) << "row " << row << " c " << c;
    }
  }
  for (int t = 0; t < T; t++) {
    for (int c = 0; c < C; c++) {
      double want = dwpe0[static_cast<size_t>(t) * C + c];
      for (int b = 0; b < B; b++) want += dout[(static_cast<size_t>(b) * T + t) * C + c];
      EXPECT_NEAR(dwpe[static_cast<size_t>(t) * C + c], want, 1e-5) << "t " << t << " c " << c;
    }
  }
}

}  // namespace
}  // namespace tessera
