#include "serve/model_assets.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <set>
#include <span>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/huge_pages.h"
#include "core/try.h"
#include "data/gguf_vocab.h"
#include "data/hf_tokenizer.h"
#include "io/json_guard.h"
#include "io/gguf.h"
#include "io/safetensors.h"
#include "kernels/cpu/int8_kernel.h"
#include "kernels/q4.h"
#include "nn/gguf_model.h"

namespace tessera::serve {

namespace fs = std::filesystem;

namespace {

// The folder a model path names (itself, or a file's folder).
fs::path folder_of(const std::string& model_path) {
  std::error_code ec;
  if (fs::is_directory(model_path, ec)) return model_path;
  fs::path p = fs::path(model_path).parent_path();
  return p.empty() ? fs::path(".") : p;
}

Result<nlohmann::json> read_json(const fs::path& path) {
  ASSIGN_OR_RETURN(std::vector<std::byte> bytes, io::read_file(path.string()));
  const std::string_view text(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  if (Status st = io::check_json_nesting(text, io::JsonLimits{}); !st.ok()) return st.With(path.string());
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    return Status::Corruption(fmt::format("{}: not a JSON object", path.string()));
  return j;
}

// eos_token_id as an int or a list of ints; anything else is an error.
Status eos_ids(const nlohmann::json& j, const fs::path& file, std::set<int>* out) {
  auto it = j.find("eos_token_id");
  if (it == j.end() || it->is_null()) return Status::OK();
  auto one = [&](const nlohmann::json& v) -> Status {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > (1 << 24))
      return Status::InvalidArgument(fmt::format("{}: eos_token_id {} is not a token id", file.string(), v.dump()));
    out->insert(v.get<int>());
    return Status::OK();
  };
  if (it->is_array()) {
    for (const nlohmann::json& v : *it) RETURN_IF_ERROR(one(v));
    return Status::OK();
  }
  return one(*it);
}

// temperature [0, 2], top_p (0, 1], top_k >= 0 (0: all), as a request's;
// absent or null: not set. Anything else is one line naming the key.
Status sampling_defaults(const nlohmann::json& j, const fs::path& file, SamplingDefaults* out) {
  auto number = [&](const char* key, double lo, double hi, bool open_lo, std::optional<float>* dst) -> Status {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return Status::OK();
    const bool ok = it->is_number() && (open_lo ? it->get<double>() > lo : it->get<double>() >= lo) &&
                    it->get<double>() <= hi;
    if (!ok)
      return Status::InvalidArgument(fmt::format("{}: {} {} is not a number in {}{}, {}]", file.string(), key,
                                                 it->dump(), open_lo ? "(" : "[", lo, hi));
    *dst = static_cast<float>(it->get<double>());
    return Status::OK();
  };
  RETURN_IF_ERROR(number("temperature", 0.0, 2.0, false, &out->temperature));
  RETURN_IF_ERROR(number("top_p", 0.0, 1.0, true, &out->top_p));
  if (auto it = j.find("top_k"); it != j.end() && !it->is_null()) {
    if (!it->is_number_integer() || it->get<int64_t>() < 0 || it->get<int64_t>() > (1 << 20))
      return Status::InvalidArgument(
          fmt::format("{}: top_k {} is not a count of tokens (0: all)", file.string(), it->dump()));
    out->top_k = static_cast<int>(it->get<int64_t>());
  }
  return Status::OK();
}

Result<ModelAssets> gguf_assets(const io::GgufFile& f, const std::string& chat_template, int vocab) {
  ModelAssets a;
  ASSIGN_OR_RETURN(std::unique_ptr<data::HfTokenizer> tok, data::gguf_tokenizer(f));
  if (tok->vocab_size() > vocab)
    return Status::InvalidArgument(fmt::format("{}: the vocabulary has {} tokens but the model only {}", f.path(),
                                               tok->vocab_size(), vocab));
  a.source = fmt::format("the GGUF file's tokenizer ({} tokens)", tok->vocab_size());
  std::string bos, eos;
  std::set<int> stops;
  for (const char* key : {"tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"}) {
    if (!f.has(key)) continue;
    ASSIGN_OR_RETURN(uint64_t id, f.get_uint(key));
    if (id >= static_cast<uint64_t>(tok->vocab_size()))
      return Status::InvalidArgument(fmt::format("{}: {} {} is outside the vocabulary", f.path(), key, id));
    if (std::string_view(key).find("bos") != std::string_view::npos) {
      bos = tok->token_text(static_cast<uint32_t>(id));
    } else {
      if (eos.empty()) eos = tok->token_text(static_cast<uint32_t>(id));
      stops.insert(static_cast<int>(id));
    }
  }
  std::string text;
  if (!chat_template.empty()) {
    ASSIGN_OR_RETURN(std::vector<std::byte> bytes, io::read_file(chat_template));
    text.assign(reinterpret_cast<const char*>(bytes.data()), bytes.size());
    a.source += fmt::format(", chat template {}", chat_template);
  } else if (f.has("tokenizer.chat_template")) {
    ASSIGN_OR_RETURN(text, f.get_string("tokenizer.chat_template"));
    a.source += ", its chat template";
  }
  if (!text.empty()) {
    ASSIGN_OR_RETURN(data::ChatTemplate t, data::ChatTemplate::parse(text, bos, eos));
    a.chat_template = std::make_shared<const data::ChatTemplate>(std::move(t));
  }
  a.tokenizer = std::move(tok);
  a.stop_tokens.assign(stops.begin(), stops.end());
  return a;
}

}  // namespace

Result<ModelAssets> load_model_assets(const std::string& model_path, const std::string& tokenizer,
                                      const std::string& vocab_dir, const std::string& chat_template, int vocab) {
  ModelAssets a;
  const fs::path dir = folder_of(model_path);
  std::error_code ec;
  // A GGUF file brings its own vocabulary, chat template and end ids.
  if (tokenizer.empty() && fs::is_regular_file(model_path, ec) && is_gguf(model_path)) {
    ASSIGN_OR_RETURN(io::GgufFile f, io::GgufFile::open(model_path));
    if (data::gguf_has_vocab(f)) return gguf_assets(f, chat_template, vocab);
  }
  const bool hf_tok = tokenizer.empty() && fs::exists(dir / "tokenizer.json", ec);
  const std::string name = !tokenizer.empty() ? tokenizer : hf_tok ? dir.string() : vocab >= 50257 ? "gpt2" : "byte";
  ASSIGN_OR_RETURN(a.tokenizer, data::make_tokenizer(name, vocab_dir));
  if (a.tokenizer->vocab_size() > vocab)
    return Status::InvalidArgument(fmt::format("tokenizer '{}' has {} tokens but the model's vocabulary has only {}",
                                               name, a.tokenizer->vocab_size(), vocab));
  a.source = fmt::format("tokenizer {}", a.tokenizer->name());

  // The chat template: --chat-template, else the folder's tokenizer_config.json.
  const auto* hf = dynamic_cast<const data::HfTokenizer*>(a.tokenizer.get());
  if (!chat_template.empty()) {
    ASSIGN_OR_RETURN(std::vector<std::byte> bytes, io::read_file(chat_template));
    std::string bos, eos;
    if (fs::exists(dir / "tokenizer_config.json", ec)) {
      ASSIGN_OR_RETURN(nlohmann::json cfg, read_json(dir / "tokenizer_config.json"));
      auto token_text = [](const nlohmann::json& v) {
        if (v.is_string()) return v.get<std::string>();
        if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
        return std::string();
      };
      if (cfg.contains("bos_token")) bos = token_text(cfg["bos_token"]);
      if (cfg.contains("eos_token")) eos = token_text(cfg["eos_token"]);
    }
    ASSIGN_OR_RETURN(data::ChatTemplate t,
                     data::ChatTemplate::parse(std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()),
                                               bos, eos));
    a.chat_template = std::make_shared<const data::ChatTemplate>(std::move(t));
    a.source += fmt::format(", chat template {}", chat_template);
  } else if (fs::exists(dir / "tokenizer_config.json", ec)) {
    Result<data::ChatTemplate> t = data::ChatTemplate::load((dir / "tokenizer_config.json").string());
    if (t.ok()) {
      a.chat_template = std::make_shared<const data::ChatTemplate>(std::move(t).value());
      a.source += ", the folder's chat template";
    } else if (t.status().code() != StatusCode::kNotFound) {
      return t.status();  // a template that is there but unreadable is an error, not a silent plain format
    }
  }

