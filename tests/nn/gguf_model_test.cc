// GGUF model files (nn/gguf_model.h): a model written by save_gguf and read
// by load_gguf gives the same logits as the model itself (F32 bit for bit;
// 4-bit files against the int4 tier's own quantization, the oracle of what
// the blocks hold), for GPT-2 and Llama shapes (grouped-query attention,
// untied and tied heads); bad files are refused in one line.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include <unistd.h>

#include "io/gguf.h"
#include "kernels/q4.h"
#include "nn/gguf_model.h"
#include "nn/gpt.h"
#include "nn/gpt2_weights.h"
#include "nn/kv_cache.h"
#include "nn/forward_util.h"
#include "test_util.h"
#include "aborting.h"

namespace tessera {
namespace {

using testing_util::all_logits;
using testing_util::make_gpt;
using testing_util::tiny_gpt2;

std::string temp_path(const std::string& name) {
  return testing::TempDir() + "/" + name + "_" + std::to_string(::getpid()) + ".gguf";
}

DecoderConfig llama(int heads, int kv_heads, bool tied) {
  DecoderConfig c;
  c.norm = Norm::kRMSNorm;
  c.positions = Positions::kRope;
  c.mlp = Mlp::kSwiGLU;
  c.qkv_bias = false;
  c.bias = false;
  c.layers = 2;
  c.heads = heads;
  c.kv_heads = kv_heads;
  c.channels = 256;
  c.mlp_hidden = 512;
  c.vocab = 300;
  c.context = 64;
  c.rope_theta = 10000.0;
  c.tied_head = tied;
  return c;
}

std::unique_ptr<GPT> random_model(const DecoderConfig& c, uint64_t seed) {
  auto m = make_gpt(c, Backend::kCPU, ModelShard{}, nullptr, ModelUse::kInference);
  m->init_weights(seed);
  return m;
}

std::vector<int> some_tokens(int V, int n) {
  std::vector<int> t(n);
  for (int i = 0; i < n; i++) t[i] = (i * 37 + 11) % V;
  return t;
}

std::unique_ptr<GPT> round_trip(const GPT& m, GgufWeights w, const std::string& name) {
  const std::string path = temp_path(name);
  Status st = save_gguf(m, path, w);
  EXPECT_TRUE(st.ok()) << st.message();
  auto back = load_gpt2(path, nullptr, Backend::kCPU, ModelUse::kInference);  // by its magic
  EXPECT_TRUE(back.ok()) << back.status().message();
  std::remove(path.c_str());
  return back.ok() ? std::move(back).value() : nullptr;
}

// f's metadata and tensors again, tensor `name` replaced by (type, ne, bytes).
io::GgufWriter copy_replacing(const io::GgufFile& f, const std::string& name, io::GgmlType type,
                              const std::vector<int64_t>& ne, const std::vector<uint8_t>& bytes) {
  io::GgufWriter w;
  for (const io::GgufKv& kv : f.metadata()) w.set(kv.key, kv.value);
  for (const io::GgufTensorInfo& t : f.tensors()) {
    if (t.name == name) {
      w.add_tensor(t.name, type, ne, bytes);
      continue;
    }
    auto b = f.tensor_bytes(t);
    w.add_tensor(t.name, t.type, t.ne, std::vector<uint8_t>(b.begin(), b.end()));
  }
  return w;
}

// m written to a GGUF file of `weights`, read back as the INT8 tier and as
// the whole fp32 model quantized in memory afterwards (nullptrs, with the
// failure recorded, when either cannot be had).
std::pair<std::unique_ptr<GPT>, std::unique_ptr<GPT>> int8_tier_and_whole(const GPT& m, GgufWeights weights,
                                                                            const std::string& name) {
  const std::string path = temp_path(name);
  Status st = save_gguf(m, path, weights);
  EXPECT_TRUE(st.ok()) << st.message();
  auto tier = load_gguf(path, Backend::kCPU, ModelUse::kInt8Inference);
  auto whole = load_gguf(path, Backend::kCPU, ModelUse::kInference);
  std::remove(path.c_str());
  EXPECT_TRUE(tier.ok()) << tier.status().message();
  EXPECT_TRUE(whole.ok()) << whole.status().message();
  if (!tier.ok() || !whole.ok()) return {};
  st = (*whole)->quantize_int8();
  EXPECT_TRUE(st.ok()) << st.message();
  if (!st.ok()) return {};
  return {std::move(tier).value(), std::move(whole).value()};
}

TEST(GgufModel, Gpt2F32GivesTheSameLogitsBitForBit) {
  auto m = tiny_gpt2();
  auto back = round_trip(*m, GgufWeights::kF32, "gpt2_f32");
  ASSERT_NE(back, nullptr);
  EXPECT_EQ(back->config(), m->config());
  EXPECT_FALSE(back->int4());
  const std::vector<int> t = some_tokens(m->config().vocab, 20);
  EXPECT_EQ(all_logits(*back, t), all_logits(*m, t));
}

TEST(GgufModel, LlamaF32GivesTheSameLogitsBitForBit) {
  for (auto [heads, kv, tied] : {std::tuple{8, 2, false}, std::tuple{8, 8, true}, std::tuple{8, 1, false}}) {
    auto m = random_model(llama(heads, kv, tied), 3);
    auto back = round_trip(*m, GgufWeights::kF32, "llama_f32");
    ASSERT_NE(back, nullptr);
    EXPECT_EQ(back->config(), m->config()) << back->config().str();
    const std::vector<int> t = some_tokens(300, 24);
    EXPECT_EQ(all_logits(*back, t), all_logits(*m, t)) << heads << " heads, " << kv << " kv";
  }
}

// A Qwen2-shaped model (the Llama family with q, k and v biases) travels as
// GGUF's qwen2 architecture: its query and key rows unpermuted (llama.cpp
// rotates their halves), its biases in the heads' order. The biases are
// made random here (init_weights zeroes them), so that a misplaced element
// shows in the logits.
TEST(GgufModel, Qwen2F32GivesTheSameLogitsBitForBit) {
  for (auto [heads, kv, tied] : {std::tuple{8, 2, true}, std::tuple{8, 8, false}}) {
    DecoderConfig c = llama(heads, kv, tied);
    c.qkv_bias = true;
    auto m = random_model(c, 9);
    Tensor b = m->params().tensor(kQkvB);
    const std::vector<float> r = testing_util::uniform(static_cast<size_t>(b.numel()), 13, -0.5f, 0.5f);
    std::copy(r.begin(), r.end(), b.f32());
    const std::string path = temp_path("qwen2");
    ASSERT_TRUE(save_gguf(*m, path, GgufWeights::kF32).ok());
    {
      auto f = io::GgufFile::open(path);
      ASSERT_TRUE(f.ok());
      EXPECT_EQ(*f->get_string("general.architecture"), "qwen2");
      EXPECT_NE(f->find_tensor("blk.1.attn_q.bias"), nullptr);
    }
    auto back = load_gguf(path, Backend::kCPU, ModelUse::kInference);
    std::remove(path.c_str());
    ASSERT_TRUE(back.ok()) << back.status().message();
    EXPECT_EQ((*back)->config(), c) << (*back)->config().str();
    const std::vector<int> t = some_tokens(300, 24);
    EXPECT_EQ(all_logits(**back, t), all_logits(*m, t)) << heads << " heads, " << kv << " kv";
  }
}

// Llama 3's rotary scaling travels as llama.cpp's converter writes it: the
// divisors in tensor rope_freqs.weight, no metadata. A scaled model written
// and read back is the same model (the same config, the same logits bit for
// bit), and the divisors are transformers' formula's
// (_compute_llama3_parameters, in double here).
TEST(GgufModel, Llama3RotaryScalingTravelsAsRopeFreqs) {
  DecoderConfig c = llama(8, 2, false);  // hs 32: 16 frequencies
  c.rope_scaling = RopeScaling{RopeScaling::Kind::kLlama3, 8.0, 1.0, 4.0, 8192};
  auto m = random_model(c, 5);
  const std::string path = temp_path("llama3");
  ASSERT_TRUE(save_gguf(*m, path, GgufWeights::kF32).ok());
  {
    auto f = io::GgufFile::open(path);
    ASSERT_TRUE(f.ok()) << f.status().message();
    const io::GgufTensorInfo* t = f->find_tensor("rope_freqs.weight");
    ASSERT_NE(t, nullptr);
    ASSERT_EQ(t->type, io::GgmlType::kF32);
    ASSERT_EQ(t->shape(), std::vector<int64_t>{16});
    std::vector<float> got(16);
    std::memcpy(got.data(), f->tensor_bytes(*t).data(), sizeof(float) * 16);
    int ones = 0, factors = 0, between = 0;
    for (int i = 0; i < 16; i++) {
      const double wavelen = 2.0 * M_PI * std::pow(10000.0, 2.0 * i / 32.0);
      double want = 8.0;
      if (wavelen < 8192.0 / 4.0) {
        want = 1.0, ones++;
      } else if (wavelen > 8192.0) {
        factors++;
      } else {
        const double smooth = (8192.0 / wavelen - 1.0) / 3.0;
        want = 1.0 / ((1.0 - smooth) / 8.0 + smooth), between++;
      }
      EXPECT_NEAR(got[i], want, 1e-5 * want) << "divisor " << i;
    }
    EXPECT_GT(ones, 0);
    EXPECT_GT(factors, 0);
    EXPECT_GE(between, 2);
    EXPECT_FALSE(f->has("llama.rope.scaling.type"));
  }
  auto back = load_gguf(path, Backend::kCPU, ModelUse::kInference);
  std::remove(path.c_str());
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ((*back)->config(), c) << (*back)->config().str();
  const std::vector<int> t = some_tokens(300, 24);
  EXPECT_EQ(all_logits(**back, t), all_logits(*m, t));

  // Other numbers of the same shape: the file's divisors give back a
  // scaling with low_freq_factor 1 and the same divisors (here original
  // context 4096, low 2, high 8 -> 2048, 1, 4), and the model's logits to
  // the rounding of the frequencies.
  DecoderConfig other = c;
  other.rope_scaling = RopeScaling{RopeScaling::Kind::kLlama3, 16.0, 2.0, 8.0, 4096};
  auto m2 = random_model(other, 6);
  auto back2 = round_trip(*m2, GgufWeights::kF32, "llama3_other");
  ASSERT_NE(back2, nullptr);
  const RopeScaling& r = back2->config().rope_scaling;
  EXPECT_EQ(r.kind, RopeScaling::Kind::kLlama3);
  EXPECT_EQ(r.factor, 16.0);
  EXPECT_EQ(r.low_freq_factor, 1.0);
  EXPECT_NEAR(r.high_freq_factor, 4.0, 1e-3);
  EXPECT_EQ(r.original_context, 2048);
  const std::vector<float> a = back2->config().llama3_rope_factors(), b = other.llama3_rope_factors();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); i++) EXPECT_NEAR(a[i], b[i], 1e-5 * b[i]) << i;
  const std::vector<float> la = all_logits(*back2, t), lb = all_logits(*m2, t);
  ASSERT_EQ(la.size(), lb.size());
  for (size_t i = 0; i < la.size(); i++) ASSERT_NEAR(la[i], lb[i], 1e-4f) << i;
}

