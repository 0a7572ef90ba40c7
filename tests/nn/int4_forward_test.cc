// The int4 tiers of the model (GPT::quantize_q4, GPT::load_q4): the ragged
// forward with Q4_0 / Q4_K matmuls against the same model in fp32 (what
// quantization may change), the matrices handed back and forth unchanged,
// and the refusals. The kernels themselves are exact against their oracle
// in tests/kernels/matmul_q4_test.cc.
#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/q4.h"
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
std::unique_ptr<GPT> tiny() { return testing_util::tiny_gpt2(); }

// A Llama-shaped model (RMSNorm, SwiGLU, GQA, untied head) whose input
// channels are multiples of 256, so Q4_K covers every matrix but the MLP
// projection's (F = 288: Q4_0).
GPTConfig llama_256() {
  DecoderConfig c;
  c.norm = Norm::kRMSNorm;
  c.positions = Positions::kRope;
  c.mlp = Mlp::kSwiGLU;
  c.qkv_bias = false;
  c.bias = false;
  c.layers = 2;
  c.heads = 8;
  c.kv_heads = 2;
  c.channels = 256;
  c.mlp_hidden = 288;
  c.vocab = 300;
  c.context = 64;
  c.tied_head = false;
  return c;
}

int same_argmax(const std::vector<float>& a, const std::vector<float>& b, int N, int V, int Vp) {
  int same = 0;
  for (int i = 0; i < N; i++) {
    const float* x = a.data() + static_cast<size_t>(i) * Vp;
    const float* y = b.data() + static_cast<size_t>(i) * Vp;
    same += std::max_element(x, x + V) - x == std::max_element(y, y + V) - y;
  }
  return same;
}

TEST(Int4Forward, Q4_0CloseToFp32OnTheTinyGpt2) {
  auto fp = tiny();
  auto q = tiny();
  auto made = q->quantize_q4(q4::Type::kQ4_0);
  ASSERT_TRUE(made.ok()) << made.status().message();
  EXPECT_EQ(*made, "q4_0: 9 matrices");
  EXPECT_TRUE(q->int4());
  EXPECT_TRUE(q->quantized());
  // 18 bytes per 32 weights.
  const int64_t C = 64, L = 2, Vp = fp->config().padded_vocab();
  EXPECT_EQ(q->q4_bytes(), (L * (3 * C * C + C * C + 4 * C * C + C * 4 * C) + Vp * C) / 32 * 18);
  const int V = fp->config().vocab;
  std::vector<int> tokens(fp->config().context);
  for (int i = 0; i < static_cast<int>(tokens.size()); i++) tokens[i] = (i * 7 + 3) % V;
  const std::vector<float> a = all_logits(*fp, tokens), b = all_logits(*q, tokens);
  const double err = testing_util::normalised_error(b.data(), a.data(), static_cast<int64_t>(a.size()));
  EXPECT_LE(err, 0.25);
  EXPECT_GT(err, 0.0);
  const int N = static_cast<int>(tokens.size());
  EXPECT_GE(same_argmax(a, b, N, V, static_cast<int>(Vp)), N / 2);
}

// Q4_K is the better 4-bit tier: closer to fp32 than Q4_0 on the same
// random weights, and a matrix whose channels are not a multiple of 256
// falls back to Q4_0 as llama.cpp's quantizer does.
TEST(Int4Forward, Q4_KIsCloserToFp32ThanQ4_0) {
  const GPTConfig c = llama_256();
  auto fp = make_gpt(c, Backend::kCPU, ModelShard{}, nullptr, ModelUse::kInference);
  fp->init_weights(11);
  std::vector<int> tokens(48);
  for (int i = 0; i < 48; i++) tokens[i] = (i * 13 + 1) % c.vocab;
  const std::vector<float> ref = all_logits(*fp, tokens);
  double err[2];
  for (q4::Type t : {q4::Type::kQ4_0, q4::Type::kQ4_K}) {
    auto q = make_gpt(c, Backend::kCPU, ModelShard{}, nullptr, ModelUse::kInference);
    q->init_weights(11);
    auto made = q->quantize_q4(t);
    ASSERT_TRUE(made.ok()) << made.status().message();
    EXPECT_EQ(*made, t == q4::Type::kQ4_0 ? "q4_0: 9 matrices" : "q4_k: 7 matrices, q4_0: 2 matrices");
    const std::vector<float> got = all_logits(*q, tokens);
    err[t == q4::Type::kQ4_K] = testing_util::normalised_error(got.data(), ref.data(), static_cast<int64_t>(ref.size()));
  }
  EXPECT_LT(err[1], err[0]) << "q4_k " << err[1] << ", q4_0 " << err[0];
  EXPECT_LE(err[0], 0.25);
}

