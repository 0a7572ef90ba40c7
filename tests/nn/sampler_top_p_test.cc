// Nucleus sampling (sample_token with top_p, nn/sampler.h) and
// token_logprob against direct computation.
#include <cmath>
#include <map>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "nn/sampler.h"

namespace tessera {
namespace {

TEST(SamplerTopP, OneIsThePlainDraw) {
  std::mt19937_64 init(3);
  std::vector<float> logits(500);
  for (float& x : logits) x = static_cast<float>(static_cast<double>(init() % 1000) / 100.0);
  for (int top_k : {0, 40}) {
    std::mt19937_64 a(9), b(9);
    for (int i = 0; i < 200; i++)
      ASSERT_EQ(sample_token(logits.data(), 500, 0.8f, top_k, 1.0f, a), sample_token(logits.data(), 500, 0.8f, top_k, b));
  }
}

// Probabilities 0.5, 0.25, 0.125, 0.0625, ... (logits log p): top_p 0.7
// keeps the first two (0.75 >= 0.7), renormalised to 2/3 and 1/3.
TEST(SamplerTopP, KeepsTheSmallestNucleusAndRenormalises) {
  const int V = 12;
  std::vector<float> logits(V);
  for (int i = 0; i < V; i++) logits[(i * 5) % V] = static_cast<float>(std::log(std::pow(0.5, i + 1)));
  std::mt19937_64 rng(1);
  std::map<int, int> seen;
  const int n = 30000;
  for (int i = 0; i < n; i++) seen[sample_token(logits.data(), V, 1.0f, 0, 0.7f, rng)]++;
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_NEAR(seen[0] / double(n), 2.0 / 3.0, 0.015);
  EXPECT_NEAR(seen[5] / double(n), 1.0 / 3.0, 0.015);
  // A nucleus smaller than the top token: the argmax alone.
  for (int i = 0; i < 100; i++) ASSERT_EQ(sample_token(logits.data(), V, 1.0f, 0, 0.01f, rng), 0);
  // With top_k 3 the total is the top three's (0.875): 0.7 of it needs three.
  seen.clear();
  for (int i = 0; i < n; i++) seen[sample_token(logits.data(), V, 1.0f, 3, 0.7f, rng)]++;
  EXPECT_EQ(seen.size(), 2u);  // 0.5 + 0.25 = 0.75 >= 0.7 * 0.875
}

// The nucleus reaches far into a flat vocabulary (the sorted prefix grows
// past its first 64).
TEST(SamplerTopP, GrowsPastTheFirstPartialSort) {
  const int V = 5000;
  std::vector<float> logits(V, 0.0f);
  std::mt19937_64 rng(2);
  std::vector<int> count(V, 0);
  for (int i = 0; i < 20000; i++) count[sample_token(logits.data(), V, 1.0f, 0, 0.5f, rng)]++;
  int used = 0;
  for (int i = 0; i < V; i++) used += count[i] > 0;
  // Ties break by id: exactly ids 0..2499 form the nucleus.
  for (int i = 2500; i < V; i++) ASSERT_EQ(count[i], 0) << i;
  EXPECT_GT(used, 2300);
}

TEST(SamplerTopP, TokenLogprob) {
  const std::vector<float> logits = {1.0f, 2.0f, 3.0f};
  const double z = std::exp(1.0) + std::exp(2.0) + std::exp(3.0);
  for (int i = 0; i < 3; i++) EXPECT_NEAR(token_logprob(logits.data(), 3, i), logits[i] - std::log(z), 1e-6);
}

}  // namespace
}  // namespace tessera
