// The continuous-batching engine (serve/engine.h) against generate()
// (nn/sampler.h) run on each prompt alone as the oracle: batching, chunked
// prefill, queueing and preemption must not change what a request gets.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <fstream>

#include "nn/gpt.h"
#include "nn/gpt2_weights.h"
#include "nn/sampler.h"
#include "obs/metrics.h"
#include "serve/engine.h"
#include "aborting.h"

namespace tessera::serve {
namespace {

using testing_util::make_gpt;

const GPTConfig kConfig{2, 4, 64, 99, 128};

// The same random model every call (so the engine's copy and the oracle's
// are equal), with sharpened attention as in tests/nn/kv_cache_test.cc.
std::unique_ptr<GPT> make_model() {
  auto m = make_gpt(kConfig, Backend::kCPU, ModelShard{}, nullptr, ModelUse::kInference);
  m->init_weights(11);
  Tensor qkvw = m->params().tensor(kQkvW);
  for (int64_t i = 0; i < qkvw.numel(); i++) qkvw.f32()[i] *= 20.0f;
  return m;
}

std::vector<int> random_prompt(int n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int> t(n);
  for (int& x : t) x = static_cast<int>(rng() % kConfig.vocab);
  return t;
}

// Collects one request's tokens and its end.
struct Outcome {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<int> tokens;
  bool admitted = false, done = false;
  RequestResult result;
  int stop_after = -1;  // on_token returns false at this many tokens
  int delay_ms = 0;     // on_token sleeps this long (holds the engine's thread: a slow step)

