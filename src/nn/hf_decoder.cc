#include "nn/hf_decoder.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/try.h"
#include "io/json_guard.h"
#include "tensor/dtype.h"

namespace tessera {

namespace fs = std::filesystem;

namespace {

constexpr const char* kIndex = "model.safetensors.index.json";
constexpr const char* kSingle = "model.safetensors";

bool llama_family(const std::string& arch) {
  return arch == "LlamaForCausalLM" || arch == "MistralForCausalLM" || arch == "Qwen2ForCausalLM";
}

Result<nlohmann::json> read_json(const std::string& path) {
  ASSIGN_OR_RETURN(std::vector<std::byte> bytes, io::read_file(path));
  const std::string_view text(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  if (Status st = io::check_json_nesting(text, io::JsonLimits{}); !st.ok()) return st.With(path);
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return Status::Corruption(fmt::format("{}: not a JSON object", path));
  return j;
}

std::string architecture_of(const nlohmann::json& j) {
  auto it = j.find("architectures");
  if (it != j.end() && it->is_array() && !it->empty() && (*it)[0].is_string()) return (*it)[0].get<std::string>();
  return "";
}

// Query head j of Tessera's order is Hugging Face's head b*G + a for j =
// a*KV + b (model/decoder.h).
int hf_head(int j, int KV, int G) { return (j % KV) * G + j / KV; }

// One HF tensor: its name, shape, and how its elements map into the arena.
struct Piece {
  std::string name;
  std::vector<int64_t> shape;  // as stored (row-major)
  int id;
  int layer;  // -1 for the non-layer tensors
  // What kind of copy: plain (the tensor is a contiguous block at offset of
  // the parameter's layer slice), or one of the permuted ones.
  enum Kind { kPlain, kQRows, kORows } kind = kPlain;
  int64_t offset = 0;  // floats into the layer's slice (kPlain, kQRows)
};

std::vector<Piece> pieces_of(const DecoderConfig& c) {
  const int64_t C = c.channels, V = c.vocab, hs = c.hs(), NH = c.heads, KV = c.kv(), F = c.ffn();
  std::vector<Piece> p;
  p.push_back({"model.embed_tokens.weight", {V, C}, kWte, -1});
  for (int l = 0; l < c.layers; l++) {
    const std::string h = fmt::format("model.layers.{}.", l);
    p.push_back({h + "input_layernorm.weight", {C}, kLn1W, l});
    p.push_back({h + "self_attn.q_proj.weight", {NH * hs, C}, kQkvW, l, Piece::kQRows, 0});
    p.push_back({h + "self_attn.k_proj.weight", {KV * hs, C}, kQkvW, l, Piece::kPlain, NH * hs * C});
    p.push_back({h + "self_attn.v_proj.weight", {KV * hs, C}, kQkvW, l, Piece::kPlain, (NH + KV) * hs * C});
    if (c.qkv_bias) {
      p.push_back({h + "self_attn.q_proj.bias", {NH * hs}, kQkvB, l, Piece::kQRows, 0});
      p.push_back({h + "self_attn.k_proj.bias", {KV * hs}, kQkvB, l, Piece::kPlain, NH * hs});
      p.push_back({h + "self_attn.v_proj.bias", {KV * hs}, kQkvB, l, Piece::kPlain, (NH + KV) * hs});
    }
    p.push_back({h + "self_attn.o_proj.weight", {C, NH * hs}, kAttProjW, l, Piece::kORows, 0});
    if (c.bias) p.push_back({h + "self_attn.o_proj.bias", {C}, kAttProjB, l});
    p.push_back({h + "post_attention_layernorm.weight", {C}, kLn2W, l});
    p.push_back({h + "mlp.gate_proj.weight", {F, C}, kFcW, l, Piece::kPlain, 0});
    p.push_back({h + "mlp.up_proj.weight", {F, C}, kFcW, l, Piece::kPlain, F * C});
    p.push_back({h + "mlp.down_proj.weight", {C, F}, kFcProjW, l});
    if (c.bias) {
      p.push_back({h + "mlp.gate_proj.bias", {F}, kFcB, l, Piece::kPlain, 0});
      p.push_back({h + "mlp.up_proj.bias", {F}, kFcB, l, Piece::kPlain, F});
      p.push_back({h + "mlp.down_proj.bias", {C}, kFcProjB, l});
    }
  }
  p.push_back({"model.norm.weight", {C}, kLnfW, -1});
  if (!c.tied_head) p.push_back({"lm_head.weight", {V, C}, kLmHead, -1});
  return p;
}

int64_t numel(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

std::string shape_str(const std::vector<int64_t>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); i++) out += (i ? ", " : "") + std::to_string(v[i]);
  return out + "]";
}

// The start of piece p's layer slice in arena a (the whole model's layout).
float* layer_base(const Arena& a, const Piece& p, int layers) {
  Tensor t = a.tensor(p.id);
  const int64_t per_layer = p.layer < 0 ? 0 : t.numel() / layers;
  return t.f32() + (p.layer < 0 ? 0 : p.layer * per_layer);
}

// Copies between an HF tensor (src, in HF layout) and the arena (dst), in
// the direction `in` (HF -> arena) or out.
void copy_piece(const DecoderConfig& c, const Piece& p, float* slice, float* hf, bool in) {
  const int64_t C = c.channels, hs = c.hs(), KV = c.kv(), G = c.heads / KV;
  auto move = [&](float* arena, float* file, int64_t n) {
    if (in) std::memcpy(arena, file, sizeof(float) * n);
    else std::memcpy(file, arena, sizeof(float) * n);
  };
  switch (p.kind) {
    case Piece::kPlain: move(slice + p.offset, hf, numel(p.shape)); break;
    case Piece::kQRows: {
      // Rows (or bias entries) of query head j come from HF head hf_head(j).
      const int64_t row = p.shape.size() == 2 ? hs * C : hs;
      for (int j = 0; j < c.heads; j++) move(slice + j * row, hf + hf_head(j, KV, G) * row, row);
      break;
    }
    case Piece::kORows: {
      // o_proj (C, NH*hs): columns of head j from HF head hf_head(j).
      const int64_t Q = c.q_dim();
      for (int64_t r = 0; r < C; r++)
        for (int j = 0; j < c.heads; j++) move(slice + r * Q + j * hs, hf + r * Q + hf_head(j, KV, G) * hs, hs);
      break;
    }
  }
}

Status check_representable(const DecoderConfig& c) {
  if (c.norm == Norm::kRMSNorm && c.positions == Positions::kRope && c.mlp == Mlp::kSwiGLU) return Status::OK();
  return Status::InvalidArgument(fmt::format(
      "{} has no Hugging Face architecture (Llama's is RMSNorm, rotary positions and SwiGLU; GPT-2's is layernorm, "
      "learned positions and GELU)",
      c.str()));
}

}  // namespace

Result<HfFolder> resolve_hf_folder(const std::string& path) {
  HfFolder f;
  std::error_code ec;
  const bool dir = fs::is_directory(path, ec);
  f.dir = dir ? path : fs::path(path).parent_path().string();
  if (f.dir.empty()) f.dir = ".";
  f.config = (fs::path(f.dir) / "config.json").string();
  if (!fs::exists(f.config, ec)) return Status::NotFound(fmt::format("{}: no config.json in {}", path, f.dir));
  ASSIGN_OR_RETURN(nlohmann::json cfg, read_json(f.config));
  f.architecture = architecture_of(cfg);
  std::string index;
  if (dir) {
    if (fs::exists(fs::path(f.dir) / kSingle, ec)) f.files.push_back((fs::path(f.dir) / kSingle).string());
    else if (fs::exists(fs::path(f.dir) / kIndex, ec)) index = (fs::path(f.dir) / kIndex).string();
    else return Status::NotFound(fmt::format("{}: neither {} nor {} in the folder", path, kSingle, kIndex));
  } else if (path.ends_with(".index.json")) {
    index = path;
  } else if (!fs::exists(path, ec) && fs::exists(fs::path(f.dir) / kIndex, ec)) {
    index = (fs::path(f.dir) / kIndex).string();  // model.safetensors written as shards
  } else {
    f.files.push_back(path);
  }
  if (!index.empty()) {
    ASSIGN_OR_RETURN(nlohmann::json j, read_json(index));
    auto map = j.find("weight_map");
    if (map == j.end() || !map->is_object() || map->empty())
      return Status::Corruption(fmt::format("{}: no \"weight_map\" object", index));
    std::set<std::string> files;
    for (auto it = map->begin(); it != map->end(); ++it) {
      if (!it->is_string()) return Status::Corruption(fmt::format("{}: weight_map[\"{}\"] is not a file name", index, it.key()));
      const std::string name = it->get<std::string>();
      if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..")
        return Status::Corruption(fmt::format("{}: weight_map names '{}', not a file in the folder", index, name));
      files.insert(name);
    }
    for (const std::string& name : files) f.files.push_back((fs::path(f.dir) / name).string());
  }
  return f;
}

bool is_hf_decoder(const std::string& path) {
  std::error_code ec;
  const fs::path dir = fs::is_directory(path, ec) ? fs::path(path) : fs::path(path).parent_path();
  const fs::path cfg = (dir.empty() ? fs::path(".") : dir) / "config.json";
  if (!fs::exists(cfg, ec)) return false;
  Result<nlohmann::json> j = read_json(cfg.string());
  return j.ok() && llama_family(architecture_of(*j));
}

Result<DecoderConfig> read_hf_model_config(const std::string& path) {
  ASSIGN_OR_RETURN(nlohmann::json j, read_json(path));
  const std::string arch = architecture_of(j);
  if (arch == "GPT2LMHeadModel" || (arch.empty() && j.contains("n_embd"))) return read_hf_config(path);
  return read_hf_decoder_config(path);
}

Result<DecoderConfig> read_hf_decoder_config(const std::string& path) {
  ASSIGN_OR_RETURN(nlohmann::json j, read_json(path));
  const std::string arch = architecture_of(j);
  if (!llama_family(arch))
    return Status::InvalidArgument(fmt::format(
        "{}: architecture '{}' is not one Tessera builds (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, "
        "GPT2LMHeadModel)",
        path, arch.empty() ? "(none)" : arch));
  auto bad = [&](const std::string& m) { return Status::InvalidArgument(fmt::format("{}: {}", path, m)); };
  auto integer = [&](const char* key, int* dst, bool required) -> Status {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) {
      if (required) return bad(fmt::format("missing \"{}\"", key));
      return Status::OK();
    }
    if (!it->is_number_integer()) return bad(fmt::format("\"{}\" is not an integer", key));
    const int64_t v = it->get<int64_t>();
    if (v <= 0 || v > (int64_t{1} << 24)) return bad(fmt::format("\"{}\" = {} is out of range", key, v));
    *dst = static_cast<int>(v);
    return Status::OK();
  };
  DecoderConfig c;
  c.norm = Norm::kRMSNorm;
  c.positions = Positions::kRope;
  c.mlp = Mlp::kSwiGLU;
  c.bias = false;
  c.qkv_bias = arch == "Qwen2ForCausalLM";
  RETURN_IF_ERROR(integer("num_hidden_layers", &c.layers, true));
  RETURN_IF_ERROR(integer("num_attention_heads", &c.heads, true));
  RETURN_IF_ERROR(integer("hidden_size", &c.channels, true));
  RETURN_IF_ERROR(integer("vocab_size", &c.vocab, true));
  RETURN_IF_ERROR(integer("max_position_embeddings", &c.context, true));
  RETURN_IF_ERROR(integer("intermediate_size", &c.mlp_hidden, true));
  RETURN_IF_ERROR(integer("num_key_value_heads", &c.kv_heads, false));
  RETURN_IF_ERROR(integer("head_dim", &c.head_dim, false));
  if (j.contains("hidden_act") && j["hidden_act"] != "silu")
    return bad(fmt::format("hidden_act {} (only silu, SwiGLU's, is built)", j["hidden_act"].dump()));
  if (j.contains("quantization_config")) return bad("quantized weights (quantization_config) are not read");
  if (auto it = j.find("rms_norm_eps"); it != j.end()) {
    if (!it->is_number() || !(it->get<double>() > 0)) return bad("\"rms_norm_eps\" is not a positive number");
    c.norm_eps = static_cast<float>(it->get<double>());
  }
  if (auto it = j.find("rope_theta"); it != j.end()) {
    if (!it->is_number()) return bad("\"rope_theta\" is not a number");
    c.rope_theta = it->get<double>();
  }
  if (auto it = j.find("tie_word_embeddings"); it != j.end() && it->is_boolean()) c.tied_head = it->get<bool>();
  else c.tied_head = false;  // LlamaConfig's default
  const bool attention_bias = j.value("attention_bias", false), mlp_bias = j.value("mlp_bias", false);
  if (attention_bias != mlp_bias)
    return bad(fmt::format("attention_bias {} with mlp_bias {}: Tessera's biases are qkv only (Qwen2) or qkv, output "
                           "and MLP together",
                           attention_bias, mlp_bias));
  if (attention_bias) c.qkv_bias = c.bias = true;
  if (auto it = j.find("rope_scaling"); it != j.end() && !it->is_null()) {
    if (!it->is_object()) return bad("\"rope_scaling\" is not an object");
    const std::string type = it->value("rope_type", it->value("type", std::string("default")));
    RopeScaling& r = c.rope_scaling;
    if (type == "linear") {
      r.kind = RopeScaling::Kind::kLinear;
    } else if (type == "llama3") {
      r.kind = RopeScaling::Kind::kLlama3;
      r.low_freq_factor = it->value("low_freq_factor", 1.0);
      r.high_freq_factor = it->value("high_freq_factor", 4.0);
      r.original_context = it->value("original_max_position_embeddings", 8192);
    } else if (type != "default") {
      return bad(fmt::format("rope_scaling type '{}' (linear and llama3 are built)", type));
    }
    if (r.kind != RopeScaling::Kind::kNone) {
      auto f = it->find("factor");
      if (f == it->end() || !f->is_number()) return bad("rope_scaling has no numeric \"factor\"");
      r.factor = f->get<double>();
    }
  }
  // A sliding window at least as long as the context is full attention.
  int window = 0;
  const bool sliding = arch == "MistralForCausalLM" || j.value("use_sliding_window", false);
  if (sliding) RETURN_IF_ERROR(integer("sliding_window", &window, false));
  if (window > 0 && window < c.context) c.context = window;
  if (Status st = c.validate(); !st.ok()) return st.With(path);
  return c;
}

