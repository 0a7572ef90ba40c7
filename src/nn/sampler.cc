#include "nn/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include <fmt/format.h>

#include "core/check.h"
#include "nn/kv_cache.h"

namespace tessera {

namespace {

// Prompts are prefilled this many positions at a time, which bounds the
// logits buffer and the cache's scratch at kPrefillChunk rows whatever the
// prompt length (and costs nothing: the matmuls are already row-blocked).
constexpr int kPrefillChunk = 128;

// Uniform in [0, 1) from the top 53 bits of one draw.
double uniform01(std::mt19937_64& rng) { return static_cast<double>(rng() >> 11) * 0x1.0p-53; }

}  // namespace

int sample_token(const float* logits, int V, float temperature, int top_k, std::mt19937_64& rng) {
  CHECK(V >= 1);
  CHECK(temperature >= 0.0f && top_k >= 0);
  if (temperature == 0.0f) {
    return static_cast<int>(std::max_element(logits, logits + V) - logits);  // first of equal maxima
  }
  // Candidates: all ids in order, or the top_k by (logit descending, id
  // ascending), a total order, so ties resolve the same everywhere.
  const int k = (top_k == 0 || top_k >= V) ? V : top_k;
  std::vector<int> ids;
  if (k < V) {
    ids.resize(V);
    std::iota(ids.begin(), ids.end(), 0);
    std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), [logits](int a, int b) {
      return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    });
  }
  auto id = [&](int j) { return k < V ? ids[j] : j; };
  double maxval = -INFINITY;
  for (int j = 0; j < k; j++) maxval = std::max(maxval, static_cast<double>(logits[id(j)]));
  std::vector<double> weight(k);
  double sum = 0.0;
  for (int j = 0; j < k; j++) {
    weight[j] = std::exp((static_cast<double>(logits[id(j)]) - maxval) / temperature);
    sum += weight[j];
  }
  const double u = uniform01(rng) * sum;
  double cdf = 0.0;
  for (int j = 0; j < k; j++) {
    cdf += weight[j];
    if (u < cdf) return id(j);
  }
  // u landed in the rounding gap of the last partial sum: take the last
  // candidate with any weight.
  for (int j = k - 1; j > 0; j--) {
    if (weight[j] > 0.0) return id(j);
  }
  return id(0);
}