// rope_freqs.weight that is not Llama 3's scaling is refused in one line
// naming the tensor; all ones is no scaling.
TEST(GgufModel, RopeFreqsThatAreNotLlama3sAreRefused) {
  DecoderConfig c = llama(8, 2, false);
  c.rope_scaling = RopeScaling{RopeScaling::Kind::kLlama3, 8.0, 1.0, 4.0, 8192};
  auto m = random_model(c, 7);
  const std::string path = temp_path("llama3_src");
  ASSERT_TRUE(save_gguf(*m, path, GgufWeights::kF32).ok());
  auto f = io::GgufFile::open(path);
  ASSERT_TRUE(f.ok());
  std::vector<float> good(16);
  std::memcpy(good.data(), f->tensor_bytes(*f->find_tensor("rope_freqs.weight")).data(), sizeof(float) * 16);
  // The file again with rope_freqs.weight replaced: the load's result.
  auto with = [&](const std::vector<float>& values, io::GgmlType type) {
    std::vector<uint8_t> bytes(values.size() * (type == io::GgmlType::kF32 ? 4 : 2));
    if (type == io::GgmlType::kF32) std::memcpy(bytes.data(), values.data(), bytes.size());
    io::GgufWriter w = copy_replacing(*f, "rope_freqs.weight", type, {static_cast<int64_t>(values.size())}, bytes);
    const std::string edited = temp_path("llama3_edited");
    EXPECT_TRUE(w.write(edited).ok());
    auto r = load_gguf(edited);
    std::remove(edited.c_str());
    return r;
  };
  auto expect_refused = [&](const std::vector<float>& values, io::GgmlType type, const std::string& words) {
    auto r = with(values, type);
    ASSERT_FALSE(r.ok()) << words;
    EXPECT_NE(r.status().message().find("rope_freqs.weight"), std::string::npos) << r.status().message();
    EXPECT_NE(r.status().message().find(words), std::string::npos) << r.status().message();
    EXPECT_EQ(r.status().message().find('\n'), std::string::npos);
  };
  std::vector<float> short_one(good.begin(), good.end() - 1), below = good, bent = good, nan = good;
  below[3] = 0.5f;
  nan[5] = std::nanf("");
  int smooth = 0;
  while (!(good[smooth] > 1.0f && good[smooth] < 8.0f)) smooth++;
  bent[smooth] *= 1.05f;
  expect_refused(short_one, io::GgmlType::kF32, "is 16 F32 values");
  expect_refused(good, io::GgmlType::kF16, "F16 of shape [16]");
  expect_refused(below, io::GgmlType::kF32, "divisor 3 is 0.5");
  expect_refused(nan, io::GgmlType::kF32, "divisor 5 is nan");
  expect_refused(bent, io::GgmlType::kF32, "not Llama 3's rotary scaling");
  auto plain = with(std::vector<float>(16, 1.0f), io::GgmlType::kF32);
  ASSERT_TRUE(plain.ok()) << plain.status().message();
  EXPECT_EQ((*plain)->config().rope_scaling.kind, RopeScaling::Kind::kNone);
  // Both a scaling type and the divisors.
  const std::string both = temp_path("llama3_both");
  ASSERT_TRUE(save_gguf(*m, both, GgufWeights::kF32, [](io::GgufWriter& w) {
                w.set_string("llama.rope.scaling.type", "linear");
                w.set_float32("llama.rope.scaling.factor", 2.0f);
                return Status::OK();
              }).ok());
  auto r = load_gguf(both);
  std::remove(both.c_str());
  std::remove(path.c_str());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("both rope.scaling.type and tensor 'rope_freqs.weight'"), std::string::npos)
      << r.status().message();
}