Status write_hf_decoder_config(const DecoderConfig& c, const std::string& path) {
  RETURN_IF_ERROR(check_representable(c));
  nlohmann::ordered_json j;
  const bool qwen2 = c.qkv_bias && !c.bias;
  j["architectures"] = {qwen2 ? "Qwen2ForCausalLM" : "LlamaForCausalLM"};
  j["model_type"] = qwen2 ? "qwen2" : "llama";
  j["hidden_size"] = c.channels;
  j["intermediate_size"] = c.ffn();
  j["num_hidden_layers"] = c.layers;
  j["num_attention_heads"] = c.heads;
  j["num_key_value_heads"] = c.kv();
  j["head_dim"] = c.hs();
  j["vocab_size"] = c.vocab;
  j["max_position_embeddings"] = c.context;
  j["rms_norm_eps"] = c.norm_eps;
  j["rope_theta"] = c.rope_theta;
  const RopeScaling& r = c.rope_scaling;
  if (r.kind == RopeScaling::Kind::kLinear) {
    j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", r.factor}};
  } else if (r.kind == RopeScaling::Kind::kLlama3) {
    j["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", r.factor},
                         {"low_freq_factor", r.low_freq_factor},
                         {"high_freq_factor", r.high_freq_factor},
                         {"original_max_position_embeddings", r.original_context}};
  } else {
    j["rope_scaling"] = nullptr;
  }
  j["hidden_act"] = "silu";
  j["tie_word_embeddings"] = c.tied_head;
  if (!qwen2) {
    j["attention_bias"] = c.bias;
    j["mlp_bias"] = c.bias;
  }
  j["torch_dtype"] = "float32";
  std::string text = j.dump(2) + "\n";
  std::span<const std::byte> piece(reinterpret_cast<const std::byte*>(text.data()), text.size());
  return io::write_file_atomic(path, std::span<const std::span<const std::byte>>(&piece, 1));
}

