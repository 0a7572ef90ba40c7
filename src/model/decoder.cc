#include "model/decoder.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include <fmt/format.h>

#include "core/check.h"

namespace tessera {

bool DecoderConfig::operator==(const DecoderConfig& o) const {
  return layers == o.layers && heads == o.heads && channels == o.channels && vocab == o.vocab &&
         context == o.context && kv() == o.kv() && hs() == o.hs() && ffn() == o.ffn() && norm == o.norm &&
         norm_eps == o.norm_eps && positions == o.positions && rope_theta == o.rope_theta &&
         rope_scaling == o.rope_scaling && mlp == o.mlp && qkv_bias == o.qkv_bias && bias == o.bias &&
         tied_head == o.tied_head;
}

bool DecoderConfig::gpt2() const {
  DecoderConfig g;
  g.layers = layers;
  g.heads = heads;
  g.channels = channels;
  g.vocab = vocab;
  g.context = context;
  return *this == g;
}

Status DecoderConfig::validate() const {
  auto bad = [](std::string m) { return Status::InvalidArgument(std::move(m)); };
  if (layers <= 0) return bad(fmt::format("model.layers must be positive, got {}", layers));
  if (heads <= 0) return bad(fmt::format("model.heads must be positive, got {}", heads));
  if (channels <= 0) return bad(fmt::format("model.dim must be positive, got {}", channels));
  if (vocab <= 0) return bad(fmt::format("model.vocab must be positive, got {}", vocab));
  if (context <= 0) return bad(fmt::format("model.context must be positive, got {}", context));
  if (kv_heads < 0 || head_dim < 0 || mlp_hidden < 0)
    return bad(fmt::format("model.kv_heads, model.head_dim and model.mlp_hidden must not be negative (got {}, {}, {})",
                           kv_heads, head_dim, mlp_hidden));
  if (head_dim == 0 && channels % heads != 0)
    return bad(fmt::format("model.dim ({}) must be divisible by model.heads ({})", channels, heads));
  if (heads % kv() != 0)
    return bad(fmt::format("model.kv_heads ({}) must divide model.heads ({}): each key/value head serves a whole "
                           "group of query heads",
                           kv(), heads));
  if (positions == Positions::kRope && hs() % 2 != 0)
    return bad(fmt::format("rotary positions turn pairs of channels: the head size {} must be even", hs()));
  if (positions == Positions::kRope && !(rope_theta > 1.0))
    return bad(fmt::format("model.rope_theta must be above 1, got {}", rope_theta));
  if (norm == Norm::kLayerNorm && norm_eps != 1e-5f)
    return bad(fmt::format("model.norm_eps {} with layernorm: the layernorm kernels use GPT-2's 1e-5 only", norm_eps));
  if (!(norm_eps > 0.0f) || !std::isfinite(norm_eps))
    return bad(fmt::format("model.norm_eps must be positive, got {}", norm_eps));
  const RopeScaling& r = rope_scaling;
  if (r.kind != RopeScaling::Kind::kNone && !(r.factor >= 1.0))
    return bad(fmt::format("model.rope_scaling.factor must be at least 1, got {}", r.factor));
  if (r.kind == RopeScaling::Kind::kLlama3 &&
      (!(r.low_freq_factor > 0.0) || !(r.high_freq_factor > r.low_freq_factor) || r.original_context <= 0))
    return bad(fmt::format("llama3 rope_scaling needs 0 < low_freq_factor < high_freq_factor and a positive "
                           "original context (got {}, {}, {})",
                           r.low_freq_factor, r.high_freq_factor, r.original_context));
  // Token ids are 32-bit (version-2 shards past 65,536: Llama 3, Qwen); the
  // bound is the tokenizer.json loader's.
  if (vocab > (1 << 24)) return bad(fmt::format("model.vocab {} exceeds 16777216 token ids", vocab));
  return Status::OK();
}

int64_t DecoderConfig::layer_parameters() const {
  const int64_t C = channels, F = ffn();
  const bool ln = norm == Norm::kLayerNorm;
  int64_t n = 2 * C * (ln ? 2 : 1);                    // the two norms
  n += int64_t{qkv_dim()} * C + (qkv_bias ? qkv_dim() : 0);  // qkv
  n += C * q_dim() + (bias ? C : 0);                   // attention output
  n += int64_t{fc_rows()} * C + (bias ? fc_rows() : 0);  // fc (gate and up)
  n += C * F + (bias ? C : 0);                         // projection down
  return int64_t{layers} * n;
}

int64_t DecoderConfig::num_parameters() const {
  const int64_t C = channels, V = vocab;
  int64_t n = V * C + layer_parameters() + C * (norm == Norm::kLayerNorm ? 2 : 1);
  if (positions == Positions::kLearned) n += int64_t{context} * C;
  if (!tied_head) n += V * C;
  return n;
}

double DecoderConfig::flops_per_token(int T) const {
  double matmul_params = static_cast<double>(num_parameters());
  if (!tied_head) matmul_params -= static_cast<double>(vocab) * channels;  // the input embedding is a lookup
  return 6.0 * matmul_params + 6.0 * layers * static_cast<double>(q_dim()) * T;
}

std::vector<float> DecoderConfig::rope_inv_freq() const {
  const int half = hs() / 2;
  std::vector<float> f(half);
  const RopeScaling& r = rope_scaling;
  for (int i = 0; i < half; i++) {
    // HF: 1 / base ** (arange(0, dim, 2).float() / dim), in float32.
    const float expo = static_cast<float>(2 * i) / static_cast<float>(hs());
    float inv = static_cast<float>(1.0 / std::pow(rope_theta, static_cast<double>(expo)));
    if (r.kind == RopeScaling::Kind::kLinear) {
      inv = static_cast<float>(inv / r.factor);
    } else if (r.kind == RopeScaling::Kind::kLlama3) {
      // transformers' _compute_llama3_parameters.
      const double low_wavelen = r.original_context / r.low_freq_factor;
      const double high_wavelen = r.original_context / r.high_freq_factor;
      const double wavelen = 2.0 * std::numbers::pi / inv;
      if (wavelen > low_wavelen) {
        inv = static_cast<float>(inv / r.factor);
      } else if (wavelen >= high_wavelen) {
        const double smooth = (r.original_context / wavelen - r.low_freq_factor) /
                              (r.high_freq_factor - r.low_freq_factor);
        inv = static_cast<float>((1.0 - smooth) * inv / r.factor + smooth * inv);
      }
    }
    f[i] = inv;
  }
  return f;
}

std::vector<float> DecoderConfig::llama3_rope_factors() const {
  const RopeScaling& r = rope_scaling;
  if (r.kind != RopeScaling::Kind::kLlama3) return {};
  DecoderConfig plain = *this;
  plain.rope_scaling = RopeScaling{};
  const std::vector<float> inv = plain.rope_inv_freq();
  // The converter's float32 tensor arithmetic on its Python scalars.
  const float factor = static_cast<float>(r.factor), low = static_cast<float>(r.low_freq_factor);
  const float high = static_cast<float>(r.high_freq_factor), old = static_cast<float>(r.original_context);
  const float low_wavelen = static_cast<float>(r.original_context / r.low_freq_factor);
  const float high_wavelen = static_cast<float>(r.original_context / r.high_freq_factor);
  std::vector<float> f(inv.size());
  for (size_t i = 0; i < inv.size(); i++) {
    const float wavelen = static_cast<float>(2.0 * std::numbers::pi) / inv[i];
    if (wavelen < high_wavelen) {
      f[i] = 1.0f;
    } else if (wavelen > low_wavelen) {
      f[i] = factor;
    } else {
      const float smooth = (old / wavelen - low) / (high - low);
      f[i] = 1.0f / ((1.0f - smooth) / factor + smooth);
    }
  }
  return f;
}

std::string DecoderConfig::str() const {
  std::string s = fmt::format("L={} NH={} C={} V={} maxT={}", layers, heads, channels, vocab, context);
  if (gpt2()) return s;
  if (kv() != heads) s += fmt::format(" KV={}", kv());
  if (hs() * heads != channels) s += fmt::format(" hs={}", hs());
  if (ffn() != 4 * channels) s += fmt::format(" F={}", ffn());
  if (norm == Norm::kRMSNorm) s += fmt::format(" rmsnorm({:g})", norm_eps);
  if (positions == Positions::kRope) {
    s += fmt::format(" rope({:g}", rope_theta);
    if (rope_scaling.kind == RopeScaling::Kind::kLinear) s += fmt::format(", linear x{:g}", rope_scaling.factor);
    if (rope_scaling.kind == RopeScaling::Kind::kLlama3) s += fmt::format(", llama3 x{:g}", rope_scaling.factor);
    s += ")";
  }
  if (mlp == Mlp::kSwiGLU) s += " swiglu";
  if (!qkv_bias && !bias) s += " no-bias";
  else if (!bias) s += " qkv-bias";
  else if (!qkv_bias) s += " no-qkv-bias";
  if (!tied_head) s += " untied";
  return s;
}

Status ModelShard::validate(const DecoderConfig& c) const {
  if (tp < 1) return Status::InvalidArgument(fmt::format("parallel.tp must be at least 1, got {}", tp));
  if (tp_rank < 0 || tp_rank >= tp)
    return Status::InvalidArgument(fmt::format("tensor-parallel rank {} is outside [0, {})", tp_rank, tp));
  if (c.heads % tp != 0)
    return Status::InvalidArgument(fmt::format(
        "model.heads ({}) must be divisible by parallel.tp ({}): tensor parallelism splits whole heads", c.heads, tp));
  if (c.kv() % tp != 0)
    return Status::InvalidArgument(fmt::format(
        "model.kv_heads ({}) must be divisible by parallel.tp ({}): tensor parallelism splits whole key/value heads "
        "(replicating them, as Megatron-LM can, is not built)",
        c.kv(), tp));
  if (c.ffn() % tp != 0)
    return Status::InvalidArgument(fmt::format("the MLP width {} must be divisible by parallel.tp ({})", c.ffn(), tp));
  const int end = layer_end < 0 ? c.layers : layer_end;
  if (layer_begin < 0 || end <= layer_begin || end > c.layers)
    return Status::InvalidArgument(
        fmt::format("pipeline stage layers [{}, {}) are not a non-empty range of the model's {} layers", layer_begin,
                    end, c.layers));
  return Status::OK();
}

const char* param_name(int id) {
  static const char* kNames[kNumParams] = {"wte",     "wpe",     "ln1w", "ln1b",    "qkvw",    "qkvb",
                                           "attprojw", "attprojb", "ln2w", "ln2b",    "fcw",     "fcb",
                                           "fcprojw", "fcprojb", "lnfw", "lnfb",    "lmhead"};
  CHECK(id >= 0 && id < kNumParams);
  return kNames[id];
}

bool param_decays(int id) {
  return id == kWte || id == kWpe || id == kQkvW || id == kAttProjW || id == kFcW || id == kFcProjW || id == kLmHead;
}

TensorSlice param_slice(const DecoderConfig& c, const ModelShard& s, int id) {
  const int64_t L = c.layers, C = c.channels, Vp = c.padded_vocab(s.tp), hs = c.hs(), KV = c.kv();
  const int64_t G = c.heads / KV, F = c.ffn(), tp = s.tp, r = s.tp_rank;
  const int64_t KVl = KV / tp, Fl = F / tp, Vl = Vp / tp;
  const int64_t l0 = s.layer_begin, Ll = s.layers(c);
  const bool first = s.layer_begin == 0, last = l0 + Ll == L;
  const bool ln = c.norm == Norm::kLayerNorm, swiglu = c.mlp == Mlp::kSwiGLU;
  TensorSlice t;
  auto set = [&](Shape global, Shape view, std::vector<int64_t> begin, std::vector<int64_t> size) {
    t.global = global;
    t.view = view;
    t.begin = std::move(begin);
    t.size = std::move(size);
  };
  // A tensor this configuration does not have: no rows anywhere.
  auto absent = [&](Shape shape) {
    shape.dims[0] = 0;
    set(shape, shape, std::vector<int64_t>(shape.rank, 0),
        std::vector<int64_t>(shape.dims.begin(), shape.dims.begin() + shape.rank));
  };
  // Per layer (L, C), replicated across tp.
  auto per_layer = [&](bool present) {
    if (present) set({L, C}, {L, C}, {l0, 0}, {Ll, C});
    else absent({L, C});
  };
  switch (id) {
    case kWte: set({Vp, C}, {Vp, C}, {r * Vl, 0}, {first || (last && c.tied_head) ? Vl : 0, C}); break;
    case kWpe:
      if (c.positions == Positions::kLearned) set({c.context, C}, {c.context, C}, {0, 0}, {first ? c.context : 0, C});
      else absent({c.context, C});
      break;
    case kLn1W:
    case kLn2W: per_layer(true); break;
    case kLn1B:
    case kLn2B: per_layer(ln); break;
    case kAttProjB:
    case kFcProjB: per_layer(c.bias); break;
    case kQkvW:
      set({L, c.qkv_dim(), C}, {L, G + 2, KV * hs, C}, {l0, 0, r * KVl * hs, 0}, {Ll, G + 2, KVl * hs, C});
      break;
    case kQkvB:
      if (c.qkv_bias) set({L, c.qkv_dim()}, {L, G + 2, KV * hs}, {l0, 0, r * KVl * hs}, {Ll, G + 2, KVl * hs});
      else absent({L, c.qkv_dim()});
      break;
    case kAttProjW:
      if (G == 1) set({L, C, c.q_dim()}, {L, C, c.q_dim()}, {l0, 0, r * KVl * hs}, {Ll, C, KVl * hs});
      else set({L, C, c.q_dim()}, {L, C, G, KV * hs}, {l0, 0, 0, r * KVl * hs}, {Ll, C, G, KVl * hs});
      break;
    case kFcW:
      if (swiglu) set({L, 2 * F, C}, {L, 2, F, C}, {l0, 0, r * Fl, 0}, {Ll, 2, Fl, C});
      else set({L, F, C}, {L, F, C}, {l0, r * Fl, 0}, {Ll, Fl, C});
      break;
    case kFcB:
      if (!c.bias) absent({L, c.fc_rows()});
      else if (swiglu) set({L, 2 * F}, {L, 2, F}, {l0, 0, r * Fl}, {Ll, 2, Fl});
      else set({L, F}, {L, F}, {l0, r * Fl}, {Ll, Fl});
      break;
    case kFcProjW: set({L, C, F}, {L, C, F}, {l0, 0, r * Fl}, {Ll, C, Fl}); break;
    case kLnfW: set({C}, {C}, {0}, {last ? C : 0}); break;
    case kLnfB:
      if (ln) set({C}, {C}, {0}, {last ? C : 0});
      else absent({C});
      break;
    case kLmHead:
      if (c.tied_head) absent({Vp, C});
      else set({Vp, C}, {Vp, C}, {r * Vl, 0}, {last ? Vl : 0, C});
      break;
    default: CHECK(false);
  }
  return t;
}

Arena param_layout(const DecoderConfig& c, const ModelShard& shard, std::span<const int> omit) {
  // Local tensors are the blocks of param_slice(), merged back to the
  // canonical number of dimensions: views that split a dimension (qkv's
  // slabs, SwiGLU's gate and up, the projection's groups) join it again.
  Arena a;
  for (int id = 0; id < kNumParams; id++) {
    TensorSlice t = param_slice(c, shard, id);
    Shape local;
    local.rank = t.global.rank;
    if (t.view.rank == t.global.rank) {
      for (int d = 0; d < t.view.rank; d++) local.dims[d] = t.size[d];
    } else {
      // The view splits global dimension k into (k, k+1): qkv's slabs and
      // SwiGLU's gate and up at 1, the projection's groups at 2.
      CHECK(t.view.rank == t.global.rank + 1);
      const int k = id == kAttProjW ? 2 : 1;
      for (int d = 0; d < t.global.rank; d++)
        local.dims[d] = d < k ? t.size[d] : d == k ? t.size[d] * t.size[d + 1] : t.size[d + 1];
    }
    CHECK(local.numel() == t.block_numel());
    if (std::find(omit.begin(), omit.end(), id) != omit.end()) local.dims[0] = 0;
    a.reserve(param_name(id), DType::kF32, local);
  }
  return a;
}

}  // namespace tessera