// The file's tensors are laid out as llama.cpp reads them (llama, then qwen2): shapes in ggml
// order, the query rows permuted for its rotary kernel.
TEST(GgufModel, LlamaTensorsAreInLlamaCppsLayout) {
  const DecoderConfig c = llama(8, 8, false);
  auto m = random_model(c, 4);
  const std::string path = temp_path("llama_layout");
  ASSERT_TRUE(save_gguf(*m, path, GgufWeights::kF32).ok());
  auto f = io::GgufFile::open(path);
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_EQ(*f->get_string("general.architecture"), "llama");
  EXPECT_EQ(*f->get_uint("llama.attention.head_count_kv"), 8u);
  const io::GgufTensorInfo* q = f->find_tensor("blk.0.attn_q.weight");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->ne, (std::vector<int64_t>{256, 256}));
  // With one group (KV == NH) Tessera's head order is HF's: file row 1 of
  // head 0 is HF row hs/2 = 16, which is the model's qkv row 16.
  std::vector<float> qw(static_cast<size_t>(q->numel()));
  ASSERT_TRUE(f->read_f32("blk.0.attn_q.weight", qw).ok());
  const float* qkv = m->layer_params(0).qkvw;
  for (int col = 0; col < 256; col++) ASSERT_EQ(qw[256 + col], qkv[16 * 256 + col]);
  EXPECT_EQ(f->find_tensor("output.weight")->ne, (std::vector<int64_t>{256, 300}));
  std::remove(path.c_str());

  // qwen2 keeps Hugging Face's rows (llama.cpp's NEOX rotary): file row 1
  // is the model's row 1, and the query bias is in the same order.
  DecoderConfig qc = c;
  qc.qkv_bias = true;
  auto qm = random_model(qc, 4);
  Tensor qb = qm->params().tensor(kQkvB);
  for (int64_t i = 0; i < qb.numel(); i++) qb.f32()[i] = static_cast<float>(i);
  ASSERT_TRUE(save_gguf(*qm, path, GgufWeights::kF32).ok());
  auto qf = io::GgufFile::open(path);
  ASSERT_TRUE(qf.ok()) << qf.status().message();
  EXPECT_EQ(*qf->get_string("general.architecture"), "qwen2");
  ASSERT_TRUE(qf->read_f32("blk.0.attn_q.weight", qw).ok());
  const float* qqkv = qm->layer_params(0).qkvw;
  for (int col = 0; col < 256; col++) ASSERT_EQ(qw[256 + col], qqkv[256 + col]);
  std::vector<float> bias(256);
  ASSERT_TRUE(qf->read_f32("blk.0.attn_q.bias", bias).ok());
  for (int i = 0; i < 256; i++) ASSERT_EQ(bias[i], static_cast<float>(i));
  std::remove(path.c_str());
}

