// Finite-difference checks of every reference backward kernel (src/kernels/ref).
//
// For each op we define a scalar loss L = sum(out * R) for a fixed random R,
// so dL/dout = R is what the backward kernel receives, and compare its
// gradient w.r.t. every differentiable input (weights and biases included)
// with central differences (L(x+h) - L(x-h)) / 2h, element by element.
// Cross-entropy uses L = mean(losses), i.e. a uniform dloss = 1/N.
//
// Dimension letters as in ops.inc: B batch, T time, C channels, NH heads,
// N rows, OC output channels, V vocabulary, Vp padded vocabulary.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "kernels/ref/ops.h"

namespace tessera::ref {
namespace {

// Finite-difference step. The forward kernels compute in fp32, so L carries
// relative rounding noise of ~1e-7 per output; that noise is divided by 2h.
// h = 1e-2 keeps it near 1e-5 on these shapes, while the truncation error of
// the central difference (h^2/6 * L''') stays near 1e-5 for inputs of order 1.
// (Measured worst case over all checks below: 5e-5 relative; at h = 1e-3 the
// rounding noise grows tenfold, to 5e-4.)
constexpr float kStep = 1e-2f;

// |analytic - numeric| <= kGradTol * max(1, |numeric|). Both error sources
// above are ~1e-5 here, so 1e-2 leaves over two orders of margin against
// noise while a real bug (a missing term, a wrong index, a factor of 2) is an
// O(1) relative error and still fails loudly.
constexpr double kGradTol = 1e-2;

std::vector<float> random_vector(size_t n, std::mt19937& rng, float scale = 1.0f) {
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// L = sum(out * r), accumulated in double so the sum adds no fp32 noise.
double weighted_sum(const std::vector<float>& out, const std::vector<float>& r) {
  double acc = 0.0;
  for (size_t i = 0; i < out.size(); i++) acc += static_cast<double>(out[i]) * r[i];
  return acc;
}

// Compares `analytic` with central differences of `loss` w.r.t. every element
// of `x`; `loss` reads x through the caller's captures. x is restored after.
void expect_gradient_matches(const std::string& what, std::vector<float>& x, const std::vector<float>& analytic,
                             const std::function<double()>& loss) {
  ASSERT_EQ(x.size(), analytic.size()) << what;
  for (size_t i = 0; i < x.size(); i++) {
    const float orig = x[i];
    const float x_plus = orig + kStep;
    const float x_minus = orig - kStep;
    x[i] = x_plus;
    const double loss_plus = loss();
    x[i] = x_minus;
    const double loss_minus = loss();
    x[i] = orig;
    // Divide by the step actually taken: x +- h is rounded to fp32.
    const double numeric =
        (loss_plus - loss_minus) / (static_cast<double>(x_plus) - static_cast<double>(x_minus));
    EXPECT_LE(std::abs(analytic[i] - numeric), kGradTol * std::max(1.0, std::abs(numeric)))
        << what << "[" << i << "]: analytic " << analytic[i] << ", numeric " << numeric;
  }
}

// ---------------------------------------------------------------- encoder

TEST(RefGradcheck, Encoder) {
  constexpr int B = 2, T = 3, C = 4, V = 5;
  constexpr int kMaxT = T + 1;  // wpe (>=T, C): its last row is never read
  std::mt19937 rng(1);
  // Token 3 appears three times (both batches, several positions), token 1
  // twice; tokens 2 and 4 never appear, so their dwte rows must stay zero.
  const std::vector<int> inp = {3, 1, 3, 0, 3, 1};
  std::vector<float> wte = random_vector(static_cast<size_t>(V) * C, rng);
  std::vector<float> wpe = random_vector(static_cast<size_t>(kMaxT) * C, rng);
  const std::vector<float> r = random_vector(static_cast<size_t>(B) * T * C, rng);
  std::vector<float> out(r.size());

  auto loss = [&] {
    encoder_forward(out.data(), inp.data(), wte.data(), wpe.data(), B, T, C);
    return weighted_sum(out, r);
  };
  std::vector<float> dwte(wte.size(), 0.0f), dwpe(wpe.size(), 0.0f);
  encoder_backward(dwte.data(), dwpe.data(), r.data(), inp.data(), B, T, C);

  expect_gradient_matches("dwte", wte, dwte, loss);
  expect_gradient_matches("dwpe", wpe, dwpe, loss);
  for (int c = 0; c < C; c++) {
    EXPECT_EQ(dwte[2 * C + c], 0.0f) << "unused token 2";
    EXPECT_EQ(dwte[4 * C + c], 0.0f) << "unused token 4";
    EXPECT_EQ(dwpe[T * C + c], 0.0f) << "unused position " << T;
  }
}

// ---------------------------------------------------------------- layernorm

TEST(RefGradcheck, Layernorm) {
  constexpr int N = 4, C = 6;
  std::mt19937 rng(2);
  std::vector<float> inp = random_vector(static_cast<size_t>(N) * C, rng);
  std::vector<float> weight = random_vector(C, rng);
  std::vector<float> bias = random_vector(C, rng);
  const std::vector<float> r = random_vector(inp.size(), rng);
  std::vector<float> out(inp.size()), mean(N), rstd(N);

  auto loss = [&] {
    layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), weight.data(), bias.data(), N, C);
    return weighted_sum(out, r);
  };
  loss();  // fills mean and rstd for the backward pass
  std::vector<float> dinp(inp.size(), 0.0f), dweight(C, 0.0f), dbias(C, 0.0f);
  layernorm_backward(dinp.data(), dweight.data(), dbias.data(), r.data(), inp.data(), weight.data(), mean.data(),
                     rstd.data(), N, C);

