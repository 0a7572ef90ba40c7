// The CPU matmul from several threads at once, and its bounded primitive
// cache (src/kernels/cpu/matmul.cc). Each thread runs many forward and
// backward matmuls, fp32 and bf16, on shapes it shares with the other
// threads and on shapes of its own, with row counts that get exact-shape
// primitives and row counts that share a run-time-row one; every result is
// checked against the reference kernels, computed beforehand on one thread.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/cpu_features.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/ops.h"
#include "kernels/ref/ops.h"
#include "test_util.h"

namespace tessera {
namespace {

using Vec = std::vector<float>;

using testing_util::normalised_error;  // max |got - want| / max(1, max |want|)
using testing_util::uniform;

double tolerance(MatmulPrecision prec) {
  if (prec == MatmulPrecision::kF32) return 1e-5;
  return cpu_features().has_bf16_matmul() ? 1e-5 : 1e-2;  // kernels_test.cc says why
}

// One linear layer's three products on fixed inputs, with the oracle's
// answers. Gradients start from random values: the kernels must add.
struct Case {
  int N, C, OC;
  MatmulPrecision prec;
  bool bias;
  Vec inp, weight, b, dout, dinp0, dweight0, dbias0;  // inputs and gradient starting values
  Vec out_want, dinp_want, dweight_want, dbias_want;

  Case(int n, int c, int oc, MatmulPrecision p, bool with_bias, uint32_t seed)
      : N(n), C(c), OC(oc), prec(p), bias(with_bias) {
    inp = uniform(size_t(N) * C, seed);
    weight = uniform(size_t(OC) * C, seed + 1);
    b = uniform(OC, seed + 2);
    dout = uniform(size_t(N) * OC, seed + 3);
    dinp0 = uniform(size_t(N) * C, seed + 4);
    dweight0 = uniform(size_t(OC) * C, seed + 5);
    dbias0 = uniform(OC, seed + 6);
    out_want.assign(size_t(N) * OC, 0.0f);
    ref::matmul_forward(out_want.data(), inp.data(), weight.data(), bias ? b.data() : nullptr, N, C, OC, prec);
    dinp_want = dinp0, dweight_want = dweight0, dbias_want = dbias0;
    ref::matmul_backward(dinp_want.data(), dweight_want.data(), bias ? dbias_want.data() : nullptr, dout.data(),
                         inp.data(), weight.data(), N, C, OC, prec);
  }

  // Runs the CPU kernels into fresh buffers; returns the worst error.
  double run_cpu() const {
    Vec out(size_t(N) * OC, 0.0f), dinp = dinp0, dweight = dweight0, dbias = dbias0;
    cpu::matmul_forward(out.data(), inp.data(), weight.data(), bias ? b.data() : nullptr, N, C, OC, prec);
    cpu::matmul_backward(dinp.data(), dweight.data(), bias ? dbias.data() : nullptr, dout.data(), inp.data(),
                         weight.data(), N, C, OC, prec);
    double err = std::max(normalised_error(out, out_want), normalised_error(dinp, dinp_want));
    err = std::max(err, normalised_error(dweight, dweight_want));
    if (bias) err = std::max(err, normalised_error(dbias, dbias_want));
    return err;
  }