TEST(GgufModel, Q4_0Gpt2EqualsTheInt4TierBitForBit) {
  auto m = tiny_gpt2();
  auto back = round_trip(*m, GgufWeights::kQ4_0, "gpt2_q4_0");
  ASSERT_NE(back, nullptr);
  EXPECT_TRUE(back->int4());
  EXPECT_TRUE(back->fp32_matmul_weights_released());  // never held: the blocks are the file's
  auto q = tiny_gpt2();
  ASSERT_TRUE(q->quantize_q4(q4::Type::kQ4_0).ok());
  EXPECT_EQ(back->q4_bytes(), q->q4_bytes());
  const std::vector<int> t = some_tokens(m->config().vocab, 20);
  EXPECT_EQ(all_logits(*back, t), all_logits(*q, t));
}

// Multi-head: the rows move (rotary permutation), each row's blocks stay
// the same, so the products are the int4 tier's own, bit for bit.
TEST(GgufModel, Q4_KLlamaEqualsTheInt4TierBitForBit) {
  const DecoderConfig c = llama(8, 8, false);
  auto m = random_model(c, 5);
  auto back = round_trip(*m, GgufWeights::kQ4_K, "llama_q4_k");
  ASSERT_NE(back, nullptr);
  EXPECT_TRUE(back->int4());
  auto q = random_model(c, 5);
  ASSERT_TRUE(q->quantize_q4(q4::Type::kQ4_K).ok());
  const std::vector<int> t = some_tokens(300, 24);
  EXPECT_EQ(all_logits(*back, t), all_logits(*q, t));
}

// Grouped-query: the attention projection's columns are in HF's head order
// in the file. Q4_0 blocks (32) move whole within the head size; Q4_K
// blocks (256) cannot, and the input is gathered instead. Either way the
// logits are the int4 tier's within fp32 rounding (Q4_0: the same blocks
// summed in another order) or within 4-bit error (Q4_K: the projection's
// blocks cut along other columns).
TEST(GgufModel, GroupedQueryInt4FilesMatchTheInt4Tier) {
  const DecoderConfig c = llama(8, 2, false);
  const std::vector<int> t = some_tokens(300, 24);
  auto fp = random_model(c, 6);
  const std::vector<float> ref = all_logits(*fp, t);
  for (q4::Type type : {q4::Type::kQ4_0, q4::Type::kQ4_K}) {
    auto back = round_trip(*fp, type == q4::Type::kQ4_0 ? GgufWeights::kQ4_0 : GgufWeights::kQ4_K, "gqa_q4");
    ASSERT_NE(back, nullptr);
    auto q = random_model(c, 6);
    ASSERT_TRUE(q->quantize_q4(type).ok());
    const std::vector<float> a = all_logits(*back, t), b = all_logits(*q, t);
    const double err = testing_util::normalised_error(a.data(), b.data(), static_cast<int64_t>(a.size()));
    EXPECT_LE(err, type == q4::Type::kQ4_0 ? 1e-5 : 0.1) << q4::type_name(type);
    EXPECT_LE(testing_util::normalised_error(a.data(), ref.data(), static_cast<int64_t>(a.size())), 0.25);
  }
}

// A tied Llama's Q4_0 file: the int4 tier keeps token_embd as its Q4_0
// rows (quantized_embeddings) and looks them up. The reference: the same
// model with its fp32 table set to those rows' values, quantized in memory
// (the layers' blocks are the file's; the tied head's re-quantize to the
// file's, a Q4_0 block's values giving back themselves), so the logits are
// the same bit for bit.
TEST(GgufModel, QuantizedEmbeddingsLookUpTheFilesRows) {
  const DecoderConfig c = llama(8, 8, true);
  auto m = random_model(c, 13);
  const std::string path = temp_path("tied_q4_0");
  ASSERT_TRUE(save_gguf(*m, path, GgufWeights::kQ4_0).ok());
  auto tier = load_gguf(path, Backend::kCPU, ModelUse::kInference);
  auto f = io::GgufFile::open(path);
  std::remove(path.c_str());
  ASSERT_TRUE(tier.ok()) << tier.status().message();
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_TRUE((*tier)->int4());
  EXPECT_TRUE((*tier)->quantized_embeddings());
  const io::GgufTensorInfo* embd = f->find_tensor("token_embd.weight");
  ASSERT_EQ(embd->type, io::GgmlType::kQ4_0);
  const int64_t rb = q4::row_bytes(q4::Type::kQ4_0, c.channels);
  float* wte = m->params().tensor(kWte).f32();
  for (int v = 0; v < c.vocab; v++)
    q4::dequantize_row(q4::Type::kQ4_0, wte + int64_t{v} * c.channels, f->tensor_bytes(*embd).data() + v * rb,
                       c.channels);
  ASSERT_TRUE(m->quantize_q4(q4::Type::kQ4_0).ok());
  EXPECT_FALSE(m->quantized_embeddings());
  const std::vector<int> t = some_tokens(300, 24);
  EXPECT_EQ(all_logits(**tier, t), all_logits(*m, t));
}

TEST(GgufModel, F16AndQ8_0LoadAsFp32CloseToTheModel) {
  const DecoderConfig c = llama(8, 2, false);
  auto m = random_model(c, 7);
  const std::vector<int> t = some_tokens(300, 24);
  const std::vector<float> ref = all_logits(*m, t);
  for (GgufWeights w : {GgufWeights::kF16, GgufWeights::kQ8_0}) {
    auto back = round_trip(*m, w, "llama_f16_q8");
    ASSERT_NE(back, nullptr);
    EXPECT_FALSE(back->int4());
    EXPECT_FALSE(back->int8());
    const std::vector<float> got = all_logits(*back, t);
    const double err = testing_util::normalised_error(got.data(), ref.data(), static_cast<int64_t>(ref.size()));
    EXPECT_GT(err, 0.0);
    EXPECT_LE(err, w == GgufWeights::kF16 ? 1e-3 : 2e-2);
  }
}