  expect_gradient_matches("dinp", inp, dinp, loss);
  expect_gradient_matches("dweight", weight, dweight, loss);
  expect_gradient_matches("dbias", bias, dbias, loss);
}

TEST(RefGradcheck, LayernormNormalizesEachRow) {
  constexpr int N = 5, C = 16;
  std::mt19937 rng(3);
  // Rows far from mean 0 / variance 1, so a missing centring or scaling shows.
  std::vector<float> inp = random_vector(static_cast<size_t>(N) * C, rng, 5.0f);
  for (int i = 0; i < N; i++)
    for (int c = 0; c < C; c++) inp[i * C + c] += 3.0f * (i - 2);
  const std::vector<float> weight(C, 1.0f), bias(C, 0.0f);
  std::vector<float> out(inp.size()), mean(N), rstd(N);
  layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), weight.data(), bias.data(), N, C);

  for (int i = 0; i < N; i++) {
    double in_mean = 0.0, in_var = 0.0, out_mean = 0.0, out_var = 0.0;
    for (int c = 0; c < C; c++) in_mean += inp[i * C + c];
    in_mean /= C;
    for (int c = 0; c < C; c++) in_var += (inp[i * C + c] - in_mean) * (inp[i * C + c] - in_mean);
    in_var /= C;
    for (int c = 0; c < C; c++) out_mean += out[i * C + c];
    out_mean /= C;
    for (int c = 0; c < C; c++) out_var += (out[i * C + c] - out_mean) * (out[i * C + c] - out_mean);
    out_var /= C;  // biased variance, as layernorm uses
    // eps = 1e-5 shifts the variance by eps/var ~ 1e-6 here; fp32 adds ~1e-6.
    EXPECT_NEAR(out_mean, 0.0, 1e-5) << "row " << i;
    EXPECT_NEAR(out_var, 1.0, 1e-4) << "row " << i;
    EXPECT_NEAR(mean[i], in_mean, 1e-5 * std::max(1.0, std::abs(in_mean))) << "saved mean, row " << i;
    EXPECT_NEAR(rstd[i], 1.0 / std::sqrt(in_var + 1e-5), 1e-5 * rstd[i]) << "saved rstd, row " << i;
  }
}

// ---------------------------------------------------------------- matmul

