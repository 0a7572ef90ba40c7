#include "nn/gpt.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <new>
#include <optional>
#include <random>

#include <sys/mman.h>
#include <unistd.h>

#include <fmt/format.h>

#include "core/check.h"
#include "comm/communicator.h"
#include "kernels/cpu/int8_kernel.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/ops.h"
#include "io/gguf.h"
#include "kernels/q4.h"
#include "nn/int8_check.h"
#include "nn/kv_cache.h"
#include "nn/vocab_parallel.h"
#include "obs/trace.h"
#include "tensor/device_memory.h"

namespace tessera {

namespace {

// Activations kept for backward, one set per pipeline slot (micro-batch in
// flight), then scratch shared by all slots. Shapes in gpt.h's letters, with
// Ll this stage's layers, NHl = NH/tp query heads of hs, Ql = NHl*hs,
// QKVl = (NHl + 2 KV/tp)*hs, Fl = F/tp, FCl = Fl (GELU) or 2Fl (SwiGLU's gate
// and up), Vl = Vp/tp;
// "last:" and "first:" tensors are empty on other stages. Attention buffers
// hold S floats per (b, h, t) row: S = T for the CPU backends (the (T,T)
// matrices), S = 1 for CUDA's flash attention (OpsTable's
// attention_saved_floats and attention_scratch_floats). "full head:"
// tensors exist on the CPU backends only; "chunked head:" ones on CUDA,
// whose output layer works on Hc = min(B*T, head_chunk_rows_) rows at once.
enum ActId {
  kInputs,     // (B,T) int32
  kTargets,    // (B,T) int32
  kEncoded,    // (B,T,C) embeddings, or the input received from the previous stage
  kLn1,        // (Ll,B,T,C)
  kLn1Mean,    // (Ll,B,T)
  kLn1Rstd,    // (Ll,B,T)
  kQkv,        // (Ll,B,T,QKVl): rotated queries and keys with rotary positions
  kAtty,       // (Ll,B,T,Ql)
  kAtt,        // (Ll,B,NHl,T,S): softmax probabilities, or flash's log-sum-exp
  kResidual2,  // (Ll,B,T,C)
  kLn2,        // (Ll,B,T,C)
  kLn2Mean,    // (Ll,B,T)
  kLn2Rstd,    // (Ll,B,T)
  kFch,        // (Ll,B,T,FCl)
  kFchGelu,    // (Ll,B,T,Fl): gelu(fch), or SwiGLU's silu(gate) * up
  kResidual3,  // (Ll,B,T,C)
  kLnf,        // last: (B,T,C)
  kLnfMean,    // last: (B,T)
  kLnfRstd,    // last: (B,T)
  kLogits,     // last, full head: (B,T,Vl)
  kProbs,      // last, full head: (B,T,Vl)
  kLosses,     // last: (B,T)
  kLse,        // last, chunked head: (B,T) log-sum-exp of each row's logits
  kLocalTargets,  // last, tp > 1: (B,T) int32, target - v0 or -1 off this rank's vocabulary
  kDInput,     // not first: (B,T,C) d(stage input), sent to the previous stage
  kPositions,  // rotary: (B,T) int32, each row's position t
  kNumSlotActs,
  // scratch
  kPreatt = kNumSlotActs,  // (B,NHl,T,S)
  kAttproj,    // (B,T,C): consumed by the residual add
  kFcproj,     // (B,T,C)
  kDLogits,    // last, full head: (B,T,Vl)
  kHeadChunk,  // last, chunked head: (Hc,Vl) one chunk's logits, then its dlogits
  kDResidual,  // (B,T,C): d(residual stream) flowing down the layers
  kDLnf,       // last: (B,T,C)
  kDFchGelu,   // (B,T,Fl)
  kDFch,       // (B,T,FCl)
  kDLn2,       // (B,T,C)
  kDAtty,      // (B,T,Ql)
  kDPreatt,    // (B,NHl,T,S)
  kDAtt,       // (B,NHl,T,S)
  kDQkv,       // (B,T,QKVl)
  kDLn1,       // (B,T,C)
  kCEStats,    // tp > 1: (3,B,T) row max, sum of exp, target logit
  kNumActs
};

}  // namespace

namespace {
// A rank's widths (gpt.cc's letters above).
struct LocalDims {
  int C, NHl, KVl, hs, Ql, QKVl, Fl, FCl;
};
LocalDims local_dims(const GPTConfig& c, const ModelShard& s) {
  LocalDims d;
  d.C = c.channels;
  d.NHl = c.heads / s.tp;
  d.KVl = c.kv() / s.tp;
  d.hs = c.hs();
  d.Ql = d.NHl * d.hs;
  d.QKVl = (d.NHl + 2 * d.KVl) * d.hs;
  d.Fl = c.ffn() / s.tp;
  d.FCl = c.fc_rows() / s.tp;
  return d;
}
}  // namespace

GPT::GPT(Uninitialised, const GPTConfig& config, Backend backend, const ModelShard& shard, comm::Communicator* tp_comm,
         ModelUse use)
    : config_(config),
      shard_(shard),
      tp_comm_(tp_comm),
      backend_(backend),
      device_(device_of(backend)),
      use_(use),
      ops_(ops_for(backend)) {}

Result<std::unique_ptr<GPT>> GPT::create(const GPTConfig& config, Backend backend, const ModelShard& shard,
                                         comm::Communicator* tp_comm, ModelUse use) {
  // Before the constructor: ops_for() of a backend not compiled in aborts.
  RETURN_IF_ERROR(backend_available(backend));
  std::unique_ptr<GPT> model(new GPT(Uninitialised{}, config, backend, shard, tp_comm, use));
  RETURN_IF_ERROR(model->init());
  return model;
}

Status GPT::init() {
  RETURN_IF_ERROR(config_.validate());
  RETURN_IF_ERROR(shard_.validate(config_));
  if (shard_.tp > 1 && tp_comm_ == nullptr)
    return Status::InvalidArgument(fmt::format("a tensor-parallel shard (tp = {}) needs its communicator", shard_.tp));
  // Tensor parallelism is CPU-only: nn/vocab_parallel.cc runs host loops.
  if (device_ != Device::kCPU && shard_.tp > 1)
    return Status::InvalidArgument(fmt::format(
        "tensor parallelism (tp = {}) runs on the CPU only, not on the {} backend", shard_.tp, backend_name(backend_)));
  RETURN_IF_ERROR(backend_available(backend_));
  // The Llama family's ops are ref and cpu only so far.
  const bool gqa = config_.kv() != config_.heads;
  const bool rms = config_.norm == Norm::kRMSNorm, rope = config_.positions == Positions::kRope;
  const bool swiglu = config_.mlp == Mlp::kSwiGLU;
  if ((gqa && !ops_.attention_gqa_forward) || (rms && !ops_.rmsnorm_forward) || (rope && !ops_.rope_forward) ||
      (swiglu && !ops_.swiglu_forward))
    return Status::Unavailable(fmt::format(
        "the {} backend has no kernels yet for {} (grouped-query attention, RMSNorm, rotary positions, SwiGLU run on "
        "the CPU backends)",
        backend_name(backend_), config_.str()));
  if (rope) {
    const std::vector<float> f = config_.rope_inv_freq();
    Arena r;
    r.set_device(device_);
    r.reserve("rope_inv_freq", DType::kF32, {static_cast<int64_t>(f.size())});
    RETURN_IF_ERROR(r.try_allocate().With("the rotary frequencies"));
    RETURN_IF_ERROR(try_copy_to_device(device_, r.tensor(0).f32(), f.data(), sizeof(float) * f.size()));
    rope_ = std::move(r);
  }
  if (shard_.layer_end < 0) shard_.layer_end = config_.layers;
  shard_.first = shard_.layer_begin == 0;
  shard_.last = shard_.layer_end == config_.layers;
  local_layers_ = shard_.layer_end - shard_.layer_begin;
  Vl_ = config_.padded_vocab(shard_.tp) / shard_.tp;
  v0_ = shard_.tp_rank * Vl_;
  if (use_ == ModelUse::kInt8Inference && (device_ != Device::kCPU || !whole()))
    return Status::InvalidArgument("an INT8 model is whole and on the CPU (the INT8 tier)");
  // The INT8 tier's model holds its matmul weights only as INT8 matrices.
  const int int8_omit[] = {kQkvW, kAttProjW, kFcW, kFcProjW, kLmHead};
  Arena params = param_layout(config_, shard_,
                              use_ == ModelUse::kInt8Inference ? std::span<const int>(int8_omit) : std::span<const int>());
  fp32_released_ = use_ == ModelUse::kInt8Inference;
  CHECK(params.count() == kNumParams);
  params.set_device(device_);
  const char* what = use_ == ModelUse::kTraining        ? "the parameters of"
                     : use_ == ModelUse::kInt8Inference ? "the fp32 weights (embeddings, norms, biases) of"
                                                        : "the weights of";
  RETURN_IF_ERROR(params.try_allocate().With(fmt::format("{} {}", what, config_.str())));
  if (use_ == ModelUse::kTraining) {
    Result<Arena> grads = params.try_clone_layout(device_);
    if (!grads.ok()) return grads.status().With(fmt::format("the gradients of {}", config_.str()));
    grads_ = std::move(grads).value();
  }
  params_ = std::move(params);
  return Status::OK();
}

LayerParams layer_view(const ParamPtrs& p, const GPTConfig& c, const ModelShard& s, int l) {
  const LocalDims d = local_dims(c, s);
  const int64_t C = d.C;
  const bool ln = c.norm == Norm::kLayerNorm;
  // Layer l's block of tensor id, null where the tensor has no elements.
  auto at = [&](int id, int64_t per_layer, bool present = true) -> float* {
    return present && p[id] != nullptr ? p[id] + l * per_layer : nullptr;
  };
  LayerParams v;
  v.ln1w = at(kLn1W, C);
  v.ln1b = at(kLn1B, C, ln);
  v.qkvw = at(kQkvW, int64_t{d.QKVl} * C);
  v.qkvb = at(kQkvB, d.QKVl, c.qkv_bias);
  v.attprojw = at(kAttProjW, C * d.Ql);
  v.attprojb = at(kAttProjB, C, c.bias);
  v.ln2w = at(kLn2W, C);
  v.ln2b = at(kLn2B, C, ln);
  v.fcw = at(kFcW, int64_t{d.FCl} * C);
  v.fcb = at(kFcB, d.FCl, c.bias);
  v.fcprojw = at(kFcProjW, C * d.Fl);
  v.fcprojb = at(kFcProjB, C, c.bias);
  return v;
}

LayerParams GPT::layer_params(int l) const {
  ParamPtrs p = param_ptrs();
  // The INT8 tier's model has no fp32 matmul weights (ModelUse).
  if (use_ == ModelUse::kInt8Inference)
    for (int id : {kQkvW, kAttProjW, kFcW, kFcProjW}) p.p[id] = nullptr;
  return layer_view(p, config_, shard_, l);
}

ParamPtrs GPT::ptrs(const Arena& a) {
  ParamPtrs p;
  for (int i = 0; i < kNumParams; i++) p.p[i] = a.tensor(i).f32();
  return p;
}

bool GPT::decays(int id) { return param_decays(id); }

bool GPT::counts_in_norm(int id) const {
  switch (id) {
    case kWte: return shard_.first;  // the last stage's copy (tied head) holds the same gradient
    case kQkvW:
    case kQkvB:
    case kAttProjW:
    case kFcW:
    case kFcB:
    case kFcProjW:
    case kLmHead: return true;  // split across tp ranks
    default: return shard_.tp_rank == 0;  // replicated across tp ranks
  }
}

Status GPT::init_weights(uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  const float proj_scale = 1.0f / std::sqrt(2.0f * config_.layers);
  RETURN_IF_ERROR(params_.try_zero());
  // Off the CPU: the same draws into a host copy, then one upload.
  Arena staging;
  if (device_ != Device::kCPU) {
    Result<Arena> host = params_.try_clone_layout(Device::kCPU);
    if (!host.ok()) return host.status().With(fmt::format("initialising {}", config_.str()));
    staging = std::move(host).value();
  }
  const Arena& dst = device_ == Device::kCPU ? params_ : staging;
  std::vector<float> full;  // one whole tensor at a time
  int64_t largest = 0;
  for (int id = 0; id < kNumParams; id++) largest = std::max(largest, param_slice(config_, shard_, id).global.numel());
  try {
    full.reserve(static_cast<size_t>(largest));
  } catch (const std::bad_alloc&) {
    return Status::ResourceExhausted(fmt::format("initialising {}: cannot allocate a {:.1f} MB host buffer: out of memory",
                                                 config_.str(), static_cast<double>(largest) * sizeof(float) / 1e6));
  }
  for (int id = 0; id < kNumParams; id++) {
    const TensorSlice t = param_slice(config_, shard_, id);
    int64_t n = t.global.numel();
    full.assign(n, 0.0f);
    if ((id == kWte || id == kLmHead) && n > 0) n = int64_t{config_.vocab} * config_.channels;  // padding rows stay 0
    if (decays(id)) {
      float s = (id == kAttProjW || id == kFcProjW) ? proj_scale : 1.0f;
      for (int64_t i = 0; i < n; i++) full[i] = normal(rng) * s;
    } else if (id == kLn1W || id == kLn2W || id == kLnfW) {
      std::fill(full.begin(), full.end(), 1.0f);
    }
    if (t.block_numel() > 0) gather_block(full.data(), t, dst.tensor(id).f32());
  }
  if (device_ != Device::kCPU) return params_.try_copy_from(staging).With(fmt::format("initialising {}", config_.str()));
  return Status::OK();
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

Status GPT::try_reserve_activations(int B, int T, int slots) {
  CHECK(B > 0 && T > 0 && slots > 0);
  const int have = static_cast<int>(slot_acts_.size());
  if (have > 0 && slots <= have && B <= act_B_ && T <= act_T_) return Status::OK();
  B = std::max(B, act_B_);
  T = std::max(T, act_T_);
  slots = std::max(slots, have);
  const LocalDims d = local_dims(config_, shard_);
  const int64_t Ll = local_layers_, C = config_.channels, tp = shard_.tp;
  const int64_t NHl = d.NHl, Ql = d.Ql, QKVl = d.QKVl, Fl = d.Fl, FCl = d.FCl, Vl = Vl_;
  const int64_t BT = int64_t{B} * T;
  const int hs = d.hs;
  const int64_t rope = config_.positions == Positions::kRope ? 1 : 0;
  // Attention floats per (b, h) at capacity T; a shorter batch's layers fit
  // (S(T) is T or 1, never more for a smaller T).
  const int64_t att_saved = T * att_saved_floats(T, hs);
  const int64_t att_scratch = T * att_scratch_floats(T, hs);
  const int64_t last = shard_.last ? 1 : 0, first = shard_.first ? 1 : 0;
  const int64_t full_head = chunked_head() ? 0 : last, chunked = chunked_head() ? last : 0;
  const int64_t head_rows = std::min<int64_t>(BT, head_chunk_rows_);
  std::vector<int> idx(kNumActs, -1);
  auto layout_slot = [&](Arena& a) {
    a.set_device(device_);
    auto add = [&](ActId id, const char* name, DType dt, Shape s) { idx[id] = a.reserve(name, dt, s); };
    add(kInputs, "inputs", DType::kI32, {BT});
    add(kTargets, "targets", DType::kI32, {BT});
    add(kEncoded, "encoded", DType::kF32, {BT, C});
    add(kLn1, "ln1", DType::kF32, {Ll, BT, C});
    add(kLn1Mean, "ln1_mean", DType::kF32, {Ll, BT});
    add(kLn1Rstd, "ln1_rstd", DType::kF32, {Ll, BT});
    add(kQkv, "qkv", DType::kF32, {Ll, BT, QKVl});
    add(kAtty, "atty", DType::kF32, {Ll, BT, Ql});
    add(kAtt, "att", DType::kF32, {Ll, B * NHl, att_saved});
    add(kResidual2, "residual2", DType::kF32, {Ll, BT, C});
    add(kLn2, "ln2", DType::kF32, {Ll, BT, C});
    add(kLn2Mean, "ln2_mean", DType::kF32, {Ll, BT});
    add(kLn2Rstd, "ln2_rstd", DType::kF32, {Ll, BT});
    add(kFch, "fch", DType::kF32, {Ll, BT, FCl});
    add(kFchGelu, "fch_gelu", DType::kF32, {Ll, BT, Fl});
    add(kResidual3, "residual3", DType::kF32, {Ll, BT, C});
    add(kLnf, "lnf", DType::kF32, {last * BT, C});
    add(kLnfMean, "lnf_mean", DType::kF32, {last * BT});
    add(kLnfRstd, "lnf_rstd", DType::kF32, {last * BT});
    add(kLogits, "logits", DType::kF32, {full_head * BT, Vl});
    add(kProbs, "probs", DType::kF32, {full_head * BT, Vl});
    add(kLosses, "losses", DType::kF32, {last * BT});
    add(kLse, "lse", DType::kF32, {chunked * BT});
    add(kLocalTargets, "local_targets", DType::kI32, {(tp > 1 ? last : 0) * BT});
    add(kDInput, "dinput", DType::kF32, {(1 - first) * BT, C});
    add(kPositions, "positions", DType::kI32, {rope * BT});
  };
  // The new arenas replace the old only once all of them are allocated.
  const std::string what = fmt::format("the activations of {} micro-batch(es) of {}x{} tokens", slots, B, T);
  std::vector<Arena> acts(slots);
  for (Arena& a : acts) {
    layout_slot(a);
    RETURN_IF_ERROR(a.try_allocate().With(what));
  }
  Arena s;
  s.set_device(device_);
  auto add = [&](ActId id, const char* name, Shape shape) { idx[id] = s.reserve(name, DType::kF32, shape); };
  add(kPreatt, "preatt", {B * NHl, att_scratch});
  add(kAttproj, "attproj", {BT, C});
  add(kFcproj, "fcproj", {BT, C});
  add(kDLogits, "dlogits", {full_head * BT, Vl});
  add(kHeadChunk, "head_chunk", {chunked * head_rows, Vl});
  add(kDResidual, "dresidual", {BT, C});
  add(kDLnf, "dlnf", {last * BT, C});
  add(kDFchGelu, "dfch_gelu", {BT, Fl});
  add(kDFch, "dfch", {BT, FCl});
  add(kDLn2, "dln2", {BT, C});
  add(kDAtty, "datty", {BT, Ql});
  add(kDPreatt, "dpreatt", {B * NHl, att_scratch});
  add(kDAtt, "datt", {B * NHl, att_scratch});
  add(kDQkv, "dqkv", {BT, QKVl});
  add(kDLn1, "dln1", {BT, C});
  add(kCEStats, "ce_stats", {(tp > 1 ? 3 : 0) * BT});
  RETURN_IF_ERROR(s.try_allocate().With(what));
  slot_acts_ = std::move(acts);
  scratch_ = std::move(s);
  slot_state_.assign(slots, SlotState{});
  acts_idx_ = std::move(idx);
  act_B_ = B;
  act_T_ = T;
  held_logits_ = HeldLogits{};
  return Status::OK();
}

void GPT::set_head_chunk_rows(int rows) {
  CHECK(rows > 0);
  if (rows == head_chunk_rows_) return;
  head_chunk_rows_ = rows;
  // The chunk buffer is sized from it: lay the arenas out again on the next
  // try_reserve_activations().
  slot_acts_.clear();
  scratch_ = Arena();
  slot_state_.clear();
  act_B_ = act_T_ = 0;
  held_logits_ = HeldLogits{};
}

int64_t GPT::activation_bytes() const {
  int64_t n = static_cast<int64_t>(scratch_.bytes());
  for (const Arena& a : slot_acts_) n += static_cast<int64_t>(a.bytes());
  return n;
}

namespace {
// Views of activations inside arenas laid out for a larger capacity: only
// the first B*T rows are used, so per-layer offsets below use the current
// B*T stride, not the capacity.
struct ActView {
  const Arena* slot;
  const Arena* scratch;
  const std::vector<int>* idx;
  const Arena& arena(int id) const { return id < kNumSlotActs ? *slot : *scratch; }
  float* f(int id) const { return arena(id).tensor((*idx)[id]).f32(); }
  int* i(int id) const { return static_cast<int*>(arena(id).tensor((*idx)[id]).data); }
};
}  // namespace

// One layer's activations: for training, layer l's rows of the (Ll, B*T, ...)
// tensors kept for backward (training_layer_acts()); for inference, one scratch
// shared by every layer.
struct GPT::LayerActs {
  float *ln1, *ln1_mean, *ln1_rstd;  // (N,C), (N), (N)
  float* qkv;                        // (N,QKVl)
  float* atty;                       // (N,Ql)
  float *att, *preatt;               // dense attention only: (B,NHl,T,S)
  float* attproj;                    // (N,C)
  float* residual2;                  // (N,C)
  float *ln2, *ln2_mean, *ln2_rstd;  // (N,C), (N), (N)
  float *fch, *fch_gelu;             // (N,FCl), (N,Fl)
  float* fcproj;                     // (N,C)
  float* residual3;                  // (N,C): the layer's output
};

// How a layer's attention finds its keys: dense causal attention over the
// (B,T) rows themselves, or a paged KV cache (device arrays built by
// forward_tokens).
struct GPT::AttentionArgs {
  int B = 0, T = 0;
  const PagedKVCache* cache = nullptr;
  const int* slots = nullptr;  // (N) pool row each row's key and value go to
  const int* table = nullptr;  // (S,W) pool blocks of the batch's sequences
  const int* seq = nullptr;    // (N) row -> batch sequence
  const int* pos = nullptr;    // (N) row -> position
  int W = 0;
};

namespace {
// Layer l of a training slot whose current batch has BT rows and att_size
// attention floats per layer. The one place the per-layer offsets live.
template <typename Acts>
Acts training_layer_acts(const ActView& act, int l, int64_t BT, int64_t C, const LocalDims& d, int64_t att_size) {
  const int64_t QKVl = d.QKVl, Ql = d.Ql, Fl = d.Fl, FCl = d.FCl;
  const int64_t BTC = BT * C;
  Acts a;
  a.ln1 = act.f(kLn1) + l * BTC;
  a.ln1_mean = act.f(kLn1Mean) + l * BT;
  a.ln1_rstd = act.f(kLn1Rstd) + l * BT;
  a.qkv = act.f(kQkv) + l * BT * QKVl;
  a.atty = act.f(kAtty) + l * BT * Ql;
  a.att = act.f(kAtt) + l * att_size;
  a.preatt = act.f(kPreatt);
  a.attproj = act.f(kAttproj);
  a.residual2 = act.f(kResidual2) + l * BTC;
  a.ln2 = act.f(kLn2) + l * BTC;
  a.ln2_mean = act.f(kLn2Mean) + l * BT;
  a.ln2_rstd = act.f(kLn2Rstd) + l * BT;
  a.fch = act.f(kFch) + l * BT * FCl;
  a.fch_gelu = act.f(kFchGelu) + l * BT * Fl;
  a.fcproj = act.f(kFcproj);
  a.residual3 = act.f(kResidual3) + l * BTC;
  return a;
}
}  // namespace

float* GPT::stage_input(int slot) {
  return ActView{&slot_acts_.at(slot), &scratch_, &acts_idx_}.f(kEncoded);
}

const float* GPT::stage_output(int slot) const {
  const SlotState& st = slot_state_.at(slot);
  const int64_t BTC = int64_t{st.B} * st.T * config_.channels;
  return ActView{&slot_acts_[slot], &scratch_, &acts_idx_}.f(kResidual3) + (local_layers_ - 1) * BTC;
}

float* GPT::stage_output_grad() { return ActView{&slot_acts_.at(0), &scratch_, &acts_idx_}.f(kDResidual); }

const float* GPT::stage_input_grad(int slot) const {
  return ActView{&slot_acts_.at(slot), &scratch_, &acts_idx_}.f(kDInput);
}

double GPT::take_tp_comm_seconds() {
  double s = tp_seconds_;
  tp_seconds_ = 0.0;
  return s;
}

Status GPT::tp_all_reduce(float* x, int64_t n) {
  obs::trace::Span span("tp all_reduce", "comm", {{"bytes", n * 4}});
  auto t0 = std::chrono::steady_clock::now();
  Status st = tp_comm_->all_reduce(x, x, n, comm::ElemType::kF32, comm::ReduceOp::kSum);
  tp_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return st;
}

Status GPT::tp_all_reduce_max(float* x, int64_t n) {
  obs::trace::Span span("tp all_reduce", "comm", {{"bytes", n * 4}});
  auto t0 = std::chrono::steady_clock::now();
  Status st = tp_comm_->all_reduce(x, x, n, comm::ElemType::kF32, comm::ReduceOp::kMax);
  tp_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return st;
}

void GPT::norm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w, const float* b,
                       int N) const {
  if (config_.norm == Norm::kRMSNorm) {
    ops_.rmsnorm_forward(out, rstd, inp, w, N, config_.channels, config_.norm_eps);
  } else {
    ops_.layernorm_forward(out, mean, rstd, inp, w, b, N, config_.channels);
  }
}

void GPT::norm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp, const float* w,
                        const float* mean, const float* rstd, int N) const {
  if (config_.norm == Norm::kRMSNorm) {
    ops_.rmsnorm_backward(dinp, dw, dout, inp, w, rstd, N, config_.channels);
  } else {
    ops_.layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, config_.channels);
  }
}