Result<std::unique_ptr<GPT>> load_hf_decoder(const std::string& path, Backend backend, ModelUse use) {
  ASSIGN_OR_RETURN(HfFolder folder, resolve_hf_folder(path));
  ASSIGN_OR_RETURN(DecoderConfig c, read_hf_decoder_config(folder.config));
  std::vector<io::SafetensorsFile> files;
  std::map<std::string, std::pair<size_t, const io::TensorInfo*>> where;  // name -> file, info
  for (const std::string& name : folder.files) {
    ASSIGN_OR_RETURN(io::SafetensorsFile f, io::SafetensorsFile::open(name));
    files.push_back(std::move(f));
  }
  for (size_t k = 0; k < files.size(); k++) {
    for (const io::TensorInfo& t : files[k].tensors()) {
      if (!where.emplace(t.name, std::make_pair(k, &t)).second)
        return Status::InvalidArgument(fmt::format("{}: tensor '{}' is in two files", folder.dir, t.name));
    }
  }
  // Every name and shape before anything is allocated.
  const std::vector<Piece> pieces = pieces_of(c);
  std::set<std::string> wanted;
  for (const Piece& p : pieces) {
    wanted.insert(p.name);
    auto it = where.find(p.name);
    if (it == where.end())
      return Status::InvalidArgument(
          fmt::format("{}: tensor '{}' is missing (the model is {})", folder.dir, p.name, c.str()));
    const io::TensorInfo& t = *it->second.second;
    if (t.shape != p.shape)
      return Status::InvalidArgument(fmt::format("{}: tensor '{}' has shape {} but {} needs {}", folder.dir, p.name,
                                                 shape_str(t.shape), c.str(), shape_str(p.shape)));
    if (t.dtype != io::StDType::kF32 && t.dtype != io::StDType::kBF16 && t.dtype != io::StDType::kF16)
      return Status::InvalidArgument(fmt::format("{}: tensor '{}' is {} (F32, BF16 or F16 are read)", folder.dir,
                                                 p.name, io::st_dtype_name(t.dtype)));
  }
  for (const auto& [name, at] : where) {
    if (wanted.count(name)) continue;
    // Buffers some exports carry, and a tied head written out anyway.
    if (name.ends_with(".rotary_emb.inv_freq") || (c.tied_head && name == "lm_head.weight")) continue;
    return Status::InvalidArgument(fmt::format(
        "{}: unexpected tensor '{}' (not part of {}: a different architecture or config?)", folder.dir, name, c.str()));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<GPT> model, GPT::create(c, backend, ModelShard{}, nullptr, use));
  // Through a host copy of the parameters (the model may be on a device).
  Arena host_arena;
  const bool on_host = model->device() == Device::kCPU;
  if (!on_host) {
    ASSIGN_OR_RETURN(host_arena, model->params().try_clone_layout(Device::kCPU));
  }
  Arena& a = on_host ? model->params() : host_arena;
  RETURN_IF_ERROR(a.try_zero());
  std::vector<float> buf;
  for (const Piece& p : pieces) {
    const auto [k, info] = where[p.name];
    buf.resize(static_cast<size_t>(numel(p.shape)));
    RETURN_IF_ERROR(files[k].read_f32(p.name, std::span<float>(buf.data(), buf.size())));
    copy_piece(c, p, layer_base(a, p, c.layers), buf.data(), /*in=*/true);
  }
  if (!on_host) RETURN_IF_ERROR(model->params().try_copy_from(host_arena).With("uploading the weights"));
  return model;
}

