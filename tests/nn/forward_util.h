// Shared by the inference-tier tests (int8_forward, int4_forward,
// gguf_model): the committed PyTorch tiny GPT-2 loaded for inference, and
// the logits of every position of one sequence through the paged cache.
#pragma once

#include <memory>
#include <vector>

#include <gtest/gtest.h>

#include "nn/gpt.h"
#include "nn/gpt2_weights.h"
#include "nn/kv_cache.h"
#include "aborting.h"

namespace tessera::testing_util {

inline std::unique_ptr<GPT> tiny_gpt2() {
  auto m = load_gpt2(TESSERA_TEST_DATA_DIR "/reference/gpt2_tiny.safetensors", nullptr, Backend::kCPU,
                     ModelUse::kInference);
  EXPECT_TRUE(m.ok()) << m.status().message();
  return m.ok() ? std::move(m).value() : nullptr;
}

// (N, Vp) logits of tokens as one sequence, every row.
inline std::vector<float> all_logits(GPT& m, const std::vector<int>& tokens) {
  const int N = static_cast<int>(tokens.size()), Vp = m.config().padded_vocab();
  auto cache = make_kv_cache(m, 4);
  const int seq = cache->add_sequence().value();
  EXPECT_TRUE(cache->extend(seq, N).ok());
  std::vector<int> seqs(N, seq), pos(N), rows(N);
  for (int i = 0; i < N; i++) pos[i] = rows[i] = i;
  std::vector<float> logits(static_cast<size_t>(N) * Vp);
  Status st = m.forward_tokens(TokenBatch{tokens, seqs, pos}, *cache, rows, logits.data());
  EXPECT_TRUE(st.ok()) << st.message();
  return logits;
}

}  // namespace tessera::testing_util