void check_matmul(bool with_bias, unsigned seed) {
  constexpr int N = 4, C = 5, OC = 3;
  std::mt19937 rng(seed);
  std::vector<float> inp = random_vector(static_cast<size_t>(N) * C, rng);
  std::vector<float> weight = random_vector(static_cast<size_t>(OC) * C, rng);
  std::vector<float> bias = random_vector(OC, rng);
  const std::vector<float> r = random_vector(static_cast<size_t>(N) * OC, rng);
  std::vector<float> out(r.size());
  const float* bias_ptr = with_bias ? bias.data() : nullptr;

  auto loss = [&] {
    matmul_forward(out.data(), inp.data(), weight.data(), bias_ptr, N, C, OC, MatmulPrecision::kF32);
    return weighted_sum(out, r);
  };
  std::vector<float> dinp(inp.size(), 0.0f), dweight(weight.size(), 0.0f), dbias(OC, 0.0f);
  matmul_backward(dinp.data(), dweight.data(), with_bias ? dbias.data() : nullptr, r.data(), inp.data(),
                  weight.data(), N, C, OC, MatmulPrecision::kF32);

  expect_gradient_matches("dinp", inp, dinp, loss);
  expect_gradient_matches("dweight", weight, dweight, loss);
  if (with_bias) expect_gradient_matches("dbias", bias, dbias, loss);

  // dinp may be null (the first layer needs no input gradient): dweight alone.
  std::vector<float> dweight_only(weight.size(), 0.0f);
  matmul_backward(nullptr, dweight_only.data(), nullptr, r.data(), inp.data(), weight.data(), N, C, OC,
                  MatmulPrecision::kF32);
  EXPECT_EQ(dweight_only, dweight);
}

TEST(RefGradcheck, MatmulWithBias) { check_matmul(/*with_bias=*/true, 4); }
TEST(RefGradcheck, MatmulWithoutBias) { check_matmul(/*with_bias=*/false, 5); }

// ---------------------------------------------------------------- attention

namespace attn {
constexpr int B = 2, T = 5, C = 8, NH = 2;
constexpr int hs = C / NH;
constexpr size_t kInp = static_cast<size_t>(B) * T * 3 * C;  // qkv (B,T,3C)
constexpr size_t kOut = static_cast<size_t>(B) * T * C;
constexpr size_t kAtt = static_cast<size_t>(B) * NH * T * T;
// Offset of q (part 0), k (part 1) or v (part 2) of head h at (b, t) in qkv.
constexpr size_t qkv_index(int b, int t, int part, int h, int i) {
  return (static_cast<size_t>(b) * T + t) * 3 * C + static_cast<size_t>(part) * C + h * hs + i;
}
}  // namespace attn

TEST(RefGradcheck, Attention) {
  using namespace attn;
  std::mt19937 rng(6);
  std::vector<float> inp = random_vector(kInp, rng);
  const std::vector<float> r = random_vector(kOut, rng);
  std::vector<float> out(kOut), preatt(kAtt), att(kAtt);

  auto loss = [&] {
    attention_forward(out.data(), preatt.data(), att.data(), inp.data(), B, T, C, NH);
    return weighted_sum(out, r);
  };
  loss();  // fills att for the backward pass
  std::vector<float> dinp(kInp, 0.0f), dpreatt(kAtt, 0.0f), datt(kAtt, 0.0f);
  attention_backward(dinp.data(), dpreatt.data(), datt.data(), r.data(), inp.data(), att.data(), B, T, C, NH);

  expect_gradient_matches("dqkv", inp, dinp, loss);
}

