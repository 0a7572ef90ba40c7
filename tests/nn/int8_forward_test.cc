// The INT8 CPU tier of the model (GPT::quantize_int8): the ragged forward
// with int8 matmuls against the same model in fp32 (the oracle of what
// quantization may change), on the committed PyTorch tiny GPT-2.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include <unistd.h>

#include "io/safetensors.h"
#include "nn/gpt.h"
#include "nn/gpt2_weights.h"
#include "nn/kv_cache.h"
#include "nn/sampler.h"
#include "obs/process.h"
#include "nn/forward_util.h"
#include "test_util.h"
#include "aborting.h"

namespace tessera {
namespace {

using testing_util::all_logits;
using testing_util::make_gpt;
std::unique_ptr<GPT> tiny() { return testing_util::tiny_gpt2(); }

TEST(Int8Forward, CloseToFp32AndMostlyTheSameArgmax) {
  auto fp = tiny();
  auto q = tiny();
  ASSERT_TRUE(q->quantize_int8().ok());
  EXPECT_TRUE(q->int8());
  EXPECT_GT(q->int8_bytes(), 0);
  const int V = fp->config().vocab, Vp = fp->config().padded_vocab();
  std::vector<int> tokens(fp->config().context);
  for (int i = 0; i < static_cast<int>(tokens.size()); i++) tokens[i] = (i * 7 + 3) % V;
  const std::vector<float> a = all_logits(*fp, tokens), b = all_logits(*q, tokens);
  const double err = testing_util::normalised_error(b.data(), a.data(), static_cast<int64_t>(a.size()));
  EXPECT_LE(err, 0.05);
  EXPECT_GT(err, 0.0);
  int same = 0;
  const int N = static_cast<int>(tokens.size());
  for (int i = 0; i < N; i++) {
    const float* x = a.data() + static_cast<size_t>(i) * Vp;
    const float* y = b.data() + static_cast<size_t>(i) * Vp;
    same += std::max_element(x, x + V) - x == std::max_element(y, y + V) - y;
  }
  EXPECT_GE(same, N * 3 / 4) << same << " of " << N << " argmaxes agree";
}

// tessera quantize's file (docs/formats/int8.md) loads back into the same
// INT8 model: the same logits bit for bit, and the file is what it says.
TEST(Int8Forward, FileRoundTrip) {
  auto q = tiny();
  ASSERT_TRUE(q->quantize_int8().ok());
  // The process id in the name: isa.avx2 and isa.zen3_emulated run this test
  // beside the plain one, in the same temporary folder.
  const std::string path = testing::TempDir() + "/tiny_int8_" + std::to_string(::getpid()) + ".safetensors";
  Status saved = save_int8(*q, path);
  ASSERT_TRUE(saved.ok()) << saved.message();
  auto back = load_gpt2(path, nullptr, Backend::kCPU, ModelUse::kInference);
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_TRUE((*back)->int8());
  EXPECT_EQ((*back)->int8_bytes(), q->int8_bytes());
  std::vector<int> tokens = {1, 5, 9, 2, 7, 7, 30};
  EXPECT_EQ(all_logits(**back, tokens), all_logits(*q, tokens));
  auto f = io::SafetensorsFile::open(path);
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->metadata().at("tessera_quantization"), "int8-symmetric-per-output-channel");
  const io::TensorInfo* t = f->find("h.0.attn.c_attn.weight_int8");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->dtype, io::StDType::kI8);
  EXPECT_EQ(f->find("h.0.attn.c_attn.weight"), nullptr);
  EXPECT_NE(f->find("lm_head.weight_scale"), nullptr);
  // An INT8 file cannot become a training model.
  EXPECT_FALSE(load_gpt2(path, nullptr, Backend::kCPU, ModelUse::kTraining).ok());
  std::remove(path.c_str());
}

// Giving the fp32 matmul weights back changes no logit of the INT8 model
// and shrinks the resident memory by about their size.
TEST(Int8Forward, ReleasingFp32MatmulWeightsKeepsTheLogitsAndFreesMemory) {
  GPTConfig c;
  c.layers = 4;
  c.heads = 4;
  c.channels = 256;
  c.vocab = 512;
  c.context = 64;
  auto m = make_gpt(c, Backend::kCPU, ModelShard{}, nullptr, ModelUse::kInference);
  m->init_weights(7);
  EXPECT_EQ(m->release_fp32_matmul_weights().status().code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(m->quantize_int8().ok());
  std::vector<int> tokens(40);
  for (int i = 0; i < 40; i++) tokens[i] = (i * 11 + 5) % c.vocab;
  const std::vector<float> before = all_logits(*m, tokens);
  const double rss0 = obs::read_process_stats().value().resident_bytes;
  auto released = m->release_fp32_matmul_weights();
  ASSERT_TRUE(released.ok()) << released.status().message();
  const double rss1 = obs::read_process_stats().value().resident_bytes;
  const int64_t matmul_bytes = int64_t{12} * c.channels * c.channels * c.layers * 4;  // (3+1+4+4) C^2 per layer
  EXPECT_GE(*released, matmul_bytes * 9 / 10);
  EXPECT_LE(*released, matmul_bytes);
  // 0.75: the process's resident set is measured, not the weights' pages
  // alone; under qemu (isa.zen3_emulated) the emulator's own translation
  // buffers grow as the release code first runs (CI measured 0.82 there).
  EXPECT_GE(rss0 - rss1, 0.75 * static_cast<double>(*released)) << "resident " << rss0 << " -> " << rss1;
  EXPECT_TRUE(m->fp32_matmul_weights_released());
  EXPECT_EQ(all_logits(*m, tokens), before);
}

TEST(Int8Forward, RefusesTrainingModels) {
  auto m = make_gpt(GPTConfig{1, 2, 16, 32, 8});
  EXPECT_EQ(m->quantize_int8().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tessera
