// The decoder's shape: one configuration of which GPT-2 and the Llama family
// (Llama 2/3, Mistral, Qwen2, TinyLlama, SmolLM) are instances, and the
// tables every layer above reads instead of deriving the shape again: the
// parameter tensors (name, global shape, how tensor and pipeline parallelism
// slice them, weight decay), the parameter count and the model FLOPs.
// Pure arithmetic: no kernels, no memory beyond the small tables.
//
// Dimension letters: L layers, C channels (the residual stream), NH query
// heads, KV key/value heads (GQA; KV == NH is multi-head, KV == 1
// multi-query), hs head size, G = NH/KV query heads per key/value head, F
// the MLP's hidden width, V vocabulary, Vp V padded to a multiple of 128 (and
// of tp), maxT context.
//
// Query head order. Hugging Face stores query head h next to h+1 and lets
// head h use key/value head h / G. Tessera stores the query heads grouped by
// position in their group: internal head j = a*KV + b is HF head b*G + a
// (a < G, b < KV), and uses key/value head j % KV = b. With that order the
// fused qkv weight (L, (NH+2KV)*hs, C) viewed as (L, G+2, KV*hs, C) gives a
// tensor-parallel rank one rectangular block (its key/value heads, every
// slab), which holds exactly its query heads, their key/value heads, in
// the same relative order; the attention output projection's columns are
// permuted alike. With G = 1 (GPT-2, every multi-head model) the order is
// Hugging Face's own. nn/hf_weights.cc permutes at import and export.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "tensor/arena.h"
#include "tensor/slice.h"

namespace tessera {

enum class Norm { kLayerNorm, kRMSNorm };
enum class Positions { kLearned, kRope };
enum class Mlp { kGelu, kSwiGLU };

// Hugging Face's rope_scaling: none, linear (positions divided by factor:
// every frequency / factor), or Llama 3's (long wavelengths / factor, short
// ones kept, a smooth blend between low_freq_factor and high_freq_factor of
// the original context).
struct RopeScaling {
  enum class Kind { kNone, kLinear, kLlama3 };
  Kind kind = Kind::kNone;
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int original_context = 8192;
  bool operator==(const RopeScaling&) const = default;
};

struct DecoderConfig {
  int layers = 0;    // L
  int heads = 0;     // NH
  int channels = 0;  // C
  int vocab = 0;     // V
  int context = 0;   // maxT
  int kv_heads = 0;    // KV; 0: NH
  int head_dim = 0;    // hs; 0: C / NH
  int mlp_hidden = 0;  // F; 0: 4C
  Norm norm = Norm::kLayerNorm;
  float norm_eps = 1e-5f;  // layernorm: 1e-5 only (GPT-2's)
  Positions positions = Positions::kLearned;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling{};
  Mlp mlp = Mlp::kGelu;
  bool qkv_bias = true;   // biases on q, k, v (GPT-2, Qwen2)
  bool bias = true;       // biases on the attention output and the MLP (GPT-2)
  bool tied_head = true;  // the output layer is wte (else its own lm_head)