// Output row (b, t) may depend only on q of (b, t) and on k, v of (b, t2 <= t).
TEST(RefGradcheck, AttentionIsCausal) {
  using namespace attn;
  std::mt19937 rng(7);
  std::vector<float> inp = random_vector(kInp, rng);
  std::vector<float> out(kOut), preatt(kAtt), att(kAtt);
  attention_forward(out.data(), preatt.data(), att.data(), inp.data(), B, T, C, NH);

  // Probabilities: zero above the diagonal, each row sums to 1.
  for (int bh = 0; bh < B * NH; bh++) {
    for (int t = 0; t < T; t++) {
      const float* a = att.data() + (static_cast<size_t>(bh) * T + t) * T;
      double row_sum = 0.0;
      for (int t2 = 0; t2 < T; t2++) {
        if (t2 > t) {
          EXPECT_EQ(a[t2], 0.0f) << "att above diagonal, bh " << bh << " t " << t << " t2 " << t2;
        }
        row_sum += a[t2];
      }
      EXPECT_NEAR(row_sum, 1.0, 1e-6);
    }
  }

  // Backward: a loss that reads only output row (b, t) must give exactly zero
  // gradient to every other position's q, to future k and v, and to the other
  // batch element. Exact, not approximate: those terms must never be formed.
  for (int b = 0; b < B; b++) {
    for (int t = 0; t < T; t++) {
      std::vector<float> dout(kOut, 0.0f);
      for (int c = 0; c < C; c++) dout[(static_cast<size_t>(b) * T + t) * C + c] = 1.0f + 0.1f * c;
      std::vector<float> dinp(kInp, 0.0f), dpreatt(kAtt, 0.0f), datt(kAtt, 0.0f);
      attention_backward(dinp.data(), dpreatt.data(), datt.data(), dout.data(), inp.data(), att.data(), B, T, C,
                         NH);
      for (int b2 = 0; b2 < B; b2++) {
        for (int t2 = 0; t2 < T; t2++) {
          for (int h = 0; h < NH; h++) {
            for (int i = 0; i < hs; i++) {
              const bool other = b2 != b;
              if (other || t2 != t) {
                EXPECT_EQ(dinp[qkv_index(b2, t2, 0, h, i)], 0.0f) << "dq, row (" << b << "," << t << ") from ("
                                                                    << b2 << "," << t2 << ")";
              }
              if (other || t2 > t) {
                EXPECT_EQ(dinp[qkv_index(b2, t2, 1, h, i)], 0.0f) << "dk, row (" << b << "," << t << ") from ("
                                                                    << b2 << "," << t2 << ")";
                EXPECT_EQ(dinp[qkv_index(b2, t2, 2, h, i)], 0.0f) << "dv, row (" << b << "," << t << ") from ("
                                                                    << b2 << "," << t2 << ")";
              }
            }
          }
        }
      }
    }
  }

  // Forward: changing anything at position t2 leaves every earlier output row
  // bit-for-bit unchanged.
  for (int b = 0; b < B; b++) {
    for (int t2 = 1; t2 < T; t2++) {
      std::vector<float> poked = inp;
      for (int j = 0; j < 3 * C; j++) poked[(static_cast<size_t>(b) * T + t2) * 3 * C + j] += 10.0f;
      std::vector<float> poked_out(kOut);
      attention_forward(poked_out.data(), preatt.data(), att.data(), poked.data(), B, T, C, NH);
      for (int t = 0; t < t2; t++)
        for (int c = 0; c < C; c++) {
          const size_t o = (static_cast<size_t>(b) * T + t) * C + c;
          EXPECT_EQ(poked_out[o], out[o]) << "out (" << b << "," << t << "," << c << ") after poking t2 " << t2;
        }
    }
  }
}

// ---------------------------------------------------------------- gelu, residual

TEST(RefGradcheck, Gelu) {
  constexpr int64_t n = 64;
  std::mt19937 rng(8);
  std::vector<float> inp = random_vector(n, rng, 2.0f);  // covers both tails and the bend near 0
  const std::vector<float> r = random_vector(n, rng);
  std::vector<float> out(n);

  auto loss = [&] {
    gelu_forward(out.data(), inp.data(), n);
    return weighted_sum(out, r);
  };
  std::vector<float> dinp(n, 0.0f);
  gelu_backward(dinp.data(), inp.data(), r.data(), n);

  expect_gradient_matches("dinp", inp, dinp, loss);
}