  // The ids that end a generation.
  std::set<int> stops;
  if (fs::exists(dir / "generation_config.json", ec)) {
    ASSIGN_OR_RETURN(nlohmann::json g, read_json(dir / "generation_config.json"));
    RETURN_IF_ERROR(eos_ids(g, dir / "generation_config.json", &stops));
    RETURN_IF_ERROR(sampling_defaults(g, dir / "generation_config.json", &a.sampling));
    if (a.sampling.temperature || a.sampling.top_p || a.sampling.top_k)
      a.source += fmt::format(", sampling defaults{}{}{}",
                              a.sampling.temperature ? fmt::format(" temperature {}", *a.sampling.temperature) : "",
                              a.sampling.top_p ? fmt::format(" top_p {}", *a.sampling.top_p) : "",
                              a.sampling.top_k ? fmt::format(" top_k {}", *a.sampling.top_k) : "");
  }
  if (stops.empty() && hf && a.chat_template && !a.chat_template->eos_token().empty()) {
    const int64_t id = hf->token_id(a.chat_template->eos_token());
    if (id >= 0) stops.insert(static_cast<int>(id));
  }
  for (int t : stops) {
    if (t >= vocab)
      return Status::InvalidArgument(
          fmt::format("{}: eos_token_id {} is outside the model's vocabulary of {}", dir.string(), t, vocab));
  }
  a.stop_tokens.assign(stops.begin(), stops.end());
  return a;
}

