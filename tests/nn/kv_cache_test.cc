// The ragged-batch forward through the paged KV cache (GPT::forward_tokens,
// nn/kv_cache.h) against GPT::forward over each sequence alone as the
// oracle, and sampling/generation (nn/sampler.h). Two models: a random one
// (GPTConfig{2, 4, 64, 99, 32}) and the committed PyTorch tiny GPT-2 (same
// shape, tests/reference/).
#include <algorithm>
#include <cmath>
#include <cstdio>
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
#include "aborting.h"

namespace tessera {
namespace {

using testing_util::forward_or_die;
using testing_util::logits_or_die;
using testing_util::make_gpt;
using testing_util::make_kv_cache;

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
  auto m = make_gpt(GPTConfig{2, 4, 64, 99, 32});
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
    forward_or_die(*model_, tokens.data(), nullptr, 1, T);
    const float* row = logits_or_die(*model_) + static_cast<int64_t>(T - 1) * Vp_;
    return std::vector<float>(row, row + Vp_);
  }
  // Feeds tokens[from, to) of cache sequence seq (extending it first) and
  // returns the logits (to - from, Vp) of every row.
  std::vector<float> feed(PagedKVCache& cache, int seq, const std::vector<int>& tokens, int from, int to) {
    const int n = to - from;
    EXPECT_TRUE(cache.extend(seq, n).ok());
    std::vector<int> ids(n, seq), pos(n), rows(n);
    for (int i = 0; i < n; i++) {
      rows[i] = i;
      pos[i] = from + i;
    }
    std::vector<float> logits(static_cast<size_t>(n) * Vp_);
    Status st = model_->forward_tokens(TokenBatch{{tokens.data() + from, static_cast<size_t>(n)}, ids, pos}, cache,
                                       rows, logits.data());
    EXPECT_TRUE(st.ok()) << st.message();
    return logits;
  }
  std::unique_ptr<GPT> model_;
  int V_ = 0, Vp_ = 0, maxT_ = 0;
};

TEST_P(KVCacheTest, PrefillOfWholeSequenceMatchesForward) {
  const int T = maxT_;
  for (int bs : {1, 5, 16, 64}) {
    std::vector<int> tokens = random_tokens(T, V_, 11);
    forward_or_die(*model_, tokens.data(), nullptr, 1, T);
    auto cache = make_kv_cache(*model_, (T + bs - 1) / bs, bs);
    const int seq = cache->add_sequence().value();
    std::vector<float> logits = feed(*cache, seq, tokens, 0, T);
    EXPECT_EQ(cache->length(seq), T);
    EXPECT_LT(normalised_error(logits.data(), logits_or_die(*model_), int64_t{T} * Vp_), kTol) << "block size " << bs;
  }
}

TEST_P(KVCacheTest, PrefixThenOneTokenAtATimeMatchesRecomputeAtEveryPosition) {
  const int prefix = 5;
  std::vector<int> tokens = random_tokens(maxT_, V_, 12);
  auto cache = make_kv_cache(*model_, 8, 4);
  const int seq = cache->add_sequence().value();
  std::vector<float> logits = feed(*cache, seq, tokens, 0, prefix);
  std::vector<float> want = recompute_last({tokens.begin(), tokens.begin() + prefix});
  EXPECT_LT(normalised_error(logits.data() + (prefix - 1) * Vp_, want.data(), Vp_), kTol);
  for (int p = prefix; p < maxT_; p++) {
    logits = feed(*cache, seq, tokens, p, p + 1);
    ASSERT_EQ(cache->length(seq), p + 1);
    want = recompute_last({tokens.begin(), tokens.begin() + p + 1});
    EXPECT_LT(normalised_error(logits.data(), want.data(), Vp_), kTol) << "position " << p;
  }
  EXPECT_EQ(cache->used_blocks(), maxT_ / 4);
  cache->release(seq);
  EXPECT_EQ(cache->free_blocks(), 8);
}