int sample_token(const float* logits, int V, float temperature, int top_k, float top_p, std::mt19937_64& rng) {
  CHECK(top_p > 0.0f && top_p <= 1.0f);
  if (top_p >= 1.0f || temperature == 0.0f) return sample_token(logits, V, temperature, top_k, rng);
  const int k = (top_k == 0 || top_k >= V) ? V : top_k;
  // Weight order is logit order: sort the candidates by (logit descending, id
  // ascending), growing the sorted prefix only as far as the nucleus reaches
  // (a partial sort of the first 64, then 256, ...: the nucleus is usually
  // small, and a full sort of 50257 ids per token would cost milliseconds).
  std::vector<int> ids(V);
  std::iota(ids.begin(), ids.end(), 0);
  auto before = [logits](int a, int b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
  int sorted = std::min(k, 64);
  std::partial_sort(ids.begin(), ids.begin() + sorted, ids.end(), before);
  const double maxval = logits[ids[0]];
  // The candidates' total weight, in id order (deterministic).
  double total = 0.0;
  if (k == V) {
    for (int j = 0; j < V; j++) total += std::exp((static_cast<double>(logits[j]) - maxval) / temperature);
  } else {
    // The top k are exactly the first k once sorted that far.
    if (sorted < k) {
      std::partial_sort(ids.begin() + sorted, ids.begin() + k, ids.end(), before);
      sorted = k;
    }
    for (int j = 0; j < k; j++) total += std::exp((static_cast<double>(logits[ids[j]]) - maxval) / temperature);
  }
  std::vector<double> weight;
  weight.reserve(sorted);
  double kept = 0.0;
  int n = 0;
  while (n < k) {
    if (n == sorted) {
      const int grow = std::min(k, sorted * 4);
      std::partial_sort(ids.begin() + sorted, ids.begin() + grow, ids.end(), before);
      sorted = grow;
    }
    const double w = std::exp((static_cast<double>(logits[ids[n]]) - maxval) / temperature);
    weight.push_back(w);
    kept += w;
    n++;
    if (kept >= top_p * total) break;
  }
  const double u = uniform01(rng) * kept;
  double cdf = 0.0;
  for (int j = 0; j < n; j++) {
    cdf += weight[j];
    if (u < cdf) return ids[j];
  }
  return ids[n - 1];
}

float token_logprob(const float* logits, int V, int id) {
  CHECK(id >= 0 && id < V);
  double maxval = -INFINITY;
  for (int j = 0; j < V; j++) maxval = std::max(maxval, static_cast<double>(logits[j]));
  double sum = 0.0;
  for (int j = 0; j < V; j++) sum += std::exp(static_cast<double>(logits[j]) - maxval);
  return static_cast<float>(static_cast<double>(logits[id]) - maxval - std::log(sum));
}

Result<std::vector<int>> generate(GPT& model, std::span<const int> prompt, int max_new_tokens, float temperature,
                                  int top_k, uint64_t seed, bool use_cache,
                                  const std::function<void(int)>& on_token) {
  const GPTConfig& cfg = model.config();
  if (prompt.empty()) return Status::InvalidArgument("the prompt is empty: generation needs at least one token");
  if (prompt.size() > static_cast<size_t>(cfg.context))
    return Status::InvalidArgument(
        fmt::format("the prompt is {} tokens, longer than the model's context of {}", prompt.size(), cfg.context));
  if (max_new_tokens < 0)
    return Status::InvalidArgument(fmt::format("number of tokens to generate must be >= 0, got {}", max_new_tokens));
  if (!(temperature >= 0.0f) || !std::isfinite(temperature))
    return Status::InvalidArgument(fmt::format("temperature must be finite and >= 0, got {}", temperature));
  if (top_k < 0) return Status::InvalidArgument(fmt::format("top-k must be >= 0, got {}", top_k));
  const int P = static_cast<int>(prompt.size());
  RETURN_IF_ERROR(model.check_batch(prompt.data(), nullptr, 1, P));

  const int V = cfg.vocab, Vp = cfg.padded_vocab();
  // The sequence stays within the context: the last token drawn is never fed.
  const int count = std::min(max_new_tokens, cfg.context - P);
  std::vector<int> out;
  if (count == 0) return out;
  out.reserve(count);
  std::mt19937_64 rng(seed);
  auto emit = [&](int token) {
    out.push_back(token);
    if (on_token) on_token(token);
  };

  if (use_cache) {
    // One sequence in a pool just large enough for it.
    const int positions = P + count - 1;
    ASSIGN_OR_RETURN(std::unique_ptr<PagedKVCache> made,
                     PagedKVCache::create(model, std::max(1, (positions + PagedKVCache::kDefaultBlockSize - 1) /
                                                                 PagedKVCache::kDefaultBlockSize)));
    PagedKVCache& cache = *made;
    ASSIGN_OR_RETURN(const int seq, cache.add_sequence());
    std::vector<float> logits(Vp);
    std::vector<int> seq_ids(kPrefillChunk, seq), pos(kPrefillChunk);
    int rows = 0;
    for (int at = 0; at < P; at += rows) {
      rows = std::min(kPrefillChunk, P - at);
      RETURN_IF_ERROR(cache.extend(seq, rows));
      for (int i = 0; i < rows; i++) pos[i] = at + i;
      const int last_row = rows - 1;
      TokenBatch b{std::span<const int>(prompt.data() + at, rows), std::span<const int>(seq_ids.data(), rows),
                   std::span<const int>(pos.data(), rows)};
      // Logits only for the prompt's last position.
      RETURN_IF_ERROR(model.forward_tokens(b, cache, at + rows == P ? std::span<const int>(&last_row, 1)
                                                                    : std::span<const int>(), logits.data()));
    }
    for (int t = P;; t++) {
      int token = sample_token(logits.data(), V, temperature, top_k, rng);
      emit(token);
      if (static_cast<int>(out.size()) == count) break;
      RETURN_IF_ERROR(cache.extend(seq, 1));
      const int zero = 0;
      TokenBatch b{std::span<const int>(&token, 1), std::span<const int>(&seq, 1), std::span<const int>(&t, 1)};
      RETURN_IF_ERROR(model.forward_tokens(b, cache, std::span<const int>(&zero, 1), logits.data()));
    }
  } else {
    // GPT::try_forward re-lays its activation arena whenever T grows, which would
    // make every step allocate (40% of the time at GPT-2 124M shapes). So the
    // first step runs over the longest sequence this call feeds: the prompt
    // padded with token 0, which causal attention keeps out of row P-1; later
    // steps fit in the arena that leaves.
    std::vector<int> seq(prompt.begin(), prompt.end());
    seq.resize(P + count - 1, 0);  // padding, overwritten by the tokens drawn
    int T = P;
    RETURN_IF_ERROR(model.try_forward(seq.data(), nullptr, 1, static_cast<int>(seq.size())).status());
    for (;;) {
      ASSIGN_OR_RETURN(const float* logits, model.try_logits());
      const int token = sample_token(logits + static_cast<size_t>(T - 1) * Vp, V, temperature, top_k, rng);
      emit(token);
      if (static_cast<int>(out.size()) == count) break;
      seq[T++] = token;
      RETURN_IF_ERROR(model.try_forward(seq.data(), nullptr, 1, T).status());
    }
  }
  return out;
}

}  // namespace tessera