// The INT8 tier from a file that is not 4-bit quantizes each matmul weight
// as it reads it (fp32 matmul weights never allocated): every INT8 matrix
// and scale bit for bit those of loading the fp32 model and quantizing it
// whole (the row moves of grouped-query and rotary layouts, the projection's
// columns, a tied or untied head with its padding rows), and so the logits.
TEST(GgufModel, Int8TierFromAFileEqualsQuantizingTheFp32Model) {
  struct Case {
    std::string name;
    std::unique_ptr<GPT> model;
  };
  std::vector<Case> cases;
  cases.push_back({"gpt2", tiny_gpt2()});
  cases.push_back({"llama gqa untied", random_model(llama(8, 2, false), 8)});
  cases.push_back({"llama tied", random_model(llama(8, 8, true), 9)});
  for (const Case& k : cases) {
    for (GgufWeights w : {GgufWeights::kF32, GgufWeights::kQ8_0}) {
      SCOPED_TRACE(k.name + (w == GgufWeights::kF32 ? " f32" : " q8_0"));
      auto [tier, whole] = int8_tier_and_whole(*k.model, w, "int8_tier");
      ASSERT_TRUE(tier && whole);
      EXPECT_TRUE(tier->int8());
      EXPECT_TRUE(tier->fp32_matmul_weights_released()) << "never held";
      std::vector<std::vector<int8_t>> codes;
      std::vector<std::vector<float>> scales;
      whole->for_each_int8([&](int, int OC, int C, const int8_t* q, const float* s) {
        codes.emplace_back(q, q + static_cast<size_t>(OC) * C);
        scales.emplace_back(s, s + OC);
      });
      size_t n = 0;
      tier->for_each_int8([&](int index, int OC, int C, const int8_t* q, const float* s) {
        ASSERT_LT(n, codes.size());
        EXPECT_EQ(std::vector<int8_t>(q, q + static_cast<size_t>(OC) * C), codes[n]) << "matrix " << index;
        EXPECT_EQ(std::vector<float>(s, s + OC), scales[n]) << "matrix " << index;
        n++;
      });
      EXPECT_EQ(n, codes.size());
      const std::vector<int> t = some_tokens(tier->config().vocab, 20);
      EXPECT_EQ(all_logits(*tier, t), all_logits(*whole, t));
      // A Q8_0 file's embeddings are Q8_0 rows (as llama.cpp's converter
      // writes them): the tier keeps those rows (the fp32 table given back)
      // and looks them up in both forwards, with the same values.
      EXPECT_EQ(tier->quantized_embeddings(), w == GgufWeights::kQ8_0);
      const std::vector<int> targets(t.begin() + 1, t.end());
      const std::vector<int> inputs(t.begin(), t.end() - 1);
      auto a = tier->try_forward(inputs.data(), targets.data(), 1, static_cast<int>(inputs.size()));
      auto b = whole->try_forward(inputs.data(), targets.data(), 1, static_cast<int>(inputs.size()));
      ASSERT_TRUE(a.ok() && b.ok());
      EXPECT_EQ(*a, *b);
    }
  }
}

// Tensors of more than 2^20 elements load a chunk of rows at a time (the
// query rows' rotary permutation, the projection's columns, the INT8 rows'
// codes and the head across chunks): the same model as the file's, bit for
// bit, and the INT8 tier the same as quantizing it whole.
TEST(GgufModel, TensorsOverAChunkLoadAsWholeOnes) {
  DecoderConfig c = llama(8, 2, false);
  c.layers = 1;
  c.channels = 1088;  // 8 heads of 136: attn_q and attn_output 1088 x 1088
  c.mlp_hidden = 256;
  c.vocab = 1100;  // token_embd and output 1100 x 1088
  auto m = random_model(c, 12);
  const std::vector<int> t = some_tokens(c.vocab, 12);
  auto back = round_trip(*m, GgufWeights::kF32, "chunks_f32");
  ASSERT_NE(back, nullptr);
  EXPECT_EQ(all_logits(*back, t), all_logits(*m, t));
  auto [tier, whole] = int8_tier_and_whole(*m, GgufWeights::kQ8_0, "chunks_q8_0");
  ASSERT_TRUE(tier && whole);
  EXPECT_EQ(all_logits(*tier, t), all_logits(*whole, t));
}

