// Training behaviour end to end: a tiny model overfits one batch; gradient
// accumulation over micro-steps equals one big batch.
#include <cmath>
#include <cstring>
#include <random>

#include <gtest/gtest.h>

#include "nn/gpt.h"
#include "optim/optimizer.h"

namespace tessera {
namespace {

TEST(Training, TinyModelOverfitsAFixedBatch) {
  GPT model(GPTConfig{2, 2, 32, 64, 16});
  model.init_weights(1);
  AdamW opt(model);
  OptimizerConfig oc;
  oc.lr = 3e-3f;
  oc.min_lr = 3e-3f;
  oc.steps = 200;
  oc.weight_decay = 0.0f;
  std::mt19937 rng(5);
  std::vector<int> in(4 * 16), tg(4 * 16);
  for (size_t i = 0; i < in.size(); i++) in[i] = rng() % 64, tg[i] = rng() % 64;
  float first = 0, last = 0;
  for (int s = 0; s < oc.steps; s++) {
    float loss = model.forward(in.data(), tg.data(), 4, 16);
    if (s == 0) first = loss;
    last = loss;
    model.zero_grad();
    model.backward();
    opt.step(model, oc, lr_at(oc, s));
  }
  EXPECT_NEAR(first, std::log(64.0f), 0.2f);
  EXPECT_LT(last, 0.05f) << "random targets are memorisable: the loss should approach zero";
}

TEST(Training, GradAccumulationEqualsOneLargeBatch) {
  GPTConfig c{2, 2, 32, 50, 8};
  GPT a(c), b(c);
  a.init_weights(3);
  b.init_weights(3);
  std::mt19937 rng(9);
  std::vector<int> in(8 * 8), tg(8 * 8);
  for (size_t i = 0; i < in.size(); i++) in[i] = rng() % 50, tg[i] = rng() % 50;
  a.zero_grad();
  a.forward(in.data(), tg.data(), 8, 8);
  a.backward();
  b.zero_grad();
  for (int micro = 0; micro < 2; micro++) {
    b.forward(in.data() + micro * 32, tg.data() + micro * 32, 4, 8);
    b.backward(0.5f);
  }
  const float* ga = reinterpret_cast<const float*>(a.grads().base());
  const float* gb = reinterpret_cast<const float*>(b.grads().base());
  size_t n = a.grads().bytes() / 4;
  double max_diff = 0, max_g = 0;
  for (size_t i = 0; i < n; i++) {
    max_diff = std::max(max_diff, static_cast<double>(std::fabs(ga[i] - gb[i])));
    max_g = std::max(max_g, static_cast<double>(std::fabs(ga[i])));
  }
  EXPECT_LE(max_diff, 1e-5 * max_g);
}

TEST(Training, PaddedVocabRowsStayZero) {
  GPTConfig c{1, 2, 16, 10, 8};  // V=10 -> Vp=128
  GPT model(c);
  model.init_weights(2);
  AdamW opt(model);
  OptimizerConfig oc;
  std::vector<int> in = {1, 2, 3, 4, 5, 6, 7, 8}, tg = {2, 3, 4, 5, 6, 7, 8, 9};
  for (int s = 0; s < 3; s++) {
    model.forward(in.data(), tg.data(), 1, 8);
    model.zero_grad();
    model.backward();
    opt.step(model, oc, 1e-2f);
  }
  const float* wte = model.param_ptrs()[kWte];
  for (int64_t i = int64_t{c.vocab} * c.channels; i < int64_t{c.padded_vocab()} * c.channels; i++)
    ASSERT_EQ(wte[i], 0.0f);
}

}  // namespace
}  // namespace tessera