// An fp16 cache (KvDtype::kF16; its kernels against the oracle and the
// fp32 kernels in kernels/kv_f16_test.cc): a prompt, then a token at a
// time, every position's logits near the fp32 cache's. Keys and values
// rounded to 11 significant bits moved the logits by a normalised 3.3e-5
// (the PyTorch model) and 1.7e-3 (the random one, whose queries and keys
// are sharpened 20 times); 4e-3 bounds it. The pool holds half the bytes.
TEST_P(KVCacheTest, F16CacheStaysNearTheFp32Cache) {
  const int prefix = 5;
  std::vector<int> tokens = random_tokens(maxT_, V_, 13);
  auto f32 = make_kv_cache(*model_, 8, 4);
  Result<std::unique_ptr<PagedKVCache>> made = PagedKVCache::create(*model_, 8, 4, 256, KvDtype::kF16);
  ASSERT_TRUE(made.ok()) << made.status().message();
  PagedKVCache& f16 = **made;
  EXPECT_EQ(f16.dtype(), KvDtype::kF16);
  EXPECT_EQ(f16.bytes() * 2, f32->bytes());
  const int a = f32->add_sequence().value(), b = f16.add_sequence().value();
  double worst = 0.0;
  for (int p = 0; p < maxT_;) {
    const int to = p == 0 ? prefix : p + 1;
    const std::vector<float> want = feed(*f32, a, tokens, p, to), got = feed(f16, b, tokens, p, to);
    const double err = normalised_error(got.data(), want.data(), static_cast<int64_t>(to - p) * Vp_);
    worst = std::max(worst, err);
    EXPECT_LT(err, 4e-3) << "positions " << p << ".." << to;
    EXPECT_GT(err, 0.0) << "positions " << p << ".." << to << ": the fp16 cache is not in use";
    p = to;
  }
  std::printf("fp16 cache: worst normalised logit error %.2e over %d positions\n", worst, maxT_);
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

TEST(KVCacheErrors, BadRowsAreStatusesThatWriteNothing) {
  auto model = make_model(Kind::kRandom);
  const int Vp = model->config().padded_vocab();
  auto cache = make_kv_cache(*model, 2, 4);  // 8 positions
  const int seq = cache->add_sequence().value();
  std::vector<float> logits(8 * static_cast<size_t>(Vp));
  // Past the pool: ResourceExhausted, nothing reserved.
  Status st = cache->extend(seq, 9);
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted) << st.message();
  EXPECT_EQ(cache->length(seq), 0);
  EXPECT_EQ(cache->free_blocks(), 2);
  // Past the context.
  auto big = make_kv_cache(*model, 16, 4);
  const int s2 = big->add_sequence().value();
  st = big->extend(s2, 33);
  EXPECT_NE(st.message().find("context of 32"), std::string::npos) << st.message();
  ASSERT_TRUE(cache->extend(seq, 3).ok());
  const int zero = 0;
  auto run = [&](std::vector<int> tokens, std::vector<int> seqs, std::vector<int> pos) {
    return model->forward_tokens(TokenBatch{tokens, seqs, pos}, *cache, std::span<const int>(&zero, 1),
                                 logits.data());
  };
  st = run({1, 2, 99}, {seq, seq, seq}, {0, 1, 2});
  EXPECT_NE(st.message().find("outside the vocabulary"), std::string::npos) << st.message();
  st = run({1, 2, 3, 4}, {seq, seq, seq, seq}, {0, 1, 2, 3});
  EXPECT_NE(st.message().find("reserved"), std::string::npos) << st.message();
  st = run({1}, {seq + 1}, {0});
  EXPECT_NE(st.message().find("not live"), std::string::npos) << st.message();
  st = run({1, 2}, {seq}, {0, 1});
  EXPECT_FALSE(st.ok());
  st = run({}, {}, {});
  EXPECT_FALSE(st.ok());
  const int bad_row = 5;
  st = model->forward_tokens(TokenBatch{std::vector<int>{1}, std::vector<int>{seq}, std::vector<int>{0}}, *cache,
                             std::span<const int>(&bad_row, 1), logits.data());
  EXPECT_NE(st.message().find("logit row"), std::string::npos) << st.message();
  ASSERT_TRUE(run({1, 2, 3}, {seq, seq, seq}, {0, 1, 2}).ok());

  auto other = make_gpt(GPTConfig{1, 4, 64, 99, 32});
  st = other->forward_tokens(TokenBatch{std::vector<int>{1}, std::vector<int>{seq}, std::vector<int>{0}}, *cache,
                            std::span<const int>(&zero, 1), logits.data());
  EXPECT_NE(st.message().find("another model"), std::string::npos) << st.message();
  cache->release(seq);
  EXPECT_EQ(cache->free_blocks(), 2);
  EXPECT_EQ(cache->live_sequences(), 0);
}