ModelUse inference_use(const InferenceDtype& d) {
  return d.dtype == "int8" && d.backend == Backend::kCPU ? ModelUse::kInt8Inference : ModelUse::kInference;
}

Status apply_int4_dtype(GPT& model, const std::string& dtype, const std::string& who, bool release) {
  q4::Type t;
  if (model.int4()) {  // a 4-bit file (GGUF) is int4 as it is, whatever --dtype says
    std::fprintf(stderr, "%s: int4 from the file's blocks, %.1f MB; %s\n", who.c_str(), model.q4_bytes() / 1e6,
                 cpu::q4_kernel_summary().c_str());
    return Status::OK();
  }
  if (!q4::dtype_type(dtype, &t)) return Status::OK();
  ASSIGN_OR_RETURN(std::string made, model.quantize_q4(t));
  std::fprintf(stderr, "%s: %s %s, %.1f MB; %s\n", who.c_str(), dtype.c_str(), made.c_str(), model.q4_bytes() / 1e6,
               cpu::q4_kernel_summary().c_str());
  if (release) RETURN_IF_ERROR(model.release_fp32_matmul_weights().status());
  return Status::OK();
}

Status apply_inference_dtype(GPT& model, const InferenceDtype& d) {
  model.set_precision(d.dtype == "bf16" ? MatmulPrecision::kBF16 : MatmulPrecision::kF32);
  if (d.dtype == "int8" && model.int4())
    return Status::InvalidArgument(fmt::format("{}: a 4-bit file runs as the int4 tier (--dtype int4)", d.source));
  // An INT8 file (tessera quantize) loads as an INT8 model whatever --dtype
  // says; --dtype int8 quantizes an fp32 one.
  if (d.dtype == "int8" && !model.int8()) RETURN_IF_ERROR(model.quantize_int8());
  if ((d.dtype == "int4" || d.dtype == "int4k") && d.backend != Backend::kCPU)
    return Status::InvalidArgument(fmt::format("--dtype {} is a CPU tier (--backend cpu)", d.dtype));
  RETURN_IF_ERROR(apply_int4_dtype(model, d.dtype, d.who, /*release=*/true));
  weights_to_huge_pages(model, d.who);
  return Status::OK();
}

int64_t weights_to_huge_pages(const GPT& model, const std::string& who) {
  if (!huge_pages_wanted()) return 0;
  const std::vector<std::span<const uint8_t>> blocks = model.stored_weights();
  int64_t total = 0;
  for (std::span<const uint8_t> b : blocks) total += static_cast<int64_t>(b.size());
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t huge = collapse_to_huge_pages(blocks);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (total > 0)
    std::fprintf(stderr, "%s: weights in 2 MiB pages: %.1f of %.1f MB in %.2f s%s\n", who.c_str(), huge / 1e6,
                 total / 1e6, s, huge == 0 ? " (the kernel gave none: 4 KiB pages, as before)" : "");
  return huge;
}

double kv_cache_blocks(const KvCacheRequest& r, int context, int block_size, int64_t block_bytes) {
  const double per_seq = (context + block_size - 1) / block_size;
  return r.kv_memory_mb > 0 ? std::max(1.0, std::floor(r.kv_memory_mb * (1 << 20) / block_bytes))
         : r.kv_blocks > 0  ? r.kv_blocks
                            : r.max_seqs * per_seq;
}

Status check_serving_memory(const std::string& id, double weights_bytes, double kv_blocks, int64_t block_bytes,
                            int block_size, const obs::MemoryLimit& limit) {
  const double kv = kv_blocks * block_bytes;
  if (limit.bytes > 0 && weights_bytes + kv > limit.bytes)
    return Status::InvalidArgument(fmt::format(
        "{} needs {:.1f} GB (weights {:.1f} GB, KV cache {:.1f} GB: {:.0f} blocks of {} positions) but this host has "
        "{:.1f} GB ({}); lower --kv-blocks, --kv-memory or --max-seqs",
        id, (weights_bytes + kv) / 1e9, weights_bytes / 1e9, kv / 1e9, kv_blocks, block_size, limit.bytes / 1e9,
        limit.source));
  if (kv_blocks > INT32_MAX)
    return Status::InvalidArgument(fmt::format("the KV cache of {:.0f} blocks is more than {} blocks", kv_blocks,
                                               INT32_MAX));
  return Status::OK();
}

}  // namespace tessera::serve