// for_each_q4 -> load_q4 into a model that never held fp32 matmul weights
// (the GGUF loader's path) gives the same logits bit for bit.
TEST(Int4Forward, LoadQ4TakesTheMatricesBack) {
  const GPTConfig c = llama_256();
  auto q = make_gpt(c, Backend::kCPU, ModelShard{}, nullptr, ModelUse::kInference);
  q->init_weights(5);
  ASSERT_TRUE(q->quantize_q4(q4::Type::kQ4_K).ok());
  std::vector<GPT::Q4Matrix> ms;
  q->for_each_q4([&](int k, int, int, const GPT::Q4Matrix& m) {
    EXPECT_EQ(k, static_cast<int>(ms.size()));
    ms.push_back(m);
  });
  ASSERT_EQ(ms.size(), 9u);
  auto back = make_gpt(c, Backend::kCPU, ModelShard{}, nullptr, ModelUse::kInt8Inference);
  // The fp32 tensors that stay (embeddings, norms) from the original.
  for (int id = 0; id < kNumParams; id++) {
    Tensor dst = back->params().tensor(id);
    if (dst.numel() > 0) std::copy_n(q->params().tensor(id).f32(), dst.numel(), dst.f32());
  }
  Status st = back->load_q4([&](int k, int, int, GPT::Q4Matrix* m) {
    *m = ms[k];
    return Status::OK();
  });
  ASSERT_TRUE(st.ok()) << st.message();
  std::vector<int> tokens = {1, 5, 9, 2, 7, 7, 30, 299};
  EXPECT_EQ(all_logits(*back, tokens), all_logits(*q, tokens));
}

// A stored matrix whose columns are permuted, with the permutation as
// in_perm, computes the same products (the blocks are summed in another
// order: equal within fp32 rounding).
TEST(Int4Forward, InputPermutationGathersTheColumns) {
  const GPTConfig c = llama_256();
  auto q = make_gpt(c, Backend::kCPU, ModelShard{}, nullptr, ModelUse::kInference);
  q->init_weights(9);
  ASSERT_TRUE(q->quantize_q4(q4::Type::kQ4_0).ok());
  std::vector<GPT::Q4Matrix> ms;
  q->for_each_q4([&](int, int, int, const GPT::Q4Matrix& m) { ms.push_back(m); });
  // Matrix 1 (layer 0's attention projection, (256, 256)): its 8 blocks of
  // 32 columns in reverse order.
  GPT::Q4Matrix& m = ms[1];
  const int C = 256, nb = C / 32;
  const int64_t rb = q4::row_bytes(m.type, C);
  std::vector<uint8_t> w(m.w.size());
  for (int o = 0; o < C; o++)
    for (int b = 0; b < nb; b++)
      std::copy_n(m.w.data() + o * rb + (nb - 1 - b) * 18, 18, w.data() + o * rb + b * 18);
  m.w = w;
  m.in_perm.resize(C);
  for (int col = 0; col < C; col++) m.in_perm[col] = (nb - 1 - col / 32) * 32 + col % 32;
  auto back = make_gpt(c, Backend::kCPU, ModelShard{}, nullptr, ModelUse::kInference);
  back->init_weights(9);
  ASSERT_TRUE(back->load_q4([&](int k, int, int, GPT::Q4Matrix* out) {
                    *out = ms[k];
                    return Status::OK();
                  }).ok());
  std::vector<int> tokens = {3, 1, 4, 1, 5, 9, 2, 6};
  const std::vector<float> a = all_logits(*q, tokens), b = all_logits(*back, tokens);
  EXPECT_LE(testing_util::normalised_error(b.data(), a.data(), static_cast<int64_t>(a.size())), 1e-5);
}

TEST(Int4Forward, Refusals) {
  // Training models, and a model already quantized.
  auto train = make_gpt(GPTConfig{1, 2, 32, 32, 8});
  EXPECT_EQ(train->quantize_q4(q4::Type::kQ4_0).status().code(), StatusCode::kInvalidArgument);
  auto q = tiny();
  ASSERT_TRUE(q->quantize_int8().ok());
  EXPECT_EQ(q->quantize_q4(q4::Type::kQ4_0).status().code(), StatusCode::kInvalidArgument);
  // Input channels not a multiple of 32.
  GPTConfig odd{1, 2, 48, 32, 8};
  auto m = make_gpt(odd, Backend::kCPU, ModelShard{}, nullptr, ModelUse::kInference);
  m->init_weights(1);
  auto r = m->quantize_q4(q4::Type::kQ4_0);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("multiples of 32"), std::string::npos) << r.status().message();
  // load_q4: a matrix of the wrong size, and a block whose scale is NaN.
  auto fresh = tiny();
  Status st = fresh->load_q4([](int, int OC, int C, GPT::Q4Matrix* mm) {
    mm->w.resize(static_cast<size_t>(OC) * q4::row_bytes(mm->type, C) - 1);
    return Status::OK();
  });
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.message();
  EXPECT_FALSE(fresh->int4());
  st = fresh->load_q4([](int, int OC, int C, GPT::Q4Matrix* mm) {
    mm->w.assign(static_cast<size_t>(OC) * q4::row_bytes(mm->type, C), 0);
    mm->w[0] = 0x00, mm->w[1] = 0x7e;  // fp16 NaN
    return Status::OK();
  });
  EXPECT_FALSE(st.ok());
  EXPECT_FALSE(fresh->int4());
}

}  // namespace
}  // namespace tessera