TEST(RefGradcheck, Residual) {
  constexpr int64_t n = 24;
  std::mt19937 rng(9);
  std::vector<float> inp1 = random_vector(n, rng);
  std::vector<float> inp2 = random_vector(n, rng);
  const std::vector<float> r = random_vector(n, rng);
  std::vector<float> out(n);

  auto loss = [&] {
    residual_forward(out.data(), inp1.data(), inp2.data(), n);
    return weighted_sum(out, r);
  };
  std::vector<float> dinp1(n, 0.0f), dinp2(n, 0.0f);
  residual_backward(dinp1.data(), dinp2.data(), r.data(), n);

  expect_gradient_matches("dinp1", inp1, dinp1, loss);
  expect_gradient_matches("dinp2", inp2, dinp2, loss);
}

// ---------------------------------------------------------------- crossentropy

TEST(RefGradcheck, CrossentropySoftmax) {
  constexpr int N = 6, V = 7, Vp = 8;
  std::mt19937 rng(10);
  std::vector<float> logits = random_vector(static_cast<size_t>(N) * Vp, rng, 2.0f);
  // A huge padding logit: if it leaked into the softmax (or even into its
  // max) every real probability would underflow to 0.
  for (int i = 0; i < N; i++) logits[i * Vp + V] = 1e4f;
  const std::vector<int> targets = {0, 6, 3, 6, 2, 5};  // includes the last real column
  // probs starts as garbage so an unwritten padding column shows.
  std::vector<float> losses(N), probs(logits.size(), -1.0f);

  // L = mean(losses), so d L / d losses[i] = 1/N for every row.
  auto loss = [&] {
    crossentropy_softmax_forward(losses.data(), probs.data(), logits.data(), targets.data(), N, V, Vp);
    double acc = 0.0;
    for (float l : losses) acc += l;
    return acc / N;
  };
  loss();  // fills probs for the backward pass
  std::vector<float> dlogits(logits.size(), 0.0f);
  crossentropy_softmax_backward(dlogits.data(), probs.data(), targets.data(), 1.0f / N, N, V, Vp);

  for (int i = 0; i < N; i++) {
    EXPECT_EQ(probs[i * Vp + V], 0.0f) << "padding prob, row " << i;
    EXPECT_EQ(dlogits[i * Vp + V], 0.0f) << "padding gradient, row " << i;
  }
  // Covers the padding column too: perturbing it must not move the loss.
  expect_gradient_matches("dlogits", logits, dlogits, loss);
}

TEST(RefGradcheck, CrossentropyOfUniformLogitsIsLogV) {
  constexpr int N = 3, V = 7, Vp = 8;
  std::vector<float> logits(static_cast<size_t>(N) * Vp, 2.5f);
  for (int i = 0; i < N; i++) logits[i * Vp + V] = -1e4f;  // padding garbage, ignored
  const std::vector<int> targets = {0, 3, 6};
  std::vector<float> losses(N), probs(logits.size(), -1.0f);
  crossentropy_softmax_forward(losses.data(), probs.data(), logits.data(), targets.data(), N, V, Vp);
  for (int i = 0; i < N; i++) {
    EXPECT_NEAR(losses[i], std::log(static_cast<double>(V)), 1e-6) << "row " << i;
    for (int j = 0; j < V; j++) EXPECT_NEAR(probs[i * Vp + j], 1.0 / V, 1e-7) << "row " << i << " col " << j;
    EXPECT_EQ(probs[i * Vp + V], 0.0f) << "padding prob, row " << i;
  }
}

// ---------------------------------------------------------------- accumulation

// The checks above start every gradient at zero, which cannot tell '+=' from
// '='. Here each backward runs once into zeroed buffers and once into buffers
// holding kPrefill; the second must end exactly kPrefill higher (up to fp32
// rounding of the sum), as ops.inc promises.
constexpr float kPrefill = 0.75f;

