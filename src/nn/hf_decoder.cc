#include "nn/hf_decoder.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <set>
#include <string>

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

// Copies piece p out of the arena's layer slice (or an INT8 matrix, or its
// scales) into hf, in HF layout: place_rows() below, the other way. T is
// float for the weights, int8_t for an INT8 matrix (its scales are a
// scale_piece()'s floats).
template <typename T>
void take_piece(const DecoderConfig& c, const Piece& p, const T* slice, T* hf) {
  const int64_t C = c.channels, hs = c.hs(), KV = c.kv(), G = c.heads / KV;
  switch (p.kind) {
    case Piece::kPlain: std::memcpy(hf, slice + p.offset, sizeof(T) * numel(p.shape)); break;
    case Piece::kQRows: {
      // Rows (or bias entries) of query head j go to HF head hf_head(j).
      const int64_t row = p.shape.size() == 2 ? hs * C : hs;
      for (int j = 0; j < c.heads; j++) std::memcpy(hf + hf_head(j, KV, G) * row, slice + j * row, sizeof(T) * row);
      break;
    }
    case Piece::kORows: {
      // o_proj (C, NH*hs): columns of head j go to HF head hf_head(j).
      const int64_t Q = c.q_dim();
      for (int64_t r = 0; r < C; r++)
        for (int j = 0; j < c.heads; j++)
          std::memcpy(hf + r * Q + hf_head(j, KV, G) * hs, slice + r * Q + j * hs, sizeof(T) * hs);
      break;
    }
  }
}

// HF rows [r0, r0 + n) of piece p (src: n rows of the HF tensor, or n
// elements of a vector) into the arena's layer slice (or an INT8 matrix, or
// its scales): take_piece()'s inverse, a block of rows at a time.
template <typename T>
void place_rows(const DecoderConfig& c, const Piece& p, int64_t r0, int64_t n, const T* src, T* slice) {
  const int64_t K = p.shape.size() == 2 ? p.shape[1] : 1, hs = c.hs(), KV = c.kv(), G = c.heads / KV;
  switch (p.kind) {
    case Piece::kPlain: std::memcpy(slice + p.offset + r0 * K, src, sizeof(T) * n * K); break;
    case Piece::kQRows:
      // HF query head h = b*G + a is Tessera's head j = a*KV + b.
      for (int64_t r = r0; r < r0 + n; r++) {
        const int64_t h = r / hs, j = (h % G) * KV + h / G;
        std::memcpy(slice + (j * hs + r % hs) * K, src + (r - r0) * K, sizeof(T) * K);
      }
      break;
    case Piece::kORows: {
      const int64_t Q = c.q_dim();
      for (int64_t r = r0; r < r0 + n; r++)
        for (int j = 0; j < c.heads; j++)
          std::memcpy(slice + r * Q + j * hs, src + (r - r0) * Q + hf_head(j, KV, G) * hs, sizeof(T) * hs);
      break;
    }
  }
}

// The INT8 tier (docs/formats/int8.md): the matmul weights are INT8
// matrices, one per (layer, kind) in GPT::load_int8's order, each built from
// the HF tensors of that parameter and layer; the head is matrix 4L.
constexpr int kMatmulIds[4] = {kQkvW, kAttProjW, kFcW, kFcProjW};
constexpr const char* kInt8Key = "tessera_quantization";
constexpr const char* kInt8Value = "int8-symmetric-per-output-channel";
constexpr const char* kHeadInt8 = "lm_head.weight";  // NAME_int8 (Vp, C) and NAME_scale (Vp), tied or not

bool is_matmul(const Piece& p) {
  return p.layer >= 0 && p.shape.size() == 2 &&
         std::find(std::begin(kMatmulIds), std::end(kMatmulIds), p.id) != std::end(kMatmulIds);
}
// The scales of a matmul piece's rows, as a piece of the matrix's OC scales:
// query rows keep their head order, the output projection's rows (C) are not
// permuted (its columns are), the others are plain row ranges.
Piece scale_piece(const Piece& p) {
  Piece s = p;
  s.shape = {p.shape[0]};
  if (p.kind == Piece::kORows) s.kind = Piece::kPlain, s.offset = 0;
  else if (p.kind == Piece::kPlain) s.offset = p.offset / p.shape[1];
  return s;
}

