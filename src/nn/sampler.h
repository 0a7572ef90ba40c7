// Choosing the next token from logits, and autoregressive generation with or
// without the paged KV cache (kv_cache.h). V vocabulary, Vp padded vocabulary.
#pragma once

#include <cstdint>
#include <functional>
#include <random>
#include <span>
#include <vector>

#include "core/status.h"
#include "nn/gpt.h"

namespace tessera {

// One token id in [0, V) drawn from logits (V) (padding columns excluded by
// the caller passing the real V). temperature 0 picks the argmax (the lowest
// id among equal maxima); otherwise softmax(logits / temperature) over the
// top_k largest logits (top_k 0 or >= V: all of them), computed in double,
// sampled with one draw from rng. Same logits and rng state, same token, on
// every platform (the draw does not go through std:: distributions).
// temperature >= 0 and top_k >= 0 are the caller's to check (CHECK).
int sample_token(const float* logits, int V, float temperature, int top_k, std::mt19937_64& rng);

// As above, then nucleus sampling: of the candidates in order of weight
// (descending, ties by id), the shortest prefix whose weights reach top_p of
// the candidates' total (top_p in (0, 1]; 1 keeps them all and gives exactly
// the draw above), sampled with one draw from rng.
int sample_token(const float* logits, int V, float temperature, int top_k, float top_p, std::mt19937_64& rng);

// log softmax(logits)[id] over V logits, in double.
float token_logprob(const float* logits, int V, int id);

// Samples up to max_new_tokens tokens continuing prompt (non-empty, ids in
// [0, V), at most the model's context) with sample_token and an
// std::mt19937_64 seeded with seed, calling on_token (may be empty) with each
// as soon as it is drawn. Returns the new tokens only.
//
// The whole sequence (prompt + new tokens) never exceeds the model's context:
// generation stops early when it reaches it, so fewer than max_new_tokens
// tokens back means exactly that (a prompt filling the context gives none).
//
// use_cache: prefill the prompt into a PagedKVCache in chunks, then feed one
// token per step (GPT::forward_tokens). Without it, every step runs model.forward over the
// whole sequence so far and reads its last row: the baseline, and an oracle
// (the first step's forward is padded to the longest length the call will
// need, so that later ones reuse the model's activation arena).
// Both draw the same tokens up to fp32 rounding of the logits (identical at
// temperature 0 unless two logits tie within it). Without the cache the
// model's forward activations (model.try_logits()) are overwritten.
Result<std::vector<int>> generate(GPT& model, std::span<const int> prompt, int max_new_tokens, float temperature,
                                  int top_k, uint64_t seed, bool use_cache,
                                  const std::function<void(int)>& on_token);

}  // namespace tessera
