#include "plan/model.h"

#include <fmt/format.h>

#include <array>

namespace tessera::plan {

namespace {

struct Preset {
  const char* name;
  int layers, heads, dim, vocab, seq;
  int64_t global_batch;  // sequences
  const char* note;
};

// GPT-2 sizes from the GPT-2 paper (Radford et al. 2019, table 2) with
// llm.c's batch of 0.5M tokens; Llama sizes (Touvron et al. 2023, table 2)
// as a GPT-2-shaped stand-in (4C MLP, tied head: 6.6B for "7B"), 4M-token
// batch; the Megatron-LM sizes of Narayanan et al. 2021, table 1.
constexpr std::array<Preset, 13> kPresets = {{
    {"gpt2-124m", 12, 12, 768, 50257, 1024, 512, "GPT-2 small"},
    {"gpt2-350m", 24, 16, 1024, 50257, 1024, 512, "GPT-2 medium"},
    {"gpt2-774m", 36, 20, 1280, 50257, 1024, 512, "GPT-2 large"},
    {"gpt2-1.5b", 48, 25, 1600, 50257, 1024, 512, "GPT-2 XL"},
    {"llama-7b", 32, 32, 4096, 32000, 2048, 2048, "Llama 7B sizes"},
    {"llama-13b", 40, 40, 5120, 32000, 2048, 2048, "Llama 13B sizes"},
    {"megatron-1.7b", 24, 24, 2304, 51200, 2048, 512, "Megatron-LM 2021 table 1"},
    {"megatron-3.6b", 30, 32, 3072, 51200, 2048, 512, ""},
    {"megatron-7.5b", 36, 32, 4096, 51200, 2048, 512, ""},
    {"megatron-18b", 40, 48, 6144, 51200, 2048, 1024, ""},
    {"megatron-39b", 48, 64, 8192, 51200, 2048, 1536, ""},
    {"megatron-76b", 60, 80, 10240, 51200, 2048, 1792, ""},
    {"megatron-145b", 80, 96, 12288, 51200, 2048, 2304, ""},
}};

}  // namespace

int ModelSpec::padded_vocab(int tp) const {
  int m = 128;
  while (m % tp != 0) m += 128;
  return (vocab + m - 1) / m * m;
}

int64_t ModelSpec::parameters() const {
  const int64_t C = dim, L = layers;
  const int64_t per_layer = 2 * C + 3 * C * C + 3 * C + C * C + C + 2 * C + 4 * C * C + 4 * C + 4 * C * C + C;
  return int64_t{vocab} * C + int64_t{context > 0 ? context : seq} * C + L * per_layer + 2 * C;
}

double ModelSpec::flops_per_token() const {
  return 6.0 * static_cast<double>(parameters()) + 6.0 * layers * static_cast<double>(dim) * seq;
}

Status ModelSpec::validate() const {
  if (layers <= 0 || heads <= 0 || dim <= 0 || vocab <= 0 || seq <= 0)
    return Status::InvalidArgument(fmt::format(
        "the model needs positive --layers, --heads, --dim, --vocab and --seq (got {}, {}, {}, {}, {})", layers,
        heads, dim, vocab, seq));
  if (dim % heads != 0)
    return Status::InvalidArgument(fmt::format("--dim {} is not divisible by --heads {}", dim, heads));
  if (global_batch <= 0)
    return Status::InvalidArgument(fmt::format("--global-batch must be positive, got {}", global_batch));
  return Status::OK();
}

std::string ModelSpec::str() const {
  return fmt::format("{}: L={} NH={} C={} V={} T={}, {:.1f}M parameters, global batch {} x {} tokens", name, layers,
                     heads, dim, vocab, seq, parameters() / 1e6, global_batch, seq);
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
    return m;
  }
  return Status::NotFound(fmt::format("unknown model '{}' (known: {})", name, model_preset_names()));
}

}  // namespace tessera::plan