Result<std::vector<HfTensor>> hf_decoder_tensors(const GPT& model, const Arena& arena) {
  Arena host;
  if (arena.device() != Device::kCPU) {
    ASSIGN_OR_RETURN(host, arena.try_clone_layout(Device::kCPU));
    RETURN_IF_ERROR(host.try_copy_from(arena));
  }
  const Arena& a = arena.device() == Device::kCPU ? arena : host;
  const DecoderConfig& c = model.config();
  RETURN_IF_ERROR(check_representable(c));
  std::vector<HfTensor> out;
  for (const Piece& p : pieces_of(c)) {
    HfTensor t{p.name, p.shape, std::vector<float>(static_cast<size_t>(numel(p.shape)))};
    copy_piece(c, p, layer_base(a, p, c.layers), t.data.data(), /*in=*/false);
    out.push_back(std::move(t));
  }
  return out;
}

Status save_hf_decoder(const GPT& model, const std::string& weights_path, const HfSaveOptions& o) {
  if (!model.whole()) return Status::InvalidArgument("save_hf_decoder writes a whole model (gather the shards first)");
  if (o.dtype != io::StDType::kF32 && o.dtype != io::StDType::kBF16)
    return Status::InvalidArgument("Hugging Face folders are written in F32 or BF16");
  ASSIGN_OR_RETURN(std::vector<HfTensor> tensors, hf_decoder_tensors(model, model.params()));
  const size_t elem = o.dtype == io::StDType::kBF16 ? 2 : 4;
  std::vector<std::vector<bf16>> bf(tensors.size());
  if (o.dtype == io::StDType::kBF16) {
    for (size_t i = 0; i < tensors.size(); i++) {
      bf[i].resize(tensors[i].data.size());
      for (size_t k = 0; k < bf[i].size(); k++) bf[i][k] = f32_to_bf16(tensors[i].data[k]);
    }
  }
  // Shards in tensor order, each at most max_shard_bytes (a larger tensor alone).
  std::vector<std::vector<size_t>> shards(1);
  int64_t in_shard = 0, total = 0;
  for (size_t i = 0; i < tensors.size(); i++) {
    const int64_t b = static_cast<int64_t>(tensors[i].data.size() * elem);
    if (in_shard > 0 && in_shard + b > o.max_shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(i);
    in_shard += b;
    total += b;
  }
  const fs::path dir = fs::path(weights_path).parent_path();
  nlohmann::ordered_json map = nlohmann::ordered_json::object();
  for (size_t s = 0; s < shards.size(); s++) {
    const std::string name = shards.size() == 1 ? fs::path(weights_path).filename().string()
                                                : fmt::format("model-{:05}-of-{:05}.safetensors", s + 1, shards.size());
    io::SafetensorsWriter w;
    for (size_t i : shards[s]) {
      const void* data = o.dtype == io::StDType::kBF16 ? static_cast<const void*>(bf[i].data())
                                                       : static_cast<const void*>(tensors[i].data.data());
      w.add(tensors[i].name, o.dtype, tensors[i].shape, data);
      map[tensors[i].name] = name;
    }
    w.set_metadata("format", "pt");
    w.set_metadata("producer", "tessera " TESSERA_VERSION);
    RETURN_IF_ERROR(w.write((dir / name).string()));
  }
  if (shards.size() > 1) {
    nlohmann::ordered_json index = {{"metadata", {{"total_size", total}}}, {"weight_map", map}};
    std::string text = index.dump(2) + "\n";
    std::span<const std::byte> piece(reinterpret_cast<const std::byte*>(text.data()), text.size());
    RETURN_IF_ERROR(io::write_file_atomic((dir / kIndex).string(), std::span<const std::span<const std::byte>>(&piece, 1)));
  }
  return write_hf_decoder_config(model.config(), (dir / "config.json").string());
}

}  // namespace tessera
