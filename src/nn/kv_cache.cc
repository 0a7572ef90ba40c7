// The forward of gpt.cc restricted to new rows, with attention against the
// cached keys and values. Letters as in kv_cache.h; N = B*n rows.
//
// Per layer, for the N new rows x (N, C) of the residual stream:
//   ln1 = layernorm(x); qkv = ln1 W_qkv^T + b          (N, 3C)
//   k, v of each row -> cache at its absolute position
//   atty = attention(q, cached k/v of positions 0..p)   (N, C)
//   x2 = x + atty W_proj^T + b
//   x  = x2 + gelu(layernorm(x2) W_fc^T + b) W_fcproj^T + b
// then logits = layernorm_f(x) W_te^T.
#include "nn/kv_cache.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include <fmt/format.h>

#include "core/check.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/vec_math.h"

namespace tessera {

namespace {

// Scratch tensors, in scratch_ arena order. Shapes for N rows.
enum ScratchId {
  kX,       // (N, C) residual stream entering a layer, then leaving it
  kX2,      // (N, C) residual stream after attention
  kLn,      // (N, C) layernorm output (ln1, ln2, lnf in turn)
  kMean,    // (N)
  kRstd,    // (N)
  kQkv,     // (N, 3C)
  kAtty,    // (N, C)
  kProj,    // (N, C) output of the attention or MLP projection
  kFch,     // (N, 4C)
  kFchGelu, // (N, 4C)
  kScores,  // (threads, maxT): one row of attention scores per thread
  kNumScratch
};

// One query against keys and values 0..n_keys-1: out (hs) = softmax(scale q.k) v.
// keys and values point at the head's columns of position 0 and advance by
// stride floats per position. scores (n_keys) is scratch.
TESSERA_CPU_CLONES void attend(float* out, const float* q, const float* keys, const float* values, int n_keys,
                               int hs, int64_t stride, float scale, float* scores) {
  float maxval = -INFINITY;
  for (int t = 0; t < n_keys; t++) {
    const float* k = keys + t * stride;
    float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
    for (int i = 0; i < hs; i++) dot += q[i] * k[i];
    scores[t] = dot * scale;
    maxval = std::max(maxval, scores[t]);
  }
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int t = 0; t < n_keys; t++) {
    scores[t] = cpu::exp_approx(scores[t] - maxval);
    sum += scores[t];
  }
  const float inv_sum = 1.0f / sum;
  std::fill(out, out + hs, 0.0f);
  for (int t = 0; t < n_keys; t++) {
    const float* v = values + t * stride;
    const float w = scores[t] * inv_sum;
#pragma omp simd
    for (int i = 0; i < hs; i++) out[i] += w * v[i];
  }
}

bool same_shape(const GPTConfig& a, const GPTConfig& b) {
  return a.layers == b.layers && a.heads == b.heads && a.channels == b.channels && a.vocab == b.vocab &&
         a.context == b.context;
}

}  // namespace

KVCache::KVCache(const GPT& model, int B, int max_T) : config_(model.config()), B_(B), max_T_(max_T) {
  CHECK(model.device() == Device::kCPU);  // the cached decode runs the CPU kernels on the parameters
  CHECK(B >= 1);
  CHECK(max_T >= 1 && max_T <= config_.context);
  const int64_t L = config_.layers, C = config_.channels;
  kv_.reserve("keys", DType::kF32, {L, B, max_T, C});
  kv_.reserve("values", DType::kF32, {L, B, max_T, C});
  kv_.allocate();
  threads_ = std::max(1, omp_get_max_threads());
}

float* KVCache::keys(int layer) const {
  return kv_.tensor(0).f32() + int64_t{layer} * B_ * max_T_ * config_.channels;
}

float* KVCache::values(int layer) const {
  return kv_.tensor(1).f32() + int64_t{layer} * B_ * max_T_ * config_.channels;
}

void KVCache::reserve_rows(int rows) {
  if (rows <= scratch_rows_) return;
  const int64_t N = rows, C = config_.channels;
  Arena a;
  a.reserve("x", DType::kF32, {N, C});
  a.reserve("x2", DType::kF32, {N, C});
  a.reserve("ln", DType::kF32, {N, C});
  a.reserve("mean", DType::kF32, {N});
  a.reserve("rstd", DType::kF32, {N});
  a.reserve("qkv", DType::kF32, {N, 3 * C});
  a.reserve("atty", DType::kF32, {N, C});
  a.reserve("proj", DType::kF32, {N, C});
  a.reserve("fch", DType::kF32, {N, 4 * C});
  a.reserve("fch_gelu", DType::kF32, {N, 4 * C});
  a.reserve("scores", DType::kF32, {threads_, max_T_});
  a.allocate();
  CHECK(a.count() == kNumScratch);
  scratch_ = std::move(a);
  scratch_rows_ = rows;
}