// A file whose tensor is of a type Tessera does not read, an architecture
// it does not build, a missing tensor and a misshapen one: one line each,
// naming what is wrong.
TEST(GgufModel, RefusalsNameWhatIsWrong) {
  auto m = tiny_gpt2();
  auto expect_refused = [&](const std::function<void(io::GgufWriter&)>& edit, const std::string& words) {
    const std::string path = temp_path("refused");
    Status st = save_gguf(*m, path, GgufWeights::kF32, [&](io::GgufWriter& w) {
      edit(w);
      return Status::OK();
    });
    ASSERT_TRUE(st.ok()) << st.message();
    auto r = load_gguf(path);
    ASSERT_FALSE(r.ok()) << words;
    EXPECT_NE(r.status().message().find(words), std::string::npos) << r.status().message();
    EXPECT_EQ(r.status().message().find('\n'), std::string::npos);
    std::remove(path.c_str());
  };
  expect_refused([](io::GgufWriter& w) { w.set_string("general.architecture", "falcon"); }, "architecture 'falcon'");
  expect_refused([](io::GgufWriter& w) { w.set_uint32("gpt2.block_count", 3); }, "'blk.2.attn_norm.weight' is missing");
  expect_refused([](io::GgufWriter& w) { w.set_uint32("gpt2.context_length", 64); },
                 "tensor 'position_embd.weight' has shape [32, 64]");
  expect_refused([](io::GgufWriter& w) { w.set_uint32("gpt2.embedding_length", 32); }, "is not 4 x 32");
  expect_refused(
      [](io::GgufWriter& w) {
        w.add_tensor("blk.9.ffn_up.weight", io::GgmlType::kQ5_0, {32, 2}, std::vector<uint8_t>(2 * 22, 0));
      },
      "unexpected tensor 'blk.9.ffn_up.weight'");
  expect_refused(
      [](io::GgufWriter& w) {
        w.add_tensor("rope_freqs.weight", io::GgmlType::kF32, {8}, std::vector<uint8_t>(32, 0));
      },
      "unexpected tensor 'rope_freqs.weight'");
  // A 4-bit file is for the CPU tier, not training.
  const std::string path = temp_path("q4_train");
  ASSERT_TRUE(save_gguf(*m, path, GgufWeights::kQ4_0).ok());
  EXPECT_EQ(load_gguf(path, Backend::kCPU, ModelUse::kTraining).status().code(), StatusCode::kInvalidArgument);
  std::remove(path.c_str());
}

TEST(GgufModel, TypesTesseraDoesNotReadAreNamed) {
  // An IQ4_NL matmul weight in a hand-made file.
  auto m = tiny_gpt2();
  const std::string path = temp_path("iq4");
  ASSERT_TRUE(save_gguf(*m, path, GgufWeights::kF32).ok());
  auto f = io::GgufFile::open(path);
  ASSERT_TRUE(f.ok());
  const io::GgufTensorInfo* up = f->find_tensor("blk.0.ffn_up.weight");
  ASSERT_NE(up, nullptr);
  io::GgufWriter w = copy_replacing(*f, up->name, io::GgmlType::kIQ4_NL, up->ne,
                                    std::vector<uint8_t>(up->numel() / 32 * 18, 0));
  const std::string path2 = temp_path("iq4b");
  ASSERT_TRUE(w.write(path2).ok());
  auto r = load_gguf(path2);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("'blk.0.ffn_up.weight' is IQ4_NL"), std::string::npos) << r.status().message();
  std::remove(path.c_str());
  std::remove(path2.c_str());
}

TEST(GgufModel, SaveRefusesWhatGgufCannotHold) {
  auto m = tiny_gpt2();
  ASSERT_TRUE(m->quantize_q4(q4::Type::kQ4_0).ok());
  ASSERT_TRUE(m->release_fp32_matmul_weights().ok());
  EXPECT_EQ(save_gguf(*m, temp_path("released"), GgufWeights::kQ4_0).code(), StatusCode::kInvalidArgument);
}

// llama.cpp's own quantized files (tests/reference/llamacpp, written by
// llama-quantize: tests/reference/make_llamacpp_quantized.sh): a one-layer
// grouped-query Llama at Q4_K_M (Q4_K matrices; attn_v, ffn_down, output
// and, by override, attn_output at Q6_K), at Q4_0 (Q4_0 token_embd, Q6_K
// output), at Q4_K_S (attn_v Q5_K, output Q6_K) and at Q5_K_M with attn_q,
// attn_k and ffn_up overridden to Q5_0, Q5_1 and Q4_1, as users bring them.
std::string llamacpp_file(const std::string& name) { return TESSERA_TEST_DATA_DIR "/reference/llamacpp/" + name; }

// Every tensor listed in the index (name and element count a line) read as
// fp32 equals llama.cpp's own dequantization of it (llama-quantize to F32:
// ggml's dequantize_row_*), bit for bit; returns the tensors' types.
std::vector<io::GgmlType> expect_dequantized_as_llamacpp(const std::string& file, const std::string& deq) {
  std::vector<io::GgmlType> types;
  auto f = io::GgufFile::open(llamacpp_file(file));
  EXPECT_TRUE(f.ok()) << f.status().message();
  if (!f.ok()) return types;
  std::ifstream index(llamacpp_file(deq + ".txt"));
  std::ifstream values(llamacpp_file(deq + ".bin"), std::ios::binary);
  std::string name;
  int64_t count = 0;
  while (index >> name >> count) {
    SCOPED_TRACE(name);
    const io::GgufTensorInfo* t = f->find_tensor(name);
    EXPECT_NE(t, nullptr);
    if (t == nullptr) continue;
    EXPECT_EQ(t->numel(), count);
    std::vector<float> want(static_cast<size_t>(count)), got(static_cast<size_t>(count));
    values.read(reinterpret_cast<char*>(want.data()), static_cast<std::streamsize>(count * sizeof(float)));
    EXPECT_TRUE(values.good());
    EXPECT_TRUE(f->read_f32(name, got).ok());
    EXPECT_EQ(got, want) << io::ggml_type_name(t->type);
    types.push_back(t->type);
  }
  return types;
}

TEST(LlamaCppFiles, Q6KTensorsDequantizeAsLlamaCppDoes) {
  const std::vector<io::GgmlType> types = expect_dequantized_as_llamacpp("tiny-q4_k_m.gguf", "tiny-q6_k-deq");
  EXPECT_EQ(types, std::vector<io::GgmlType>(4, io::GgmlType::kQ6_K));
}

TEST(LlamaCppFiles, Q5KQ5_0Q5_1AndQ4_1TensorsDequantizeAsLlamaCppDoes) {
  const std::vector<io::GgmlType> types = expect_dequantized_as_llamacpp("tiny-q5_k_m.gguf", "tiny-q5-deq");
  for (io::GgmlType t : {io::GgmlType::kQ5_K, io::GgmlType::kQ5_0, io::GgmlType::kQ5_1, io::GgmlType::kQ4_1})
    EXPECT_NE(std::find(types.begin(), types.end(), t), types.end()) << io::ggml_type_name(t);
}