Status GPT::layer_forward(int l, const LayerActs& a, const float* residual, int N, const AttentionArgs& at) {
  const LocalDims d = local_dims(config_, shard_);
  const int C = config_.channels, tp = shard_.tp;
  const int NHl = d.NHl, KVl = d.KVl, hs = d.hs, Ql = d.Ql, QKVl = d.QKVl, Fl = d.Fl;
  const int64_t NC = int64_t{N} * C;
  const MatmulPrecision prec = prec_;
  const LayerParams w = layer_params(l);
  const bool lead = shard_.tp_rank == 0;  // adds the replicated biases of row-parallel layers
  const bool gqa = KVl != NHl;

  norm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, residual, w.ln1w, w.ln1b, N);
  linear(a.qkv, a.ln1, w.qkvw, 4 * l, w.qkvb, N, C, QKVl);
  if (config_.positions == Positions::kRope) ops_.rope_forward(a.qkv, at.pos, rope_freq(), N, NHl, KVl, hs);
  if (at.cache && at.cache->dtype() == KvDtype::kF16) {
    // The fp16 cache (CPU only): one pair of kernels for every head layout
    // (plain multi-head attention is KV = NH).
    uint16_t* keys = at.cache->keys_f16(l);
    uint16_t* values = at.cache->values_f16(l);
    ops_.kv_cache_write_gqa_f16(keys, values, a.qkv, at.slots, N, NHl, KVl, hs);
    ops_.paged_attention_gqa_f16_forward(a.atty, a.qkv, keys, values, at.table, at.seq, at.pos, N, NHl, KVl, hs,
                                         at.cache->block_size(), at.W);
  } else if (at.cache) {
    float* keys = at.cache->keys(l);
    float* values = at.cache->values(l);
    if (gqa) {
      ops_.kv_cache_write_gqa(keys, values, a.qkv, at.slots, N, NHl, KVl, hs);
      ops_.paged_attention_gqa_forward(a.atty, a.qkv, keys, values, at.table, at.seq, at.pos, N, NHl, KVl, hs,
                                       at.cache->block_size(), at.W);
    } else {
      ops_.kv_cache_write(keys, values, a.qkv, at.slots, N, Ql);
      ops_.paged_attention_forward(a.atty, a.qkv, keys, values, at.table, at.seq, at.pos, N, Ql, NHl,
                                   at.cache->block_size(), at.W);
    }
  } else if (gqa) {
    ops_.attention_gqa_forward(a.atty, a.preatt, a.att, a.qkv, at.B, at.T, NHl, KVl, hs);
  } else {
    ops_.attention_forward(a.atty, a.preatt, a.att, a.qkv, at.B, at.T, Ql, NHl);
  }
  linear(a.attproj, a.atty, w.attprojw, 4 * l + 1, lead ? w.attprojb : nullptr, N, Ql, C);
  if (tp > 1) RETURN_IF_ERROR(tp_all_reduce(a.attproj, NC));
  ops_.residual_forward(a.residual2, residual, a.attproj, NC);
  norm_forward(a.ln2, a.ln2_mean, a.ln2_rstd, a.residual2, w.ln2w, w.ln2b, N);
  if (config_.mlp == Mlp::kSwiGLU) {
    // gate and up in one gemm (fch keeps both for swiglu_backward).
    linear(a.fch, a.ln2, w.fcw, 4 * l + 2, w.fcb, N, C, 2 * Fl);
    ops_.swiglu_forward(a.fch_gelu, a.fch, N, Fl);
  } else if (quantized() || few_rows_f32(N)) {
    // fch is kept for gelu_backward; fused into the gemm's epilogue on CUDA.
    linear(a.fch, a.ln2, w.fcw, 4 * l + 2, w.fcb, N, C, Fl);
    ops_.gelu_forward(a.fch_gelu, a.fch, int64_t{N} * Fl);
  } else {
    ops_.matmul_gelu_forward(a.fch, a.fch_gelu, a.ln2, w.fcw, w.fcb, N, C, Fl, prec);
  }
  linear(a.fcproj, a.fch_gelu, w.fcprojw, 4 * l + 3, lead ? w.fcprojb : nullptr, N, Fl, C);
  if (tp > 1) RETURN_IF_ERROR(tp_all_reduce(a.fcproj, NC));
  ops_.residual_forward(a.residual3, a.residual2, a.fcproj, NC);
  return Status::OK();
}

