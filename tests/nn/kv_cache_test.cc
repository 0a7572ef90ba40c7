// Incremental decoding (nn/kv_cache.h) against GPT::forward as the oracle,
// and sampling/generation (nn/sampler.h). Two models: a random one
// (GPTConfig{2, 4, 64, 99, 32}) and the committed PyTorch tiny GPT-2 (same
// shape, tests/reference/).
#include <algorithm>
#include <cmath>
#include <memory>
#include <ostream>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "test_util.h"

#include "nn/gpt.h"
#include "nn/gpt2_weights.h"
#include "nn/kv_cache.h"
#include "nn/sampler.h"

namespace tessera {
namespace {

// max |ours - ref| / max(1, max |ref|). Both sides are fp32 with different
// summation orders (oneDNN blocks one row differently from many; attention
// is a dot-product loop here and gemms in GPT::forward); measured
// differences are up to 1.2e-6.
constexpr double kTol = 1e-5;

using testing_util::normalised_error;

enum class Kind { kRandom, kPyTorch };
void PrintTo(Kind k, std::ostream* os) { *os << (k == Kind::kRandom ? "random model" : "PyTorch tiny model"); }

std::unique_ptr<GPT> make_model(Kind kind) {
  if (kind == Kind::kPyTorch) {
    auto m = load_gpt2(TESSERA_TEST_DATA_DIR "/reference/gpt2_tiny.safetensors", nullptr);
    EXPECT_TRUE(m.ok()) << m.status().message();
    return std::move(m).value();
  }
  auto m = std::make_unique<GPT>(GPTConfig{2, 4, 64, 99, 32});
  m->init_weights(7);
  // GPT-2's init (std 0.02) makes attention nearly uniform, which would let
  // a cache bug that attends to the wrong positions hide below the
  // tolerance; sharper queries/keys make every position matter.
  Tensor qkvw = m->params().tensor(kQkvW);
  for (int64_t i = 0; i < qkvw.numel(); i++) qkvw.f32()[i] *= 20.0f;
  return m;
}

std::vector<int> random_tokens(int n, int V, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int> t(n);
  for (int& x : t) x = static_cast<int>(rng() % V);
  return t;
}

class KVCacheTest : public ::testing::TestWithParam<Kind> {
 protected:
  void SetUp() override {
    model_ = make_model(GetParam());
    ASSERT_TRUE(model_);
    V_ = model_->config().vocab;
    Vp_ = model_->config().padded_vocab();
    maxT_ = model_->config().context;
  }
  // Logits (Vp) at the last position of a full forward over tokens.
  std::vector<float> recompute_last(const std::vector<int>& tokens) {
    const int T = static_cast<int>(tokens.size());
    model_->forward(tokens.data(), nullptr, 1, T);
    const float* row = model_->logits() + static_cast<int64_t>(T - 1) * Vp_;
    return std::vector<float>(row, row + Vp_);
  }
  std::unique_ptr<GPT> model_;
  int V_ = 0, Vp_ = 0, maxT_ = 0;
};

TEST_P(KVCacheTest, PrefillOfWholeSequenceMatchesForward) {
  for (int B : {1, 3}) {
    const int T = maxT_;
    std::vector<int> tokens = random_tokens(B * T, V_, 11);
    model_->forward(tokens.data(), nullptr, B, T);
    std::vector<float> logits(static_cast<size_t>(B) * T * Vp_);
    KVCache cache(*model_, B, T);
    ASSERT_TRUE(forward_incremental(*model_, cache, tokens.data(), B, T, logits.data()).ok());
    EXPECT_EQ(cache.length(), T);
    EXPECT_LT(normalised_error(logits.data(), model_->logits(), int64_t{B} * T * Vp_), kTol) << "B=" << B;
  }
}

TEST_P(KVCacheTest, PrefixThenOneTokenAtATimeMatchesRecomputeAtEveryPosition) {
  const int prefix = 5;
  std::vector<int> tokens = random_tokens(maxT_, V_, 12);
  KVCache cache(*model_, 1, maxT_);
  std::vector<float> logits(static_cast<size_t>(prefix) * Vp_);
  ASSERT_TRUE(forward_incremental(*model_, cache, tokens.data(), 1, prefix, logits.data()).ok());
  std::vector<float> want = recompute_last({tokens.begin(), tokens.begin() + prefix});
  EXPECT_LT(normalised_error(logits.data() + (prefix - 1) * Vp_, want.data(), Vp_), kTol);
  for (int p = prefix; p < maxT_; p++) {
    ASSERT_TRUE(forward_incremental(*model_, cache, &tokens[p], 1, 1, logits.data()).ok());
    ASSERT_EQ(cache.length(), p + 1);
    want = recompute_last({tokens.begin(), tokens.begin() + p + 1});
    EXPECT_LT(normalised_error(logits.data(), want.data(), Vp_), kTol) << "position " << p;
  }
}

TEST_P(KVCacheTest, TwoSequencesAtOnceMatchEachAlone) {
  const int prefix = 7, steps = 6, T = prefix + steps;
  std::vector<int> seqs[2] = {random_tokens(T, V_, 21), random_tokens(T, V_, 22)};
  // Batched: (2, prefix) prefill, then (2, 1) per step.
  KVCache both(*model_, 2, T);
  std::vector<float> batched(2 * static_cast<size_t>(T) * Vp_);  // (2, T, Vp) gathered
  {
    std::vector<int> in(2 * prefix);
    for (int b = 0; b < 2; b++) std::copy(seqs[b].begin(), seqs[b].begin() + prefix, in.begin() + b * prefix);
    std::vector<float> out(2 * static_cast<size_t>(prefix) * Vp_);
    ASSERT_TRUE(forward_incremental(*model_, both, in.data(), 2, prefix, out.data()).ok());
    for (int b = 0; b < 2; b++)
      std::copy(out.begin() + b * prefix * Vp_, out.begin() + (b + 1) * prefix * Vp_,
                batched.begin() + static_cast<size_t>(b) * T * Vp_);
    for (int p = prefix; p < T; p++) {
      int step[2] = {seqs[0][p], seqs[1][p]};
      ASSERT_TRUE(forward_incremental(*model_, both, step, 2, 1, out.data()).ok());
      for (int b = 0; b < 2; b++)
        std::copy(out.begin() + b * Vp_, out.begin() + (b + 1) * Vp_,
                  batched.begin() + (static_cast<size_t>(b) * T + p) * Vp_);
    }
  }
  for (int b = 0; b < 2; b++) {
    KVCache one(*model_, 1, T);
    std::vector<float> alone(static_cast<size_t>(T) * Vp_);
    ASSERT_TRUE(forward_incremental(*model_, one, seqs[b].data(), 1, prefix, alone.data()).ok());
    for (int p = prefix; p < T; p++)
      ASSERT_TRUE(forward_incremental(*model_, one, &seqs[b][p], 1, 1, alone.data() + p * Vp_).ok());
    EXPECT_LT(normalised_error(batched.data() + static_cast<size_t>(b) * T * Vp_, alone.data(), int64_t{T} * Vp_),
              kTol)
        << "sequence " << b;
  }
}

TEST_P(KVCacheTest, ResetStartsOver) {
  std::vector<int> tokens = random_tokens(10, V_, 31);
  KVCache cache(*model_, 1, 10);
  std::vector<float> first(10 * static_cast<size_t>(Vp_)), second(first.size());
  ASSERT_TRUE(forward_incremental(*model_, cache, tokens.data(), 1, 10, first.data()).ok());
  cache.reset();
  EXPECT_EQ(cache.length(), 0);
  ASSERT_TRUE(forward_incremental(*model_, cache, tokens.data(), 1, 10, second.data()).ok());
  EXPECT_EQ(first, second);
}

TEST_P(KVCacheTest, GenerateIsDeterministicPerSeed) {
  std::vector<int> prompt = random_tokens(4, V_, 41);
  auto a = generate(*model_, prompt, 20, 1.0f, 0, 1, true, {});
  auto b = generate(*model_, prompt, 20, 1.0f, 0, 1, true, {});
  auto c = generate(*model_, prompt, 20, 1.0f, 0, 2, true, {});
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(a->size(), 20u);
  EXPECT_EQ(a.value(), b.value());
  EXPECT_NE(a.value(), c.value());
}

TEST_P(KVCacheTest, TemperatureZeroIsGreedyArgmaxOfFullRecompute) {
  std::vector<int> seq = random_tokens(3, V_, 42);
  const int P = static_cast<int>(seq.size());
  std::vector<int> streamed;
  auto got = generate(*model_, seq, 12, 0.0f, 40, 99, true, [&](int t) { streamed.push_back(t); });
  ASSERT_TRUE(got.ok()) << got.status().message();
  EXPECT_EQ(streamed, got.value());
  for (int i = 0; i < 12; i++) {
    std::vector<float> logits = recompute_last(seq);
    const int argmax = static_cast<int>(std::max_element(logits.begin(), logits.begin() + V_) - logits.begin());
    ASSERT_EQ(got.value()[i], argmax) << "token " << i;
    seq.push_back(argmax);
  }
  EXPECT_EQ(static_cast<int>(seq.size()), P + 12);
}

TEST_P(KVCacheTest, TopKOneEqualsTemperatureZero) {
  std::vector<int> prompt = random_tokens(6, V_, 43);
  auto greedy = generate(*model_, prompt, 15, 0.0f, 0, 5, true, {});
  auto top1 = generate(*model_, prompt, 15, 1.5f, 1, 6, true, {});
  ASSERT_TRUE(greedy.ok() && top1.ok());
  EXPECT_EQ(greedy.value(), top1.value());
}

TEST_P(KVCacheTest, CacheAndFullRecomputeGiveIdenticalGreedyTokens) {
  std::vector<int> prompt = random_tokens(5, V_, 44);
  auto cached = generate(*model_, prompt, 20, 0.0f, 0, 1, true, {});
  auto recomputed = generate(*model_, prompt, 20, 0.0f, 0, 1, false, {});
  ASSERT_TRUE(cached.ok() && recomputed.ok());
  EXPECT_EQ(cached.value(), recomputed.value());
}

TEST_P(KVCacheTest, GenerateStopsAtTheContextLength) {
  for (bool use_cache : {true, false}) {
    auto r = generate(*model_, random_tokens(maxT_ - 3, V_, 45), 10, 1.0f, 40, 1, use_cache, {});
    ASSERT_TRUE(r.ok()) << r.status().message();
    EXPECT_EQ(r->size(), 3u) << "use_cache=" << use_cache;  // prompt + new == context
    auto full = generate(*model_, random_tokens(maxT_, V_, 46), 10, 1.0f, 40, 1, use_cache, {});
    ASSERT_TRUE(full.ok());
    EXPECT_TRUE(full->empty());
  }
}

INSTANTIATE_TEST_SUITE_P(Models, KVCacheTest, ::testing::Values(Kind::kRandom, Kind::kPyTorch),
                         [](const auto& info) { return info.param == Kind::kRandom ? "Random" : "PyTorch"; });

TEST(KVCacheErrors, OverflowBadTokenAndWrongBatchAreStatusesThatCacheNothing) {
  auto model = make_model(Kind::kRandom);
  const int Vp = model->config().padded_vocab();
  KVCache cache(*model, 1, 4);
  std::vector<float> logits(8 * static_cast<size_t>(Vp));
  std::vector<int> tokens = {1, 2, 3, 4, 5};
  Status st = forward_incremental(*model, cache, tokens.data(), 1, 5, logits.data());
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("exceed"), std::string::npos) << st.message();
  ASSERT_TRUE(forward_incremental(*model, cache, tokens.data(), 1, 3, logits.data()).ok());
  int bad = 99;
  st = forward_incremental(*model, cache, &bad, 1, 1, logits.data());
  EXPECT_NE(st.message().find("outside the vocabulary"), std::string::npos) << st.message();
  int pair[2] = {1, 2};
  EXPECT_FALSE(forward_incremental(*model, cache, pair, 2, 1, logits.data()).ok());
  EXPECT_FALSE(forward_incremental(*model, cache, pair, 1, 0, logits.data()).ok());
  EXPECT_EQ(cache.length(), 3);
  ASSERT_TRUE(forward_incremental(*model, cache, pair, 1, 1, logits.data()).ok());
  EXPECT_EQ(cache.length(), 4);

