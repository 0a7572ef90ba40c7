// GPT-2: pre-LN transformer, learned positions, tied input/output embedding,
// 4C GELU MLP, causal attention, layernorm eps 1e-5 (llm.c's train_gpt2.c
// layout). Dimension letters: L layers, B batch, T time, C channels, NH
// heads, V vocabulary, Vp V padded to a multiple of 128, maxT context.
//
// Ownership: a GPT owns three arenas (parameters, gradients, activations).
// Parameters and gradients share one layout, so either can be treated as a
// flat buffer (global norm, all-reduce, checkpoint) or as named tensors.
// The activation arena is sized on the first forward() for (B, T) and
// re-laid only if a later call needs more; steady-state steps allocate
// nothing. Not thread-safe: one step at a time.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "kernels/precision.h"
#include "nn/ops_table.h"
#include "tensor/arena.h"

namespace tessera {

struct GPTConfig {
  int layers = 0;    // L
  int heads = 0;     // NH
  int channels = 0;  // C
  int vocab = 0;     // V
  int context = 0;   // maxT
  int padded_vocab() const { return (vocab + 127) / 128 * 128; }
  // Rejects non-positive sizes and C not divisible by NH, one line each.
  Status validate() const;
  // Parameters of the model as GPT-2 counts them (unpadded vocabulary).
  int64_t num_parameters() const;
  std::string str() const;  // "L=12 NH=12 C=768 V=50257 maxT=1024"
};

// The 16 parameter tensors, in arena order. Per-layer tensors stack L layers.
enum ParamId {
  kWte,       // (Vp, C); rows >= V stay zero
  kWpe,       // (maxT, C)
  kLn1W,      // (L, C)
  kLn1B,      // (L, C)
  kQkvW,      // (L, 3C, C)
  kQkvB,      // (L, 3C)
  kAttProjW,  // (L, C, C)
  kAttProjB,  // (L, C)
  kLn2W,      // (L, C)
  kLn2B,      // (L, C)
  kFcW,       // (L, 4C, C)
  kFcB,       // (L, 4C)
  kFcProjW,   // (L, C, 4C)
  kFcProjB,   // (L, C)
  kLnfW,      // (C)
  kLnfB,      // (C)
  kNumParams
};

struct ParamPtrs {
  float* p[kNumParams];
  float* operator[](int i) const { return p[i]; }
};

// Told during GPT::backward() as parameter gradients become final, so data
// parallelism can start reducing them while backward goes on. Events, in
// order: kFinalNorm (lnfw, lnfb), each layer L-1 ... 0 (its 12 per-layer
// tensors), then kEmbeddings (wte, which also holds the tied output layer's
// gradient, and wpe). Called on the backward thread; keep it short.
class GradListener {
 public:
  static constexpr int kFinalNorm = -1;
  static constexpr int kEmbeddings = -2;
  virtual ~GradListener() = default;
  virtual void on_grads_ready(int what) = 0;  // a layer index or a constant above
};

class GPT {
 public:
  GPT(const GPTConfig& config, Backend backend = Backend::kCPU);

  const GPTConfig& config() const { return config_; }
  void set_precision(MatmulPrecision p) { prec_ = p; }
  MatmulPrecision precision() const { return prec_; }
  Backend backend() const { return backend_; }

  Arena& params() { return params_; }
  Arena& grads() { return grads_; }
  const Arena& params() const { return params_; }
  ParamPtrs param_ptrs() const { return ptrs(params_); }
  ParamPtrs grad_ptrs() const { return ptrs(grads_); }
  // Whether AdamW decays this tensor (2-D weights only).
  static bool decays(int param_id);

  // GPT-2 initialisation: N(0, 0.02) weights, residual projections scaled by
  // 1/sqrt(2L), zero biases, unit layernorm weights. Deterministic for a seed.
  void init_weights(uint64_t seed);

  // Token ids in [0, V) and T <= maxT, or an error naming the first bad one.
  Status check_batch(const int* inputs, const int* targets, int B, int T) const;

  // Forward pass over inputs (B,T). With targets, returns the mean
  // cross-entropy and keeps what backward() needs; without, returns 0 and only
  // logits() are meaningful. The caller checks the batch (check_batch).
  float forward(const int* inputs, const int* targets, int B, int T);
  // Logits (B,T,Vp) of the last forward(); columns >= V are padding.
  const float* logits() const;
  // Per-position losses (B,T) of the last forward() with targets.
  const float* losses() const;

  void zero_grad() { grads_.zero(); }
  // Not owned; nullptr for none.
  void set_grad_listener(GradListener* l) { listener_ = l; }
  // Accumulates d(loss_scale * mean loss)/d(params) into grads() for the last
  // forward(); loss_scale is 1/grad_accum when accumulating micro-steps.
  void backward(float loss_scale = 1.0f);

 private:
  static ParamPtrs ptrs(const Arena& a);
  void layout_activations(int B, int T);

  GPTConfig config_;
  Backend backend_;
  const OpsTable& ops_;
  MatmulPrecision prec_ = MatmulPrecision::kF32;
  GradListener* listener_ = nullptr;
  Arena params_, grads_;
  Arena acts_;
  int act_B_ = 0, act_T_ = 0;  // activation arena capacity
  int B_ = 0, T_ = 0;          // shape of the last forward
  const int* inputs_ = nullptr;
  const int* targets_ = nullptr;
  std::vector<int> acts_idx_;  // arena indices, see gpt.cc
};

}  // namespace tessera