Result<float> GPT::try_forward(const int* inputs, const int* targets, int B, int T) {
  CHECK(shard_.tp == 1 && shard_.first && shard_.last);  // whole model; shards use forward_stage()
  RETURN_IF_ERROR(try_reserve_activations(B, T, 1));
  float loss = 0.0f;
  RETURN_IF_ERROR(forward_stage(0, inputs, targets, B, T, &loss));
  return loss;
}

Status GPT::try_backward(float loss_scale) {
  CHECK(shard_.tp == 1 && shard_.first && shard_.last);
  return backward_stage(0, loss_scale);
}

Status GPT::forward_stage(int slot, const int* inputs, const int* targets, int B, int T, float* loss) {
  CHECK(slot >= 0 && slot < activation_slots() && B <= act_B_ && T <= act_T_);
  if (fp32_released_ && !quantized()) return Status::InvalidArgument("an INT8 model's matrices were never loaded");
  SlotState& state = slot_state_[slot];
  state.B = B;
  state.T = T;
  state.has_targets = targets != nullptr;
  const LocalDims d = local_dims(config_, shard_);
  const int L = local_layers_, C = config_.channels, V = config_.vocab, tp = shard_.tp;
  const int NHl = d.NHl, Vl = Vl_;
  const int BT = B * T;
  const int64_t BTC = int64_t{BT} * C;
  const int64_t att_size = int64_t{B} * NHl * T * att_saved_floats(T, d.hs);
  const MatmulPrecision prec = prec_;
  ActView act{&slot_acts_[slot], &scratch_, &acts_idx_};
  ParamPtrs p = param_ptrs();
  const bool lead = shard_.tp_rank == 0;  // adds the replicated biases of row-parallel layers
  const bool rope = config_.positions == Positions::kRope;
  const float* wpe = rope ? nullptr : p[kWpe];
  const float* head_w = config_.tied_head ? p[kWte] : p[kLmHead];

  if (shard_.first) {
    obs::trace::Span span("forward embedding", "compute");
    RETURN_IF_ERROR(try_copy_to_device(device_, act.i(kInputs), inputs, sizeof(int) * BT));
    if (quantized_embeddings()) {
      // The batch's rows dequantized, then the same op over them.
      RETURN_IF_ERROR(dequantize_embeddings(inputs, BT));
      ops_.encoder_forward(act.f(kEncoded), embed_ids_.data(), embed_batch_.data(), wpe, B, T, C);
    } else if (tp == 1) {
      ops_.encoder_forward(act.f(kEncoded), act.i(kInputs), p[kWte], wpe, B, T, C);
    } else {
      vocab_parallel_encoder_forward(act.f(kEncoded), act.i(kInputs), p[kWte], v0_, Vl, lead ? wpe : nullptr, B, T,
                                     C);
      RETURN_IF_ERROR(tp_all_reduce(act.f(kEncoded), BTC));
    }
  }
  AttentionArgs dense;
  dense.B = B;
  dense.T = T;
  if (rope) {
    // Row b*T + t is at position t (every stage turns its layers' q and k).
    host_positions_.resize(BT);
    for (int i = 0; i < BT; i++) host_positions_[i] = i % T;
    RETURN_IF_ERROR(try_copy_to_device(device_, act.i(kPositions), host_positions_.data(), sizeof(int) * BT));
    dense.pos = act.i(kPositions);
  }
  for (int l = 0; l < L; l++) {
    const LayerActs a = training_layer_acts<LayerActs>(act, l, BT, C, d, att_size);
    const float* residual = l == 0 ? act.f(kEncoded) : act.f(kResidual3) + (l - 1) * BTC;
    obs::trace::Span span("forward layer", "compute", {{"layer", shard_.layer_begin + l}});
    RETURN_IF_ERROR(layer_forward(l, a, residual, BT, dense));
  }
  if (!shard_.last) return Status::OK();
  obs::trace::Span head_span("forward head", "compute");

  const float* residual = act.f(kResidual3) + (L - 1) * BTC;
  norm_forward(act.f(kLnf), act.f(kLnfMean), act.f(kLnfRstd), residual, p[kLnfW], p[kLnfB], BT);
  const int head_rows = std::min(BT, head_chunk_rows_);
  if (chunked_head()) {
    // Without targets only try_logits() can be wanted: computed when they fit in
    // one chunk, otherwise not at all.
    held_logits_ = HeldLogits{};
    if (!targets && BT <= head_rows) {
      ops_.matmul_forward(act.f(kHeadChunk), act.f(kLnf), head_w, nullptr, BT, C, Vl, prec);
      held_logits_ = HeldLogits{slot, 0, BT};
    }
  } else {
    linear(act.f(kLogits), act.f(kLnf), head_w, 4 * config_.layers, nullptr, BT, C, Vl);
  }
  if (!targets) {
    if (loss) *loss = 0.0f;
    return Status::OK();
  }
  RETURN_IF_ERROR(try_copy_to_device(device_, act.i(kTargets), targets, sizeof(int) * BT));
  float* losses = act.f(kLosses);
  if (chunked_head()) {
    // One chunk of logits at a time: the loss and each row's log-sum-exp
    // are all that is kept (backward recomputes the logits).
    float* chunk = act.f(kHeadChunk);
    for (int r0 = 0; r0 < BT; r0 += head_rows) {
      const int rows = std::min(head_rows, BT - r0);
      ops_.matmul_forward(chunk, act.f(kLnf) + int64_t{r0} * C, head_w, nullptr, rows, C, Vl, prec);
      ops_.crossentropy_lse_forward(losses + r0, act.f(kLse) + r0, chunk, act.i(kTargets) + r0, rows, V, Vl);
      held_logits_ = HeldLogits{slot, r0, rows};
    }
  } else if (tp == 1) {
    ops_.crossentropy_softmax_forward(losses, act.f(kProbs), act.f(kLogits), act.i(kTargets), BT, V, Vl);
  } else {
    // Vocabulary-parallel cross-entropy: the full-vocabulary logits are never
    // gathered; ranks agree on each row's max, then on its sum of exp and the
    // target's logit.
    float* stats = act.f(kCEStats);
    float *row_max = stats, *sums = stats + BT;  // sums: (2,B,T) sum of exp, target logit
    const int valid = std::clamp(V - v0_, 0, Vl);
    vocab_parallel_ce_max(row_max, act.f(kLogits), BT, Vl, valid);
    RETURN_IF_ERROR(tp_all_reduce_max(row_max, BT));
    vocab_parallel_ce_exp(sums, act.f(kProbs), act.i(kLocalTargets), act.f(kLogits), act.i(kTargets), row_max, BT,
                          Vl, valid, v0_);
    RETURN_IF_ERROR(tp_all_reduce(sums, 2 * int64_t{BT}));
    vocab_parallel_ce_finish(losses, act.f(kProbs), row_max, sums, BT, Vl, valid);
  }
  const float* host_losses = losses;
  if (device_ != Device::kCPU) {
    host_losses_.resize(BT);
    RETURN_IF_ERROR(try_copy_to_host(device_, host_losses_.data(), losses, sizeof(float) * BT));
    host_losses = host_losses_.data();
  }
  double sum = 0.0;
  for (int i = 0; i < BT; i++) sum += host_losses[i];
  if (loss) *loss = static_cast<float>(sum / BT);
  return Status::OK();
}