  GPT other(GPTConfig{1, 4, 64, 99, 32});
  KVCache fresh(*model, 1, 4);
  st = forward_incremental(other, fresh, pair, 1, 1, logits.data());
  EXPECT_NE(st.message().find("made for a model"), std::string::npos) << st.message();
}

TEST(GenerateErrors, EmptyOrTooLongPromptAndBadSettings) {
  auto model = make_model(Kind::kRandom);
  auto none = generate(*model, std::vector<int>{}, 4, 1.0f, 0, 1, true, {});
  EXPECT_NE(none.status().message().find("empty"), std::string::npos);
  auto too_long = generate(*model, std::vector<int>(33, 1), 4, 1.0f, 0, 1, true, {});
  EXPECT_NE(too_long.status().message().find("longer than the model's context of 32"), std::string::npos)
      << too_long.status().message();
  EXPECT_FALSE(generate(*model, std::vector<int>{1}, 4, -1.0f, 0, 1, true, {}).ok());
  EXPECT_FALSE(generate(*model, std::vector<int>{1}, 4, 1.0f, -2, 1, true, {}).ok());
  EXPECT_FALSE(generate(*model, std::vector<int>{1, 200}, 4, 1.0f, 0, 1, true, {}).ok());
  auto zero = generate(*model, std::vector<int>{1}, 0, 1.0f, 0, 1, true, {});
  ASSERT_TRUE(zero.ok());
  EXPECT_TRUE(zero->empty());
}

TEST(SampleToken, TemperatureZeroTakesTheFirstOfEqualMaxima) {
  std::mt19937_64 rng(1);
  const float logits[5] = {0.5f, 2.0f, -1.0f, 2.0f, 1.0f};
  EXPECT_EQ(sample_token(logits, 5, 0.0f, 0, rng), 1);
  EXPECT_EQ(sample_token(logits, 5, 0.7f, 1, rng), 1);  // top-1 breaks the tie the same way
}

TEST(SampleToken, TopKDrawsOnlyFromTheKLargestAndFollowsTheSoftmax) {
  // logits log(1..8): probabilities 1:2:...:8. With top_k 3, only ids 5,6,7
  // with shares 6:7:8 of 21.
  std::vector<float> logits(8);
  for (int i = 0; i < 8; i++) logits[i] = std::log(static_cast<float>(i + 1));
  std::mt19937_64 rng(3);
  int counts[8] = {};
  const int draws = 42000;
  for (int i = 0; i < draws; i++) counts[sample_token(logits.data(), 8, 1.0f, 3, rng)]++;
  for (int i = 0; i < 5; i++) EXPECT_EQ(counts[i], 0) << i;
  for (int i = 5; i < 8; i++) EXPECT_NEAR(counts[i] / double(draws), (i + 1) / 21.0, 0.01) << i;
}

TEST(SampleToken, SameSeedSameDrawsAndHighTemperatureFlattens) {
  std::vector<float> logits = {3.0f, 0.0f, 0.0f, 0.0f};
  std::mt19937_64 a(9), b(9);
  std::set<int> seen_hot;
  std::mt19937_64 c(9);
  for (int i = 0; i < 200; i++) {
    EXPECT_EQ(sample_token(logits.data(), 4, 1.0f, 0, a), sample_token(logits.data(), 4, 1.0f, 0, b));
    seen_hot.insert(sample_token(logits.data(), 4, 100.0f, 0, c));
  }
  EXPECT_EQ(seen_hot.size(), 4u);
}

}  // namespace
}  // namespace tessera
