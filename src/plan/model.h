// The job `tessera plan` prices: a GPT-2-shaped decoder (the model Tessera
// trains) and how many tokens to train it on. Dimension letters as in
// src/nn/gpt.h: L layers, NH heads, C channels, V vocabulary, T sequence.
#pragma once

#include <cstdint>
#include <string>

#include "core/status.h"

namespace tessera::plan {

struct ModelSpec {
  std::string name;        // "gpt2-124m", or "custom"
  int layers = 0;          // L
  int heads = 0;           // NH
  int dim = 0;             // C
  int vocab = 0;           // V (unpadded)
  int seq = 0;             // T, tokens per sequence
  int context = 0;         // positions (wpe rows); 0: seq
  int64_t global_batch = 0;  // sequences per optimizer step, over all ranks

  // V rounded up to a multiple of lcm(128, tp), as GPTConfig::padded_vocab.
  int padded_vocab(int tp) const;
  // GPT-2's parameter count, the same formula as GPTConfig::num_parameters
  // (unpadded vocabulary, tied head).
  int64_t parameters() const;
  // Model FLOPs per token, as src/perf/flops.h counts them for MFU:
  // 6 x parameters + 6 x L x C x T.
  double flops_per_token() const;
  Status validate() const;
  std::string str() const;  // "gpt2-124m: L=12 NH=12 C=768 V=50257 T=1024, 124.4M parameters"
};

// gpt2-124m, gpt2-350m, gpt2-774m, gpt2-1.5b, llama-7b, llama-13b, megatron-1.7b ...;
// NotFound names the known ones.
Result<ModelSpec> model_preset(const std::string& name);
std::string model_preset_names();

}  // namespace tessera::plan
