// Greedy generation gives the same tokens as the implementation before the
// ragged forward and the paged KV cache (commit 51fdd1e, nn/kv_cache.cc's
// forward_incremental): token ids recorded from that build for a fixed model
// and prompt. A change here means the new forward decodes differently.
#include <memory>
#include <vector>

#include <gtest/gtest.h>

#include "nn/gpt.h"
#include "nn/gpt2_weights.h"
#include "nn/sampler.h"
#include "aborting.h"

namespace tessera {
namespace {

using testing_util::make_gpt;

// A random model with sharp attention (as kv_cache_test.cc's) and a context
// long enough for several KV blocks.
std::unique_ptr<GPT> sharp_model() {
  auto m = make_gpt(GPTConfig{3, 4, 64, 256, 160});
  m->init_weights(11);
  Tensor qkvw = m->params().tensor(kQkvW);
  for (int64_t i = 0; i < qkvw.numel(); i++) qkvw.f32()[i] *= 20.0f;
  Tensor fcw = m->params().tensor(kFcW);
  for (int64_t i = 0; i < fcw.numel(); i++) fcw.f32()[i] *= 10.0f;
  return m;
}

std::vector<int> prompt_of(int n, int V) {
  std::vector<int> p(n);
  for (int i = 0; i < n; i++) p[i] = (i * 37 + 11) % V;
  return p;
}

TEST(SampleGolden, GreedyTokensOfTheRandomModelAreUnchanged) {
  auto model = sharp_model();
  auto out = generate(*model, prompt_of(40, 256), 100, 0.0f, 0, 1, true, nullptr);
  ASSERT_TRUE(out.ok()) << out.status().message();
  const std::vector<int> want = {193,41,45,240,155,241,196,230,241,147,193,33,103,104,196,103,121,104,143,97,120,220,62,73,104,251,104,135,41,216,70,220,217,159,231,45,68,60,121,121,121,121,121,155,48,159,235,90,155,180,180,240,73,48,155,32,219,241,219,1,219,73,20,146,73,187,219,73,180,120,235,241,73,182,159,73,73,220,220,155,235,217,12,48,180,73,73,73,73,73,155,253,241,19,196,155,154,121,155,45};
  EXPECT_EQ(*out, want);
}

TEST(SampleGolden, GreedyTokensOfThePyTorchTinyModelAreUnchanged) {
  auto m = load_gpt2(TESSERA_TEST_DATA_DIR "/reference/gpt2_tiny.safetensors", nullptr);
  ASSERT_TRUE(m.ok()) << m.status().message();
  auto out = generate(**m, prompt_of(7, 99), 25, 0.0f, 0, 1, true, nullptr);
  ASSERT_TRUE(out.ok()) << out.status().message();
  const std::vector<int> want = {35,35,35,35,35,35,35,35,35,35,35,35,35,35,35,35,35,35,35,35,35,35,35,35,35};
  EXPECT_EQ(*out, want);
}

}  // namespace
}  // namespace tessera
