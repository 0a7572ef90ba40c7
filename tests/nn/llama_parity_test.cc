// The Llama family against PyTorch: tests/reference/make_llama_reference.py
// built two tiny decoders from Hugging Face's equations and wrote them as HF
// folders with what they compute: llama_gqa (4 query heads, 2 key/value
// heads, hs 16, SwiGLU width 96, untied head, rope theta 500000 with Llama 3
// scaling) and qwen2_mqa (qkv biases, 1 key/value head, tied head). Both
// load through load_gpt2 (config.json names the architecture), so the HF
// import (query-head order, shard index, BF16) is under test too.
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "test_util.h"

#include "core/try.h"
#include "data/shard.h"
#include "io/safetensors.h"
#include "nn/gpt.h"
#include "nn/gpt2_weights.h"
#include "nn/hf_decoder.h"
#include "nn/kv_cache.h"
#include "optim/optimizer.h"
#include "parallel/data_parallel.h"
#include "tensor/dtype.h"
#include "aborting.h"

namespace tessera {
namespace {

using testing_util::backward_or_die;
using testing_util::forward_or_die;
using testing_util::logits_or_die;
using testing_util::make_adamw;
using testing_util::step_or_die;

namespace fs = std::filesystem;
const std::string kRef = std::string(TESSERA_TEST_DATA_DIR) + "/reference/";
const std::string kDir = kRef + "llama/";

// The GPT-2 parity test's bounds (tests/nn/gpt_parity_test.cc).
constexpr double kTolF32 = 2e-5;
constexpr double kTolBF16 = 3e-2;

using testing_util::normalised_error;

struct Batch {
  std::vector<int> inputs, targets;
  int B = 4, T = 16;
};

Batch batch() {
  Batch b;
  auto tokens = data::read_shard(kRef + "tokens.bin");
  EXPECT_TRUE(tokens.ok()) << tokens.status().message();
  for (int i = 0; i < b.B * b.T; i++) {
    b.inputs.push_back(static_cast<int>((*tokens)[i]));
    b.targets.push_back(static_cast<int>((*tokens)[i + 1]));
  }
  return b;
}

nlohmann::json reference(const std::string& model) {
  std::ifstream in(kDir + model + "/reference.json");
  return nlohmann::json::parse(in);
}

std::unique_ptr<GPT> load(const std::string& path, Backend backend = Backend::kCPU) {
  auto m = load_gpt2(path, nullptr, backend);
  EXPECT_TRUE(m.ok()) << m.status().message();
  return m.ok() ? std::move(m).value() : nullptr;
}

struct Case {
  std::string model;
  Backend backend;
  MatmulPrecision prec;
  double tol;
};

class LlamaParity : public ::testing::TestWithParam<Case> {};

// CUDA rows skip, saying why, without the backend or a device.
#define SKIP_UNAVAILABLE(backend)                 \
  do {                                            \
    const Status _st = backend_available(backend); \
    if (!_st.ok()) GTEST_SKIP() << _st.message(); \
  } while (0)

TEST_P(LlamaParity, LogitsLossAndEveryGradient) {
  const Case c = GetParam();
  SKIP_UNAVAILABLE(c.backend);
  const Batch b = batch();
  auto model = load(kDir + c.model, c.backend);
  ASSERT_TRUE(model);
  model->set_precision(c.prec);
  auto expected = io::SafetensorsFile::open(kDir + c.model + "/expected.safetensors");
  ASSERT_TRUE(expected.ok()) << expected.status().message();
  const double ref_loss = reference(c.model)["loss"];

  const float loss = forward_or_die(*model, b.inputs.data(), b.targets.data(), b.B, b.T);
  EXPECT_NEAR(loss, ref_loss, c.tol * ref_loss);
  const int V = model->config().vocab, Vp = model->config().padded_vocab();
  std::vector<float> want(b.B * b.T * V), ours(want.size());
  ASSERT_TRUE(expected->read_f32("logits", want).ok());
  const float* logits = logits_or_die(*model);
  for (int i = 0; i < b.B * b.T; i++)
    for (int j = 0; j < V; j++) ours[i * V + j] = logits[i * Vp + j];
  EXPECT_LE(normalised_error(ours.data(), want.data(), ours.size()), c.tol);

  model->zero_grad();
  backward_or_die(*model);
  int checked = 0;
  for (const HfTensor& g : value_or_abort(to_hf_tensors(*model, model->grads()))) {
    SCOPED_TRACE(g.name);
    std::vector<float> ref(g.data.size());
    ASSERT_TRUE(expected->read_f32("grad." + g.name, ref).ok()) << "no reference gradient";
    EXPECT_LE(normalised_error(g.data.data(), ref.data(), ref.size()), c.tol);
    checked++;
  }
  // Every tensor the reference has a gradient for (its logits and loss aside).
  EXPECT_EQ(checked, static_cast<int>(expected->tensors().size()) - 2);
}

TEST_P(LlamaParity, TenAdamWStepsMatchTorch) {
  const Case c = GetParam();
  SKIP_UNAVAILABLE(c.backend);
  const Batch b = batch();
  auto model = load(kDir + c.model, c.backend);
  ASSERT_TRUE(model);
  model->set_precision(c.prec);
  const nlohmann::json tj = reference(c.model)["train"];
  OptimizerConfig oc;
  oc.lr = tj["max_lr"];
  oc.min_lr = tj["min_lr"];
  oc.warmup = tj["warmup"];
  oc.steps = tj["steps"];
  oc.weight_decay = tj["weight_decay"];
  oc.beta1 = tj["beta1"];
  oc.beta2 = tj["beta2"];
  oc.eps = tj["eps"];
  oc.grad_clip = tj["grad_clip"];
  AdamW opt = make_adamw(gpt_param_space(*model), gpt_adamw_kernel(*model));
  for (int step = 0; step < oc.steps; step++) {
    SCOPED_TRACE(step);
    const float loss = forward_or_die(*model, b.inputs.data(), b.targets.data(), b.B, b.T);
    model->zero_grad();
    backward_or_die(*model);
    const float norm = step_or_die(opt, oc, lr_at(oc, step));
    const double ref_loss = tj["losses"][step], ref_norm = tj["grad_norms"][step];
    EXPECT_NEAR(loss, ref_loss, 5 * c.tol * ref_loss);
    EXPECT_NEAR(norm, ref_norm, 5 * c.tol * ref_norm);
  }
}

INSTANTIATE_TEST_SUITE_P(Models, LlamaParity,
                         ::testing::Values(Case{"llama_gqa", Backend::kRef, MatmulPrecision::kF32, kTolF32},
                                           Case{"llama_gqa", Backend::kCPU, MatmulPrecision::kF32, kTolF32},
                                           Case{"llama_gqa", Backend::kCPU, MatmulPrecision::kBF16, kTolBF16},
                                           Case{"qwen2_mqa", Backend::kRef, MatmulPrecision::kF32, kTolF32},
                                           Case{"qwen2_mqa", Backend::kCPU, MatmulPrecision::kF32, kTolF32},
                                           Case{"qwen2_mqa", Backend::kCPU, MatmulPrecision::kBF16, kTolBF16}
#ifdef TESSERA_HAVE_CUDA
                                           ,  // scripts/gpu-check.sh runs these where a GPU is lent
                                           Case{"llama_gqa", Backend::kCUDA, MatmulPrecision::kF32, kTolF32},
                                           Case{"llama_gqa", Backend::kCUDA, MatmulPrecision::kBF16, kTolBF16},
                                           Case{"qwen2_mqa", Backend::kCUDA, MatmulPrecision::kF32, kTolF32}
#endif
                                           ),
                         [](const auto& info) {
                           const Case& c = info.param;
                           return c.model + "_" + std::string(backend_name(c.backend)) +
                                  (c.prec == MatmulPrecision::kF32 ? "_fp32" : "_bf16");
                         });

TEST(LlamaConfig, ReadFromTheFolders) {
  auto c = read_hf_decoder_config(kDir + "llama_gqa/config.json");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->kv(), 2);
  EXPECT_EQ(c->hs(), 16);
  EXPECT_EQ(c->ffn(), 96);
  EXPECT_FALSE(c->tied_head);
  EXPECT_FALSE(c->qkv_bias);
  EXPECT_EQ(c->rope_scaling.kind, RopeScaling::Kind::kLlama3);
  EXPECT_EQ(c->num_parameters(), reference("llama_gqa")["parameters"].get<int64_t>());
  auto q = read_hf_decoder_config(kDir + "qwen2_mqa/config.json");
  ASSERT_TRUE(q.ok()) << q.status().message();
  EXPECT_TRUE(q->qkv_bias);
  EXPECT_FALSE(q->bias);
  EXPECT_TRUE(q->tied_head);
  EXPECT_EQ(q->kv(), 1);
  EXPECT_EQ(q->num_parameters(), reference("qwen2_mqa")["parameters"].get<int64_t>());
}

// The BF16 shards hold the same weights rounded: loading them gives the fp32
// folder's weights rounded to BF16, and exporting in BF16 (sharded past a
// small limit) writes the same names, shapes and bits.
TEST(LlamaFolder, Bf16ShardsImportAndExportBitForBit) {
  auto a = load(kDir + "llama_gqa");
  auto b = load(kDir + "llama_gqa_bf16");
  ASSERT_TRUE(a && b);
  const int64_t n = static_cast<int64_t>(a->params().bytes() / sizeof(float));
  const float* pa = reinterpret_cast<const float*>(a->params().base());
  const float* pb = reinterpret_cast<const float*>(b->params().base());
  for (int64_t i = 0; i < n; i++) ASSERT_EQ(bf16_to_f32(f32_to_bf16(pa[i])), pb[i]) << i;

  const std::string out = ::testing::TempDir() + "/tessera_llama_bf16";
  fs::remove_all(out);
  fs::create_directories(out);
  HfSaveOptions o;
  o.dtype = io::StDType::kBF16;
  o.max_shard_bytes = 64 << 10;
  ASSERT_TRUE(save_hf_decoder(*b, out + "/model.safetensors", o).ok());
  ASSERT_TRUE(fs::exists(out + "/model.safetensors.index.json"));
  auto src = resolve_hf_folder(kDir + "llama_gqa_bf16");
  auto dst = resolve_hf_folder(out);
  ASSERT_TRUE(src.ok() && dst.ok());
  EXPECT_GT(dst->files.size(), 2u);  // sharded past 64 KiB
  std::map<std::string, std::vector<std::byte>> want, got;
  for (auto [folder, map] : {std::pair{&*src, &want}, std::pair{&*dst, &got}}) {
    for (const std::string& file : folder->files) {
      auto f = io::SafetensorsFile::open(file);
      ASSERT_TRUE(f.ok()) << f.status().message();
      for (const io::TensorInfo& t : f->tensors()) {
        ASSERT_EQ(t.dtype, io::StDType::kBF16) << t.name;
        auto raw = f->raw(t);
        std::vector<std::byte> bytes(raw.begin(), raw.end());
        // the shape goes with the bytes
        for (int64_t d : t.shape) bytes.insert(bytes.end(), reinterpret_cast<std::byte*>(&d),
                                               reinterpret_cast<std::byte*>(&d) + sizeof d);
        (*map)[t.name] = std::move(bytes);
      }
    }
  }
  EXPECT_EQ(want.size(), got.size());
  EXPECT_TRUE(want == got);
  // And it loads back.
  auto c = load(out + "/model.safetensors");
  ASSERT_TRUE(c);
  EXPECT_EQ(std::memcmp(b->params().base(), c->params().base(), b->params().bytes()), 0);
}

TEST(LlamaFolder, Fp32ExportRoundTripsExactly) {
  auto a = load(kDir + "qwen2_mqa");
  ASSERT_TRUE(a);
  const std::string out = ::testing::TempDir() + "/tessera_qwen2_f32";
  fs::remove_all(out);
  fs::create_directories(out);
  ASSERT_TRUE(save_hf(*a, out + "/model.safetensors").ok());
  auto c = read_hf_decoder_config(out + "/config.json");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_TRUE(*c == a->config());
  auto b = load(out);
  ASSERT_TRUE(b);
  EXPECT_EQ(std::memcmp(a->params().base(), b->params().base(), a->params().bytes()), 0);
}

// Bad folders: one line naming the key or the tensor, nothing allocated.
class LlamaBadFolder : public ::testing::Test {
 protected:
  void SetUp() override {
    // One folder per test: ctest runs the fixture's tests at once.
    dir_ = ::testing::TempDir() + "/tessera_llama_bad_" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    fs::copy_file(kDir + "llama_gqa/model.safetensors", dir_ + "/model.safetensors");
    std::ifstream in(kDir + "llama_gqa/config.json");
    config_ = nlohmann::json::parse(in);
  }
  std::string error_with(const nlohmann::json& cfg) {
    std::ofstream(dir_ + "/config.json") << cfg.dump();
    auto m = load_gpt2(dir_, nullptr);
    return m.ok() ? "" : m.status().message();
  }
  std::string dir_;
  nlohmann::json config_;
};

TEST_F(LlamaBadFolder, RefusesWhatWouldChangeTheMath) {
  nlohmann::json c = config_;
  c["architectures"] = {"FalconForCausalLM"};
  EXPECT_NE(error_with(c).find("FalconForCausalLM"), std::string::npos);
  c = config_;
  c["hidden_act"] = "gelu";
  EXPECT_NE(error_with(c).find("hidden_act"), std::string::npos);
  c = config_;
  c["rope_scaling"]["rope_type"] = "yarn";
  EXPECT_NE(error_with(c).find("yarn"), std::string::npos);
  c = config_;
  c["attention_bias"] = true;
  EXPECT_NE(error_with(c).find("attention_bias"), std::string::npos);
  c = config_;
  c["num_key_value_heads"] = 3;
  EXPECT_NE(error_with(c).find("kv_heads"), std::string::npos);
  c = config_;
  c["intermediate_size"] = 100;  // the file's MLP is 96 wide
  const std::string e = error_with(c);
  EXPECT_NE(e.find("gate_proj.weight"), std::string::npos) << e;
  EXPECT_NE(e.find("shape"), std::string::npos) << e;
  c = config_;
  c["tie_word_embeddings"] = true;  // then lm_head.weight is ignored ... but must the file lack nothing
  EXPECT_EQ(error_with(c), "");
  c = config_;
  c["num_hidden_layers"] = 3;
  EXPECT_NE(error_with(c).find("model.layers.2."), std::string::npos);
  c = config_;
  c["num_hidden_layers"] = 1;
  EXPECT_NE(error_with(c).find("unexpected tensor 'model.layers.1."), std::string::npos);
}

// A sliding window shorter than the context caps it.
TEST_F(LlamaBadFolder, MistralWindowCapsTheContext) {
  nlohmann::json c = config_;
  c["architectures"] = {"MistralForCausalLM"};
  c["sliding_window"] = 8;
  std::ofstream(dir_ + "/config.json") << c.dump();
  auto m = load_gpt2(dir_, nullptr);
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_EQ((*m)->config().context, 8);
}

// Decoding through the paged cache (rotary positions per row, GQA blocks of
// KV*hs floats) gives the logits of the dense forward.
TEST(LlamaDecode, PagedCacheMatchesDenseForward) {
  for (const char* name : {"llama_gqa", "qwen2_mqa"}) {
    SCOPED_TRACE(name);
    auto model = load(kDir + name);
    ASSERT_TRUE(model);
    const Batch b = batch();
    const int T = b.T, Vp = model->config().padded_vocab();
    forward_or_die(*model, b.inputs.data(), nullptr, 1, T);
    std::vector<float> dense(logits_or_die(*model), logits_or_die(*model) + int64_t{T} * Vp);
    auto cache = PagedKVCache::create(*model, 8, 4);
    ASSERT_TRUE(cache.ok()) << cache.status().message();
    EXPECT_EQ(PagedKVCache::bytes_per_block(*model, 4),
              2 * 2 * 4 * model->config().kv_dim() * static_cast<int64_t>(sizeof(float)));
    const int seq = (*cache)->add_sequence().value();
    ASSERT_TRUE((*cache)->extend(seq, T).ok());
    // A prefill of 5, then one token at a time.
    std::vector<float> got(int64_t{T} * Vp);
    for (int from = 0; from < T;) {
      const int n = from == 0 ? 5 : 1;
      std::vector<int> ids(n, seq), pos(n), rows(n);
      for (int i = 0; i < n; i++) pos[i] = from + i, rows[i] = i;
      ASSERT_TRUE(model
                      ->forward_tokens(TokenBatch{{b.inputs.data() + from, static_cast<size_t>(n)}, ids, pos}, **cache,
                                       rows, got.data() + int64_t{from} * Vp)
                      .ok());
      from += n;
    }
    EXPECT_LE(normalised_error(got.data(), dense.data(), got.size()), 1e-5);
  }
}

}  // namespace
}  // namespace tessera