Result<const float*> GPT::try_logits() const {
  ActView act{&slot_acts_.at(0), &scratch_, &acts_idx_};
  const int64_t BT = int64_t{slot_state_.at(0).B} * slot_state_[0].T;
  if (chunked_head()) {
    if (held_logits_.slot != 0 || held_logits_.row0 != 0 || held_logits_.rows != BT) {
      std::fprintf(stderr,
                   "tessera: GPT::try_logits() on CUDA needs the last forward's %lld rows in one head chunk (%d rows; "
                   "GPT::set_head_chunk_rows) and no forward or backward since\n",
                   static_cast<long long>(BT), head_chunk_rows_);
      CHECK(false);
    }
  }
  const float* x = act.f(chunked_head() ? kHeadChunk : kLogits);
  if (device_ == Device::kCPU) return x;
  const int64_t n = BT * Vl_;
  host_logits_.resize(n);
  RETURN_IF_ERROR(try_copy_to_host(device_, host_logits_.data(), x, sizeof(float) * n));
  return static_cast<const float*>(host_logits_.data());
}

Result<const float*> GPT::try_losses() const {
  const float* x = ActView{&slot_acts_.at(0), &scratch_, &acts_idx_}.f(kLosses);
  if (device_ == Device::kCPU) return x;
  const int64_t n = int64_t{slot_state_.at(0).B} * slot_state_[0].T;
  host_losses_out_.resize(n);
  RETURN_IF_ERROR(try_copy_to_host(device_, host_losses_out_.data(), x, sizeof(float) * n));
  return static_cast<const float*>(host_losses_out_.data());
}