// The file with every tensor of a type the int4 tier requantizes (Q6_K,
// Q5_K, ...) replaced by Q4_K blocks of its values (q4::quantize_rows, the
// int4 tier's own quantizer), everything else as it was: what the 4-bit
// tier should make of the original.
std::string requantized_to_q4_k(const std::string& path, const std::string& name) {
  auto f = io::GgufFile::open(path);
  EXPECT_TRUE(f.ok()) << f.status().message();
  io::GgufWriter w;
  for (const io::GgufKv& kv : f->metadata()) w.set(kv.key, kv.value);
  for (const io::GgufTensorInfo& t : f->tensors()) {
    if (t.type == io::GgmlType::kQ6_K || t.type == io::GgmlType::kQ5_K) {
      const int64_t cols = t.ne[0], rows = t.numel() / cols;
      std::vector<float> x(static_cast<size_t>(t.numel()));
      EXPECT_TRUE(f->read_f32(t.name, x).ok());
      std::vector<uint8_t> blocks(static_cast<size_t>(rows * q4::row_bytes(q4::Type::kQ4_K, cols)));
      q4::quantize_rows(q4::Type::kQ4_K, blocks.data(), x.data(), rows, cols);
      w.add_tensor(t.name, io::GgmlType::kQ4_K, t.ne, std::move(blocks));
    } else {
      auto b = f->tensor_bytes(t);
      w.add_tensor(t.name, t.type, t.ne, std::vector<uint8_t>(b.begin(), b.end()));
    }
  }
  const std::string out = temp_path(name);
  EXPECT_TRUE(w.write(out).ok());
  return out;
}

// A Q4_K_M file loads into the 4-bit tier: its Q6_K matrices (a fused
// qkv's v rows, a projection's permuted columns, ffn_down) requantized to
// Q4_K, the Q6_K head too; the same logits, bit for bit, as the file whose
// Q6_K tensors were made Q4_K beforehand. The same for a Q4_K_S file (its
// Q5_K attn_v). A Q4_0 file with a Q6_K head (its matrices Q4_0) keeps its
// Q4_0 embeddings.
TEST(LlamaCppFiles, MixedQ6KFilesLoadIntoTheInt4Tier) {
  for (const char* file : {"tiny-q4_k_m.gguf", "tiny-q4_k_s.gguf", "tiny-q4_0.gguf"}) {
    SCOPED_TRACE(file);
    auto m = load_gguf(llamacpp_file(file));
    ASSERT_TRUE(m.ok()) << m.status().message();
    EXPECT_TRUE((*m)->int4());
    EXPECT_EQ((*m)->config().kv(), 2);
    EXPECT_TRUE((*m)->quantized_embeddings()) << "a Q4_K / Q4_0 token_embd kept as its rows";
    const std::string oracle_path = requantized_to_q4_k(llamacpp_file(file), "q6k_oracle");
    auto oracle = load_gguf(oracle_path);
    std::remove(oracle_path.c_str());
    ASSERT_TRUE(oracle.ok()) << oracle.status().message();
    const std::vector<int> t = some_tokens(256, 24);
    const std::vector<float> got = all_logits(**m, t), want = all_logits(**oracle, t);
    EXPECT_EQ(got, want);
    for (float v : got) ASSERT_TRUE(std::isfinite(v));
  }
}

// The INT8 tier and the fp32 model read a Q6_K tensor through its values: a
// file that is not mostly 4-bit (every matrix Q6_K, as llama-quantize's Q6_K
// type writes) loads into either, the fp32 model's matrices exactly
// llama.cpp's dequantized values (the INT8 tier: those quantized).
TEST(LlamaCppFiles, Q6KFilesLoadIntoTheInt8TierAndFp32) {
  auto f = io::GgufFile::open(llamacpp_file("tiny-q4_k_m.gguf"));
  ASSERT_TRUE(f.ok()) << f.status().message();
  // Q6_K everywhere the Q4_K_M file has a Q4_K matrix: its own Q6_K bytes
  // reused (ffn_down's for the 256 x 256 ones, attn_v's for attn_k).
  io::GgufWriter w;
  for (const io::GgufKv& kv : f->metadata()) w.set(kv.key, kv.value);
  auto bytes_of = [&](const char* n) {
    auto b = f->tensor_bytes(*f->find_tensor(n));
    return std::vector<uint8_t>(b.begin(), b.end());
  };
  for (const io::GgufTensorInfo& t : f->tensors()) {
    if (t.type != io::GgmlType::kQ4_K || t.name == "token_embd.weight") {
      auto b = f->tensor_bytes(t);
      w.add_tensor(t.name, t.type, t.ne, std::vector<uint8_t>(b.begin(), b.end()));
    } else {
      w.add_tensor(t.name, io::GgmlType::kQ6_K, t.ne,
                   bytes_of(t.ne[1] == 128 ? "blk.0.attn_v.weight" : "blk.0.ffn_down.weight"));
    }
  }
  const std::string path = temp_path("all_q6k");
  ASSERT_TRUE(w.write(path).ok());
  auto fp32 = load_gguf(path, Backend::kCPU, ModelUse::kInference);
  auto int8 = load_gguf(path, Backend::kCPU, ModelUse::kInt8Inference);
  std::remove(path.c_str());
  ASSERT_TRUE(fp32.ok()) << fp32.status().message();
  ASSERT_TRUE(int8.ok()) << int8.status().message();
  EXPECT_FALSE((*fp32)->int4());
  EXPECT_FALSE((*fp32)->int8());
  EXPECT_TRUE((*int8)->int8());
  ASSERT_TRUE((*fp32)->quantize_int8().ok());
  const std::vector<int> t = some_tokens(256, 24);
  EXPECT_EQ(all_logits(**int8, t), all_logits(**fp32, t));
}