Status forward_incremental(const GPT& model, KVCache& cache, const int* tokens, int B, int n, float* logits) {
  const GPTConfig& cfg = model.config();
  if (!same_shape(cfg, cache.config_))
    return Status::InvalidArgument(fmt::format("the KV cache was made for a model with {}, not {}",
                                               cache.config_.str(), cfg.str()));
  if (B != cache.B_)
    return Status::InvalidArgument(fmt::format("batch of {} sequences for a KV cache of {}", B, cache.B_));
  if (n < 1) return Status::InvalidArgument(fmt::format("{} new positions: need at least one", n));
  const int pos0 = cache.length_;
  if (pos0 + n > cache.max_T_)
    return Status::InvalidArgument(fmt::format("{} cached + {} new positions exceed the KV cache's {}", pos0, n,
                                               cache.max_T_));
  for (int64_t i = 0; i < int64_t{B} * n; i++) {
    if (tokens[i] < 0 || tokens[i] >= cfg.vocab)
      return Status::InvalidArgument(
          fmt::format("token id {} at position {} is outside the vocabulary [0, {})", tokens[i], i, cfg.vocab));
  }

  const int L = cfg.layers, C = cfg.channels, NH = cfg.heads, hs = C / NH, Vp = cfg.padded_vocab();
  const int N = B * n;
  const int64_t NC = int64_t{N} * C;
  const int64_t maxT = cache.max_T_;
  const MatmulPrecision prec = model.precision();
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const ParamPtrs p = model.param_ptrs();
  cache.reserve_rows(N);
  auto buf = [&](ScratchId id) { return cache.scratch_.tensor(id).f32(); };
  float* x = buf(kX);
  float* x2 = buf(kX2);
  float* ln = buf(kLn);
  float* mean = buf(kMean);
  float* rstd = buf(kRstd);
  float* qkv = buf(kQkv);
  float* atty = buf(kAtty);
  float* proj = buf(kProj);
  float* fch = buf(kFch);
  float* fch_gelu = buf(kFchGelu);
  float* scores = buf(kScores);

  // Positions pos0.. use rows pos0.. of wpe; encoder_forward indexes wpe by t < n.
  cpu::encoder_forward(x, tokens, p[kWte], p[kWpe] + int64_t{pos0} * C, B, n, C);
  for (int l = 0; l < L; l++) {
    cpu::layernorm_forward(ln, mean, rstd, x, p[kLn1W] + l * C, p[kLn1B] + l * C, N, C);
    cpu::matmul_forward(qkv, ln, p[kQkvW] + int64_t{l} * 3 * C * C, p[kQkvB] + l * 3 * C, N, C, 3 * C, prec);

    // Append this layer's keys and values: row (b, i) is position pos0 + i.
    float* keys = cache.keys(l);
    float* values = cache.values(l);
    for (int b = 0; b < B; b++) {
      for (int i = 0; i < n; i++) {
        const float* row = qkv + (int64_t{b} * n + i) * 3 * C;
        const int64_t at = (b * maxT + pos0 + i) * C;
        std::memcpy(keys + at, row + C, sizeof(float) * C);
        std::memcpy(values + at, row + 2 * C, sizeof(float) * C);
      }
    }

    // Query (b, h, i) at absolute position pos0 + i sees keys 0..pos0 + i.
    // Work grows with i, so items are dealt round-robin.
    const int items = B * NH * n;
#pragma omp parallel for schedule(static, 1) num_threads(cache.threads_) if (items > 1)
    for (int item = 0; item < items; item++) {
      const int i = item % n, h = (item / n) % NH, b = item / (n * NH);
      const int64_t row = int64_t{b} * n + i;
      const int64_t head0 = (int64_t{b} * maxT) * C + int64_t{h} * hs;
      attend(atty + row * C + h * hs, qkv + row * 3 * C + h * hs, keys + head0, values + head0, pos0 + i + 1, hs,
             C, scale, scores + omp_get_thread_num() * maxT);
    }

    cpu::matmul_forward(proj, atty, p[kAttProjW] + int64_t{l} * C * C, p[kAttProjB] + l * C, N, C, C, prec);
    cpu::residual_forward(x2, x, proj, NC);
    cpu::layernorm_forward(ln, mean, rstd, x2, p[kLn2W] + l * C, p[kLn2B] + l * C, N, C);
    cpu::matmul_forward(fch, ln, p[kFcW] + int64_t{l} * 4 * C * C, p[kFcB] + l * 4 * C, N, C, 4 * C, prec);
    cpu::gelu_forward(fch_gelu, fch, 4 * NC);
    cpu::matmul_forward(proj, fch_gelu, p[kFcProjW] + int64_t{l} * 4 * C * C, p[kFcProjB] + l * C, N, 4 * C, C,
                        prec);
    cpu::residual_forward(x, x2, proj, NC);
  }
  cpu::layernorm_forward(ln, mean, rstd, x, p[kLnfW], p[kLnfB], N, C);
  cpu::matmul_forward(logits, ln, p[kWte], nullptr, N, C, Vp, prec);
  cache.length_ = pos0 + n;
  return Status::OK();
}

}  // namespace tessera