  std::string name() const {
    return "N=" + std::to_string(N) + " C=" + std::to_string(C) + " OC=" + std::to_string(OC) +
           (prec == MatmulPrecision::kF32 ? " f32" : " bf16") + (bias ? " bias" : "");
  }
};

TEST(CpuMatmulThreads, ConcurrentSameAndDifferentShapesMatchReference) {
  constexpr int kThreads = 4;
  constexpr int kRounds = 12;
  std::vector<Case> shared, own[kThreads];
  uint32_t seed = 100;
  for (MatmulPrecision prec : {MatmulPrecision::kF32, MatmulPrecision::kBF16}) {
    // Every thread runs these: the same primitives and the same bindings'
    // shapes at the same time. 128 rows: exact primitive; 100: run-time rows.
    shared.emplace_back(128, 96, 160, prec, true, seed += 10);
    shared.emplace_back(100, 96, 160, prec, false, seed += 10);
    for (int t = 0; t < kThreads; t++) {
      // Shapes of one thread only: a weight shape and row counts of its own,
      // and the shared weight shape with another row count (one run-time-row
      // primitive serving several threads' sizes).
      own[t].emplace_back(64 * (t + 1), 48 + 16 * t, 80, prec, t % 2 == 0, seed += 10);
      own[t].emplace_back(37 + 11 * t, 48 + 16 * t, 80, prec, true, seed += 10);
      own[t].emplace_back(1 + 13 * t, 96, 160, prec, true, seed += 10);
    }
  }
  std::atomic<int> failures{0};
  std::vector<std::string> messages(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; t++) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(t);
      std::vector<const Case*> work;
      for (const Case& c : shared) work.push_back(&c);
      for (const Case& c : own[t]) work.push_back(&c);
      for (int round = 0; round < kRounds; round++) {
        std::shuffle(work.begin(), work.end(), rng);  // different interleavings each round
        for (const Case* c : work) {
          const double err = c->run_cpu();
          if (!(err <= tolerance(c->prec))) {
            failures++;
            messages[t] = c->name() + " err " + std::to_string(err) + " round " + std::to_string(round);
          }
        }
      }
    });
  }
  for (std::thread& th : threads) th.join();
  for (int t = 0; t < kThreads; t++) EXPECT_EQ(messages[t], "") << "thread " << t;
  EXPECT_EQ(failures.load(), 0);
  EXPECT_LE(cpu::matmul_cache_size(), cpu::matmul_cache_capacity());
}

// A serving loop's batch changes every step: row counts that are not a
// multiple of the exact-row quantum share one run-time-row primitive per
// product, so 1..63 rows compile at most three (forward, backward data,
// backward weights) per precision, not three per size.
TEST(CpuMatmulThreads, ChangingRowCountsShareOnePrimitive) {
  const int C = 40, OC = 24;
  // Which row counts get exact primitives: multiples of 64 and 2..64.
  EXPECT_FALSE(cpu::matmul_rows_get_exact_primitive(1));
  for (int rows : {2, 31, 63, 64, 128, 192}) EXPECT_TRUE(cpu::matmul_rows_get_exact_primitive(rows)) << rows;
  for (MatmulPrecision prec : {MatmulPrecision::kF32, MatmulPrecision::kBF16}) {
    // Warm the run-time-row primitives of this weight shape first.
    Case(65, C, OC, prec, true, 7).run_cpu();
    const uint64_t before = cpu::matmul_primitives_compiled();
    for (int rows = 65; rows < 128; rows++) {
      ASSERT_FALSE(cpu::matmul_rows_get_exact_primitive(rows)) << rows;
      Case c(rows, C, OC, prec, true, 1000 + rows);
      EXPECT_LE(c.run_cpu(), tolerance(prec)) << c.name();
    }
    EXPECT_EQ(cpu::matmul_primitives_compiled(), before);
  }
}

// Run-time-row primitives at widths where oneDNN's gemm blocks and
// threads the work (the shapes above are small), for all three products.
TEST(CpuMatmulThreads, RunTimeRowsAtModelWidthMatchReference) {
  for (MatmulPrecision prec : {MatmulPrecision::kF32, MatmulPrecision::kBF16}) {
    for (int rows : {255, 65}) {
      ASSERT_FALSE(cpu::matmul_rows_get_exact_primitive(rows));
      Case c(rows, 512, 1536, prec, true, 3000 + rows);
      EXPECT_LE(c.run_cpu(), tolerance(prec)) << c.name();
    }
  }
}

// Many distinct exact-shape row counts: the cache drops the least recently
// used primitives instead of growing, and results stay right throughout.
TEST(CpuMatmulThreads, ManyDistinctShapesKeepCacheBounded) {
  const int C = 16, OC = 8;
  const uint64_t before = cpu::matmul_primitives_compiled();
  const int kSizes = static_cast<int>(cpu::matmul_cache_capacity());  // 3 primitives each: 3x the bound
  for (int i = 1; i <= kSizes; i++) {
    const int rows = 64 * i;
    ASSERT_TRUE(cpu::matmul_rows_get_exact_primitive(rows));
    Case c(rows, C, OC, MatmulPrecision::kF32, false, 2000 + i);
    EXPECT_LE(c.run_cpu(), tolerance(MatmulPrecision::kF32)) << c.name();
    ASSERT_LE(cpu::matmul_cache_size(), cpu::matmul_cache_capacity());
  }
  EXPECT_GE(cpu::matmul_primitives_compiled() - before, uint64_t(3) * kSizes);
  EXPECT_EQ(cpu::matmul_cache_size(), cpu::matmul_cache_capacity());
}

}  // namespace
}  // namespace tessera