  int kv() const { return kv_heads > 0 ? kv_heads : heads; }
  int hs() const { return head_dim > 0 ? head_dim : channels / heads; }
  int ffn() const { return mlp_hidden > 0 ? mlp_hidden : 4 * channels; }
  int q_dim() const { return heads * hs(); }                // attention output width
  int kv_dim() const { return kv() * hs(); }                // keys (or values) per token
  int qkv_dim() const { return (heads + 2 * kv()) * hs(); }  // the fused qkv projection
  // Rows of the MLP's first projection: F, or 2F for SwiGLU (gate, up).
  int fc_rows() const { return mlp == Mlp::kSwiGLU ? 2 * ffn() : ffn(); }
  // GPT-2's shape exactly (every option at its default, hs = C/NH).
  bool gpt2() const;
  // V rounded up to a multiple of 128 and of tp, so every tensor-parallel
  // rank holds Vp/tp rows; padding rows are zero and their logits ignored.
  int padded_vocab(int tp = 1) const {
    int m = 128;
    while (m % tp != 0) m += 128;  // lcm(128, tp)
    return (vocab + m - 1) / m * m;
  }
  // One line naming the first bad field ("model.kv_heads (3) must divide
  // model.heads (8)").
  Status validate() const;
  // Parameters as Hugging Face counts them (unpadded vocabulary; a tied head
  // once): GPT-2 124M 124,439,808; Llama-2-7b 6,738,415,616.
  int64_t num_parameters() const;
  // Parameters inside the transformer blocks, all L of them.
  int64_t layer_parameters() const;
  // Model FLOPs of one token's forward and backward at sequence length T, as
  // MFU counts them (PaLM appendix B): 6 x (parameters in matmuls, the output
  // layer's V x C included, embeddings excluded) + 6 x L x T x NH x hs for
  // attention's two (T,T) products (forward 2 x, backward 4 x, causal halving
  // ignored, as nanoGPT and llm.c count).
  double flops_per_token(int T) const;
  // The frequencies of the rotary embedding (hs/2 of them): theta^(-2i/hs),
  // scaled as rope_scaling says, computed as Hugging Face does (float32
  // results of double arithmetic where HF uses float32 tensors).
  std::vector<float> rope_inv_freq() const;
  // Llama 3's scaling as llama.cpp's converter writes it into a GGUF file
  // (tensor rope_freqs.weight, convert_hf_to_gguf's LlamaModel): each
  // frequency's divisor (1 for short wavelengths, factor for long ones, the
  // smooth blend between), hs/2 of them, computed in float32 as it does.
  // Empty unless rope_scaling is Llama 3's.
  std::vector<float> llama3_rope_factors() const;
  // "L=12 NH=12 C=768 V=50257 maxT=1024" for GPT-2; other instances add what
  // differs ("KV=4 hs=64 F=2048 rmsnorm rope(500000) swiglu untied").
  std::string str() const;
  // The same model: equal shapes, widths compared as derived (kv_heads = 0
  // and kv_heads = heads are one model, as are head_dim and mlp_hidden left 0
  // or spelled out), so a config read back from a file compares equal.
  bool operator==(const DecoderConfig& o) const;
};

// The part of the model a rank holds. Layers [layer_begin, layer_end) of the
// pipeline stage; tensor-parallel rank tp_rank of tp.
struct ModelShard {
  int tp = 1, tp_rank = 0;
  int layer_begin = 0, layer_end = -1;  // -1: to the last layer
  bool first = true;                    // embeddings (wte, wpe)
  bool last = true;                     // final norm and output head
  // Whole model for end < 0; checks tp divides the query and key/value heads
  // and the MLP width, and the layer range.
  Status validate(const DecoderConfig& c) const;
  int layers(const DecoderConfig& c) const { return (layer_end < 0 ? c.layers : layer_end) - layer_begin; }
};

// The 17 parameter tensors, in arena order. Per-layer tensors stack L
// layers. A tensor the configuration does not have (wpe with rotary
// positions, biases of a bias-free model, layernorm biases under RMSNorm,
// lm_head when tied) is present with no elements.
enum ParamId {
  kWte,       // (Vp, C); rows >= V stay zero
  kWpe,       // (maxT, C): learned positions
  kLn1W,      // (L, C)
  kLn1B,      // (L, C): layernorm
  kQkvW,      // (L, (NH+2KV)*hs, C): queries (in Tessera's head order), keys, values
  kQkvB,      // (L, (NH+2KV)*hs): qkv_bias
  kAttProjW,  // (L, C, NH*hs)
  kAttProjB,  // (L, C): bias
  kLn2W,      // (L, C)
  kLn2B,      // (L, C): layernorm
  kFcW,       // (L, F, C), or SwiGLU's (L, 2F, C): gate rows, then up rows
  kFcB,       // (L, F) or (L, 2F): bias
  kFcProjW,   // (L, C, F)
  kFcProjB,   // (L, C): bias
  kLnfW,      // (C)
  kLnfB,      // (C): layernorm
  kLmHead,    // (Vp, C): untied output layer
  kNumParams
};

// Where parameter id of the shard sits in the whole model's tensor
// (tensor/slice.h). Absent tensors (wpe off the first stage, a bias the
// model lacks, ...) have an empty block. Views: qkv weights (L, G+2, KV*hs,
// C) and biases (L, G+2, KV*hs), SwiGLU's fc (L, 2, F, C) and (L, 2, F), the
// attention projection (L, C, G, KV*hs) when G > 1, the rest their canonical
// shapes; wte's and lm_head's global rows are padded_vocab(shard.tp).
TensorSlice param_slice(const DecoderConfig& c, const ModelShard& s, int param_id);
// The parameter arena of a shard, laid out (offsets, bytes) but not
// allocated: what the model allocates, for reading another rank's arena.
// Tensors listed in `omit` are laid out with no elements (the INT8 tier's
// model holds its matmul weights elsewhere: nn/gpt.h).
Arena param_layout(const DecoderConfig& c, const ModelShard& s, std::span<const int> omit = {});
// Name of a parameter tensor ("wte", "qkvw", ..., "lmhead"), as in the arena
// and in checkpoints.
const char* param_name(int param_id);
// Whether AdamW decays this tensor (the 2-D weights: embeddings, matmuls).
bool param_decays(int param_id);

}  // namespace tessera