TEST(KVCacheErrors, SequenceSlotsAreBounded) {
  auto model = make_model(Kind::kRandom);
  auto cache = make_kv_cache(*model, 4, 4, 2);
  EXPECT_TRUE(cache->add_sequence().ok());
  EXPECT_TRUE(cache->add_sequence().ok());
  EXPECT_EQ(cache->add_sequence().status().code(), StatusCode::kResourceExhausted);
  cache->release(0);
  EXPECT_EQ(cache->add_sequence().value(), 0);
}

// The serving pattern (continuous batching): 8 sequences with prompts of 1
// to 300 tokens join at different steps, their prompts are read in chunks
// of at most 64 tokens per step while the others decode one token per step,
// all in one ragged forward; short sequences end early and their blocks go
// to later ones. Every logit row equals the full forward over that sequence
// alone at that position.
TEST(PagedKVCache, EightRaggedSequencesDecodedTogetherMatchEachAlone) {
  auto model = make_gpt(GPTConfig{2, 4, 64, 99, 320});
  model->init_weights(5);
  Tensor qkvw = model->params().tensor(kQkvW);
  for (int64_t i = 0; i < qkvw.numel(); i++) qkvw.f32()[i] *= 20.0f;
  const int V = 99, Vp = model->config().padded_vocab();
  const int kChunk = 64, kBlock = 16;
  struct Seq {
    int prompt, decode, join;  // prompt length, tokens decoded, step it joins at
    std::vector<int> tokens;
    int id = -1, fed = 0;
    bool done = false;
    std::vector<std::vector<float>> logits;  // at positions prompt-1 .. prompt+decode-2
    std::vector<int> blocks_seen;
  };
  std::vector<Seq> seqs = {{1, 12, 0}, {7, 5, 0}, {300, 6, 1}, {16, 3, 2}, {17, 8, 3},
                           {100, 4, 5}, {250, 6, 9}, {33, 10, 12}};
  for (size_t k = 0; k < seqs.size(); k++) seqs[k].tokens = random_tokens(seqs[k].prompt + seqs[k].decode, V, 100 + k);
  // A pool that cannot hold every sequence at once: blocks must be reused.
  auto cache = make_kv_cache(*model, 40, kBlock, 8);
  std::vector<int> freed_blocks;
  bool reused = false;
  for (int step = 0; step < 200; step++) {
    std::vector<int> tok, sid, pos, out_rows;
    std::vector<int> owner;  // per logit row: index into seqs
    for (size_t k = 0; k < seqs.size(); k++) {
      Seq& s = seqs[k];
      if (s.done || step < s.join) continue;
      const int total = s.prompt + s.decode - 1;  // positions fed (the last decoded token is never fed)
      // Admission: wait until the pool has room for the whole sequence.
      if (s.id < 0) {
        if (cache->free_blocks() < cache->blocks_needed(total)) continue;
        s.id = cache->add_sequence().value();
      }
      const int n = s.fed < s.prompt ? std::min(kChunk, s.prompt - s.fed) : 1;
      ASSERT_TRUE(cache->extend(s.id, n).ok());
      for (int i = 0; i < n; i++) {
        tok.push_back(s.tokens[s.fed + i]);
        sid.push_back(s.id);
        pos.push_back(s.fed + i);
      }
      s.fed += n;
      if (s.fed >= s.prompt) {
        out_rows.push_back(static_cast<int>(tok.size()) - 1);
        owner.push_back(static_cast<int>(k));
      }
    }
    if (tok.empty()) {
      if (std::all_of(seqs.begin(), seqs.end(), [](const Seq& s) { return s.done; })) break;
      continue;
    }
    std::vector<float> logits(out_rows.size() * static_cast<size_t>(Vp));
    Status st = model->forward_tokens(TokenBatch{tok, sid, pos}, *cache, out_rows, logits.data());
    ASSERT_TRUE(st.ok()) << st.message();
    for (size_t r = 0; r < out_rows.size(); r++) {
      Seq& s = seqs[owner[r]];
      s.logits.emplace_back(logits.begin() + r * Vp, logits.begin() + (r + 1) * Vp);
      if (s.fed == s.prompt + s.decode - 1) {
        for (int b : cache->blocks(s.id)) {
          if (std::find(freed_blocks.begin(), freed_blocks.end(), b) != freed_blocks.end()) reused = true;
        }
        s.blocks_seen = cache->blocks(s.id);
        cache->release(s.id);
        freed_blocks.insert(freed_blocks.end(), s.blocks_seen.begin(), s.blocks_seen.end());
        s.done = true;
      }
    }
    // Blocks of sequences that ended are also checked when reused later.
    for (Seq& s : seqs) {
      if (s.id >= 0 && !s.done) {
        for (int b : cache->blocks(s.id))
          if (std::find(freed_blocks.begin(), freed_blocks.end(), b) != freed_blocks.end()) reused = true;
      }
    }
  }
  EXPECT_TRUE(reused) << "no sequence ran on blocks another one had freed";
  EXPECT_EQ(cache->free_blocks(), cache->num_blocks());
  EXPECT_EQ(cache->live_sequences(), 0);
  for (size_t k = 0; k < seqs.size(); k++) {
    const Seq& s = seqs[k];
    ASSERT_TRUE(s.done) << "sequence " << k;
    ASSERT_EQ(static_cast<int>(s.logits.size()), s.decode) << "sequence " << k;
    const int T = s.prompt + s.decode - 1;
    forward_or_die(*model, s.tokens.data(), nullptr, 1, T);
    for (int j = 0; j < s.decode; j++) {
      const int p = s.prompt - 1 + j;
      EXPECT_LT(normalised_error(s.logits[j].data(), logits_or_die(*model) + int64_t{p} * Vp, Vp), kTol)
          << "sequence " << k << " (prompt " << s.prompt << ") position " << p;
    }
  }
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

namespace tessera {
namespace {

// Prefix caching in the pool (nn/kv_cache.h): committed blocks outlive their
// sequence, a new sequence gets the longest cached prefix (never its last
// token), a mismatch anywhere in the chain stops the match, blocks are
// shared read-only, and eviction takes the least recently released first.
TEST(PrefixCache, CommitMatchReleaseEvict) {
  auto model = make_gpt(GPTConfig{1, 2, 16, 50, 64}, Backend::kCPU, ModelShard{}, nullptr, ModelUse::kInference);
  auto cache = make_kv_cache(*model, 6, 4);
  std::vector<int> a(11);
  for (int i = 0; i < 11; i++) a[i] = i + 1;
  const int s = cache->add_sequence().value();
  EXPECT_EQ(cache->match_prefix(s, a), 0);  // nothing cached yet
  ASSERT_TRUE(cache->extend(s, 11).ok());
  cache->commit(s, a, 11);  // blocks 0-3 and 4-7 are full; 8-10 is not
  EXPECT_EQ(cache->cached_blocks(), 2);
  const std::vector<int> blocks = cache->blocks(s);
  cache->release(s);
  EXPECT_EQ(cache->used_blocks(), 0);
  EXPECT_EQ(cache->free_blocks(), 6);  // the cached ones count as available
  EXPECT_EQ(cache->cached_blocks(), 2);

  // The same prompt: both full blocks again, the rest to compute.
  const int t = cache->add_sequence().value();
  EXPECT_EQ(cache->match_prefix(t, a), 8);
  EXPECT_EQ(cache->length(t), 8);
  EXPECT_EQ(cache->blocks(t)[0], blocks[0]);
  EXPECT_EQ(cache->blocks(t)[1], blocks[1]);
  // A second sequence shares them while the first holds them.
  const int u = cache->add_sequence().value();
  std::vector<int> b = a;
  b[5] = 99;  // differs in the second block: only the first matches
  EXPECT_EQ(cache->match_prefix(u, b), 4);
  EXPECT_EQ(cache->blocks(u)[0], blocks[0]);
  EXPECT_EQ(cache->used_blocks(), 2);
  // An 8-token prompt gets one block: its last token must be computed.
  const int w = cache->add_sequence().value();
  EXPECT_EQ(cache->match_prefix(w, std::span<const int>(a.data(), 8)), 4);
  cache->release(w);
  cache->release(u);
  cache->release(t);
  EXPECT_EQ(cache->used_blocks(), 0);

  // A different first block matches nothing.
  std::vector<int> c = a;
  c[0] = 42;
  const int x = cache->add_sequence().value();
  EXPECT_EQ(cache->match_prefix(x, c), 0);
  // Filling the pool evicts the cached blocks, least recently released first.
  ASSERT_TRUE(cache->extend(x, 4 * 5).ok());  // 5 blocks: 4 free + 1 evicted
  EXPECT_EQ(cache->cached_blocks(), 1);
  ASSERT_TRUE(cache->extend(x, 4).ok());  // the 6th: the other cached block
  EXPECT_EQ(cache->cached_blocks(), 0);
  EXPECT_EQ(cache->free_blocks(), 0);
  cache->release(x);
  EXPECT_EQ(cache->free_blocks(), 6);
  const int y = cache->add_sequence().value();
  EXPECT_EQ(cache->match_prefix(y, a), 0);  // evicted: nothing to reuse
}

// The forward through cached blocks gives the logits of computing them.
TEST(PrefixCache, CachedPrefixGivesTheSameLogits) {
  auto model = make_gpt(GPTConfig{2, 4, 32, 50, 64}, Backend::kCPU, ModelShard{}, nullptr, ModelUse::kInference);
  model->init_weights(5);
  const int Vp = model->config().padded_vocab();
  auto cache = make_kv_cache(*model, 16, 4);
  std::vector<int> prompt(23);
  for (int i = 0; i < 23; i++) prompt[i] = (i * 7) % 50;
  auto run = [&](int seq, int from) {
    const int n = static_cast<int>(prompt.size()) - from;
    std::vector<int> ids(n, seq), pos(n);
    for (int i = 0; i < n; i++) pos[i] = from + i;
    const int last = n - 1;
    std::vector<float> logits(Vp);
    EXPECT_TRUE(model
                    ->forward_tokens(TokenBatch{{prompt.data() + from, static_cast<size_t>(n)}, ids, pos}, *cache,
                                     std::span<const int>(&last, 1), logits.data())
                    .ok());
    return logits;
  };
  const int s = cache->add_sequence().value();
  ASSERT_TRUE(cache->extend(s, 23).ok());
  const std::vector<float> want = run(s, 0);
  cache->commit(s, prompt, 23);
  cache->release(s);
  const int t = cache->add_sequence().value();
  const int cached = cache->match_prefix(t, prompt);
  EXPECT_EQ(cached, 20);
  ASSERT_TRUE(cache->extend(t, 3).ok());
  const std::vector<float> got = run(t, cached);
  // The same keys and values; the 3-row matmuls may round differently from
  // the 23-row ones.
  double worst = 0;
  for (int v = 0; v < Vp; v++) worst = std::max(worst, std::fabs(static_cast<double>(got[v]) - want[v]));
  EXPECT_LE(worst, 1e-5);
}

}  // namespace
}  // namespace tessera