  RequestSink sink() {
    RequestSink s;
    s.on_admitted = [this] {
      std::lock_guard<std::mutex> l(mu);
      admitted = true;
    };
    s.on_token = [this](const TokenEvent& ev) {
      if (delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
      std::lock_guard<std::mutex> l(mu);
      tokens.push_back(ev.token);
      return stop_after < 0 || static_cast<int>(tokens.size()) < stop_after;
    };
    s.on_finish = [this](const RequestResult& r) {
      std::lock_guard<std::mutex> l(mu);
      result = r;
      done = true;
      cv.notify_all();
    };
    return s;
  }
  void wait() {
    std::unique_lock<std::mutex> l(mu);
    ASSERT_TRUE(cv.wait_for(l, std::chrono::seconds(60), [&] { return done; })) << "request never finished";
  }
  bool wait_tokens(int n) {
    for (int i = 0; i < 6000; i++) {
      {
        std::lock_guard<std::mutex> l(mu);
        if (static_cast<int>(tokens.size()) >= n || done) return static_cast<int>(tokens.size()) >= n;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return false;
  }
};

SamplingParams greedy(int max_tokens) {
  SamplingParams p;
  p.temperature = 0.0f;
  p.max_tokens = max_tokens;
  return p;
}

std::vector<int> solo(GPT& oracle, const std::vector<int>& prompt, const SamplingParams& p) {
  auto out = generate(oracle, prompt, p.max_tokens, p.temperature, p.top_k, p.seed, true, {});
  EXPECT_TRUE(out.ok()) << out.status().message();
  return out.ok() ? *out : std::vector<int>{};
}

// Sixteen prompts of 1 to 100 tokens, all at once, through a batch of 8 with
// a 48-token step budget (so prompts are read in chunks beside decodes and
// half the requests queue): each gets exactly its solo greedy tokens.
// The Llama family through the engine (issue #30): the random-weight folders
// of tests/reference/llama (GQA with Llama 3 rope scaling and an untied head;
// Qwen2's qkv biases, multi-query, tied head) decode greedily to PyTorch's
// tokens (make_llama_reference.py's "greedy"), and 12 concurrent requests
// of different lengths equal their solo runs.
TEST(ServeEngine, LlamaFoldersDecodeAsPyTorchAndConcurrentlyAsAlone) {
  for (const char* name : {"llama_gqa", "qwen2_mqa"}) {
    SCOPED_TRACE(name);
    const std::string dir = std::string(TESSERA_TEST_DATA_DIR) + "/reference/llama/" + name;
    auto load = [&] {
      auto m = load_gpt2(dir, nullptr, Backend::kCPU, ModelUse::kInference);
      EXPECT_TRUE(m.ok()) << m.status().message();
      return std::move(m).value();
    };
    std::ifstream in(dir + "/reference.json");
    const nlohmann::json greedy_ref = nlohmann::json::parse(in)["greedy"];
    const std::vector<int> prompt = greedy_ref["prompt"].get<std::vector<int>>();
    const std::vector<int> want = greedy_ref["tokens"].get<std::vector<int>>();
    auto oracle = load();
    obs::Registry reg;
    EngineOptions o;
    o.max_seqs = 4;
    o.max_batch_tokens = 16;
    o.block_size = 4;
    auto engine = Engine::create(load(), o, reg);
    ASSERT_TRUE(engine.ok()) << engine.status().message();
    Outcome torch_prompt;
    ASSERT_TRUE((*engine)->submit(prompt, greedy(static_cast<int>(want.size())), torch_prompt.sink()).ok());
    torch_prompt.wait();
    EXPECT_EQ(torch_prompt.tokens, want);

    const int n = 12;
    std::vector<std::vector<int>> prompts;
    std::vector<std::unique_ptr<Outcome>> outs;
    for (int i = 0; i < n; i++) {
      std::vector<int> p(1 + (i * 5) % 17);
      for (size_t k = 0; k < p.size(); k++) p[k] = static_cast<int>((i * 31 + k * 7) % 99);
      prompts.push_back(p);
      outs.push_back(std::make_unique<Outcome>());
      ASSERT_TRUE((*engine)->submit(prompts[i], greedy(6 + i % 4), outs[i]->sink()).ok());
    }
    for (int i = 0; i < n; i++) {
      outs[i]->wait();
      EXPECT_EQ(outs[i]->tokens, solo(*oracle, prompts[i], greedy(6 + i % 4))) << "request " << i;
    }
    EXPECT_EQ((*engine)->stats().kv_used_blocks, 0);
  }
}

// Automatic prefix caching (issue #30): 32 requests sharing a 1,000-token
// system prompt get the same greedy tokens with the cache as without it;
// the hit counter shows the reuse; afterwards every block is free or cached.
TEST(ServeEngine, PrefixCacheGivesTheSameTokensAndReusesTheSharedPrompt) {
  const GPTConfig c{2, 4, 64, 99, 1100};
  auto model = [&] {
    auto m = make_gpt(c, Backend::kCPU, ModelShard{}, nullptr, ModelUse::kInference);
    m->init_weights(21);
    return m;
  };
  std::mt19937_64 rng(3);
  std::vector<int> system(1000);
  for (int& t : system) t = static_cast<int>(rng() % c.vocab);
  std::vector<std::vector<int>> prompts;
  for (int i = 0; i < 32; i++) {
    std::vector<int> p = system;
    for (int k = 0; k < 1 + i % 9; k++) p.push_back(static_cast<int>((i * 13 + k * 5) % c.vocab));
    prompts.push_back(std::move(p));
  }
  std::vector<std::vector<int>> got[2];
  EngineStats stats[2];
  for (int cached = 0; cached < 2; cached++) {
    obs::Registry reg;
    EngineOptions o;
    o.max_seqs = 8;
    o.max_batch_tokens = 512;
    o.prefix_cache = cached == 1;
    auto engine = Engine::create(model(), o, reg);
    ASSERT_TRUE(engine.ok()) << engine.status().message();
    std::vector<std::unique_ptr<Outcome>> outs;
    for (const auto& p : prompts) {
      outs.push_back(std::make_unique<Outcome>());
      ASSERT_TRUE((*engine)->submit(p, greedy(6), outs.back()->sink()).ok());
    }
    for (auto& out : outs) {
      out->wait();
      got[cached].push_back(out->tokens);
    }
    stats[cached] = (*engine)->stats();
    EXPECT_EQ(stats[cached].kv_used_blocks, 0);
  }
  for (int i = 0; i < 32; i++) EXPECT_EQ(got[1][i], got[0][i]) << "request " << i;
  EXPECT_EQ(stats[0].prefix_hits, 0);
  // The first admitted requests compute the prompt; every later one finds
  // its 62 full blocks (992 tokens) cached.
  EXPECT_GE(stats[1].prefix_hits, int64_t{16} * 992);
  EXPECT_EQ(stats[1].prefix_queries, [&] {
    int64_t n = 0;
    for (const auto& p : prompts) n += static_cast<int64_t>(p.size());
    return n;
  }());
  EXPECT_GT(stats[1].kv_cached_blocks, 0);
}

// 200 requests over a shared prompt, a quarter of them cancelled at random
// moments or stopped by their sink: nothing leaks; every block is free or
// cached at the end.
TEST(ServeEngine, PrefixCacheLeaksNoBlocksUnderCancellations) {
  obs::Registry reg;
  EngineOptions o;
  o.max_seqs = 6;
  o.max_batch_tokens = 64;
  o.kv_blocks = 48;
  o.block_size = 8;
  auto engine = Engine::create(make_model(), o, reg);
  ASSERT_TRUE(engine.ok()) << engine.status().message();
  std::mt19937_64 rng(9);
  const std::vector<int> system = random_prompt(40, 77);
  std::vector<std::unique_ptr<Outcome>> outs;
  std::vector<uint64_t> ids;
  for (int i = 0; i < 200; i++) {
    std::vector<int> p = system;
    const int extra = static_cast<int>(rng() % 30);
    for (int k = 0; k < extra; k++) p.push_back(static_cast<int>(rng() % kConfig.vocab));
    if (rng() % 5 == 0) p.resize(1 + rng() % p.size());  // some share only part of it
    outs.push_back(std::make_unique<Outcome>());
    if (rng() % 8 == 0) outs.back()->stop_after = 1 + static_cast<int>(rng() % 3);
    auto id = (*engine)->submit(p, greedy(4 + static_cast<int>(rng() % 8)), outs.back()->sink());
    ASSERT_TRUE(id.ok()) << id.status().message();
    ids.push_back(*id);
    if (rng() % 6 == 0) (*engine)->cancel(ids[rng() % ids.size()]);
    if (i % 25 == 24) outs[i - 3]->wait();  // let the engine run between bursts
  }
  for (auto& out : outs) out->wait();
  const EngineStats s = (*engine)->stats();
  EXPECT_EQ(s.kv_used_blocks, 0);
  EXPECT_EQ(s.running, 0);
  EXPECT_EQ(s.waiting, 0);
  EXPECT_GT(s.prefix_hits, 0);
  EXPECT_LE(s.kv_cached_blocks, 48);
}

TEST(ServeEngine, ConcurrentGreedyRequestsEqualEachAlone) {
  auto oracle = make_model();
  obs::Registry reg;
  EngineOptions o;
  o.max_seqs = 8;
  o.max_batch_tokens = 48;
  auto engine = Engine::create(make_model(), o, reg);
  ASSERT_TRUE(engine.ok()) << engine.status().message();

  const int n = 16;
  std::vector<std::vector<int>> prompts;
  std::vector<std::unique_ptr<Outcome>> outs;
  for (int i = 0; i < n; i++) {
    const int len = i == 0 ? 1 : 1 + (i * 37) % 100;
    prompts.push_back(random_prompt(len, 100 + i));
    outs.push_back(std::make_unique<Outcome>());
    ASSERT_TRUE((*engine)->submit(prompts[i], greedy(12 + i % 5), outs[i]->sink()).ok());
  }
  for (int i = 0; i < n; i++) {
    outs[i]->wait();
    EXPECT_EQ(outs[i]->result.reason, FinishReason::kLength);
    EXPECT_EQ(outs[i]->result.completion_tokens, 12 + i % 5);
    EXPECT_EQ(outs[i]->tokens, solo(*oracle, prompts[i], greedy(12 + i % 5))) << "request " << i;
  }
  const EngineStats s = (*engine)->stats();
  EXPECT_EQ(s.kv_used_blocks, 0);
  EXPECT_EQ(s.running, 0);
  EXPECT_EQ(s.waiting, 0);
}

// Sampling with a seed: the same tokens as generate() with that seed
// (top_p 1), and the same tokens alone or batched with others (top_p < 1).
TEST(ServeEngine, SeededSamplingDoesNotDependOnTheBatch) {
  auto oracle = make_model();
  obs::Registry reg;
  auto engine = Engine::create(make_model(), EngineOptions{}, reg);
  ASSERT_TRUE(engine.ok());
  SamplingParams p;
  p.temperature = 0.9f;
  p.top_k = 30;
  p.max_tokens = 20;
  p.seed = 1234;
  const std::vector<int> prompt = random_prompt(17, 5);
  Outcome alone;
  ASSERT_TRUE((*engine)->submit(prompt, p, alone.sink()).ok());
  alone.wait();
  EXPECT_EQ(alone.tokens, solo(*oracle, prompt, p));

  p.top_p = 0.8f;
  Outcome a;
  ASSERT_TRUE((*engine)->submit(prompt, p, a.sink()).ok());
  a.wait();
  std::vector<std::unique_ptr<Outcome>> others;
  Outcome b;
  for (int i = 0; i < 5; i++) {
    others.push_back(std::make_unique<Outcome>());
    SamplingParams q = p;
    q.seed = 99 + i;
    ASSERT_TRUE((*engine)->submit(random_prompt(3 + 20 * i, 50 + i), q, others.back()->sink()).ok());
    if (i == 2) ASSERT_TRUE((*engine)->submit(prompt, p, b.sink()).ok());
  }
  b.wait();
  for (auto& o : others) o->wait();
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.tokens.size(), 20u);
}

// A pool of 10 blocks (160 positions) for six sequences that grow to 70:
// decoding runs out of blocks, the newest sequences are preempted and
// recomputed, and every request still gets its solo tokens.
TEST(ServeEngine, PreemptedSequencesFinishWithTheirSoloTokens) {
  auto oracle = make_model();
  obs::Registry reg;
  EngineOptions o;
  o.max_seqs = 6;
  o.kv_blocks = 10;
  o.max_batch_tokens = 64;
  auto engine = Engine::create(make_model(), o, reg);
  ASSERT_TRUE(engine.ok());
  std::vector<std::vector<int>> prompts;
  std::vector<std::unique_ptr<Outcome>> outs;
  for (int i = 0; i < 6; i++) {
    prompts.push_back(random_prompt(10 + 3 * i, 300 + i));
    outs.push_back(std::make_unique<Outcome>());
    ASSERT_TRUE((*engine)->submit(prompts[i], greedy(50), outs[i]->sink()).ok());
  }
  int preempted = 0;
  for (int i = 0; i < 6; i++) {
    outs[i]->wait();
    preempted += outs[i]->result.preemptions;
    EXPECT_EQ(outs[i]->tokens, solo(*oracle, prompts[i], greedy(50))) << "request " << i;
  }
  EXPECT_GT(preempted, 0) << "the pool was meant to run out";
  EXPECT_EQ((*engine)->stats().preemptions, preempted);
  EXPECT_EQ((*engine)->stats().kv_used_blocks, 0);
}

// A preempted request waits again, but it has been served: the queue
// timeout (meant for requests never admitted) must not end it.
TEST(ServeEngine, PreemptedRequestsDoNotTimeOut) {
  obs::Registry reg;
  EngineOptions o;
  o.max_seqs = 6;
  o.kv_blocks = 10;
  // 0.3 s: long enough that a loaded machine still admits the six requests
  // before it (at 0.05 s all six could time out in the queue unserved, and
  // nothing was preempted), short against a preempted request's wait.
  o.queue_timeout_s = 0.3;
  auto engine = Engine::create(make_model(), o, reg);
  ASSERT_TRUE(engine.ok());
  std::vector<std::unique_ptr<Outcome>> outs;
  for (int i = 0; i < 6; i++) {
    outs.push_back(std::make_unique<Outcome>());
    outs.back()->delay_ms = 5;  // steps of ~30 ms: a preempted request waits far past 0.3 s
    ASSERT_TRUE((*engine)->submit(random_prompt(10 + 3 * i, 300 + i), greedy(50), outs.back()->sink()).ok());
  }
  int preempted = 0;
  for (auto& out : outs) {
    out->wait();
    preempted += out->result.preemptions;
    if (out->result.preemptions > 0) {
      EXPECT_EQ(out->result.reason, FinishReason::kLength) << out->result.status.message();
      EXPECT_EQ(out->tokens.size(), 50u);
    }
  }
  EXPECT_GT(preempted, 0);
}

TEST(ServeEngine, CancelFreesTheBlocks) {
  obs::Registry reg;
  auto engine = Engine::create(make_model(), EngineOptions{}, reg);
  ASSERT_TRUE(engine.ok());
  Outcome o;
  o.delay_ms = 5;
  auto id = (*engine)->submit(random_prompt(40, 1), greedy(80), o.sink());
  ASSERT_TRUE(id.ok());
  ASSERT_TRUE(o.wait_tokens(2));
  (*engine)->cancel(*id);
  o.wait();
  EXPECT_EQ(o.result.reason, FinishReason::kCancelled);
  EXPECT_LT(o.result.completion_tokens, 80);
  EXPECT_EQ((*engine)->stats().kv_used_blocks, 0);
  (*engine)->cancel(*id);  // finished: ignored
  (*engine)->cancel(12345);  // unknown: ignored
}

TEST(ServeEngine, StopFromTheCallbackAndEndOfText) {
  obs::Registry reg;
  auto engine = Engine::create(make_model(), EngineOptions{}, reg);
  ASSERT_TRUE(engine.ok());
  Outcome o;
  o.stop_after = 3;
  ASSERT_TRUE((*engine)->submit(random_prompt(5, 2), greedy(30), o.sink()).ok());
  o.wait();
  EXPECT_EQ(o.result.reason, FinishReason::kStop);
  EXPECT_EQ(o.tokens.size(), 3u);
  EXPECT_EQ(o.result.completion_tokens, 3);

  // Whatever greedy draws first, declared the end-of-text id, ends the
  // request at once (reported as stop, not as a token) unless ignore_eos.
  auto oracle = make_model();
  const std::vector<int> prompt = random_prompt(5, 2);
  const int first = solo(*oracle, prompt, greedy(1)).at(0);
  EngineOptions eo;
  eo.eot_token = first;
  obs::Registry reg2;
  auto e2 = Engine::create(make_model(), eo, reg2);
  ASSERT_TRUE(e2.ok());
  Outcome a, b;
  ASSERT_TRUE((*e2)->submit(prompt, greedy(10), a.sink()).ok());
  SamplingParams p = greedy(10);
  p.ignore_eos = true;
  ASSERT_TRUE((*e2)->submit(prompt, p, b.sink()).ok());
  a.wait();
  b.wait();
  EXPECT_EQ(a.result.reason, FinishReason::kStop);
  EXPECT_TRUE(a.tokens.empty());
  EXPECT_EQ(b.result.reason, FinishReason::kLength);
  EXPECT_EQ(b.tokens.size(), 10u);
}

TEST(ServeEngine, RefusesWhatCannotRun) {
  obs::Registry reg;
  EngineOptions o;
  o.kv_blocks = 4;  // 64 positions
  auto engine = Engine::create(make_model(), o, reg);
  ASSERT_TRUE(engine.ok());
  Engine& e = **engine;
  auto code = [&](std::vector<int> prompt, SamplingParams p) {
    Outcome out;
    Result<uint64_t> r = e.submit(std::move(prompt), p, out.sink());
    return r.ok() ? StatusCode::kOk : r.status().code();
  };
  EXPECT_EQ(code({}, greedy(1)), StatusCode::kInvalidArgument);
  EXPECT_EQ(code({1, 99}, greedy(1)), StatusCode::kInvalidArgument);   // id past the vocabulary
  EXPECT_EQ(code({1, -1}, greedy(1)), StatusCode::kInvalidArgument);
  EXPECT_EQ(code(random_prompt(128, 1), greedy(1)), StatusCode::kInvalidArgument);  // fills the context
  EXPECT_EQ(code(random_prompt(60, 1), greedy(10)), StatusCode::kInvalidArgument);  // 70 > the pool's 64
  EXPECT_EQ(code({1}, greedy(0)), StatusCode::kInvalidArgument);
  SamplingParams p = greedy(1);
  p.top_p = 0.0f;
  EXPECT_EQ(code({1}, p), StatusCode::kInvalidArgument);
  p = greedy(1);
  p.temperature = -1.0f;
  EXPECT_EQ(code({1}, p), StatusCode::kInvalidArgument);

  EngineOptions bad;
  bad.max_seqs = 0;
  EXPECT_FALSE(Engine::create(make_model(), bad, reg).ok());
  bad = EngineOptions{};
  bad.max_batch_tokens = 4;  // < max_seqs
  EXPECT_FALSE(Engine::create(make_model(), bad, reg).ok());
}

// max_seqs 1 and max_queue 2: while one request runs, two wait and the rest
// are refused at once; a request waiting past the queue timeout is ended
// with Unavailable.
TEST(ServeEngine, QueueLimitAndQueueTimeout) {
  obs::Registry reg;
  EngineOptions o;
  o.max_seqs = 1;
  o.max_queue = 2;
  o.queue_timeout_s = 0.2;
  auto engine = Engine::create(make_model(), o, reg);
  ASSERT_TRUE(engine.ok());
  Engine& e = **engine;
  Outcome running;
  running.delay_ms = 10;  // 100 tokens: a second, against the 0.2 s queue timeout
  auto first = e.submit(random_prompt(10, 1), greedy(100), running.sink());
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE(running.wait_tokens(1));
  std::vector<std::unique_ptr<Outcome>> outs;
  int accepted = 0, refused = 0;
  for (int i = 0; i < 6; i++) {
    outs.push_back(std::make_unique<Outcome>());
    auto r = e.submit(random_prompt(10, 2 + i), greedy(5), outs.back()->sink());
    if (r.ok()) {
      accepted++;
    } else {
      EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted);
      refused++;
      outs.pop_back();
    }
  }
  EXPECT_EQ(accepted, 2);
  EXPECT_EQ(refused, 4);
  // The running request holds the only place far longer than 0.2 s (100
  // tokens); the waiting ones time out.
  for (auto& out : outs) {
    out->wait();
    EXPECT_EQ(out->result.reason, FinishReason::kError);
    EXPECT_EQ(out->result.status.code(), StatusCode::kUnavailable);
    EXPECT_FALSE(out->admitted);
  }
  e.cancel(*first);
  running.wait();
}

TEST(ServeEngine, DrainFinishesRunningWorkAndRefusesNew) {
  obs::Registry reg;
  auto engine = Engine::create(make_model(), EngineOptions{}, reg);
  ASSERT_TRUE(engine.ok());
  Engine& e = **engine;
  Outcome a, b;
  ASSERT_TRUE(e.submit(random_prompt(10, 1), greedy(30), a.sink()).ok());
  ASSERT_TRUE(e.submit(random_prompt(20, 2), greedy(30), b.sink()).ok());
  std::thread t([&] { EXPECT_TRUE(e.drain(30)); });
  while (!e.draining()) std::this_thread::yield();
  Outcome c;
  auto r = e.submit(random_prompt(5, 3), greedy(5), c.sink());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
  t.join();
  EXPECT_TRUE(a.done && b.done);
  EXPECT_EQ(a.result.reason, FinishReason::kLength);
  EXPECT_EQ(b.tokens.size(), 30u);
}

TEST(ServeEngine, MetricsCountTokensAndRequests) {
  obs::Registry reg;
  auto engine = Engine::create(make_model(), EngineOptions{}, reg);
  ASSERT_TRUE(engine.ok());
  Outcome a;
  ASSERT_TRUE((*engine)->submit(random_prompt(33, 1), greedy(7), a.sink()).ok());
  a.wait();
  EXPECT_EQ(reg.counter("tessera_prompt_tokens_total", "").value(), 33);
  EXPECT_EQ(reg.counter("tessera_generation_tokens_total", "").value(), 7);
  const std::string text = reg.render_prometheus();
  EXPECT_NE(text.find("tessera_time_to_first_token_seconds_count 1"), std::string::npos) << text;
  EXPECT_NE(text.find("tessera_inter_token_latency_seconds_count 6"), std::string::npos) << text;
  EXPECT_NE(text.find("tessera_kv_cache_usage_ratio 0"), std::string::npos) << text;
}

}  // namespace
}  // namespace tessera::serve
