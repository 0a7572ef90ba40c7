// The Llama family's kernels (ops.inc: grouped-query attention, RMSNorm,
// rotary embedding, SwiGLU, the paged GQA cache): the reference backward of
// each against central differences, and properties of the cpu kernels (their
// values against the reference are rows of the shared op table, op_table.h). Dimension letters as in ops.inc.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/ops.h"
#include "kernels/ref/ops.h"
#include "test_util.h"

namespace tessera {
namespace {

using Vec = std::vector<float>;
using testing_util::uniform;

double weighted_sum(const Vec& out, const Vec& r) {
  double acc = 0.0;
  for (size_t i = 0; i < out.size(); i++) acc += static_cast<double>(out[i]) * r[i];
  return acc;
}

// As gradcheck_test.cc: h = 1e-2, |analytic - numeric| <= 1e-2 max(1, |numeric|).
void expect_gradient_matches(const std::string& what, Vec& x, const Vec& analytic,
                             const std::function<double()>& loss) {
  ASSERT_EQ(x.size(), analytic.size()) << what;
  const float h = 1e-2f;
  for (size_t i = 0; i < x.size(); i++) {
    const float saved = x[i];
    x[i] = saved + h;
    const double up = loss();
    x[i] = saved - h;
    const double down = loss();
    x[i] = saved;
    const double numeric = (up - down) / (2.0 * h);
    ASSERT_NEAR(analytic[i], numeric, 1e-2 * std::max(1.0, std::fabs(numeric))) << what << "[" << i << "]";
  }
}

double normalised_error(const Vec& want, const Vec& got) { return testing_util::normalised_error(got, want); }

// Llama 3's frequencies for head size hs (base 500000), any scaling aside.
Vec inv_freq(int hs, double theta = 500000.0) {
  Vec f(hs / 2);
  for (int i = 0; i < hs / 2; i++) f[i] = static_cast<float>(1.0 / std::pow(theta, 2.0 * i / hs));
  return f;
}

// ------------------------------------------------------------ finite differences

TEST(LlamaGradcheck, RmsNorm) {
  const int N = 3, C = 7;
  Vec inp = uniform(N * C, 1), w = uniform(C, 2, 0.5f, 1.5f);
  const Vec r = uniform(N * C, 3);
  Vec out(N * C), rstd(N);
  auto loss = [&] {
    ref::rmsnorm_forward(out.data(), rstd.data(), inp.data(), w.data(), N, C, 1e-5f);
    return weighted_sum(out, r);
  };
  loss();
  Vec dinp(N * C, 0.0f), dw(C, 0.0f);
  ref::rmsnorm_backward(dinp.data(), dw.data(), r.data(), inp.data(), w.data(), rstd.data(), N, C);
  expect_gradient_matches("dinp", inp, dinp, loss);
  expect_gradient_matches("dweight", w, dw, loss);
}

TEST(LlamaGradcheck, RmsNormOutputHasUnitRms) {
  const int N = 4, C = 64;
  const Vec inp = uniform(N * C, 4, -3.0f, 3.0f), w(C, 1.0f);
  Vec out(N * C), rstd(N);
  ref::rmsnorm_forward(out.data(), rstd.data(), inp.data(), w.data(), N, C, 0.0f);
  for (int n = 0; n < N; n++) {
    double ss = 0.0;
    for (int c = 0; c < C; c++) ss += static_cast<double>(out[n * C + c]) * out[n * C + c];
    EXPECT_NEAR(ss / C, 1.0, 1e-5);
  }
}

TEST(LlamaGradcheck, SwiGlu) {
  const int N = 3, F = 5;
  Vec inp = uniform(N * 2 * F, 5, -3.0f, 3.0f);
  const Vec r = uniform(N * F, 6);
  Vec out(N * F);
  auto loss = [&] {
    ref::swiglu_forward(out.data(), inp.data(), N, F);
    return weighted_sum(out, r);
  };
  Vec dinp(N * 2 * F, 0.0f);
  ref::swiglu_backward(dinp.data(), inp.data(), r.data(), N, F);
  expect_gradient_matches("dinp", inp, dinp, loss);
}

TEST(LlamaGradcheck, Rope) {
  const int N = 4, NH = 4, KV = 2, hs = 8;
  const int W = (NH + 2 * KV) * hs;
  Vec inp = uniform(N * W, 7);
  const Vec r = uniform(N * W, 8), f = inv_freq(hs, 10000.0);
  const std::vector<int> pos = {0, 3, 17, 250};
  Vec out;
  auto loss = [&] {
    out = inp;
    ref::rope_forward(out.data(), pos.data(), f.data(), N, NH, KV, hs);
    return weighted_sum(out, r);
  };
  // The gradient of the rotation is the inverse rotation of r.
  Vec dinp = r;
  ref::rope_backward(dinp.data(), pos.data(), f.data(), N, NH, KV, hs);
  expect_gradient_matches("dqkv", inp, dinp, loss);
}

TEST(LlamaGradcheck, RopeTurnsQueriesAndKeysNotValues) {
  const int N = 2, NH = 2, KV = 1, hs = 4;
  const int W = (NH + 2 * KV) * hs;
  const Vec inp = uniform(N * W, 9), f = inv_freq(hs, 10000.0);
  const std::vector<int> pos = {0, 5};
  Vec out = inp;
  ref::rope_forward(out.data(), pos.data(), f.data(), N, NH, KV, hs);
  for (int c = 0; c < W; c++) EXPECT_EQ(out[c], inp[c]) << "position 0 is the identity, column " << c;
  for (int c = (NH + KV) * hs; c < W; c++) EXPECT_EQ(out[W + c], inp[W + c]) << "values are not turned";
  // A rotation keeps each pair's length: (x1, x2) of head 0, pair 0.
  const int half = hs / 2;
  EXPECT_NEAR(std::hypot(out[W], out[W + half]), std::hypot(inp[W], inp[W + half]), 1e-6);
  EXPECT_NE(out[W], inp[W]);
}

TEST(LlamaGradcheck, GroupedQueryAttention) {
  const int B = 2, T = 4, NH = 4, KV = 2, hs = 3;
  const size_t n_inp = static_cast<size_t>(B) * T * (NH + 2 * KV) * hs;
  const size_t n_out = static_cast<size_t>(B) * T * NH * hs, n_att = static_cast<size_t>(B) * NH * T * T;
  Vec inp = uniform(n_inp, 10);
  const Vec r = uniform(n_out, 11);
  Vec out(n_out), preatt(n_att), att(n_att);
  auto loss = [&] {
    ref::attention_gqa_forward(out.data(), preatt.data(), att.data(), inp.data(), B, T, NH, KV, hs);
    return weighted_sum(out, r);
  };
  loss();
  Vec dinp(n_inp, 0.0f), dpre(n_att, 0.0f), datt(n_att, 0.0f);
  ref::attention_gqa_backward(dinp.data(), dpre.data(), datt.data(), r.data(), inp.data(), att.data(), B, T, NH, KV,
                              hs);
  expect_gradient_matches("dqkv", inp, dinp, loss);
}

// GQA is multi-head attention with each key/value head repeated for the
// query heads that use it (h % KV): the oracle below builds that MHA input.
TEST(LlamaGradcheck, GroupedQueryAttentionIsRepeatedKeyValueHeads) {
  const int B = 1, T = 5, NH = 6, KV = 2, hs = 4;
  const int W = (NH + 2 * KV) * hs, C = NH * hs;
  const Vec inp = uniform(static_cast<size_t>(B) * T * W, 12);
  Vec mha(static_cast<size_t>(B) * T * 3 * C);
  for (int t = 0; t < T; t++) {
    for (int h = 0; h < NH; h++) {
      for (int i = 0; i < hs; i++) {
        mha[t * 3 * C + h * hs + i] = inp[t * W + h * hs + i];
        mha[t * 3 * C + C + h * hs + i] = inp[t * W + NH * hs + (h % KV) * hs + i];
        mha[t * 3 * C + 2 * C + h * hs + i] = inp[t * W + (NH + KV) * hs + (h % KV) * hs + i];
      }
    }
  }
  const size_t n_att = static_cast<size_t>(B) * NH * T * T;
  Vec out(static_cast<size_t>(B) * T * C), want(out.size()), pre(n_att), att(n_att);
  ref::attention_gqa_forward(out.data(), pre.data(), att.data(), inp.data(), B, T, NH, KV, hs);
  ref::attention_forward(want.data(), pre.data(), att.data(), mha.data(), B, T, C, NH);
  EXPECT_EQ(out, want);
}

// ------------------------------------------------------------ cpu vs ref

constexpr double kTol = 1e-5;

// The cpu kernels against the oracle on odd shapes are rows of the shared
// op table (op_table.h, AllOps/CpuMatchesRef); here, properties of them.

// With KV == NH the GQA kernel is the multi-head one, bit for bit.
TEST(CpuGqaAttention, MultiHeadCaseIsAttentionForwardBitwise) {
  const int B = 2, T = 70, C = 64, NH = 4;
  const Vec inp = uniform(static_cast<size_t>(B) * T * 3 * C, 23);
  const size_t n_att = static_cast<size_t>(B) * NH * T * T;
  Vec a(static_cast<size_t>(B) * T * C), b(a.size()), pre(n_att), att_a(n_att), att_b(n_att);
  cpu::attention_forward(a.data(), pre.data(), att_a.data(), inp.data(), B, T, C, NH);
  cpu::attention_gqa_forward(b.data(), pre.data(), att_b.data(), inp.data(), B, T, NH, NH, C / NH);
  EXPECT_EQ(a, b);
  EXPECT_EQ(att_a, att_b);
}

TEST(CpuLlamaOps, RopeBackwardUndoesForward) {
  for (auto [N, NH, KV, hs] : {std::tuple{1, 1, 1, 2}, std::tuple{7, 4, 2, 8}, std::tuple{300, 12, 4, 64}}) {
    SCOPED_TRACE("N=" + std::to_string(N) + " hs=" + std::to_string(hs));
    const size_t n = static_cast<size_t>(N) * (NH + 2 * KV) * hs;
    const Vec x = uniform(n, 40), f = inv_freq(hs);
    std::vector<int> pos(N);
    for (int i = 0; i < N; i++) pos[i] = (i * 37) % 8192;
    Vec round = x;
    cpu::rope_forward(round.data(), pos.data(), f.data(), N, NH, KV, hs);
    cpu::rope_backward(round.data(), pos.data(), f.data(), N, NH, KV, hs);
    EXPECT_LE(normalised_error(x, round), 1e-5);
  }
}

// The paged cache with fewer key/value heads: rows of KV*hs floats; the
// attention over it equals dense GQA attention over the same sequence.
TEST(CpuLlamaOps, PagedGqaMatchesDenseAndRef) {
  const int T = 21, NH = 4, KV = 2, hs = 8, bs = 4;
  const int W = (NH + 2 * KV) * hs, Ck = KV * hs;
  const int blocks = (T + bs - 1) / bs;
  const Vec qkv = uniform(static_cast<size_t>(T) * W, 60, -2.0f, 2.0f);
  std::vector<int> table(blocks), pos(T), seq(T, 0), slots(T);
  for (int b = 0; b < blocks; b++) table[b] = blocks - 1 - b;  // reversed pool order
  for (int t = 0; t < T; t++) {
    pos[t] = t;
    slots[t] = table[t / bs] * bs + t % bs;
  }
  Vec dense(static_cast<size_t>(T) * NH * hs), pre(static_cast<size_t>(NH) * T * T), att(pre.size());
  ref::attention_gqa_forward(dense.data(), pre.data(), att.data(), qkv.data(), 1, T, NH, KV, hs);
  for (int k = 0; k < 2; k++) {
    Vec kc(static_cast<size_t>(blocks) * bs * Ck), vc(kc.size()), out(dense.size());
    (k ? cpu::kv_cache_write_gqa : ref::kv_cache_write_gqa)(kc.data(), vc.data(), qkv.data(), slots.data(), T, NH, KV,
                                                            hs);
    (k ? cpu::paged_attention_gqa_forward : ref::paged_attention_gqa_forward)(
        out.data(), qkv.data(), kc.data(), vc.data(), table.data(), seq.data(), pos.data(), T, NH, KV, hs, bs, blocks);
    EXPECT_LE(normalised_error(dense, out), kTol) << (k ? "cpu" : "ref");
  }
}

TEST(CpuLlamaOps, EncoderWithoutPositions) {
  const int B = 2, T = 3, C = 5, V = 7;
  const Vec wte = uniform(V * C, 70);
  const std::vector<int> ids = {1, 6, 1, 0, 3, 6};
  for (int k = 0; k < 2; k++) {
    Vec out(B * T * C), dwte(V * C, 0.0f);
    (k ? cpu::encoder_forward : ref::encoder_forward)(out.data(), ids.data(), wte.data(), nullptr, B, T, C);
    for (int i = 0; i < B * T; i++)
      for (int c = 0; c < C; c++) EXPECT_EQ(out[i * C + c], wte[ids[i] * C + c]);
    const Vec dout(B * T * C, 1.0f);
    (k ? cpu::encoder_backward : ref::encoder_backward)(dwte.data(), nullptr, dout.data(), ids.data(), B, T, C);
    EXPECT_EQ(dwte[1 * C], 2.0f);
    EXPECT_EQ(dwte[6 * C], 2.0f);
    EXPECT_EQ(dwte[2 * C], 0.0f);
  }
}

}  // namespace
}  // namespace tessera
