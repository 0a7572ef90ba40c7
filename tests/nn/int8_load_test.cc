// Loading the INT8 tier tensor by tensor (issue #30 item 3): a model made
// with ModelUse::kInt8Inference quantizes each matmul tensor as it is read
// and never holds the fp32 matmul weights. The oracle is the fp32 model
// quantized whole (GPT::quantize_int8): the same codes, scales and logits,
// bit for bit, for GPT-2 and the Llama family (GQA, MQA with qkv biases, a
// BF16 folder). INT8 files of the family round-trip; the fp32 uses of an
// INT8-only model are refused in one line.
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "io/safetensors.h"
#include "nn/gpt.h"
#include "nn/gpt2_weights.h"
#include "nn/hf_decoder.h"
#include "nn/kv_cache.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;

const std::string kRef = TESSERA_TEST_DATA_DIR "/reference";
const char* const kModels[] = {"gpt2_tiny.safetensors", "llama/llama_gqa", "llama/qwen2_mqa", "llama/llama_gqa_bf16"};

std::unique_ptr<GPT> load(const std::string& path, ModelUse use) {
  auto m = load_gpt2(path, nullptr, Backend::kCPU, use);
  EXPECT_TRUE(m.ok()) << path << ": " << m.status().ToString();
  return m.ok() ? std::move(m).value() : nullptr;
}

// Every position's logits of one sequence through the paged cache.
std::vector<float> logits(GPT& m) {
  const int T = 12, Vp = m.config().padded_vocab();
  std::vector<int> tokens(T), seq(T), pos(T), rows(T);
  auto cache = PagedKVCache::create(m, 4, 8);
  EXPECT_TRUE(cache.ok());
  const int s = (*cache)->add_sequence().value();
  EXPECT_TRUE((*cache)->extend(s, T).ok());
  for (int i = 0; i < T; i++) tokens[i] = (i * 13 + 5) % m.config().vocab, seq[i] = s, pos[i] = rows[i] = i;
  std::vector<float> out(static_cast<size_t>(T) * Vp);
  EXPECT_TRUE(m.forward_tokens(TokenBatch{tokens, seq, pos}, **cache, rows, out.data()).ok());
  return out;
}

struct Matrices {
  std::vector<std::vector<int8_t>> w;
  std::vector<std::vector<float>> scale;
};
Matrices matrices(const GPT& m) {
  Matrices x;
  m.for_each_int8([&](int, int OC, int C, const int8_t* w, const float* s) {
    x.w.emplace_back(w, w + int64_t{OC} * C);
    x.scale.emplace_back(s, s + OC);
  });
  return x;
}

void expect_same(const GPT& a, const GPT& b) {
  const Matrices x = matrices(a), y = matrices(b);
  ASSERT_EQ(x.w.size(), y.w.size());
  for (size_t k = 0; k < x.w.size(); k++) {
    EXPECT_EQ(x.w[k], y.w[k]) << "matrix " << k;
    EXPECT_EQ(x.scale[k], y.scale[k]) << "matrix " << k;
  }
}

TEST(Int8Load, TensorByTensorEqualsQuantizingTheFp32Model) {
  for (const char* name : kModels) {
    SCOPED_TRACE(name);
    auto fp = load(kRef + "/" + name, ModelUse::kInference);
    auto st = load(kRef + "/" + name, ModelUse::kInt8Inference);
    ASSERT_TRUE(fp && st);
    ASSERT_TRUE(fp->quantize_int8().ok());
    ASSERT_TRUE(st->int8());
    EXPECT_TRUE(st->fp32_matmul_weights_released());
    expect_same(*fp, *st);
    EXPECT_EQ(logits(*fp), logits(*st));
    // The matmul weights (and an untied head) are not allocated in fp32.
    EXPECT_LT(st->params().bytes(), fp->params().bytes() / 2);
    EXPECT_EQ(st->release_fp32_matmul_weights().value(), 0);
  }
}

TEST(Int8Load, Int8FilesRoundTripForEveryFamily) {
  for (const char* name : kModels) {
    SCOPED_TRACE(name);
    auto st = load(kRef + "/" + name, ModelUse::kInt8Inference);
    ASSERT_TRUE(st);
    const fs::path dir = fs::path(testing::TempDir()) / fs::path(name).filename().concat("_int8");
    fs::remove_all(dir);
    fs::create_directories(dir);
    const std::string out = (dir / "model.safetensors").string();
    ASSERT_TRUE(save_int8(*st, out).ok());
    // Loaded as fp32 inference, an INT8 file makes an INT8 model anyway.
    for (const std::string& path : {out, dir.string()}) {
      auto back = load(path, ModelUse::kInference);
      ASSERT_TRUE(back);
      EXPECT_TRUE(back->int8());
      EXPECT_TRUE(back->fp32_matmul_weights_released());
      expect_same(*st, *back);
      EXPECT_EQ(logits(*st), logits(*back));
    }
    // Not for training: one line naming the file.
    auto train = load_gpt2(out, nullptr, Backend::kCPU, ModelUse::kTraining);
    ASSERT_FALSE(train.ok());
    EXPECT_NE(train.status().message().find("not training"), std::string::npos) << train.status().message();
  }
}