// Runs `backward` on gradient buffers of the given sizes, from 0 and from kPrefill.
void expect_accumulates(const std::string& op, const std::vector<size_t>& sizes,
                        const std::function<void(std::vector<std::vector<float>>&)>& backward) {
  std::vector<std::vector<float>> fresh, primed;
  for (size_t n : sizes) {
    fresh.emplace_back(n, 0.0f);
    primed.emplace_back(n, kPrefill);
  }
  backward(fresh);
  backward(primed);
  for (size_t g = 0; g < sizes.size(); g++)
    for (size_t i = 0; i < sizes[g]; i++)
      EXPECT_NEAR(primed[g][i], fresh[g][i] + kPrefill, 1e-6f * std::max(1.0f, std::abs(fresh[g][i])))
          << op << " gradient " << g << "[" << i << "]";
}

TEST(RefGradcheck, BackwardKernelsAccumulate) {
  std::mt19937 rng(11);
  {
    constexpr int B = 2, T = 3, C = 4, V = 5;
    const std::vector<int> inp = {3, 1, 3, 0, 3, 1};
    const std::vector<float> dout = random_vector(static_cast<size_t>(B) * T * C, rng);
    expect_accumulates("encoder", {static_cast<size_t>(V) * C, static_cast<size_t>(T) * C}, [&](auto& g) {
      encoder_backward(g[0].data(), g[1].data(), dout.data(), inp.data(), B, T, C);
    });
  }
  {
    constexpr int N = 3, C = 6;
    const std::vector<float> inp = random_vector(N * C, rng), weight = random_vector(C, rng),
                             bias = random_vector(C, rng), dout = random_vector(N * C, rng);
    std::vector<float> out(N * C), mean(N), rstd(N);
    layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), weight.data(), bias.data(), N, C);
    expect_accumulates("layernorm", {N * C, C, C}, [&](auto& g) {
      layernorm_backward(g[0].data(), g[1].data(), g[2].data(), dout.data(), inp.data(), weight.data(), mean.data(),
                         rstd.data(), N, C);
    });
  }
  {
    constexpr int N = 3, C = 4, OC = 5;
    const std::vector<float> inp = random_vector(N * C, rng), weight = random_vector(OC * C, rng),
                             dout = random_vector(N * OC, rng);
    expect_accumulates("matmul", {N * C, OC * C, OC}, [&](auto& g) {
      matmul_backward(g[0].data(), g[1].data(), g[2].data(), dout.data(), inp.data(), weight.data(), N, C, OC,
                      MatmulPrecision::kF32);
    });
  }
  {
    using namespace attn;
    const std::vector<float> inp = random_vector(kInp, rng), dout = random_vector(kOut, rng);
    std::vector<float> out(kOut), preatt(kAtt), att(kAtt);
    attention_forward(out.data(), preatt.data(), att.data(), inp.data(), B, T, C, NH);
    expect_accumulates("attention", {kInp}, [&](auto& g) {
      // dpreatt and datt are scratch, zeroed by the caller on every call.
      std::vector<float> dpreatt(kAtt, 0.0f), datt(kAtt, 0.0f);
      attention_backward(g[0].data(), dpreatt.data(), datt.data(), dout.data(), inp.data(), att.data(), B, T, C, NH);
    });
  }
  {
    constexpr int64_t n = 16;
    const std::vector<float> inp = random_vector(n, rng), dout = random_vector(n, rng);
    expect_accumulates("gelu", {n}, [&](auto& g) { gelu_backward(g[0].data(), inp.data(), dout.data(), n); });
    expect_accumulates("residual", {n, n},
                       [&](auto& g) { residual_backward(g[0].data(), g[1].data(), dout.data(), n); });
  }
  {
    constexpr int N = 3, V = 7, Vp = 8;
    const std::vector<float> logits = random_vector(N * Vp, rng);
    const std::vector<int> targets = {1, 6, 0};
    std::vector<float> losses(N), probs(N * Vp);
    crossentropy_softmax_forward(losses.data(), probs.data(), logits.data(), targets.data(), N, V, Vp);
    // Also covers "padding columns untouched": they must keep kPrefill.
    expect_accumulates("crossentropy", {N * Vp}, [&](auto& g) {
      crossentropy_softmax_backward(g[0].data(), probs.data(), targets.data(), 1.0f / N, N, V, Vp);
    });
  }
}

}  // namespace
}  // namespace tessera::ref
