// Training behaviour end to end: a tiny model overfits one batch; gradient
// accumulation over micro-steps equals one big batch.
#include <cmath>
#include <cstring>
#include <random>

#include <gtest/gtest.h>

#include "nn/gpt.h"
#include "optim/optimizer.h"
#include "parallel/data_parallel.h"
#include "aborting.h"

namespace tessera {
namespace {

using testing_util::backward_or_die;
using testing_util::forward_or_die;
using testing_util::make_adamw;
using testing_util::make_gpt;
using testing_util::step_or_die;

TEST(Training, TinyModelOverfitsAFixedBatch) {
  auto model = make_gpt(GPTConfig{2, 2, 32, 64, 16});
  model->init_weights(1);
  AdamW opt = make_adamw(gpt_param_space(*model), gpt_adamw_kernel(*model));
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
    float loss = forward_or_die(*model, in.data(), tg.data(), 4, 16);
    if (s == 0) first = loss;
    last = loss;
    model->zero_grad();
    backward_or_die(*model);
    step_or_die(opt, oc, lr_at(oc, s));
  }
  EXPECT_NEAR(first, std::log(64.0f), 0.2f);
  EXPECT_LT(last, 0.05f) << "random targets are memorisable: the loss should approach zero";
}

TEST(Training, GradAccumulationEqualsOneLargeBatch) {
  GPTConfig c{2, 2, 32, 50, 8};
  auto a = make_gpt(c);
  auto b = make_gpt(c);
  a->init_weights(3);
  b->init_weights(3);
  std::mt19937 rng(9);
  std::vector<int> in(8 * 8), tg(8 * 8);
  for (size_t i = 0; i < in.size(); i++) in[i] = rng() % 50, tg[i] = rng() % 50;
  a->zero_grad();
  forward_or_die(*a, in.data(), tg.data(), 8, 8);
  backward_or_die(*a);
  b->zero_grad();
  for (int micro = 0; micro < 2; micro++) {
    forward_or_die(*b, in.data() + micro * 32, tg.data() + micro * 32, 4, 8);
    backward_or_die(*b, 0.5f);
  }
  const float* ga = reinterpret_cast<const float*>(a->grads().base());
  const float* gb = reinterpret_cast<const float*>(b->grads().base());
  size_t n = a->grads().bytes() / 4;
  double max_diff = 0, max_g = 0;
  for (size_t i = 0; i < n; i++) {
    max_diff = std::max(max_diff, static_cast<double>(std::fabs(ga[i] - gb[i])));
    max_g = std::max(max_g, static_cast<double>(std::fabs(ga[i])));
  }
  EXPECT_LE(max_diff, 1e-5 * max_g);
}

TEST(Training, PaddedVocabRowsStayZero) {
  GPTConfig c{1, 2, 16, 10, 8};  // V=10 -> Vp=128
  auto model = make_gpt(c);
  model->init_weights(2);
  AdamW opt = make_adamw(gpt_param_space(*model), gpt_adamw_kernel(*model));
  OptimizerConfig oc;
  std::vector<int> in = {1, 2, 3, 4, 5, 6, 7, 8}, tg = {2, 3, 4, 5, 6, 7, 8, 9};
  for (int s = 0; s < 3; s++) {
    forward_or_die(*model, in.data(), tg.data(), 1, 8);
    model->zero_grad();
    backward_or_die(*model);
    step_or_die(opt, oc, 1e-2f);
  }
  const float* wte = model->param_ptrs()[kWte];
  for (int64_t i = int64_t{c.vocab} * c.channels; i < int64_t{c.padded_vocab()} * c.channels; i++)
    ASSERT_EQ(wte[i], 0.0f);
}

}  // namespace
}  // namespace tessera