TEST(Int8Load, AnInt8OnlyModelRefusesWhatNeedsFp32Weights) {
  for (const char* name : {"gpt2_tiny.safetensors", "llama/llama_gqa"}) {
    SCOPED_TRACE(name);
    auto st = load(kRef + "/" + name, ModelUse::kInt8Inference);
    ASSERT_TRUE(st);
    const std::string out = testing::TempDir() + "/int8_only_export.safetensors";
    const Status s = save_hf(*st, out);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("never loaded"), std::string::npos) << s.message();
    EXPECT_EQ(st->quantize_int8().code(), StatusCode::kInvalidArgument);
  }
  // An INT8 model that was never filled refuses to run instead of reading
  // weights it does not have.
  GPTConfig c{1, 2, 16, 50, 32};
  auto empty = GPT::create(c, Backend::kCPU, ModelShard{}, nullptr, ModelUse::kInt8Inference);
  ASSERT_TRUE(empty.ok());
  auto cache = PagedKVCache::create(**empty, 4, 2);
  ASSERT_TRUE(cache.ok());
  const int s = (*cache)->add_sequence().value();
  ASSERT_TRUE((*cache)->extend(s, 1).ok());
  std::vector<int> tok{1}, seq{s}, pos{0}, rows{0};
  std::vector<float> out(static_cast<size_t>(c.padded_vocab()));
  EXPECT_EQ((*empty)->forward_tokens(TokenBatch{tok, seq, pos}, **cache, rows, out.data()).code(),
            StatusCode::kInvalidArgument);
}

// An INT8 file whose codes or scales are out of range is refused in one line.
TEST(Int8Load, BadCodesInAFamilyInt8FileAreOneLine) {
  auto st = load(kRef + "/llama/llama_gqa", ModelUse::kInt8Inference);
  ASSERT_TRUE(st);
  const fs::path dir = fs::path(testing::TempDir()) / "bad_int8";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string out = (dir / "model.safetensors").string();
  ASSERT_TRUE(save_int8(*st, out).ok());
  const std::string name = "model.layers.1.mlp.up_proj.weight_int8";
  uint64_t at = 0;
  {
    auto f = io::SafetensorsFile::open(out);
    ASSERT_TRUE(f.ok());
    const io::TensorInfo* t = f->find(name);
    ASSERT_NE(t, nullptr);
    const std::span<const std::byte> raw = f->raw(*t);
    std::ifstream in(out, std::ios::binary);
    uint64_t header = 0;
    in.read(reinterpret_cast<char*>(&header), 8);
    at = 8 + header + t->begin + raw.size() / 2;
  }
  {
    std::fstream io(out, std::ios::binary | std::ios::in | std::ios::out);
    io.seekp(static_cast<std::streamoff>(at));
    const char bad = static_cast<char>(-128);
    io.write(&bad, 1);
  }
  auto back = load_gpt2(dir.string(), nullptr, Backend::kCPU, ModelUse::kInference);
  ASSERT_FALSE(back.ok());
  EXPECT_NE(back.status().message().find("model.layers.1.mlp.up_proj.weight_int8"), std::string::npos)
      << back.status().message();
  EXPECT_NE(back.status().message().find("-128"), std::string::npos) << back.status().message();
}

// tessera synth model's folders: deterministic, loadable, sharded past the
// limit, written without building the model.
TEST(SynthModel, RandomFoldersAreDeterministicAndLoad) {
  DecoderConfig c = *read_hf_decoder_config(kRef + "/llama/llama_gqa/config.json");
  auto write = [&](const std::string& dir, int64_t shard) {
    fs::remove_all(dir);
    fs::create_directories(dir);
    HfSaveOptions o;
    o.dtype = io::StDType::kBF16;
    o.max_shard_bytes = shard;
    EXPECT_TRUE(save_random_hf_decoder(c, dir + "/model.safetensors", o, 7).ok());
  };
  const std::string a = testing::TempDir() + "/synth_a", b = testing::TempDir() + "/synth_b";
  write(a, int64_t{1} << 40);
  write(b, 4096);  // every tensor past the first in its own shard
  EXPECT_TRUE(fs::exists(b + "/model.safetensors.index.json"));
  auto ma = load(a, ModelUse::kInference), mb = load(b, ModelUse::kInference);
  ASSERT_TRUE(ma && mb);
  EXPECT_EQ(ma->config(), c);
  ASSERT_EQ(ma->params().bytes(), mb->params().bytes());
  EXPECT_EQ(std::memcmp(ma->params().base(), mb->params().base(), ma->params().bytes()), 0);
  // Norm weights are ones, matrices have GPT-2's spread.
  const Tensor ln = ma->params().tensor(kLn1W), qkv = ma->params().tensor(kQkvW);
  EXPECT_EQ(ln.f32()[0], 1.0f);
  double sq = 0;
  for (int64_t i = 0; i < qkv.numel(); i++) sq += double{qkv.f32()[i]} * qkv.f32()[i];
  EXPECT_NEAR(std::sqrt(sq / qkv.numel()), 0.02, 0.002);
}

}  // namespace
}  // namespace tessera