// An INT8 file's codes are -127..127 and its scales positive and finite.
Status check_int8_codes(const std::string& where, const std::string& name, std::span<const int8_t> codes,
                        std::span<const float> scales) {
  for (size_t o = 0; o < scales.size(); o++) {
    if (!(scales[o] > 0.0f) || !std::isfinite(scales[o]))
      return Status::InvalidArgument(
          fmt::format("{}: tensor '{}_scale' holds a scale that is not a positive number at {}", where, name, o));
  }
  if (std::find(codes.begin(), codes.end(), int8_t{-128}) != codes.end())
    return Status::InvalidArgument(fmt::format("{}: tensor '{}_int8' holds -128 (codes are -127..127)", where, name));
  return Status::OK();
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
  // The float's shortest decimal (1e-06, as config.json files spell it, not
  // 9.999999974752427e-07): the same float when read back.
  j["rms_norm_eps"] = std::stod(fmt::format("{}", c.norm_eps));
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
  bool file_int8 = false;
  for (const std::string& name : folder.files) {
    ASSIGN_OR_RETURN(io::SafetensorsFile f, io::SafetensorsFile::open(name));
    if (auto q = f.metadata().find(kInt8Key); q != f.metadata().end()) {
      if (q->second != kInt8Value)
        return Status::InvalidArgument(
            fmt::format("{}: unknown quantization '{}' (this build reads '{}')", name, q->second, kInt8Value));
      file_int8 = true;
    }
    files.push_back(std::move(f));
  }
  for (size_t k = 0; k < files.size(); k++) {
    for (const io::TensorInfo& t : files[k].tensors()) {
      if (!where.emplace(t.name, std::make_pair(k, &t)).second)
        return Status::InvalidArgument(fmt::format("{}: tensor '{}' is in two files", folder.dir, t.name));
    }
  }
  // An INT8 file holds no fp32 matmul weights: only the INT8 tier reads it.
  if (file_int8 && use == ModelUse::kTraining)
    return Status::InvalidArgument(fmt::format("{}: an INT8 file (tessera quantize) is for inference on the CPU, "
                                               "not training: start from the fp32 or bf16 folder",
                                               folder.dir));
  if (file_int8) use = ModelUse::kInt8Inference;
  const bool int8 = use == ModelUse::kInt8Inference;
  // Every name, shape and dtype before anything is allocated.
  const std::vector<Piece> pieces = pieces_of(c);
  std::set<std::string> wanted;
  auto need = [&](const std::string& name, const std::vector<int64_t>& shape, bool i8) -> Status {
    wanted.insert(name);
    auto it = where.find(name);
    if (it == where.end())
      return Status::InvalidArgument(
          fmt::format("{}: tensor '{}' is missing (the model is {})", folder.dir, name, c.str()));
    const io::TensorInfo& t = *it->second.second;
    if (t.shape != shape)
      return Status::InvalidArgument(fmt::format("{}: tensor '{}' has shape {} but {} needs {}", folder.dir, name,
                                                 shape_str(t.shape), c.str(), shape_str(shape)));
    if (i8 && t.dtype != io::StDType::kI8)
      return Status::InvalidArgument(fmt::format("{}: tensor '{}' is {} (I8 is read)", folder.dir, name,
                                                 io::st_dtype_name(t.dtype)));
    if (!i8 && t.dtype != io::StDType::kF32 && t.dtype != io::StDType::kBF16 && t.dtype != io::StDType::kF16)
      return Status::InvalidArgument(fmt::format("{}: tensor '{}' is {} (F32, BF16 or F16 are read)", folder.dir,
                                                 name, io::st_dtype_name(t.dtype)));
    return Status::OK();
  };
  const int64_t Vp = c.padded_vocab(), C = c.channels;
  for (const Piece& p : pieces) {
    const bool quantized = file_int8 && (is_matmul(p) || p.id == kLmHead);
    if (!quantized) {
      RETURN_IF_ERROR(need(p.name, p.shape, false));
    } else if (p.id != kLmHead) {
      RETURN_IF_ERROR(need(p.name + "_int8", p.shape, true));
      RETURN_IF_ERROR(need(p.name + "_scale", {p.shape[0]}, false));
    }
  }
  if (file_int8) {
    RETURN_IF_ERROR(need(std::string(kHeadInt8) + "_int8", {Vp, C}, true));
    RETURN_IF_ERROR(need(std::string(kHeadInt8) + "_scale", {Vp}, false));
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
  // A few rows at a time: each piece is read in blocks of about 4M elements
  // (converted to fp32, the file's pages given back as they are read:
  // io/safetensors.h) and placed, or quantized and placed, before the next
  // block. So loading needs one block of memory beyond the model.
  constexpr int64_t kBlockElems = int64_t{4} << 20;
  std::vector<float> buf;
  std::vector<int8_t> codes;
  std::vector<float> scales;
  // Calls f(r0, n) for blocks of rows of piece p.
  auto blocks = [&](const Piece& p, const std::function<Status(int64_t r0, int64_t n)>& f) -> Status {
    const int64_t rows = p.shape[0], K = p.shape.size() == 2 ? p.shape[1] : 1;
    const int64_t step = std::max<int64_t>(1, kBlockElems / K);
    for (int64_t r0 = 0; r0 < rows; r0 += step) RETURN_IF_ERROR(f(r0, std::min(step, rows - r0)));
    return Status::OK();
  };
  auto read_rows = [&](const std::string& name, int64_t first, int64_t n) -> Status {
    const auto [k, info] = where[name];
    buf.resize(static_cast<size_t>(n));
    return files[k].read_f32(name, static_cast<uint64_t>(first), std::span<float>(buf.data(), buf.size()));
  };
  for (const Piece& p : pieces) {
    if (int8 && (is_matmul(p) || p.id == kLmHead)) continue;  // into the INT8 matrices below
    const int64_t K = p.shape.size() == 2 ? p.shape[1] : 1;
    float* slice = layer_base(a, p, c.layers);
    RETURN_IF_ERROR(blocks(p, [&](int64_t r0, int64_t n) -> Status {
      RETURN_IF_ERROR(read_rows(p.name, r0 * K, n * K));
      place_rows<float>(c, p, r0, n, buf.data(), slice);
      return Status::OK();
    }));
  }
  if (!on_host) RETURN_IF_ERROR(model->params().try_copy_from(host_arena).With("uploading the weights"));
  if (!int8) return model;

  // Matrix k of the INT8 tier from its HF pieces, block by block of rows:
  // quantized here (per output row, so a block of a piece in HF's row order
  // gives the codes quantizing the whole fp32 matrix gives), or read from
  // an INT8 file's codes and checked.
  auto piece_codes = [&](const Piece& p, int8_t* w, float* scale) -> Status {
    const int64_t K = p.shape[1];
    const Piece sp = scale_piece(p);
    return blocks(p, [&](int64_t r0, int64_t n) -> Status {
      codes.resize(static_cast<size_t>(n * K));
      scales.resize(static_cast<size_t>(n));
      if (!file_int8) {
        RETURN_IF_ERROR(read_rows(p.name, r0 * K, n * K));
        model->quantize_matrix_int8(buf.data(), static_cast<int>(n), static_cast<int>(K), codes.data(), scales.data());
      } else {
        const auto [k, wt] = where[p.name + "_int8"];
        RETURN_IF_ERROR(files[k].read_raw(wt->name, std::as_writable_bytes(std::span(codes)),
                                          static_cast<uint64_t>(r0 * K)));
        const auto [ks, st] = where[p.name + "_scale"];
        RETURN_IF_ERROR(files[ks].read_f32(st->name, static_cast<uint64_t>(r0), std::span(scales)));
        RETURN_IF_ERROR(check_int8_codes(folder.dir, p.name, codes, scales));
      }
      place_rows<int8_t>(c, p, r0, n, codes.data(), w);
      place_rows<float>(c, sp, r0, n, scales.data(), scale);
      return Status::OK();
    });
  };
  const int L = c.layers;
  RETURN_IF_ERROR(model->load_int8([&](int k, int OC, int K, int8_t* w, float* scale) -> Status {
    if (k < 4 * L) {
      for (const Piece& p : pieces) {
        if (p.layer != k / 4 || p.id != kMatmulIds[k % 4] || !is_matmul(p)) continue;
        RETURN_IF_ERROR(piece_codes(p, w, scale));
      }
      return Status::OK();
    }
    // The head, (Vp, C) with zero padding rows: tied to wte (in the arena by
    // now), or lm_head.weight; an INT8 file holds its codes.
    if (file_int8) {
      const auto [kw, wt] = where[std::string(kHeadInt8) + "_int8"];
      const std::span<int8_t> w_span(w, static_cast<size_t>(OC) * K);
      RETURN_IF_ERROR(files[kw].read_raw(wt->name, std::as_writable_bytes(w_span)));
      const auto [ks, st] = where[std::string(kHeadInt8) + "_scale"];
      const std::span<float> s_span(scale, static_cast<size_t>(OC));
      RETURN_IF_ERROR(files[ks].read_f32(st->name, s_span));
      return check_int8_codes(folder.dir, kHeadInt8, w_span, s_span);
    }
    if (c.tied_head) {
      model->quantize_matrix_int8(model->param_ptrs()[kWte], OC, K, w, scale);
      return Status::OK();
    }
    const Piece head{"lm_head.weight", {OC, K}, kLmHead, -1};  // V rows in the file, then zero rows
    return blocks(head, [&](int64_t r0, int64_t n) -> Status {
      const int64_t in_file = std::clamp<int64_t>(c.vocab - r0, 0, n);
      if (in_file > 0) RETURN_IF_ERROR(read_rows(head.name, r0 * K, in_file * K));
      buf.resize(static_cast<size_t>(n * K));
      std::fill(buf.begin() + in_file * K, buf.end(), 0.0f);
      model->quantize_matrix_int8(buf.data(), static_cast<int>(n), K, w + r0 * K, scale + r0);
      return Status::OK();
    });
  }));
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
  if (model.fp32_matmul_weights_released() && &arena == &model.params())
    return Status::InvalidArgument("the model's fp32 matmul weights were released or never loaded (the INT8 tier)");
  std::vector<HfTensor> out;
  for (const Piece& p : pieces_of(c)) {
    HfTensor t{p.name, p.shape, std::vector<float>(static_cast<size_t>(numel(p.shape)))};
    take_piece<float>(c, p, layer_base(a, p, c.layers), t.data.data());
    out.push_back(std::move(t));
  }
  return out;
}

namespace {

// One tensor of a folder being written: its bytes are made when the writer
// reaches it (one tensor in memory at a time).
struct OutTensor {
  std::string name;
  io::StDType dtype;
  std::vector<int64_t> shape;
  io::SafetensorsWriter::Fill fill;
  const void* data = nullptr;  // instead of fill: bytes already in the file's layout
};

// Writes tensors into the folder of weights_path: one file, or HF's shards
// (each at most max_shard_bytes, a larger tensor alone) with
// model.safetensors.index.json; then config.json.
Status write_hf_folder(const DecoderConfig& c, const std::string& weights_path, std::vector<OutTensor> tensors,
                       int64_t max_shard_bytes, const std::map<std::string, std::string>& metadata) {
  std::vector<std::vector<size_t>> shards(1);
  int64_t in_shard = 0, total = 0;
  for (size_t i = 0; i < tensors.size(); i++) {
    const int64_t b = numel(tensors[i].shape) * static_cast<int64_t>(io::st_dtype_size(tensors[i].dtype));
    if (in_shard > 0 && in_shard + b > max_shard_bytes) {
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
      if (tensors[i].data != nullptr) w.add(tensors[i].name, tensors[i].dtype, tensors[i].shape, tensors[i].data);
      else w.add(tensors[i].name, tensors[i].dtype, tensors[i].shape, std::move(tensors[i].fill));
      map[tensors[i].name] = name;
    }
    w.set_metadata("format", "pt");
    w.set_metadata("producer", "tessera " TESSERA_VERSION);
    for (const auto& [k, v] : metadata) w.set_metadata(k, v);
    RETURN_IF_ERROR(w.write((dir / name).string()));
  }
  if (shards.size() > 1) {
    nlohmann::ordered_json index = {{"metadata", {{"total_size", total}}}, {"weight_map", map}};
    std::string text = index.dump(2) + "\n";
    std::span<const std::byte> piece(reinterpret_cast<const std::byte*>(text.data()), text.size());
    RETURN_IF_ERROR(io::write_file_atomic((dir / kIndex).string(), std::span<const std::span<const std::byte>>(&piece, 1)));
  }
  return write_hf_decoder_config(c, (dir / "config.json").string());
}

// A piece of the host arena a as an HF tensor in dtype (F32 or BF16).
OutTensor arena_piece(const DecoderConfig& c, const Arena& a, const Piece& p, io::StDType dtype) {
  // An fp32 piece stored as it is in the arena is written from there.
  if (dtype == io::StDType::kF32 && p.kind == Piece::kPlain && numel(p.shape) > 0)
    return {p.name, dtype, p.shape, nullptr, layer_base(a, p, c.layers) + p.offset};
  return {p.name, dtype, p.shape, [&c, &a, p, dtype](std::span<std::byte> out) -> Status {
            const int64_t n = numel(p.shape);
            float* slice = layer_base(a, p, c.layers);
            if (dtype == io::StDType::kF32) {
              take_piece<float>(c, p, slice, reinterpret_cast<float*>(out.data()));
              return Status::OK();
            }
            std::vector<float> f(static_cast<size_t>(n));
            take_piece<float>(c, p, slice, f.data());
            for (int64_t k = 0; k < n; k++) {
              const bf16 h = f32_to_bf16(f[k]);
              std::memcpy(out.data() + 2 * k, &h, 2);
            }
            return Status::OK();
          }};
}

// The host copy of a model's parameters (the arena itself on the CPU).
Result<const Arena*> host_params(const GPT& model, Arena* staging) {
  if (model.params().device() == Device::kCPU) return &model.params();
  ASSIGN_OR_RETURN(*staging, model.params().try_clone_layout(Device::kCPU));
  RETURN_IF_ERROR(staging->try_copy_from(model.params()));
  return staging;
}

}  // namespace

Status save_hf_decoder(const GPT& model, const std::string& weights_path, const HfSaveOptions& o) {
  if (!model.whole()) return Status::InvalidArgument("save_hf_decoder writes a whole model (gather the shards first)");
  if (o.dtype != io::StDType::kF32 && o.dtype != io::StDType::kBF16)
    return Status::InvalidArgument("Hugging Face folders are written in F32 or BF16");
  if (model.fp32_matmul_weights_released())
    return Status::InvalidArgument(
        "the model's fp32 matmul weights were released or never loaded (the INT8 tier): write its INT8 form "
        "(tessera quantize) or load the fp32 folder");
  const DecoderConfig& c = model.config();
  RETURN_IF_ERROR(check_representable(c));
  Arena staging;
  ASSIGN_OR_RETURN(const Arena* a, host_params(model, &staging));
  std::vector<OutTensor> tensors;
  for (const Piece& p : pieces_of(c)) tensors.push_back(arena_piece(c, *a, p, o.dtype));
  return write_hf_folder(c, weights_path, std::move(tensors), o.max_shard_bytes, {});
}

Status save_hf_decoder_int8(const GPT& model, const std::string& weights_path) {
  if (!model.int8()) return Status::InvalidArgument("save_int8: the model is not quantized (GPT::quantize_int8)");
  const DecoderConfig& c = model.config();
  RETURN_IF_ERROR(check_representable(c));
  struct Matrix {
    const int8_t* w;
    const float* scale;
    int OC, C;
  };
  std::vector<Matrix> m;
  model.for_each_int8([&](int, int OC, int C, const int8_t* w, const float* scale) { m.push_back({w, scale, OC, C}); });
  const Arena& a = model.params();  // INT8 models are on the CPU
  std::vector<OutTensor> tensors;
  for (const Piece& p : pieces_of(c)) {
    if (p.id == kLmHead) continue;  // the INT8 head below
    if (!is_matmul(p)) {
      tensors.push_back(arena_piece(c, a, p, io::StDType::kF32));
      continue;
    }
    const Matrix& x = m[4 * p.layer + static_cast<int>(std::find(std::begin(kMatmulIds), std::end(kMatmulIds), p.id) -
                                                        std::begin(kMatmulIds))];
    const Piece sp = scale_piece(p);
    tensors.push_back({p.name + "_int8", io::StDType::kI8, p.shape, [&c, p, x](std::span<std::byte> out) {
                         take_piece<int8_t>(c, p, x.w, reinterpret_cast<int8_t*>(out.data()));
                         return Status::OK();
                       }});
    tensors.push_back({p.name + "_scale", io::StDType::kF32, sp.shape, [&c, sp, x](std::span<std::byte> out) {
                         take_piece<float>(c, sp, x.scale, reinterpret_cast<float*>(out.data()));
                         return Status::OK();
                       }});
  }
  const Matrix& head = m.back();
  tensors.push_back({std::string(kHeadInt8) + "_int8", io::StDType::kI8, {head.OC, head.C},
                     [head](std::span<std::byte> out) {
                       std::memcpy(out.data(), head.w, out.size());
                       return Status::OK();
                     }});
  tensors.push_back({std::string(kHeadInt8) + "_scale", io::StDType::kF32, {head.OC}, [head](std::span<std::byte> out) {
                       std::memcpy(out.data(), head.scale, out.size());
                       return Status::OK();
                     }});
  // One file: the loaders take an INT8 file whole (no index).
  return write_hf_folder(c, weights_path, std::move(tensors), INT64_MAX, {{kInt8Key, kInt8Value}});
}

Status save_random_hf_decoder(const DecoderConfig& c, const std::string& weights_path, const HfSaveOptions& o,
                              uint64_t seed) {
  if (o.dtype != io::StDType::kF32 && o.dtype != io::StDType::kBF16)
    return Status::InvalidArgument("Hugging Face folders are written in F32 or BF16");
  RETURN_IF_ERROR(c.validate());
  RETURN_IF_ERROR(check_representable(c));
  std::vector<OutTensor> tensors;
  for (const Piece& p : pieces_of(c)) {
    // Norm weights are ones, biases zero, matrices uniform with GPT-2's
    // standard deviation 0.02 (a = 0.02 sqrt 3), drawn from a splitmix64
    // stream seeded by the seed and the tensor's name.
    const bool norm = p.id == kLn1W || p.id == kLn2W || p.id == kLnfW;
    const bool matrix = p.shape.size() == 2;
    uint64_t state = seed ^ 0x9e3779b97f4a7c15ull;
    for (char ch : p.name) state = (state ^ static_cast<uint8_t>(ch)) * 0x100000001b3ull;
    tensors.push_back({p.name, o.dtype, p.shape, [=](std::span<std::byte> out) {
                         const size_t elem = io::st_dtype_size(o.dtype), n = out.size() / elem;
                         uint64_t x = state;
                         for (size_t k = 0; k < n; k++) {
                           float v = norm ? 1.0f : 0.0f;
                           if (matrix) {
                             uint64_t z = (x += 0x9e3779b97f4a7c15ull);
                             z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
                             z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
                             z ^= z >> 31;
                             const float u = static_cast<float>(z >> 40) * (1.0f / 16777216.0f);  // [0, 1)
                             v = (2.0f * u - 1.0f) * 0.034641016f;
                           }
                           if (elem == 4) {
                             std::memcpy(out.data() + 4 * k, &v, 4);
                           } else {
                             const bf16 h = f32_to_bf16(v);
                             std::memcpy(out.data() + 2 * k, &h, 2);
                           }
                         }
                         return Status::OK();
                       }});
  }
  return write_hf_folder(c, weights_path, std::move(tensors), o.max_shard_bytes, {});
}

}  // namespace tessera
