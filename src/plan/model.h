// The job `tessera plan` prices: a decoder of the shape layer
// (model/decoder.h: GPT-2 or the Llama family) and how many tokens to train
// it on. Dimension letters as in model/decoder.h, T the sequence.
#pragma once

#include <cstdint>
#include <string>

#include "core/status.h"
#include "model/decoder.h"

namespace tessera::plan {

struct ModelSpec {
  std::string name;        // "gpt2-124m", "llama3-8b", "hf:PATH", or "custom"
  int layers = 0;          // L
  int heads = 0;           // NH
  int dim = 0;             // C
  int vocab = 0;           // V (unpadded)
  int seq = 0;             // T, tokens per sequence
  int context = 0;         // positions; 0: seq
  int64_t global_batch = 0;  // sequences per optimizer step, over all ranks
  // The family and its widths (norm, positions, MLP, kv_heads, head_dim,
  // mlp_hidden, biases, tied head); its layers, heads, channels, vocab and
  // context are the fields above (shape() fills them in).
  DecoderConfig family;

  // The decoder this spec describes, for the shape layer's tables.
  DecoderConfig shape() const;
  // V rounded up to a multiple of lcm(128, tp), as DecoderConfig::padded_vocab.
  int padded_vocab(int tp) const { return shape().padded_vocab(tp); }
  // The shape layer's count (unpadded vocabulary, a tied head once).
  int64_t parameters() const { return shape().num_parameters(); }
  // Model FLOPs per token, as src/perf/flops.h counts them for MFU
  // (DecoderConfig::flops_per_token at T = seq).
  double flops_per_token() const { return shape().flops_per_token(seq); }
  Status validate() const;
  std::string str() const;  // "llama3-8b: L=32 NH=32 C=4096 V=128256 T=8192 KV=8 F=14336 ..., 8030.3M parameters"
};

// gpt2-124m ... gpt2-1.5b, llama2-7b/13b/70b, llama3-8b/70b/405b,
// qwen2.5-0.5b, tinyllama-1.1b (the published config.json shapes),
// megatron-1.7b ... megatron-145b; NotFound names the known ones.
Result<ModelSpec> model_preset(const std::string& name);
std::string model_preset_names();

}  // namespace tessera::plan