Status GPT::backward_stage(int slot, float loss_scale) {
  CHECK(training());  // a model made for inference has no gradients
  CHECK(slot >= 0 && slot < activation_slots());
  const SlotState& state = slot_state_[slot];
  CHECK(state.B > 0);
  CHECK(!shard_.last || state.has_targets);  // backward needs a forward with targets
  const int B = state.B, T = state.T;
  const LocalDims d = local_dims(config_, shard_);
  const int L = local_layers_, C = config_.channels, V = config_.vocab, tp = shard_.tp;
  const int NHl = d.NHl, KVl = d.KVl, Ql = d.Ql, QKVl = d.QKVl, Fl = d.Fl, FCl = d.FCl, Vl = Vl_;
  const int BT = B * T;
  const int64_t BTC = int64_t{BT} * C;
  const int hs = d.hs;
  const bool rope = config_.positions == Positions::kRope, gqa = KVl != NHl;
  const int64_t att_size = int64_t{B} * NHl * T * att_saved_floats(T, hs);
  const int64_t att_scratch = int64_t{B} * NHl * T * att_scratch_floats(T, hs);
  const MatmulPrecision prec = prec_;
  ActView act{&slot_acts_[slot], &scratch_, &acts_idx_};
  ParamPtrs p = param_ptrs();
  ParamPtrs g = grad_ptrs();
  const Device dev = device_;
  auto zero = [dev](float* x, int64_t n) { return try_zero_on_device(dev, x, sizeof(float) * n); };

  float* dresidual = act.f(kDResidual);
  const float* head_w = config_.tied_head ? p[kWte] : p[kLmHead];
  float* head_g = config_.tied_head ? g[kWte] : g[kLmHead];
  std::optional<obs::trace::Span> head_span;
  if (shard_.last) head_span.emplace("backward head", "compute");
  if (shard_.last && chunked_head()) {
    // Chunk by chunk, last first (the chunk buffer may still hold the last
    // chunk's logits from forward): logits again, dlogits in their place,
    // then d(lnf) and d(wte) for those rows.
    float* dlnf = act.f(kDLnf);
    float* chunk = act.f(kHeadChunk);
    RETURN_IF_ERROR(zero(dresidual, BTC));
    RETURN_IF_ERROR(zero(dlnf, BTC));
    const int head_rows = std::min(BT, head_chunk_rows_);
    for (int r0 = (BT - 1) / head_rows * head_rows; r0 >= 0; r0 -= head_rows) {
      const int rows = std::min(head_rows, BT - r0);
      const float* lnf = act.f(kLnf) + int64_t{r0} * C;
      const bool held = held_logits_.slot == slot && held_logits_.row0 == r0 && held_logits_.rows == rows;
      if (!held) ops_.matmul_forward(chunk, lnf, head_w, nullptr, rows, C, Vl, prec);
      held_logits_ = HeldLogits{};  // dlogits from here on
      ops_.crossentropy_lse_backward(chunk, act.f(kLse) + r0, act.i(kTargets) + r0, loss_scale / BT, rows, V, Vl);
      ops_.matmul_backward(dlnf + int64_t{r0} * C, head_g, nullptr, chunk, lnf, head_w, rows, C, Vl, prec);
    }
    const float* last = act.f(kResidual3) + (L - 1) * BTC;
    norm_backward(dresidual, g[kLnfW], g[kLnfB], dlnf, last, p[kLnfW], act.f(kLnfMean), act.f(kLnfRstd), BT);
    if (listener_) listener_->on_grads_ready(GradListener::kFinalNorm);
  } else if (shard_.last) {
    float* dlogits = act.f(kDLogits);
    float* dlnf = act.f(kDLnf);
    RETURN_IF_ERROR(zero(dlogits, int64_t{BT} * Vl));
    RETURN_IF_ERROR(zero(dresidual, BTC));
    RETURN_IF_ERROR(zero(dlnf, BTC));
    if (tp == 1) {
      ops_.crossentropy_softmax_backward(dlogits, act.f(kProbs), act.i(kTargets), loss_scale / BT, BT, V, Vl);
    } else {
      ops_.crossentropy_softmax_backward(dlogits, act.f(kProbs), act.i(kLocalTargets), loss_scale / BT, BT,
                                         std::clamp(V - v0_, 0, Vl), Vl);
    }
    ops_.matmul_backward(dlnf, head_g, nullptr, dlogits, act.f(kLnf), head_w, BT, C, Vl, prec);
    if (tp > 1) RETURN_IF_ERROR(tp_all_reduce(dlnf, BTC));
    const float* last = act.f(kResidual3) + (L - 1) * BTC;
    norm_backward(dresidual, g[kLnfW], g[kLnfB], dlnf, last, p[kLnfW], act.f(kLnfMean), act.f(kLnfRstd), BT);
    if (listener_) listener_->on_grads_ready(GradListener::kFinalNorm);
  }
  // Otherwise dresidual (stage_output_grad()) holds the gradient received from
  // the next stage.

  head_span.reset();
  // dresidual holds d(output of layer l). Each block is x + f(ln(x)): the
  // residual path passes dresidual through unchanged, and the branch's
  // layernorm backward adds its part into the same buffer.
  for (int l = L - 1; l >= 0; l--) {
    obs::trace::Span span("backward layer", "compute", {{"layer", shard_.layer_begin + l}});
    const LayerActs a = training_layer_acts<LayerActs>(act, l, BT, C, d, att_size);
    const LayerParams w = layer_params(l), gw = layer_grads(l);
    const float* residual = l == 0 ? act.f(kEncoded) : act.f(kResidual3) + (l - 1) * BTC;
    float* dfch_gelu = act.f(kDFchGelu);
    float* dfch = act.f(kDFch);
    float* dln2 = act.f(kDLn2);
    float* datty = act.f(kDAtty);
    float* dpreatt = act.f(kDPreatt);
    float* datt = act.f(kDAtt);
    float* dqkv = act.f(kDQkv);
    float* dln1 = act.f(kDLn1);
    RETURN_IF_ERROR(zero(dfch_gelu, int64_t{BT} * Fl));
    RETURN_IF_ERROR(zero(dfch, int64_t{BT} * FCl));
    RETURN_IF_ERROR(zero(dln2, BTC));
    RETURN_IF_ERROR(zero(datty, int64_t{BT} * Ql));
    RETURN_IF_ERROR(zero(dpreatt, att_scratch));
    RETURN_IF_ERROR(zero(datt, att_scratch));
    RETURN_IF_ERROR(zero(dqkv, int64_t{BT} * QKVl));
    RETURN_IF_ERROR(zero(dln1, BTC));

    // MLP branch: residual3 = residual2 + fcproj(gelu(fc(ln2(residual2)))).
    // With tp > 1, fc is column-parallel and fcproj row-parallel: d(ln2) is
    // a partial sum until all-reduced.
    ops_.matmul_backward(dfch_gelu, gw.fcprojw, gw.fcprojb, dresidual, a.fch_gelu, w.fcprojw, BT, Fl, C, prec);
    if (config_.mlp == Mlp::kSwiGLU) ops_.swiglu_backward(dfch, a.fch, dfch_gelu, BT, Fl);
    else ops_.gelu_backward(dfch, a.fch, dfch_gelu, int64_t{BT} * Fl);
    ops_.matmul_backward(dln2, gw.fcw, gw.fcb, dfch, a.ln2, w.fcw, BT, C, FCl, prec);
    if (tp > 1) RETURN_IF_ERROR(tp_all_reduce(dln2, BTC));
    norm_backward(dresidual, gw.ln2w, gw.ln2b, dln2, a.residual2, w.ln2w, a.ln2_mean, a.ln2_rstd, BT);
    // Attention branch: residual2 = residual + attproj(attn(qkv(ln1(residual))))
    ops_.matmul_backward(datty, gw.attprojw, gw.attprojb, dresidual, a.atty, w.attprojw, BT, Ql, C, prec);
    if (gqa) ops_.attention_gqa_backward(dqkv, dpreatt, datt, datty, a.qkv, a.att, B, T, NHl, KVl, hs);
    else ops_.attention_backward(dqkv, dpreatt, datt, datty, a.qkv, a.atty, a.att, B, T, Ql, NHl);
    // qkv holds the turned q and k: their gradient turns back.
    if (rope) ops_.rope_backward(dqkv, act.i(kPositions), rope_freq(), BT, NHl, KVl, hs);
    ops_.matmul_backward(dln1, gw.qkvw, gw.qkvb, dqkv, a.ln1, w.qkvw, BT, C, QKVl, prec);
    if (tp > 1) RETURN_IF_ERROR(tp_all_reduce(dln1, BTC));
    norm_backward(dresidual, gw.ln1w, gw.ln1b, dln1, residual, w.ln1w, a.ln1_mean, a.ln1_rstd, BT);
    if (listener_) listener_->on_grads_ready(shard_.layer_begin + l);
  }
  if (shard_.first) {
    obs::trace::Span span("backward embedding", "compute");
    if (tp == 1) {
      ops_.encoder_backward(g[kWte], rope ? nullptr : g[kWpe], dresidual, act.i(kInputs), B, T, C);
    } else {
      vocab_parallel_encoder_backward(g[kWte], rope ? nullptr : g[kWpe], dresidual, act.i(kInputs), v0_, Vl, B, T, C);
    }
  } else {
    RETURN_IF_ERROR(try_copy_on_device(device_, act.f(kDInput), dresidual, sizeof(float) * BTC));
  }
  if (listener_ && (shard_.first || shard_.last)) listener_->on_grads_ready(GradListener::kEmbeddings);
  return Status::OK();
}

