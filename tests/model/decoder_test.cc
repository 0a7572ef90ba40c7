// The shape layer (model/decoder.h): parameter counts of published models
// against their checkpoints' (Hugging Face's model.num_parameters()), the
// parameter table's tensor-parallel blocks against the whole tensors, and
// Llama 3's rope scaling against transformers' formula.
#include <cmath>
#include <numbers>
#include <set>

#include <gtest/gtest.h>

#include "model/decoder.h"

namespace tessera {
namespace {

DecoderConfig llama(int L, int NH, int KV, int C, int F, int V, int ctx) {
  DecoderConfig c{L, NH, C, V, ctx};
  c.kv_heads = KV;
  c.mlp_hidden = F;
  c.norm = Norm::kRMSNorm;
  c.positions = Positions::kRope;
  c.mlp = Mlp::kSwiGLU;
  c.bias = c.qkv_bias = c.tied_head = false;
  return c;
}

TEST(DecoderShape, PublishedParameterCounts) {
  EXPECT_EQ((DecoderConfig{12, 12, 768, 50257, 1024}.num_parameters()), 124439808);        // gpt2
  EXPECT_EQ(llama(32, 32, 32, 4096, 11008, 32000, 4096).num_parameters(), 6738415616);     // Llama-2-7b
  EXPECT_EQ(llama(32, 32, 8, 4096, 14336, 128256, 8192).num_parameters(), 8030261248);     // Meta-Llama-3-8B
  EXPECT_EQ(llama(40, 40, 40, 5120, 13824, 32000, 4096).num_parameters(), 13015864320);    // Llama-2-13b
  EXPECT_EQ(llama(80, 64, 8, 8192, 28672, 32000, 4096).num_parameters(), 68976648192);     // Llama-2-70b
  EXPECT_EQ(llama(22, 32, 4, 2048, 5632, 32000, 2048).num_parameters(), 1100048384);       // TinyLlama-1.1B
  DecoderConfig qwen = llama(24, 14, 2, 896, 4864, 151936, 32768);                         // Qwen2.5-0.5B
  qwen.qkv_bias = qwen.tied_head = true;
  EXPECT_EQ(qwen.num_parameters(), 494032768);
}

TEST(DecoderShape, LayoutHoldsEveryParameterOnce) {
  DecoderConfig c = llama(3, 8, 2, 64, 80, 99, 16);
  c.qkv_bias = true;
  Arena whole = param_layout(c, ModelShard{});
  ASSERT_TRUE(whole.try_allocate().ok());
  int64_t n = 0;
  for (int id = 0; id < kNumParams; id++) n += whole.tensor(id).numel();
  // The arena pads wte and lm_head to Vp rows.
  EXPECT_EQ(n, c.num_parameters() + 2 * int64_t{c.padded_vocab() - c.vocab} * c.channels);
  EXPECT_EQ(whole.tensor(kWpe).numel(), 0);
  EXPECT_EQ(whole.tensor(kLn1B).numel(), 0);
  EXPECT_EQ(whole.tensor(kFcB).numel(), 0);
  EXPECT_EQ(whole.tensor(kQkvW).numel(), 3 * (8 + 2 * 2) * 8 * 64);
}

// The tp blocks of every tensor tile its view: each element once.
TEST(DecoderShape, TensorParallelBlocksTileTheTensors) {
  DecoderConfig c = llama(2, 8, 4, 32, 48, 99, 16);
  c.qkv_bias = true;
  for (int tp : {1, 2, 4}) {
    for (int id = 0; id < kNumParams; id++) {
      std::multiset<int64_t> seen;
      int64_t global = 0;
      for (int r = 0; r < tp; r++) {
        ModelShard s;
        s.tp = tp;
        s.tp_rank = r;
        ASSERT_TRUE(s.validate(c).ok());
        const TensorSlice t = param_slice(c, s, id);
        global = t.view.numel();
        // Enumerate the block's flat indices in the view.
        std::vector<int64_t> idx(t.view.rank, 0);
        const int64_t count = t.block_numel();
        for (int64_t k = 0; k < count; k++) {
          int64_t flat = 0;
          for (int d = 0; d < t.view.rank; d++) flat = flat * t.view.dims[d] + t.begin[d] + idx[d];
          seen.insert(flat);
          for (int d = t.view.rank - 1; d >= 0; d--) {
            if (++idx[d] < t.size[d]) break;
            idx[d] = 0;
          }
        }
      }
      const bool replicated = id == kLn1W || id == kLn2W || id == kLnfW || id == kLnfB || id == kLn1B ||
                              id == kLn2B || id == kAttProjB || id == kFcProjB || id == kWpe;
      SCOPED_TRACE(std::string(param_name(id)) + " tp=" + std::to_string(tp));
      EXPECT_EQ(static_cast<int64_t>(seen.size()), replicated ? tp * global : global);
      if (!replicated) EXPECT_EQ(static_cast<int64_t>(std::set<int64_t>(seen.begin(), seen.end()).size()), global);
    }
  }
}

TEST(DecoderShape, ShardsRefuseSplitKeyValueHeads) {
  DecoderConfig c = llama(2, 8, 2, 32, 48, 99, 16);
  ModelShard s;
  s.tp = 4;
  const Status st = s.validate(c);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("model.kv_heads (2) must be divisible by parallel.tp (4)"), std::string::npos);
}

TEST(DecoderShape, Llama3RopeScalingAsTransformers) {
  DecoderConfig c = llama(1, 32, 8, 4096, 14336, 128256, 131072);
  c.rope_theta = 500000.0;
  c.rope_scaling = {RopeScaling::Kind::kLlama3, 8.0, 1.0, 4.0, 8192};
  const std::vector<float> f = c.rope_inv_freq();
  ASSERT_EQ(f.size(), 64u);
  for (int i = 0; i < 64; i++) {
    const double inv = 1.0 / std::pow(500000.0, 2.0 * i / 128);
    const double wavelen = 2 * std::numbers::pi / inv;
    double want = inv;
    if (wavelen > 8192) want = inv / 8;
    else if (wavelen >= 2048) {
      const double smooth = (8192 / wavelen - 1) / 3;
      want = (1 - smooth) * inv / 8 + smooth * inv;
    }
    EXPECT_NEAR(f[i], want, 1e-6 * want) << i;
  }
  EXPECT_FLOAT_EQ(f[0], 1.0f);             // short wavelengths kept
  EXPECT_NEAR(f[63], (1.0 / std::pow(500000.0, 126.0 / 128)) / 8, 1e-12);  // long ones divided
}

TEST(DecoderShape, DescribesTheVariant) {
  EXPECT_EQ((DecoderConfig{12, 12, 768, 50257, 1024}.str()), "L=12 NH=12 C=768 V=50257 maxT=1024");
  DecoderConfig c = llama(12, 12, 4, 768, 2048, 32000, 1024);
  EXPECT_EQ(c.str(), "L=12 NH=12 C=768 V=32000 maxT=1024 KV=4 F=2048 rmsnorm(1e-05) rope(10000) swiglu no-bias untied");
  // GPT-2's FLOPs are the formula's of llm.c (6N + 6LCT).
  const DecoderConfig g{12, 12, 768, 50257, 1024};
  EXPECT_DOUBLE_EQ(g.flops_per_token(1024), 6.0 * 124439808 + 6.0 * 12 * 768 * 1024);
}

}  // namespace
}  // namespace tessera