namespace tessera {
namespace {

// The INT8 tier runs the family too: every matmul (the fused qkv with GQA's
// narrower key/value rows, the output projection, SwiGLU's gate and up, the
// untied head) quantized, the fp32 matmul weights released, and the logits
// of a paged prefill within INT8's error of the fp32 ones.
TEST(LlamaInt8, QuantizedFamilyTracksFp32) {
  for (const char* name : {"llama_gqa", "qwen2_mqa"}) {
    SCOPED_TRACE(name);
    auto m = load_gpt2(std::string(TESSERA_TEST_DATA_DIR) + "/reference/llama/" + name, nullptr, Backend::kCPU,
                       ModelUse::kInference);
    ASSERT_TRUE(m.ok()) << m.status().message();
    GPT& model = **m;
    const int T = 16, Vp = model.config().padded_vocab();
    std::vector<int> tokens(T), seq(T), pos(T), rows(T);
    for (int i = 0; i < T; i++) tokens[i] = (i * 11) % 99, pos[i] = i, rows[i] = i;
    auto logits = [&] {
      auto cache = PagedKVCache::create(model, 4, 16);
      EXPECT_TRUE(cache.ok());
      const int s = (*cache)->add_sequence().value();
      std::fill(seq.begin(), seq.end(), s);
      EXPECT_TRUE((*cache)->extend(s, T).ok());
      std::vector<float> out(static_cast<size_t>(T) * Vp);
      EXPECT_TRUE(model.forward_tokens(TokenBatch{tokens, seq, pos}, **cache, rows, out.data()).ok());
      return out;
    };
    const std::vector<float> fp32 = logits();
    ASSERT_TRUE(model.quantize_int8().ok());
    ASSERT_TRUE(model.release_fp32_matmul_weights().ok());
    const std::vector<float> int8 = logits();
    EXPECT_LE(testing_util::normalised_error(int8.data(), fp32.data(), static_cast<int64_t>(fp32.size())), 5e-2);
    EXPECT_GT(model.int8_bytes(), 0);
  }
}

}  // namespace
}  // namespace tessera