namespace {
// forward_tokens' scratch tensors, in infer_ arena order.
enum InferId {
  kIRes0,      // (N,C) residual stream, ping
  kIRes1,      // (N,C) pong
  kILn1,       // (N,C)
  kILn1Mean,   // (N)
  kILn1Rstd,   // (N)
  kIQkv,       // (N,QKV)
  kIAtty,      // (N,Q)
  kIAttproj,   // (N,C)
  kIResidual2, // (N,C)
  kILn2,       // (N,C)
  kILn2Mean,   // (N)
  kILn2Rstd,   // (N)
  kIFch,       // (N,FC)
  kIFchGelu,   // (N,F)
  kIFcproj,    // (N,C)
  kIGathered,  // (R,C) the last layer's output at the rows asked for
  kILnf,       // (R,C)
  kILnfMean,   // (R)
  kILnfRstd,   // (R)
  kILogits,    // (R,Vp) off the CPU (the CPU writes the caller's buffer)
  kNumInfer
};
}  // namespace

Status GPT::reserve_inference(int N, int R, int64_t ints) {
  if (N > infer_rows_ || R > infer_out_) {
    N = std::max(N, infer_rows_);
    R = std::max(R, infer_out_);
    const int64_t C = config_.channels, Vp = config_.padded_vocab();
    const int64_t logit_rows = device_ == Device::kCPU ? 0 : R;
    Arena a;
    a.set_device(device_);
    const Shape nc{N, C};
    for (const char* name : {"res0", "res1", "ln1"}) a.reserve(name, DType::kF32, nc);
    a.reserve("ln1_mean", DType::kF32, {N});
    a.reserve("ln1_rstd", DType::kF32, {N});
    a.reserve("qkv", DType::kF32, {N, config_.qkv_dim()});
    a.reserve("atty", DType::kF32, {N, config_.q_dim()});
    for (const char* name : {"attproj", "residual2", "ln2"}) a.reserve(name, DType::kF32, nc);
    a.reserve("ln2_mean", DType::kF32, {N});
    a.reserve("ln2_rstd", DType::kF32, {N});
    a.reserve("fch", DType::kF32, {N, config_.fc_rows()});
    a.reserve("fch_gelu", DType::kF32, {N, config_.ffn()});
    a.reserve("fcproj", DType::kF32, nc);
    a.reserve("gathered", DType::kF32, {R, C});
    a.reserve("lnf", DType::kF32, {R, C});
    a.reserve("lnf_mean", DType::kF32, {R});
    a.reserve("lnf_rstd", DType::kF32, {R});
    a.reserve("logits", DType::kF32, {logit_rows, Vp});
    RETURN_IF_ERROR(a.try_allocate().With(fmt::format("the inference scratch for {} rows", N)));
    CHECK(a.count() == kNumInfer);
    infer_ = std::move(a);
    infer_rows_ = N;
    infer_out_ = R;
  }
  if (ints > infer_int_count_) {
    Arena a;
    a.set_device(device_);
    a.reserve("ints", DType::kI32, {ints});
    RETURN_IF_ERROR(a.try_allocate().With(fmt::format("the inference index arrays ({} ints)", ints)));
    infer_ints_ = std::move(a);
    infer_int_count_ = ints;
  }
  return Status::OK();
}

struct GPT::Int8Weights {
  struct Matrix {
    std::vector<int8_t> w;  // (OC,C)
    std::vector<float> scale;  // (OC)
  };
  std::vector<Matrix> m;  // 4 per layer, then the head
};

void GPT::quantize_matrix_int8(const float* src, int OC, int C, int8_t* w, float* scale) const {
  ops_.quantize_weights_int8(w, scale, src, OC, C);
}

Status GPT::quantize_int8() {
  if (fp32_released_)
    return Status::InvalidArgument("quantize_int8: the fp32 matmul weights were released or never loaded");
  const ParamPtrs p = param_ptrs();
  // The fp32 source of each INT8 matrix, in load_int8's order.
  return load_int8([&](int k, int OC, int C, int8_t* w, float* scale) {
    const float* src = config_.tied_head ? p[kWte] : p[kLmHead];
    if (k < 4 * local_layers_) {
      const LayerParams l = layer_params(k / 4);
      const float* per_layer[4] = {l.qkvw, l.attprojw, l.fcw, l.fcprojw};
      src = per_layer[k % 4];
    }
    ops_.quantize_weights_int8(w, scale, src, OC, C);
    return Status::OK();
  });
}

Result<int64_t> GPT::release_fp32_matmul_weights() {
  if (!quantized()) return Status::InvalidArgument("the fp32 matmul weights are needed until the model is INT8 or int4");
  if (fp32_released_) return int64_t{0};  // already given back, or never allocated (kInt8Inference)
  const long page = sysconf(_SC_PAGESIZE);
  int64_t released = 0;
  for (int id : {kQkvW, kAttProjW, kFcW, kFcProjW}) {
    const Tensor t = params_.tensor(id);
    // The whole pages inside the tensor (its neighbours keep theirs).
    const uintptr_t begin = reinterpret_cast<uintptr_t>(t.data);
    const uintptr_t first = (begin + page - 1) / page * page;
    const uintptr_t last = (begin + t.nbytes()) / page * page;
    if (last <= first) continue;
    if (madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED) != 0)
      return Status::Internal(fmt::format("madvise(MADV_DONTNEED) of the fp32 weights: {}", std::strerror(errno)));
    released += static_cast<int64_t>(last - first);
  }
  fp32_released_ = true;
  released_bytes_ += released;
  return released;
}

Status GPT::load_int8(const std::function<Status(int index, int OC, int C, int8_t* w, float* scale)>& fill) {
  if (q4_) return Status::InvalidArgument("the model is int4 already");
  if (device_ != Device::kCPU || use_ == ModelUse::kTraining || !whole() || !ops_.matmul_int8_forward)
    return Status::InvalidArgument(
        "INT8 weights are for a whole model loaded for inference on the CPU (the INT8 tier)");
  // The kernel must compute the oracle's products on this CPU before any
  // weight is filled (nn/int8_check.h).
  RETURN_IF_ERROR(check_int8_matmul());
  auto q = std::make_shared<Int8Weights>();
  const int C = config_.channels;
  const int shapes[4][2] = {{config_.qkv_dim(), C}, {C, config_.q_dim()}, {config_.fc_rows(), C}, {C, config_.ffn()}};
  for (int k = 0; k < 4 * local_layers_ + 1; k++) {
    const int OC = k == 4 * local_layers_ ? config_.padded_vocab() : shapes[k % 4][0];
    const int K = k == 4 * local_layers_ ? C : shapes[k % 4][1];
    // The kernels sum a row's products in int32: at most 2^17 x 127^2.
    if (K > cpu::kMaxInt8Channels)
      return Status::InvalidArgument(fmt::format(
          "INT8 matmuls take at most {} input channels; this model's have {}", cpu::kMaxInt8Channels, K));
    Int8Weights::Matrix m;
    try {
      m.w.resize(static_cast<size_t>(OC) * K);
      m.scale.resize(OC);
    } catch (const std::bad_alloc&) {
      return Status::ResourceExhausted("not enough memory for the INT8 weights");
    }
    RETURN_IF_ERROR(fill(k, OC, K, m.w.data(), m.scale.data()));
    q->m.push_back(std::move(m));
  }
  int8_ = std::move(q);
  return Status::OK();
}

void GPT::for_each_int8(const std::function<void(int index, int OC, int C, const int8_t* w, const float* scale)>& f)
    const {
  if (!int8_) return;
  for (size_t k = 0; k < int8_->m.size(); k++) {
    const Int8Weights::Matrix& m = int8_->m[k];
    const int OC = static_cast<int>(m.scale.size());
    f(static_cast<int>(k), OC, static_cast<int>(m.w.size() / OC), m.w.data(), m.scale.data());
  }
}

