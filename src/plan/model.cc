#include "plan/model.h"

#include <fmt/format.h>

#include <algorithm>

namespace tessera::plan {

namespace {

struct Preset {
  const char* name;
  int layers, heads, dim, vocab, seq;
  int64_t global_batch;  // sequences
  const char* note;
  // The Llama family (0 for GPT-2's shape): key/value heads, SwiGLU width,
  // context, and Qwen2's qkv biases with a tied head; the rotary base and
  // the RMSNorm epsilon of their config.json files.
  int kv_heads = 0, mlp_hidden = 0, context = 0;
  bool qwen = false;
  double rope_theta = 10000.0;
  float norm_eps = 1e-5f;
};

// GPT-2 sizes from the GPT-2 paper (Radford et al. 2019, table 2) with
// llm.c's batch of 0.5M tokens; the Llama family's from their published
// config.json files (Llama 2: Touvron et al. 2023, 4M-token batches; Llama
// 3: Dubey et al. 2024; Qwen2.5; TinyLlama: 2M-token batches); the
// Megatron-LM sizes of Narayanan et al. 2021, table 1 (GPT-shaped).
const Preset kPresets[] = {
    {"gpt2-124m", 12, 12, 768, 50257, 1024, 512, "GPT-2 small"},
    {"gpt2-350m", 24, 16, 1024, 50257, 1024, 512, "GPT-2 medium"},
    {"gpt2-774m", 36, 20, 1280, 50257, 1024, 512, "GPT-2 large"},
    {"gpt2-1.5b", 48, 25, 1600, 50257, 1024, 512, "GPT-2 XL"},
    {"llama2-7b", 32, 32, 4096, 32000, 4096, 1024, "Llama-2-7b", 32, 11008, 4096},
    {"llama2-13b", 40, 40, 5120, 32000, 4096, 1024, "Llama-2-13b", 40, 13824, 4096},
    {"llama2-70b", 80, 64, 8192, 32000, 4096, 1024, "Llama-2-70b", 8, 28672, 4096},
    {"llama3-8b", 32, 32, 4096, 128256, 8192, 512, "Meta-Llama-3-8B", 8, 14336, 8192, false, 500000.0},
    {"llama3-70b", 80, 64, 8192, 128256, 8192, 512, "Meta-Llama-3-70B", 8, 28672, 8192, false, 500000.0},
    {"llama3-405b", 126, 128, 16384, 128256, 8192, 2048, "Llama-3.1-405B", 8, 53248, 8192, false, 500000.0},
    {"qwen2.5-0.5b", 24, 14, 896, 151936, 4096, 1024, "Qwen2.5-0.5B", 2, 4864, 32768, true, 1000000.0, 1e-6f},
    {"tinyllama-1.1b", 22, 32, 2048, 32000, 2048, 1024, "TinyLlama-1.1B", 4, 5632, 2048},
    {"megatron-1.7b", 24, 24, 2304, 51200, 2048, 512, "Megatron-LM 2021 table 1"},
    {"megatron-3.6b", 30, 32, 3072, 51200, 2048, 512, ""},
    {"megatron-7.5b", 36, 32, 4096, 51200, 2048, 512, ""},
    {"megatron-18b", 40, 48, 6144, 51200, 2048, 1024, ""},
    {"megatron-39b", 48, 64, 8192, 51200, 2048, 1536, ""},
    {"megatron-76b", 60, 80, 10240, 51200, 2048, 1792, ""},
    {"megatron-145b", 80, 96, 12288, 51200, 2048, 2304, ""},
};

}  // namespace

DecoderConfig ModelSpec::shape() const {
  DecoderConfig c = family;
  c.layers = layers;
  c.heads = heads;
  c.channels = dim;
  c.vocab = vocab;
  c.context = context > 0 ? context : seq;
  return c;
}

Status ModelSpec::validate() const {
  if (layers <= 0 || heads <= 0 || dim <= 0 || vocab <= 0 || seq <= 0)
    return Status::InvalidArgument(fmt::format(
        "the model needs positive --layers, --heads, --dim, --vocab and --seq (got {}, {}, {}, {}, {})", layers,
        heads, dim, vocab, seq));
  if (family.head_dim == 0 && dim % heads != 0)
    return Status::InvalidArgument(fmt::format("--dim {} is not divisible by --heads {}", dim, heads));
  if (Status st = shape().validate(); !st.ok()) return st;
  if (global_batch <= 0)
    return Status::InvalidArgument(fmt::format("--global-batch must be positive, got {}", global_batch));
  return Status::OK();
}

std::string ModelSpec::str() const {
  const DecoderConfig c = shape();
  // The shape's description after its maxT (GPT-2's has none).
  std::string extra = c.str();
  extra = extra.substr(std::min(extra.size(), fmt::format("L={} NH={} C={} V={} maxT={}", c.layers, c.heads,
                                                          c.channels, c.vocab, c.context).size()));
  return fmt::format("{}: L={} NH={} C={} V={} T={}{}, {:.1f}M parameters, global batch {} x {} tokens", name, layers,
                     heads, dim, vocab, seq, extra, parameters() / 1e6, global_batch, seq);
}

std::string model_preset_names() {
  std::string s;
  for (const auto& p : kPresets) s += (s.empty() ? "" : ", ") + std::string(p.name);
  return s;
}

Result<ModelSpec> model_preset(const std::string& name) {
  for (const auto& p : kPresets) {
    if (name != p.name) continue;
    ModelSpec m;
    m.name = p.name;
    m.layers = p.layers;
    m.heads = p.heads;
    m.dim = p.dim;
    m.vocab = p.vocab;
    m.seq = p.seq;
    m.global_batch = p.global_batch;
    if (p.kv_heads > 0) {
      DecoderConfig& f = m.family;
      f.kv_heads = p.kv_heads == p.heads ? 0 : p.kv_heads;
      f.mlp_hidden = p.mlp_hidden;
      f.norm = Norm::kRMSNorm;
      f.positions = Positions::kRope;
      f.mlp = Mlp::kSwiGLU;
      f.bias = false;
      f.qkv_bias = f.tied_head = p.qwen;
      f.rope_theta = p.rope_theta;
      f.norm_eps = p.norm_eps;
      m.context = p.context;
    }
    return m;
  }
  return Status::NotFound(fmt::format("unknown model '{}' (known: {})", name, model_preset_names()));
}

}  // namespace tessera::plan