// llama.cpp's Q5_0 stands in for Q4_K where 256 does not divide a row: a
// Q5_0 matrix of a 4-bit file whose width Q4_K cannot hold (GPT-2 at 64
// wide) is requantized to Q4_0, and the file gives the same logits, bit for
// bit, as the file with that tensor made Q4_0 beforehand.
TEST(LlamaCppFiles, Q5_0MatricesOfANarrowModelBecomeQ4_0) {
  auto m = tiny_gpt2();
  ASSERT_FALSE(q4::fits(q4::Type::kQ4_K, m->config().channels));
  const std::string path = temp_path("q5_0_src");
  ASSERT_TRUE(save_gguf(*m, path, GgufWeights::kQ4_0).ok());
  auto f = io::GgufFile::open(path);
  ASSERT_TRUE(f.ok()) << f.status().message();
  const std::string name = "blk.0.ffn_up.weight";
  const io::GgufTensorInfo* up = f->find_tensor(name);
  ASSERT_EQ(up->type, io::GgmlType::kQ4_0);
  const int64_t cols = up->ne[0], rows = up->numel() / cols;
  // Its Q4_0 values as Q5_0 blocks (d = max / -16, as ggml's quantizer),
  // then those blocks' values as Q4_0 again: the oracle.
  std::vector<float> x(static_cast<size_t>(up->numel()));
  for (int64_t r = 0; r < rows; r++)
    q4::dequantize_row(q4::Type::kQ4_0, x.data() + r * cols,
                       f->tensor_bytes(*up).data() + r * q4::row_bytes(q4::Type::kQ4_0, cols), cols);
  std::vector<uint8_t> q5(static_cast<size_t>(up->numel() / 32 * 22), 0);
  for (int64_t b = 0; b < up->numel() / 32; b++) {
    const float* xb = x.data() + 32 * b;
    float max = 0.0f;
    for (int i = 0; i < 32; i++)
      if (std::fabs(xb[i]) > std::fabs(max)) max = xb[i];
    const float d = max / -16.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    const uint16_t dh = q4::f32_to_fp16(d);
    uint8_t* y = q5.data() + 22 * b;
    std::memcpy(y, &dh, 2);
    uint32_t qh = 0;
    for (int j = 0; j < 16; j++) {
      const int a = std::min(31, static_cast<int>(xb[j] * id + 16.5f)), c = std::min(31, static_cast<int>(xb[j + 16] * id + 16.5f));
      y[6 + j] = static_cast<uint8_t>((a & 0xF) | ((c & 0xF) << 4));
      qh |= static_cast<uint32_t>((a >> 4) & 1) << j;
      qh |= static_cast<uint32_t>((c >> 4) & 1) << (j + 16);
    }
    std::memcpy(y + 2, &qh, 4);
  }
  std::vector<float> back(x.size());
  io::dequantize_q5_0(q5.data(), back.size(), back.data());
  std::vector<uint8_t> oracle_rows(static_cast<size_t>(rows * q4::row_bytes(q4::Type::kQ4_0, cols)));
  q4::quantize_rows(q4::Type::kQ4_0, oracle_rows.data(), back.data(), rows, cols);
  auto write = [&](const std::string& out, io::GgmlType type, const std::vector<uint8_t>& bytes) {
    io::GgufWriter w;
    for (const io::GgufKv& kv : f->metadata()) w.set(kv.key, kv.value);
    for (const io::GgufTensorInfo& t : f->tensors()) {
      auto b = f->tensor_bytes(t);
      if (t.name == name) w.add_tensor(t.name, type, t.ne, bytes);
      else w.add_tensor(t.name, t.type, t.ne, std::vector<uint8_t>(b.begin(), b.end()));
    }
    return w.write(out);
  };
  const std::string q5_path = temp_path("q5_0_file"), oracle_path = temp_path("q5_0_oracle");
  ASSERT_TRUE(write(q5_path, io::GgmlType::kQ5_0, q5).ok());
  ASSERT_TRUE(write(oracle_path, io::GgmlType::kQ4_0, oracle_rows).ok());
  auto got = load_gguf(q5_path);
  auto want = load_gguf(oracle_path);
  for (const std::string& p : {path, q5_path, oracle_path}) std::remove(p.c_str());
  ASSERT_TRUE(got.ok()) << got.status().message();
  ASSERT_TRUE(want.ok()) << want.status().message();
  EXPECT_TRUE((*got)->int4());
  const std::vector<int> t = some_tokens(m->config().vocab, 20);
  EXPECT_EQ(all_logits(**got, t), all_logits(**want, t));
}

// A Q5_K_M file (Q5_K, Q6_K, Q5_0, Q5_1 and Q4_1 tensors, no 4-bit ones)
// loads as the fp32 model, its matrices llama.cpp's dequantized values, and
// into the INT8 tier (those values quantized).
TEST(LlamaCppFiles, Q5FilesLoadIntoTheInt8TierAndFp32) {
  auto fp32 = load_gguf(llamacpp_file("tiny-q5_k_m.gguf"), Backend::kCPU, ModelUse::kInference);
  auto int8 = load_gguf(llamacpp_file("tiny-q5_k_m.gguf"), Backend::kCPU, ModelUse::kInt8Inference);
  ASSERT_TRUE(fp32.ok()) << fp32.status().message();
  ASSERT_TRUE(int8.ok()) << int8.status().message();
  EXPECT_FALSE((*fp32)->int4());
  EXPECT_TRUE((*int8)->int8());
  const std::vector<int> t = some_tokens(256, 24);
  const std::vector<float> logits = all_logits(**fp32, t);
  for (float v : logits) ASSERT_TRUE(std::isfinite(v));
  ASSERT_TRUE((*fp32)->quantize_int8().ok());
  EXPECT_EQ(all_logits(**int8, t), all_logits(**fp32, t));
}

}  // namespace
}  // namespace tessera
