// What `tessera serve` and `tessera sample` share (serve/model_assets.h): the
// load and quantization a --dtype means, the KV cache the server sizes and its
// memory check, and the tokenizer and end ids of a model folder. The commands
// end to end are in tests/cli/serve_api.sh, serve_llama.sh and gguf.sh.
#include "serve/model_assets.h"
#include "aborting.h"

#include <unistd.h>

#include <climits>
#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

namespace tessera::serve {
namespace {

using testing_util::make_gpt;
namespace fs = std::filesystem;

std::unique_ptr<GPT> tiny_model() {
  auto m = make_gpt(GPTConfig{1, 2, 64, 256, 32}, Backend::kCPU, ModelShard{}, nullptr,
                                 ModelUse::kInference);
  m->init_weights(5);
  return m;
}

TEST(InferenceDtype, LoadUseFromDtypeAndBackend) {
  EXPECT_EQ(inference_use({Backend::kCPU, "int8"}), ModelUse::kInt8Inference);
  EXPECT_EQ(inference_use({Backend::kCUDA, "int8"}), ModelUse::kInference);  // quantized after loading
  for (const char* d : {"fp32", "bf16", "int4", "int4k"}) EXPECT_EQ(inference_use({Backend::kCPU, d}), ModelUse::kInference) << d;
}

TEST(InferenceDtype, Fp32AndBf16OnlySetThePrecision) {
  auto m = tiny_model();
  ASSERT_TRUE(apply_inference_dtype(*m, {Backend::kCPU, "bf16", "m", "test"}).ok());
  EXPECT_EQ(m->precision(), MatmulPrecision::kBF16);
  ASSERT_TRUE(apply_inference_dtype(*m, {Backend::kCPU, "fp32", "m", "test"}).ok());
  EXPECT_EQ(m->precision(), MatmulPrecision::kF32);
  EXPECT_FALSE(m->int8());
  EXPECT_FALSE(m->int4());
  EXPECT_FALSE(m->fp32_matmul_weights_released());
}

TEST(InferenceDtype, Int8QuantizesAnFp32Model) {
  auto m = tiny_model();
  ASSERT_TRUE(apply_inference_dtype(*m, {Backend::kCPU, "int8", "m", "test"}).ok());
  EXPECT_TRUE(m->int8());
  EXPECT_FALSE(m->int4());
}

TEST(InferenceDtype, Int4QuantizesAndGivesTheFp32WeightsBack) {
  auto m = tiny_model();
  ASSERT_TRUE(apply_inference_dtype(*m, {Backend::kCPU, "int4", "m", "test"}).ok());
  EXPECT_TRUE(m->int4());
  EXPECT_GT(m->q4_bytes(), 0);
  EXPECT_TRUE(m->fp32_matmul_weights_released());
  // A 4-bit model stays one; --dtype int8 on it is refused naming the file.
  const Status st = apply_inference_dtype(*m, {Backend::kCPU, "int8", "model.gguf", "test"});
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message(), "model.gguf: a 4-bit file runs as the int4 tier (--dtype int4)");
}

TEST(InferenceDtype, FourBitTiersAreCpuOnly) {
  auto m = tiny_model();
  const Status st = apply_inference_dtype(*m, {Backend::kCUDA, "int4k", "m", "test"});
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message(), "--dtype int4k is a CPU tier (--backend cpu)");
  EXPECT_FALSE(m->int4());
}

TEST(KvCacheSize, FromTheFlags) {
  // max_seqs full contexts: 1000 positions are 63 blocks of 16.
  EXPECT_EQ(kv_cache_blocks({0, 0, 32}, 1024, 16, 4096), 32 * 64);
  EXPECT_EQ(kv_cache_blocks({0, 0, 32}, 1000, 16, 4096), 32 * 63);
  EXPECT_EQ(kv_cache_blocks({0, 100, 32}, 1024, 16, 4096), 100);
  // --kv-memory in MiB, rounded down to whole blocks, at least one; it wins.
  EXPECT_EQ(kv_cache_blocks({1, 0, 32}, 1024, 16, 4096), 256);
  EXPECT_EQ(kv_cache_blocks({1.5, 0, 32}, 1024, 16, 1 << 20), 1);
  EXPECT_EQ(kv_cache_blocks({0.001, 0, 32}, 1024, 16, 1 << 20), 1);
  EXPECT_EQ(kv_cache_blocks({2, 7, 32}, 1024, 16, 1 << 20), 2);
}

TEST(KvCacheSize, MemoryCheck) {
  const obs::MemoryLimit host{4e9, "physical memory"};
  EXPECT_TRUE(check_serving_memory("m", 1e9, 1000, 1 << 20, 16, host).ok());
  EXPECT_TRUE(check_serving_memory("m", 1e12, 1000, 1 << 20, 16, obs::MemoryLimit{}).ok());  // unknown: not checked
  const Status st = check_serving_memory("tiny", 1e9, 4000, 1 << 20, 16, host);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message(),
            "tiny needs 5.2 GB (weights 1.0 GB, KV cache 4.2 GB: 4000 blocks of 16 positions) but this host has 4.0 GB "
            "(physical memory); lower --kv-blocks, --kv-memory or --max-seqs");
  const Status big = check_serving_memory("tiny", 0, 3e9, 1, 16, obs::MemoryLimit{});
  EXPECT_EQ(big.message(), "the KV cache of 3000000000 blocks is more than 2147483647 blocks");
}

class ModelAssetsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("tessera_model_assets_test_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string weights() const { return (dir_ / "model.safetensors").string(); }
  fs::path dir_;
};

TEST_F(ModelAssetsTest, ByteTokenizerForASmallVocabularyWithoutTokenizerJson) {
  auto a = load_model_assets(weights(), "", "", "", 256);
  ASSERT_TRUE(a.ok()) << a.status().message();
  EXPECT_EQ(a->tokenizer->name(), "byte");
  EXPECT_EQ(a->chat_template, nullptr);
  EXPECT_TRUE(a->stop_tokens.empty());
  EXPECT_EQ(a->source, "tokenizer byte");
}

TEST_F(ModelAssetsTest, TokenizerLargerThanTheModelsVocabularyIsRefused) {
  auto a = load_model_assets(weights(), "byte", "", "", 100);
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(a.status().message(), "tokenizer 'byte' has 256 tokens but the model's vocabulary has only 100");
}

TEST_F(ModelAssetsTest, GenerationConfigGivesEndIdsAndSamplingDefaults) {
  std::ofstream(dir_ / "generation_config.json") << R"({"eos_token_id": [7, 3], "temperature": 0.6, "top_k": 20})";
  auto a = load_model_assets(weights(), "", "", "", 256);
  ASSERT_TRUE(a.ok()) << a.status().message();
  EXPECT_EQ(a->stop_tokens, (std::vector<int>{3, 7}));
  EXPECT_FLOAT_EQ(a->sampling.temperature.value(), 0.6f);
  EXPECT_EQ(a->sampling.top_k.value(), 20);
  EXPECT_FALSE(a->sampling.top_p.has_value());
  std::ofstream(dir_ / "generation_config.json") << R"({"eos_token_id": 300})";
  a = load_model_assets(weights(), "", "", "", 256);
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("eos_token_id 300 is outside the model's vocabulary of 256"), std::string::npos)
      << a.status().message();
}

}  // namespace
}  // namespace tessera::serve