int64_t GPT::int8_bytes() const {
  if (!int8_) return 0;
  int64_t n = 0;
  for (const Int8Weights::Matrix& m : int8_->m)
    n += static_cast<int64_t>(m.w.size()) + static_cast<int64_t>(m.scale.size() * sizeof(float));
  return n;
}

namespace {

// The name of int4 matrix k (4 per layer, then the head) for messages.
const char* q4_matrix_name(int k, int layers) {
  static constexpr const char* kNames[4] = {"qkv", "attention projection", "MLP", "MLP projection"};
  return k == 4 * layers ? "output" : kNames[k % 4];
}

}  // namespace

Status GPT::check_q4_use() const {
  if (device_ != Device::kCPU || use_ == ModelUse::kTraining || !whole() || !ops_.matmul_q4_forward)
    return Status::InvalidArgument("int4 weights are for a whole model loaded for inference on the CPU");
  if (int8_) return Status::InvalidArgument("the model is INT8 already");
  if (q4_) return Status::InvalidArgument("the model is int4 already");
  return Status::OK();
}

std::pair<int, int> GPT::matmul_shape(int k) const {
  const int C = config_.channels;
  if (k == 4 * local_layers_) return {config_.padded_vocab(), C};
  const int shapes[4][2] = {{config_.qkv_dim(), C}, {C, config_.q_dim()}, {config_.fc_rows(), C}, {C, config_.ffn()}};
  return {shapes[k % 4][0], shapes[k % 4][1]};
}

Result<std::string> GPT::quantize_q4(q4::Type type) {
  RETURN_IF_ERROR(check_q4_use());
  if (fp32_released_)
    return Status::InvalidArgument("quantize_q4: the fp32 matmul weights were released or never loaded");
  const ParamPtrs p = param_ptrs();
  int counts[2] = {0, 0};
  Status st = load_q4([&](int k, int OC, int K, Q4Matrix* m) -> Status {
    const bool head = k == 4 * local_layers_;
    m->type = q4::fits(type, K) ? type : q4::Type::kQ4_0;
    if (!q4::fits(m->type, K))
      return Status::InvalidArgument(fmt::format("int4 matrices take input channels in multiples of {}; this model's {} matmul has {}",
                                                 q4::kQ4_0Elems, q4_matrix_name(k, local_layers_), K));
    const float* src = config_.tied_head ? p[kWte] : p[kLmHead];
    if (!head) {
      const LayerParams l = layer_params(k / 4);
      const float* per_layer[4] = {l.qkvw, l.attprojw, l.fcw, l.fcprojw};
      src = per_layer[k % 4];
    }
    m->w.resize(static_cast<size_t>(OC) * q4::row_bytes(m->type, K));
    // The head's padded rows (past vocab, and past wte's rows when tied)
    // are zeros in the arena, as for INT8.
    q4::quantize_rows(m->type, m->w.data(), src, OC, K);
    counts[m->type == q4::Type::kQ4_K]++;
    return Status::OK();
  });
  RETURN_IF_ERROR(st);
  std::string line;
  for (q4::Type t : {q4::Type::kQ4_K, q4::Type::kQ4_0})
    if (counts[t == q4::Type::kQ4_K] > 0)
      line += fmt::format("{}{}: {} matrices", line.empty() ? "" : ", ", q4::type_name(t),
                          counts[t == q4::Type::kQ4_K]);
  return line;
}

Status GPT::load_q4(const std::function<Status(int index, int OC, int C, Q4Matrix* m)>& fill) {
  RETURN_IF_ERROR(check_q4_use());
  auto q = std::make_shared<std::vector<Q4Matrix>>();
  for (int k = 0; k < 4 * local_layers_ + 1; k++) {
    const auto [OC, K] = matmul_shape(k);
    Q4Matrix m;
    try {
      RETURN_IF_ERROR(fill(k, OC, K, &m));
    } catch (const std::bad_alloc&) {
      return Status::ResourceExhausted("not enough memory for the int4 weights");
    }
    const char* name = q4_matrix_name(k, local_layers_);
    if (!q4::fits(m.type, K) || m.w.size() != static_cast<size_t>(OC) * q4::row_bytes(m.type, K))
      return Status::InvalidArgument(fmt::format("int4 {} matrix {}: {} bytes of {} blocks for ({}, {})", name, k,
                                                 m.w.size(), q4::type_name(m.type), OC, K));
    if (!m.in_perm.empty()) {
      if (m.in_perm.size() != static_cast<size_t>(K))
        return Status::InvalidArgument(fmt::format("int4 {} matrix {}: an input permutation of {} columns for {}",
                                                   name, k, m.in_perm.size(), K));
      for (int32_t c : m.in_perm)
        if (c < 0 || c >= K)
          return Status::InvalidArgument(fmt::format("int4 {} matrix {}: input column {} out of range", name, k, c));
    }
    const int64_t rb = q4::row_bytes(m.type, K);
    for (int o = 0; o < OC; o++)
      RETURN_IF_ERROR(q4::check_row(m.type, m.w.data() + o * rb, K).With(fmt::format("int4 {} matrix {} row {}", name, k, o)));
    // Q4_0 and Q4_K in the CPU kernel's interleaved layouts where they run
    // faster (the same bytes, moved in place; for_each_q4 moves them back).
    if ((backend_ == Backend::kCPU || backend_ == Backend::kCPUProfiled) && q4::fits_x16(m.type, OC, K) &&
        cpu::q4_prefers_x16()) {
      q4::pack_x16(m.type, m.w.data(), m.w.data(), OC, K);
      m.type = q4::x16_of(m.type);
    }
    q->push_back(std::move(m));
  }
  q4_ = std::move(q);
  return Status::OK();
}

void GPT::for_each_q4(const std::function<void(int index, int OC, int C, const Q4Matrix& m)>& f) const {
  if (!q4_) return;
  for (size_t k = 0; k < q4_->size(); k++) {
    const auto [OC, K] = matmul_shape(static_cast<int>(k));
    const Q4Matrix& m = (*q4_)[k];
    if (!q4::interleaved(m.type)) {
      f(static_cast<int>(k), OC, K, m);
      continue;
    }
    Q4Matrix rows{q4::rows_type(m.type), std::vector<uint8_t>(m.w.size()), m.in_perm};
    q4::unpack_x16(m.type, rows.w.data(), m.w.data(), OC, K);
    f(static_cast<int>(k), OC, K, rows);
  }
}

std::vector<std::span<const uint8_t>> GPT::stored_weights() const {
  std::vector<std::span<const uint8_t>> out;
  auto bytes = [](const auto& v) {
    return std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(v.data()), v.size() * sizeof(v[0]));
  };
  if (int8_) {
    for (const Int8Weights::Matrix& m : int8_->m) {
      out.push_back(bytes(m.w));
      out.push_back(bytes(m.scale));
    }
  } else if (q4_) {
    for (const Q4Matrix& m : *q4_) out.push_back(bytes(m.w));
  } else if (device() == Device::kCPU && params().allocated()) {
    out.push_back({reinterpret_cast<const uint8_t*>(params().base()), params().bytes()});
  }
  return out;
}

Status GPT::set_quantized_embeddings(RowFormat format, std::vector<uint8_t> rows) {
  const int64_t V = config_.vocab, C = config_.channels;
  if (!quantized() || !fp32_released_ || device_ != Device::kCPU || shard_.tp != 1 || !shard_.first)
    return Status::InvalidArgument(
        "quantized embeddings are for a quantized inference model on the CPU whose fp32 matmul weights are released");
  const q4::Type q = format == RowFormat::kQ4_K ? q4::Type::kQ4_K : q4::Type::kQ4_0;
  const int64_t row_bytes = format == RowFormat::kQ8_0 ? (C % 32 == 0 ? C / 32 * 34 : 0)
                            : q4::fits(q, C)           ? q4::row_bytes(q, C)
                                                       : 0;
  if (row_bytes == 0 || static_cast<int64_t>(rows.size()) != V * row_bytes)
    return Status::InvalidArgument(fmt::format("quantized embeddings: {} bytes are not {} rows of {} values",
                                               rows.size(), V, C));
  // The fp32 table's whole pages go back (its neighbours keep theirs).
  const long page = sysconf(_SC_PAGESIZE);
  const Tensor t = params_.tensor(kWte);
  const uintptr_t begin = reinterpret_cast<uintptr_t>(t.data);
  const uintptr_t first = (begin + page - 1) / page * page, last = (begin + t.nbytes()) / page * page;
  if (last > first) {
    if (madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED) != 0)
      return Status::Internal(fmt::format("madvise(MADV_DONTNEED) of the fp32 embeddings: {}", std::strerror(errno)));
    released_bytes_ += static_cast<int64_t>(last - first);
  }
  embed_format_ = format;
  embed_row_bytes_ = row_bytes;
  embed_rows_ = std::move(rows);
  return Status::OK();
}

Status GPT::dequantize_embeddings(const int* ids, int N) {
  const int C = config_.channels;
  embed_batch_.resize(static_cast<size_t>(N) * C);
  embed_ids_.resize(N);
  for (int i = 0; i < N; i++) {
    const int id = ids[i];
    if (id < 0 || id >= config_.vocab)
      return Status::InvalidArgument(fmt::format("token id {} is outside the vocabulary [0, {})", id, config_.vocab));
    const uint8_t* row = embed_rows_.data() + static_cast<int64_t>(id) * embed_row_bytes_;
    float* out = embed_batch_.data() + static_cast<int64_t>(i) * C;
    if (embed_format_ == RowFormat::kQ8_0) {
      io::dequantize_q8_0(row, static_cast<size_t>(C), out);
    } else {
      q4::dequantize_row(embed_format_ == RowFormat::kQ4_K ? q4::Type::kQ4_K : q4::Type::kQ4_0, out, row, C);
    }
    embed_ids_[i] = i;
  }
  return Status::OK();
}

