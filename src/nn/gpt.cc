#include "nn/gpt.h"

#include <cmath>
#include <cstring>
#include <random>

#include <fmt/format.h>

#include "core/check.h"

namespace tessera {

Status GPTConfig::validate() const {
  if (layers <= 0) return Status::InvalidArgument(fmt::format("model.layers must be positive, got {}", layers));
  if (heads <= 0) return Status::InvalidArgument(fmt::format("model.heads must be positive, got {}", heads));
  if (channels <= 0) return Status::InvalidArgument(fmt::format("model.dim must be positive, got {}", channels));
  if (vocab <= 0) return Status::InvalidArgument(fmt::format("model.vocab must be positive, got {}", vocab));
  if (context <= 0) return Status::InvalidArgument(fmt::format("model.context must be positive, got {}", context));
  if (channels % heads != 0)
    return Status::InvalidArgument(
        fmt::format("model.dim ({}) must be divisible by model.heads ({})", channels, heads));
  if (vocab > 65536)
    return Status::InvalidArgument(fmt::format("model.vocab {} exceeds 65536 (tokens are stored as uint16)", vocab));
  return Status::OK();
}

int64_t GPTConfig::num_parameters() const {
  int64_t C = channels, L = layers;
  int64_t per_layer = 2 * C + 3 * C * C + 3 * C + C * C + C + 2 * C + 4 * C * C + 4 * C + 4 * C * C + C;
  return int64_t{vocab} * C + int64_t{context} * C + L * per_layer + 2 * C;
}

std::string GPTConfig::str() const {
  return fmt::format("L={} NH={} C={} V={} maxT={}", layers, heads, channels, vocab, context);
}

namespace {

// Activations kept for backward, and per-layer gradient scratch shared by all
// layers (backward visits one layer at a time). Shapes in gpt.h's letters.
enum ActId {
  kInputs,     // (B,T) int32
  kTargets,    // (B,T) int32
  kEncoded,    // (B,T,C)
  kLn1,        // (L,B,T,C)
  kLn1Mean,    // (L,B,T)
  kLn1Rstd,    // (L,B,T)
  kQkv,        // (L,B,T,3C)
  kAtty,       // (L,B,T,C)
  kPreatt,     // (L,B,NH,T,T)
  kAtt,        // (L,B,NH,T,T)
  kAttproj,    // (B,T,C) scratch: consumed by the residual add
  kResidual2,  // (L,B,T,C)
  kLn2,        // (L,B,T,C)
  kLn2Mean,    // (L,B,T)
  kLn2Rstd,    // (L,B,T)
  kFch,        // (L,B,T,4C)
  kFchGelu,    // (L,B,T,4C)
  kFcproj,     // (B,T,C) scratch
  kResidual3,  // (L,B,T,C)
  kLnf,        // (B,T,C)
  kLnfMean,    // (B,T)
  kLnfRstd,    // (B,T)
  kLogits,     // (B,T,Vp)
  kProbs,      // (B,T,Vp)
  kLosses,     // (B,T)
  // gradient scratch
  kDLogits,    // (B,T,Vp)
  kDResidual,  // (B,T,C): d(residual stream) flowing down the layers
  kDLnf,       // (B,T,C)
  kDFchGelu,   // (B,T,4C)
  kDFch,       // (B,T,4C)
  kDLn2,       // (B,T,C)
  kDAtty,      // (B,T,C)
  kDPreatt,    // (B,NH,T,T)
  kDAtt,       // (B,NH,T,T)
  kDQkv,       // (B,T,3C)
  kDLn1,       // (B,T,C)
  kNumActs
};

void reserve_params(Arena& a, const GPTConfig& c) {
  const int64_t L = c.layers, C = c.channels;
  a.reserve("wte", DType::kF32, {c.padded_vocab(), C});
  a.reserve("wpe", DType::kF32, {c.context, C});
  a.reserve("ln1w", DType::kF32, {L, C});
  a.reserve("ln1b", DType::kF32, {L, C});
  a.reserve("qkvw", DType::kF32, {L, 3 * C, C});
  a.reserve("qkvb", DType::kF32, {L, 3 * C});
  a.reserve("attprojw", DType::kF32, {L, C, C});
  a.reserve("attprojb", DType::kF32, {L, C});
  a.reserve("ln2w", DType::kF32, {L, C});
  a.reserve("ln2b", DType::kF32, {L, C});
  a.reserve("fcw", DType::kF32, {L, 4 * C, C});
  a.reserve("fcb", DType::kF32, {L, 4 * C});
  a.reserve("fcprojw", DType::kF32, {L, C, 4 * C});
  a.reserve("fcprojb", DType::kF32, {L, C});
  a.reserve("lnfw", DType::kF32, {C});
  a.reserve("lnfb", DType::kF32, {C});
  a.allocate();
}

}  // namespace

GPT::GPT(const GPTConfig& config, Backend backend) : config_(config), backend_(backend), ops_(ops_for(backend)) {
  CHECK(config_.validate().ok());
  reserve_params(params_, config_);
  grads_ = params_.clone_layout();
  CHECK(params_.count() == kNumParams);
}

ParamPtrs GPT::ptrs(const Arena& a) {
  ParamPtrs p;
  for (int i = 0; i < kNumParams; i++) p.p[i] = a.tensor(i).f32();
  return p;
}

bool GPT::decays(int id) {
  return id == kWte || id == kWpe || id == kQkvW || id == kAttProjW || id == kFcW || id == kFcProjW;
}

void GPT::init_weights(uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  const float proj_scale = 1.0f / std::sqrt(2.0f * config_.layers);
  params_.zero();
  for (int id = 0; id < kNumParams; id++) {
    Tensor t = params_.tensor(id);
    float* x = t.f32();
    int64_t n = t.numel();
    if (id == kWte) n = int64_t{config_.vocab} * config_.channels;  // padding rows stay 0
    if (decays(id)) {
      float s = (id == kAttProjW || id == kFcProjW) ? proj_scale : 1.0f;
      for (int64_t i = 0; i < n; i++) x[i] = normal(rng) * s;
    } else if (id == kLn1W || id == kLn2W || id == kLnfW) {
      for (int64_t i = 0; i < n; i++) x[i] = 1.0f;
    }
  }
}

Status GPT::check_batch(const int* inputs, const int* targets, int B, int T) const {
  if (B <= 0 || T <= 0) return Status::InvalidArgument(fmt::format("batch {}x{} is empty", B, T));
  if (T > config_.context)
    return Status::InvalidArgument(
        fmt::format("sequence length {} exceeds the model's context {}", T, config_.context));
  for (int which = 0; which < 2; which++) {
    const int* ids = which == 0 ? inputs : targets;
    if (!ids) continue;
    for (int64_t i = 0; i < int64_t{B} * T; i++) {
      if (ids[i] < 0 || ids[i] >= config_.vocab)
        return Status::InvalidArgument(fmt::format("token id {} at position {} is outside the vocabulary [0, {})",
                                                   ids[i], i, config_.vocab));
    }
  }
  return Status::OK();
}

void GPT::layout_activations(int B, int T) {
  if (B * T <= act_B_ * act_T_ && T <= act_T_ && B <= act_B_) return;
  const int64_t L = config_.layers, C = config_.channels, NH = config_.heads, Vp = config_.padded_vocab();
  const int64_t BT = int64_t{B} * T;
  Arena a;
  acts_idx_.assign(kNumActs, -1);
  auto add = [&](ActId id, const char* name, DType dt, Shape s) { acts_idx_[id] = a.reserve(name, dt, s); };
  add(kInputs, "inputs", DType::kI32, {BT});
  add(kTargets, "targets", DType::kI32, {BT});
  add(kEncoded, "encoded", DType::kF32, {BT, C});
  add(kLn1, "ln1", DType::kF32, {L, BT, C});
  add(kLn1Mean, "ln1_mean", DType::kF32, {L, BT});
  add(kLn1Rstd, "ln1_rstd", DType::kF32, {L, BT});
  add(kQkv, "qkv", DType::kF32, {L, BT, 3 * C});
  add(kAtty, "atty", DType::kF32, {L, BT, C});
  add(kPreatt, "preatt", DType::kF32, {L, B * NH, T, T});
  add(kAtt, "att", DType::kF32, {L, B * NH, T, T});
  add(kAttproj, "attproj", DType::kF32, {BT, C});
  add(kResidual2, "residual2", DType::kF32, {L, BT, C});
  add(kLn2, "ln2", DType::kF32, {L, BT, C});
  add(kLn2Mean, "ln2_mean", DType::kF32, {L, BT});
  add(kLn2Rstd, "ln2_rstd", DType::kF32, {L, BT});
  add(kFch, "fch", DType::kF32, {L, BT, 4 * C});
  add(kFchGelu, "fch_gelu", DType::kF32, {L, BT, 4 * C});
  add(kFcproj, "fcproj", DType::kF32, {BT, C});
  add(kResidual3, "residual3", DType::kF32, {L, BT, C});
  add(kLnf, "lnf", DType::kF32, {BT, C});
  add(kLnfMean, "lnf_mean", DType::kF32, {BT});
  add(kLnfRstd, "lnf_rstd", DType::kF32, {BT});
  add(kLogits, "logits", DType::kF32, {BT, Vp});
  add(kProbs, "probs", DType::kF32, {BT, Vp});
  add(kLosses, "losses", DType::kF32, {BT});
  add(kDLogits, "dlogits", DType::kF32, {BT, Vp});
  add(kDResidual, "dresidual", DType::kF32, {BT, C});
  add(kDLnf, "dlnf", DType::kF32, {BT, C});
  add(kDFchGelu, "dfch_gelu", DType::kF32, {BT, 4 * C});
  add(kDFch, "dfch", DType::kF32, {BT, 4 * C});
  add(kDLn2, "dln2", DType::kF32, {BT, C});
  add(kDAtty, "datty", DType::kF32, {BT, C});
  add(kDPreatt, "dpreatt", DType::kF32, {B * NH, T, T});
  add(kDAtt, "datt", DType::kF32, {B * NH, T, T});
  add(kDQkv, "dqkv", DType::kF32, {BT, 3 * C});
  add(kDLn1, "dln1", DType::kF32, {BT, C});
  a.allocate();
  acts_ = std::move(a);
  act_B_ = B;
  act_T_ = T;
}

namespace {
// Views of a (B,T)-shaped activation inside an arena laid out for a larger
// capacity: only the first B*T rows are used, so offsets by layer must use
// the current B*T, not the capacity. Per-layer tensors are therefore indexed
// with the current B*T stride below.
struct ActView {
  const Arena* a;
  const std::vector<int>* idx;
  float* f(int id) const { return a->tensor((*idx)[id]).f32(); }
  int* i(int id) const { return static_cast<int*>(a->tensor((*idx)[id]).data); }
};
}  // namespace

float GPT::forward(const int* inputs, const int* targets, int B, int T) {
  layout_activations(B, T);
  B_ = B;
  T_ = T;
  const int L = config_.layers, C = config_.channels, NH = config_.heads, V = config_.vocab;
  const int Vp = config_.padded_vocab();
  const int BT = B * T;
  const int64_t BTC = int64_t{BT} * C;
  const int64_t att_size = int64_t{B} * NH * T * T;
  ActView act{&acts_, &acts_idx_};
  ParamPtrs p = param_ptrs();

  std::memcpy(act.i(kInputs), inputs, sizeof(int) * BT);
  targets_ = nullptr;
  if (targets) {
    std::memcpy(act.i(kTargets), targets, sizeof(int) * BT);
    targets_ = act.i(kTargets);
  }
  inputs_ = act.i(kInputs);

  ops_.encoder_forward(act.f(kEncoded), inputs_, p[kWte], p[kWpe], B, T, C);
  for (int l = 0; l < L; l++) {
    const float* residual = l == 0 ? act.f(kEncoded) : act.f(kResidual3) + (l - 1) * BTC;
    float* ln1 = act.f(kLn1) + l * BTC;
    float* ln1_mean = act.f(kLn1Mean) + l * BT;
    float* ln1_rstd = act.f(kLn1Rstd) + l * BT;
    float* qkv = act.f(kQkv) + l * 3 * BTC;
    float* atty = act.f(kAtty) + l * BTC;
    float* preatt = act.f(kPreatt) + l * att_size;
    float* att = act.f(kAtt) + l * att_size;
    float* attproj = act.f(kAttproj);
    float* residual2 = act.f(kResidual2) + l * BTC;
    float* ln2 = act.f(kLn2) + l * BTC;
    float* ln2_mean = act.f(kLn2Mean) + l * BT;
    float* ln2_rstd = act.f(kLn2Rstd) + l * BT;
    float* fch = act.f(kFch) + l * 4 * BTC;
    float* fch_gelu = act.f(kFchGelu) + l * 4 * BTC;
    float* fcproj = act.f(kFcproj);
    float* residual3 = act.f(kResidual3) + l * BTC;

    ops_.layernorm_forward(ln1, ln1_mean, ln1_rstd, residual, p[kLn1W] + l * C, p[kLn1B] + l * C, BT, C);
    ops_.matmul_forward(qkv, ln1, p[kQkvW] + int64_t{l} * 3 * C * C, p[kQkvB] + l * 3 * C, BT, C, 3 * C, prec_);
    ops_.attention_forward(atty, preatt, att, qkv, B, T, C, NH);
    ops_.matmul_forward(attproj, atty, p[kAttProjW] + int64_t{l} * C * C, p[kAttProjB] + l * C, BT, C, C, prec_);
    ops_.residual_forward(residual2, residual, attproj, BTC);
    ops_.layernorm_forward(ln2, ln2_mean, ln2_rstd, residual2, p[kLn2W] + l * C, p[kLn2B] + l * C, BT, C);
    ops_.matmul_forward(fch, ln2, p[kFcW] + int64_t{l} * 4 * C * C, p[kFcB] + l * 4 * C, BT, C, 4 * C, prec_);
    ops_.gelu_forward(fch_gelu, fch, 4 * BTC);
    ops_.matmul_forward(fcproj, fch_gelu, p[kFcProjW] + int64_t{l} * 4 * C * C, p[kFcProjB] + l * C, BT, 4 * C,
                        C, prec_);
    ops_.residual_forward(residual3, residual2, fcproj, BTC);
  }
  const float* residual = act.f(kResidual3) + (L - 1) * BTC;
  ops_.layernorm_forward(act.f(kLnf), act.f(kLnfMean), act.f(kLnfRstd), residual, p[kLnfW], p[kLnfB], BT, C);
  ops_.matmul_forward(act.f(kLogits), act.f(kLnf), p[kWte], nullptr, BT, C, Vp, prec_);
  if (!targets) return 0.0f;

  float* losses = act.f(kLosses);
  ops_.crossentropy_softmax_forward(losses, act.f(kProbs), act.f(kLogits), targets_, BT, V, Vp);
  double sum = 0.0;
  for (int i = 0; i < BT; i++) sum += losses[i];
  return static_cast<float>(sum / BT);
}

const float* GPT::logits() const { return acts_.tensor(acts_idx_[kLogits]).f32(); }
const float* GPT::losses() const { return acts_.tensor(acts_idx_[kLosses]).f32(); }

void GPT::backward(float loss_scale) {
  CHECK(targets_ != nullptr);  // backward needs a forward with targets
  const int B = B_, T = T_;
  const int L = config_.layers, C = config_.channels, NH = config_.heads, V = config_.vocab;
  const int Vp = config_.padded_vocab();
  const int BT = B * T;
  const int64_t BTC = int64_t{BT} * C;
  const int64_t att_size = int64_t{B} * NH * T * T;
  ActView act{&acts_, &acts_idx_};
  ParamPtrs p = param_ptrs();
  ParamPtrs g = grad_ptrs();
  auto zero = [](float* x, int64_t n) { std::memset(x, 0, sizeof(float) * n); };

  float* dlogits = act.f(kDLogits);
  float* dresidual = act.f(kDResidual);
  float* dlnf = act.f(kDLnf);
  zero(dlogits, int64_t{BT} * Vp);
  zero(dresidual, BTC);
  zero(dlnf, BTC);

  ops_.crossentropy_softmax_backward(dlogits, act.f(kProbs), targets_, loss_scale / BT, BT, V, Vp);
  ops_.matmul_backward(dlnf, g[kWte], nullptr, dlogits, act.f(kLnf), p[kWte], BT, C, Vp, prec_);
  const float* last = act.f(kResidual3) + (L - 1) * BTC;
  ops_.layernorm_backward(dresidual, g[kLnfW], g[kLnfB], dlnf, last, p[kLnfW], act.f(kLnfMean), act.f(kLnfRstd), BT,
                          C);
  if (listener_) listener_->on_grads_ready(GradListener::kFinalNorm);

  // dresidual holds d(output of layer l). Each block is x + f(ln(x)): the
  // residual path passes dresidual through unchanged, and the branch's
  // layernorm backward adds its part into the same buffer.
  for (int l = L - 1; l >= 0; l--) {
    const float* residual = l == 0 ? act.f(kEncoded) : act.f(kResidual3) + (l - 1) * BTC;
    const float* ln1 = act.f(kLn1) + l * BTC;
    const float* qkv = act.f(kQkv) + l * 3 * BTC;
    const float* atty = act.f(kAtty) + l * BTC;
    const float* att = act.f(kAtt) + l * att_size;
    const float* residual2 = act.f(kResidual2) + l * BTC;
    const float* ln2 = act.f(kLn2) + l * BTC;
    const float* fch = act.f(kFch) + l * 4 * BTC;
    const float* fch_gelu = act.f(kFchGelu) + l * 4 * BTC;
    float* dfch_gelu = act.f(kDFchGelu);
    float* dfch = act.f(kDFch);
    float* dln2 = act.f(kDLn2);
    float* datty = act.f(kDAtty);
    float* dpreatt = act.f(kDPreatt);
    float* datt = act.f(kDAtt);
    float* dqkv = act.f(kDQkv);
    float* dln1 = act.f(kDLn1);
    zero(dfch_gelu, 4 * BTC);
    zero(dfch, 4 * BTC);
    zero(dln2, BTC);
    zero(datty, BTC);
    zero(dpreatt, att_size);
    zero(datt, att_size);
    zero(dqkv, 3 * BTC);
    zero(dln1, BTC);

    // MLP branch: residual3 = residual2 + fcproj(gelu(fc(ln2(residual2))))
    ops_.matmul_backward(dfch_gelu, g[kFcProjW] + int64_t{l} * 4 * C * C, g[kFcProjB] + l * C, dresidual, fch_gelu,
                         p[kFcProjW] + int64_t{l} * 4 * C * C, BT, 4 * C, C, prec_);
    ops_.gelu_backward(dfch, fch, dfch_gelu, 4 * BTC);
    ops_.matmul_backward(dln2, g[kFcW] + int64_t{l} * 4 * C * C, g[kFcB] + l * 4 * C, dfch, ln2,
                         p[kFcW] + int64_t{l} * 4 * C * C, BT, C, 4 * C, prec_);
    ops_.layernorm_backward(dresidual, g[kLn2W] + l * C, g[kLn2B] + l * C, dln2, residual2, p[kLn2W] + l * C,
                            act.f(kLn2Mean) + l * BT, act.f(kLn2Rstd) + l * BT, BT, C);
    // Attention branch: residual2 = residual + attproj(attn(qkv(ln1(residual))))
    ops_.matmul_backward(datty, g[kAttProjW] + int64_t{l} * C * C, g[kAttProjB] + l * C, dresidual, atty,
                         p[kAttProjW] + int64_t{l} * C * C, BT, C, C, prec_);
    ops_.attention_backward(dqkv, dpreatt, datt, datty, qkv, att, B, T, C, NH);
    ops_.matmul_backward(dln1, g[kQkvW] + int64_t{l} * 3 * C * C, g[kQkvB] + l * 3 * C, dqkv, ln1,
                         p[kQkvW] + int64_t{l} * 3 * C * C, BT, C, 3 * C, prec_);
    ops_.layernorm_backward(dresidual, g[kLn1W] + l * C, g[kLn1B] + l * C, dln1, residual, p[kLn1W] + l * C,
                            act.f(kLn1Mean) + l * BT, act.f(kLn1Rstd) + l * BT, BT, C);
    if (listener_) listener_->on_grads_ready(l);
  }
  ops_.encoder_backward(g[kWte], g[kWpe], dresidual, inputs_, B, T, C);
  if (listener_) listener_->on_grads_ready(GradListener::kEmbeddings);
}

}  // namespace tessera
