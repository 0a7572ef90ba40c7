// The recommendation (DLRM) ops of ops.inc: the oracle's contract on odd
// shapes (empty bags, duplicate ids, strided outputs, mean pooling), and the
// ref backward kernels against central differences of L = sum(out * R). The
// cpu and cuda backends against the oracle: the op table (op_table.h).
// Letters as in ops.inc: B samples, D dimension, E table rows, F features.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/cpu/dlrm_width.h"
#include "kernels/cpu/ops.h"
#include "kernels/ref/ops.h"

namespace tessera {
namespace {

std::vector<float> randn(size_t n, std::mt19937& rng, float scale = 1.0f) {
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// Bags for B samples over a table of E rows: sizes 0..maxlen (sample 1 is
// always empty, sample 0 repeats an id), ids drawn from a small range so
// duplicates across samples are common.
void make_bags(std::vector<int>& ids, std::vector<int>& offsets, int B, int E, int maxlen, std::mt19937& rng) {
  std::uniform_int_distribution<int> len(0, maxlen), id(0, E - 1);
  offsets.assign(1, 0);
  ids.clear();
  for (int b = 0; b < B; b++) {
    int n = b == 1 ? 0 : len(rng);
    if (b == 0) {
      const int x = id(rng);
      ids.push_back(x);
      ids.push_back(x);
    }
    for (int k = 0; k < n; k++) ids.push_back(id(rng));
    offsets.push_back(static_cast<int>(ids.size()));
  }
}

double weighted_sum(const std::vector<float>& out, const std::vector<float>& r) {
  double acc = 0.0;
  for (size_t i = 0; i < out.size(); i++) acc += static_cast<double>(out[i]) * r[i];
  return acc;
}

// Central differences of loss w.r.t. every element of x against analytic.
void expect_gradient(const std::string& what, std::vector<float>& x, const std::vector<float>& analytic,
                     const std::function<double()>& loss) {
  constexpr float h = 1e-2f;
  ASSERT_EQ(x.size(), analytic.size()) << what;
  for (size_t i = 0; i < x.size(); i++) {
    const float saved = x[i];
    x[i] = saved + h;
    const double lp = loss();
    x[i] = saved - h;
    const double lm = loss();
    x[i] = saved;
    const double numeric = (lp - lm) / (2.0 * h);
    ASSERT_NEAR(analytic[i], numeric, 1e-2 * std::max(1.0, std::fabs(numeric))) << what << " at " << i;
  }
}

// Scatters a sparse gradient into a dense (E,D) one.
std::vector<float> densify(const std::vector<int>& rows, const std::vector<float>& drows, int U, int E, int D) {
  std::vector<float> dense(static_cast<size_t>(E) * D, 0.0f);
  for (int u = 0; u < U; u++)
    for (int d = 0; d < D; d++) dense[static_cast<size_t>(rows[u]) * D + d] += drows[static_cast<size_t>(u) * D + d];
  return dense;
}

class EmbeddingBagTest : public ::testing::TestWithParam<Pooling> {};

// The oracle keeps the contract (ops.inc) on odd shapes with a stride: an
// empty bag pools to zeros, the stride's gap is not written, one gradient row
// per distinct id, ascending. Every backend against the oracle: the op table
// (op_table.h, AllOps/CpuMatchesRef and CudaMatchesRef).
TEST_P(EmbeddingBagTest, RefKeepsTheContractOnOddShapesWithStride) {
  const Pooling pooling = GetParam();
  std::mt19937 rng(7);
  for (auto [B, E, D] : {std::tuple{1, 1, 1}, std::tuple{5, 3, 7}, std::tuple{37, 101, 13}, std::tuple{300, 997, 64}}) {
    std::vector<int> ids, offsets;
    make_bags(ids, offsets, B, E, 9, rng);
    const std::vector<float> table = randn(static_cast<size_t>(E) * D, rng);
    const int64_t ld = D + 3;  // strided rows, as in the model's (B,F,D) buffer
    std::vector<float> out_ref(B * ld, -1.0f);
    ref::embedding_bag_forward(out_ref.data(), ld, table.data(), ids.data(), offsets.data(), B, D, pooling);
    if (B > 1) {
      for (int d = 0; d < D; d++) EXPECT_EQ(out_ref[1 * ld + d], 0.0f) << "empty bag pools to zeros";
    }
    EXPECT_EQ(out_ref[D], -1.0f) << "the stride's gap is not written";

    const std::vector<float> dout = randn(B * ld, rng);
    const int L = offsets[B];
    std::vector<int> rows_ref(L);
    std::vector<float> dr_ref(static_cast<size_t>(L) * D);
    const int u_ref = ref::embedding_bag_backward(rows_ref.data(), dr_ref.data(), dout.data(), ld, ids.data(),
                                                  offsets.data(), B, D, pooling);
    std::map<int, int> distinct;
    for (int x : ids) distinct[x]++;
    ASSERT_EQ(u_ref, static_cast<int>(distinct.size())) << "one gradient row per distinct id";
    for (int u = 1; u < u_ref; u++) ASSERT_LT(rows_ref[u - 1], rows_ref[u]) << "rows ascending";
  }
}

TEST_P(EmbeddingBagTest, SparseBackwardMatchesFiniteDifferences) {
  const Pooling pooling = GetParam();
  std::mt19937 rng(11);
  const int B = 6, E = 9, D = 5;
  std::vector<int> ids, offsets;
  make_bags(ids, offsets, B, E, 4, rng);
  std::vector<float> table = randn(static_cast<size_t>(E) * D, rng);
  const std::vector<float> r = randn(static_cast<size_t>(B) * D, rng);
  std::vector<int> rows(offsets[B]);
  std::vector<float> drows(static_cast<size_t>(offsets[B]) * D);
  const int U = ref::embedding_bag_backward(rows.data(), drows.data(), r.data(), D, ids.data(), offsets.data(), B,
                                            D, pooling);
  const std::vector<float> dtable = densify(rows, drows, U, E, D);
  std::vector<float> out(static_cast<size_t>(B) * D);
  expect_gradient("dtable", table, dtable, [&] {
    ref::embedding_bag_forward(out.data(), D, table.data(), ids.data(), offsets.data(), B, D, pooling);
    return weighted_sum(out, r);
  });
}

INSTANTIATE_TEST_SUITE_P(Pooling, EmbeddingBagTest, ::testing::Values(Pooling::kSum, Pooling::kMean),
                         [](const auto& info) { return info.param == Pooling::kSum ? "Sum" : "Mean"; });

TEST(DlrmInteraction, LayoutIsDenseThenLowerTrianglePairs) {
  // F = 3, D = 2: out = x0, <x1,x0>, <x2,x0>, <x2,x1>.
  const std::vector<float> feat = {1, 2, 3, 4, 5, 6};
  std::vector<float> out(5);
  ref::interaction_forward(out.data(), feat.data(), 1, 3, 2);
  EXPECT_EQ(out, (std::vector<float>{1, 2, 11, 17, 39}));
}

// The cpu kernels against the oracle (interaction, ReLU, BCE) are rows of
// the shared op table (op_table.h, AllOps/CpuMatchesRef); here, the
// reference's own gradients against finite differences.

TEST(DlrmInteraction, BackwardMatchesFiniteDifferences) {
  std::mt19937 rng(5);
  const int B = 3, F = 4, D = 3, P = F * (F - 1) / 2;
  std::vector<float> feat = randn(static_cast<size_t>(B) * F * D, rng);
  const std::vector<float> r = randn(static_cast<size_t>(B) * (D + P), rng);
  std::vector<float> dfeat(feat.size(), 0.0f), out(r.size());
  ref::interaction_backward(dfeat.data(), r.data(), feat.data(), B, F, D);
  expect_gradient("dfeat", feat, dfeat, [&] {
    ref::interaction_forward(out.data(), feat.data(), B, F, D);
    return weighted_sum(out, r);
  });
}

// The ops pick 16-float vectors with AVX-512F and 8 without; every lane
// sums in the same order at either width, so the bits are the same.
TEST(DlrmInteraction, BothVectorWidthsGiveTheSameBits) {
  std::mt19937 rng(11);
  for (auto [B, F, D] : {std::tuple{2, 1, 16}, std::tuple{5, 27, 64}, std::tuple{3, 17, 96}, std::tuple{4, 33, 32},
                         std::tuple{3, 27, 16}, std::tuple{2, 9, 128}}) {
    SCOPED_TRACE("B=" + std::to_string(B) + " F=" + std::to_string(F) + " D=" + std::to_string(D));
    const int P = F * (F - 1) / 2;
    const std::vector<float> feat = randn(static_cast<size_t>(B) * F * D, rng);
    const std::vector<float> dout = randn(static_cast<size_t>(B) * (D + P), rng);
    std::vector<float> out8(dout.size()), out16(dout.size());
    cpu::interaction_forward_width(out8.data(), feat.data(), B, F, D, false);
    cpu::interaction_forward_width(out16.data(), feat.data(), B, F, D, true);
    EXPECT_EQ(0, std::memcmp(out8.data(), out16.data(), out8.size() * sizeof(float)));
    std::vector<float> d8 = randn(feat.size(), rng), d16 = d8;  // accumulates
    cpu::interaction_backward_width(d8.data(), dout.data(), feat.data(), B, F, D, false);
    cpu::interaction_backward_width(d16.data(), dout.data(), feat.data(), B, F, D, true);
    EXPECT_EQ(0, std::memcmp(d8.data(), d16.data(), d8.size() * sizeof(float)));
  }
}

TEST(DlrmRelu, BackwardMatchesFiniteDifferences) {
  std::mt19937 rng(9);
  std::vector<float> x = randn(1001, rng);
  std::vector<float> a(x.size());
  const std::vector<float> r = randn(x.size(), rng);
  std::vector<float> da(x.size(), 0.25f);
  for (float& v : x)
    if (std::fabs(v) < 0.05f) v = 0.5f;  // keep the kink away from the step
  std::fill(da.begin(), da.end(), 0.0f);
  ref::relu_backward(da.data(), x.data(), r.data(), x.size());
  expect_gradient("dinp", x, da, [&] {
    ref::relu_forward(a.data(), x.data(), x.size());
    return weighted_sum(a, r);
  });
}

TEST(DlrmBce, StableAndBackwardMatchesFiniteDifferences) {
  std::mt19937 rng(13);
  std::vector<float> x = randn(257, rng, 3.0f);
  x[0] = 80.0f;  // large logits stay finite
  x[1] = -80.0f;
  std::vector<float> y(x.size());
  for (size_t i = 0; i < y.size(); i++) y[i] = static_cast<float>(i % 2);
  std::vector<float> la(x.size()), lb(x.size());
  ref::bce_logits_forward(la.data(), x.data(), y.data(), x.size());
  cpu::bce_logits_forward(lb.data(), x.data(), y.data(), x.size());
  EXPECT_NEAR(la[0], 80.0f, 1e-4f);  // label 0, logit 80
  EXPECT_NEAR(la[1], 80.0f, 1e-4f);  // label 1, logit -80
  EXPECT_NEAR(lb[0], 80.0f, 1e-4f);
  EXPECT_NEAR(lb[1], 80.0f, 1e-4f);
  const float dloss = 1.0f / x.size();
  std::vector<float> da(x.size(), 0.0f);
  ref::bce_logits_backward(da.data(), x.data(), y.data(), dloss, x.size());
  expect_gradient("dlogits", x, da, [&] {
    ref::bce_logits_forward(la.data(), x.data(), y.data(), x.size());
    double s = 0;
    for (float v : la) s += v;
    return s / x.size();
  });
}

}  // namespace
}  // namespace tessera