int64_t GPT::q4_bytes() const {
  if (!q4_) return 0;
  int64_t n = 0;
  for (const Q4Matrix& m : *q4_) n += static_cast<int64_t>(m.w.size());
  return n;
}

// An fp32 matmul of so few rows on the CPU that reading the weights is its
// whole cost: Tessera's own loops (kernels/cpu/matmul.h) rather than oneDNN's.
bool GPT::few_rows_f32(int N) const {
  return device_ == Device::kCPU && prec_ == MatmulPrecision::kF32 && N <= cpu::kFewRowsMax;
}

void GPT::linear(float* out, const float* inp, const float* w, int q, const float* bias, int N, int C,
                 int OC) const {
  if (q4_) {
    const Q4Matrix& m = (*q4_)[q];
    if (!m.in_perm.empty()) {
      // The stored matrix's column order (load_q4): gather the input.
      thread_local std::vector<float> gathered;
      gathered.resize(static_cast<size_t>(N) * C);
      for (int64_t i = 0; i < N; i++)
        for (int c = 0; c < C; c++) gathered[i * C + c] = inp[i * C + m.in_perm[c]];
      inp = gathered.data();
    }
    ops_.matmul_q4_forward(out, inp, m.w.data(), m.type, bias, N, C, OC);
  } else if (int8_) {
    const Int8Weights::Matrix& m = int8_->m[q];
    ops_.matmul_int8_forward(out, inp, m.w.data(), m.scale.data(), bias, N, C, OC);
  } else if (few_rows_f32(N)) {
    // decode: weight-read bound (kernels/cpu/matmul.h); timed as a matmul when profiled.
    if (backend_ == Backend::kCPUProfiled) {
      Timed<cpu::matmul_f32_rows, OpKind::kMatmul>::call(out, inp, w, bias, N, C, OC);
    } else {
      cpu::matmul_f32_rows(out, inp, w, bias, N, C, OC);
    }
  } else {
    ops_.matmul_forward(out, inp, w, bias, N, C, OC, prec_);
  }
}

Status GPT::forward_tokens(const TokenBatch& batch, PagedKVCache& cache, std::span<const int> logit_rows,
                           float* logits) {
  if (!shard_.first || !shard_.last || shard_.tp != 1)
    return Status::Unavailable(
        "forward_tokens runs the whole model on one rank (tensor and pipeline parallel inference are not built)");
  if (fp32_released_ && !quantized()) return Status::InvalidArgument("an INT8 model's matrices were never loaded");
  if (!cache.fits(*this))
    return Status::InvalidArgument(fmt::format("the KV cache was made for another model than {}", config_.str()));
  const int N = static_cast<int>(batch.tokens.size());
  if (N == 0) return Status::InvalidArgument("a forward over no tokens");
  if (batch.seq.size() != batch.tokens.size() || batch.pos.size() != batch.tokens.size())
    return Status::InvalidArgument(fmt::format("a batch of {} tokens with {} sequence ids and {} positions", N,
                                               batch.seq.size(), batch.pos.size()));
  // Rows' sequences, numbered in order of first appearance (members, so a
  // decode step allocates nothing).
  std::vector<int>& seqs = batch_seqs_;
  std::vector<int>& row_seq = batch_row_seq_;
  seqs.clear();
  row_seq.resize(N);
  int W = 1;
  for (int i = 0; i < N; i++) {
    const int t = batch.tokens[i], s = batch.seq[i], p = batch.pos[i];
    if (t < 0 || t >= config_.vocab)
      return Status::InvalidArgument(
          fmt::format("token id {} at row {} is outside the vocabulary [0, {})", t, i, config_.vocab));
    if (!cache.live(s)) return Status::InvalidArgument(fmt::format("row {}: KV-cache sequence {} is not live", i, s));
    if (p < 0 || p >= cache.length(s))
      return Status::InvalidArgument(fmt::format(
          "row {}: position {} of sequence {} is outside the {} positions reserved (PagedKVCache::extend)", i, p, s,
          cache.length(s)));
    // A sequence's rows usually come together: try the previous row's first.
    auto it = i > 0 && batch.seq[i - 1] == s ? seqs.begin() + row_seq[i - 1] : std::find(seqs.begin(), seqs.end(), s);
    row_seq[i] = static_cast<int>(it - seqs.begin());
    if (it == seqs.end()) {
      seqs.push_back(s);
      W = std::max(W, static_cast<int>(cache.blocks(s).size()));
    }
  }
  const int R = static_cast<int>(logit_rows.size());
  for (int r = 0; r < R; r++) {
    if (logit_rows[r] < 0 || logit_rows[r] >= N)
      return Status::InvalidArgument(fmt::format("logit row {} is outside the batch's {} rows", logit_rows[r], N));
  }
  const int S = static_cast<int>(seqs.size());

  // Index arrays, staged on the host: tokens, positions, row -> batch
  // sequence, pool slots (N each), then the block table (S,W).
  const int64_t ints = 4 * int64_t{N} + int64_t{S} * W;
  host_ints_.resize(ints);
  int* h_tokens = host_ints_.data();
  int* h_pos = h_tokens + N;
  int* h_seq = h_pos + N;
  int* h_slots = h_seq + N;
  int* h_table = h_slots + N;
  for (int i = 0; i < N; i++) {
    h_tokens[i] = batch.tokens[i];
    h_pos[i] = batch.pos[i];
    h_seq[i] = row_seq[i];
    h_slots[i] = cache.slot(batch.seq[i], batch.pos[i]);
  }
  for (int k = 0; k < S; k++) {
    const std::vector<int>& b = cache.blocks(seqs[k]);
    std::copy(b.begin(), b.end(), h_table + int64_t{k} * W);
  }
  RETURN_IF_ERROR(reserve_inference(N, std::max(R, 1), ints));
  int* d_ints = static_cast<int*>(infer_ints_.tensor(0).data);
  RETURN_IF_ERROR(try_copy_to_device(device_, d_ints, host_ints_.data(), sizeof(int) * ints));

  auto buf = [&](InferId id) { return infer_.tensor(id).f32(); };
  const int C = config_.channels;
  const ParamPtrs p = param_ptrs();
  AttentionArgs paged;
  paged.cache = &cache;
  paged.pos = d_ints + N;
  paged.seq = d_ints + 2 * int64_t{N};
  paged.slots = d_ints + 3 * int64_t{N};
  paged.table = d_ints + 4 * int64_t{N};
  paged.W = W;

  float* x = buf(kIRes0);
  float* y = buf(kIRes1);
  const bool learned = config_.positions == Positions::kLearned;
  if (quantized_embeddings()) {
    RETURN_IF_ERROR(dequantize_embeddings(batch.tokens.data(), N));
    ops_.encoder_forward_positions(x, embed_ids_.data(), paged.pos, embed_batch_.data(), learned ? p[kWpe] : nullptr,
                                   N, C);
  } else {
    ops_.encoder_forward_positions(x, d_ints, paged.pos, p[kWte], learned ? p[kWpe] : nullptr, N, C);
  }
  LayerActs a{};
  a.ln1 = buf(kILn1);
  a.ln1_mean = buf(kILn1Mean);
  a.ln1_rstd = buf(kILn1Rstd);
  a.qkv = buf(kIQkv);
  a.atty = buf(kIAtty);
  a.attproj = buf(kIAttproj);
  a.residual2 = buf(kIResidual2);
  a.ln2 = buf(kILn2);
  a.ln2_mean = buf(kILn2Mean);
  a.ln2_rstd = buf(kILn2Rstd);
  a.fch = buf(kIFch);
  a.fch_gelu = buf(kIFchGelu);
  a.fcproj = buf(kIFcproj);
  for (int l = 0; l < local_layers_; l++) {
    a.residual3 = y;
    RETURN_IF_ERROR(layer_forward(l, a, x, N, paged));
    std::swap(x, y);
  }
  if (R == 0) return Status::OK();
  // The head only for the rows asked for.
  float* gathered = buf(kIGathered);
  for (int r = 0; r < R; r++)
    RETURN_IF_ERROR(
        try_copy_on_device(device_, gathered + int64_t{r} * C, x + int64_t{logit_rows[r]} * C, sizeof(float) * C));
  norm_forward(buf(kILnf), buf(kILnfMean), buf(kILnfRstd), gathered, p[kLnfW], p[kLnfB], R);
  const float* head_w = config_.tied_head ? p[kWte] : p[kLmHead];
  const int Vp = config_.padded_vocab();
  if (device_ == Device::kCPU) {
    linear(logits, buf(kILnf), head_w, 4 * config_.layers, nullptr, R, C, Vp);
  } else {
    ops_.matmul_forward(buf(kILogits), buf(kILnf), head_w, nullptr, R, C, Vp, prec_);
    RETURN_IF_ERROR(try_copy_to_host(device_, logits, buf(kILogits), sizeof(float) * R * Vp));
  }
  return Status::OK();
}

}  // namespace tessera
