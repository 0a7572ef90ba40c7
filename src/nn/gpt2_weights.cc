#include <cstring>
#include <cmath>
#include "nn/gpt2_weights.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "io/json_guard.h"
#include "nn/gguf_model.h"
#include "nn/hf_decoder.h"

namespace tessera {

namespace {

// One HF tensor and where it lives in the arena: layer `layer` (or -1) of
// parameter `id`, a (rows, cols) matrix or a vector (cols == 0). Conv1D
// weights are stored transposed in HF files.
struct Slot {
  std::string name;
  int id;
  int layer;
  int64_t rows, cols;
  bool transpose;
};

std::vector<Slot> slots(const GPTConfig& c) {
  const int64_t C = c.channels;
  std::vector<Slot> s;
  s.push_back({"wte.weight", kWte, -1, c.vocab, C, false});
  s.push_back({"wpe.weight", kWpe, -1, c.context, C, false});
  for (int l = 0; l < c.layers; l++) {
    std::string h = fmt::format("h.{}.", l);
    s.push_back({h + "ln_1.weight", kLn1W, l, C, 0, false});
    s.push_back({h + "ln_1.bias", kLn1B, l, C, 0, false});
    s.push_back({h + "attn.c_attn.weight", kQkvW, l, 3 * C, C, true});
    s.push_back({h + "attn.c_attn.bias", kQkvB, l, 3 * C, 0, false});
    s.push_back({h + "attn.c_proj.weight", kAttProjW, l, C, C, true});
    s.push_back({h + "attn.c_proj.bias", kAttProjB, l, C, 0, false});
    s.push_back({h + "ln_2.weight", kLn2W, l, C, 0, false});
    s.push_back({h + "ln_2.bias", kLn2B, l, C, 0, false});
    s.push_back({h + "mlp.c_fc.weight", kFcW, l, 4 * C, C, true});
    s.push_back({h + "mlp.c_fc.bias", kFcB, l, 4 * C, 0, false});
    s.push_back({h + "mlp.c_proj.weight", kFcProjW, l, C, 4 * C, true});
    s.push_back({h + "mlp.c_proj.bias", kFcProjB, l, C, 0, false});
  }
  s.push_back({"ln_f.weight", kLnfW, -1, C, 0, false});
  s.push_back({"ln_f.bias", kLnfB, -1, C, 0, false});
  return s;
}

// Shape of a slot as stored in the HF file.
std::vector<int64_t> hf_shape(const Slot& s) {
  if (s.cols == 0) return {s.rows};
  return s.transpose ? std::vector<int64_t>{s.cols, s.rows} : std::vector<int64_t>{s.rows, s.cols};
}

float* slot_ptr(const Arena& a, const Slot& s) {
  float* base = a.tensor(s.id).f32();
  int64_t size = s.rows * (s.cols == 0 ? 1 : s.cols);
  return base + (s.layer < 0 ? 0 : s.layer * size);
}

// The INT8 matrix of a slot (GPT::for_each_int8's index), or -1 for a
// tensor that stays fp32.
int int8_index(const Slot& s) {
  switch (s.id) {
    case kQkvW: return 4 * s.layer;
    case kAttProjW: return 4 * s.layer + 1;
    case kFcW: return 4 * s.layer + 2;
    case kFcProjW: return 4 * s.layer + 3;
    default: return -1;
  }
}

constexpr const char* kInt8Key = "tessera_quantization";
constexpr const char* kInt8Value = "int8-symmetric-per-output-channel";
constexpr const char* kHeadInt8 = "lm_head.weight";

std::string shape_str(const std::vector<int64_t>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); i++) out += (i ? ", " : "") + std::to_string(v[i]);
  return out + "]";
}

bool is_ignored(std::string_view name) {
  auto ends_with = [&](std::string_view suffix) {
    return name.size() >= suffix.size() && name.substr(name.size() - suffix.size()) == suffix;
  };
  return ends_with(".attn.bias") || ends_with(".attn.masked_bias") || name == "lm_head.weight";
}

}  // namespace

std::string hf_config_path(const std::string& weights_path) {
  return (std::filesystem::path(weights_path).parent_path() / "config.json").string();
}

Result<GPTConfig> read_hf_config(const std::string& path) {
  // io::read_file: a FIFO or a folder named config.json is refused, not read forever.
  ASSIGN_OR_RETURN(std::vector<std::byte> bytes, io::read_file(path));
  const std::string_view text(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  // A deeply nested file would cost the DOM parser gigabytes (issue #18 item 1).
  if (Status st = io::check_json_nesting(text, io::JsonLimits{}); !st.ok()) return st.With(path);
  nlohmann::json j = nlohmann::json::parse(std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()),
                                           nullptr, false);
  if (j.is_discarded() || !j.is_object()) return Status::Corruption(fmt::format("{}: not a JSON object", path));
  GPTConfig c;
  struct Field {
    const char* key;
    int* dst;
  } fields[] = {{"n_layer", &c.layers}, {"n_head", &c.heads}, {"n_embd", &c.channels},
                {"n_positions", &c.context}, {"vocab_size", &c.vocab}};
  for (const Field& f : fields) {
    auto it = j.find(f.key);
    if (it == j.end() || !it->is_number_integer())
      return Status::Corruption(fmt::format("{}: missing or non-integer \"{}\"", path, f.key));
    int64_t v = it->get<int64_t>();
    if (v <= 0 || v > (1 << 24)) return Status::Corruption(fmt::format("{}: \"{}\" = {} is out of range", path, f.key, v));
    *f.dst = static_cast<int>(v);
  }
  Status st = c.validate();
  if (!st.ok()) return st.With(path);
  return c;
}

Status write_hf_config(const GPTConfig& c, const std::string& path) {
  nlohmann::ordered_json j;
  j["model_type"] = "gpt2";
  j["architectures"] = {"GPT2LMHeadModel"};
  j["n_layer"] = c.layers;
  j["n_head"] = c.heads;
  j["n_embd"] = c.channels;
  j["n_positions"] = c.context;
  j["n_ctx"] = c.context;
  j["vocab_size"] = c.vocab;
  j["layer_norm_epsilon"] = 1e-5;
  j["activation_function"] = "gelu_new";
  std::string text = j.dump(2) + "\n";
  std::span<const std::byte> piece(reinterpret_cast<const std::byte*>(text.data()), text.size());
  return io::write_file_atomic(path, std::span<const std::span<const std::byte>>(&piece, 1));
}

namespace {

// A file tensor's name without the optional "transformer." prefix.
std::string_view bare_name(std::string_view name) {
  if (name.starts_with("transformer.")) name.remove_prefix(12);
  return name;
}

// The layer of "h.N.rest" (N >= 0), else -1.
int64_t layer_of(std::string_view name) {
  if (!name.starts_with("h.")) return -1;
  int64_t l = 0;
  size_t i = 2;
  for (; i < name.size() && i < 12 && name[i] >= '0' && name[i] <= '9'; i++) l = l * 10 + (name[i] - '0');
  return i > 2 && i < name.size() && name[i] == '.' ? l : -1;
}

}  // namespace

Status check_hf_tensors(const GPTConfig& c, const io::SafetensorsFile& f) {
  auto q = f.metadata().find(kInt8Key);
  const bool int8 = q != f.metadata().end();
  if (int8 && q->second != kInt8Value)
    return Status::InvalidArgument(
        fmt::format("{}: unknown quantization '{}' (this build reads '{}')", f.path(), q->second, kInt8Value));
  // The layer count first, from the names alone: the expected list below is
  // as long as the config says, and a config.json may say anything.
  int64_t file_layers = 0;
  for (const io::TensorInfo& t : f.tensors()) file_layers = std::max(file_layers, layer_of(bare_name(t.name)) + 1);
  if (file_layers != c.layers)
    return Status::InvalidArgument(fmt::format("{}: the model ({}) has {} layer(s) but the file holds {}", f.path(),
                                               c.str(), c.layers,
                                               file_layers == 0 ? std::string("none")
                                                                : fmt::format("{} (h.0 .. h.{})", file_layers,
                                                                              file_layers - 1)));
  std::map<std::string, const io::TensorInfo*, std::less<>> by_name;
  for (const io::TensorInfo& t : f.tensors()) {
    std::string_view name = bare_name(t.name);
    if (!is_ignored(name)) by_name[std::string(name)] = &t;
  }
  auto find = [&](const std::string& name) -> Result<const io::TensorInfo*> {
    auto it = by_name.find(name);
    if (it == by_name.end()) return Status::InvalidArgument(fmt::format("{}: missing tensor '{}'", f.path(), name));
    const io::TensorInfo* t = it->second;
    by_name.erase(it);
    return t;
  };
  auto check = [&](const std::string& name, const std::vector<int64_t>& want, bool i8) -> Status {
    ASSIGN_OR_RETURN(const io::TensorInfo* t, find(name));
    if (t->shape != want)
      return Status::InvalidArgument(fmt::format("{}: tensor '{}' has shape {}, the model ({}) needs {}", f.path(),
                                                 t->name, shape_str(t->shape), c.str(), shape_str(want)));
    if (i8 && t->dtype != io::StDType::kI8)
      return Status::InvalidArgument(fmt::format("{}: tensor '{}' must be I8 of shape {} for {}", f.path(), t->name,
                                                 shape_str(want), c.str()));
    return Status::OK();
  };
  for (const Slot& s : slots(c)) {
    if (int8 && int8_index(s) >= 0) {
      RETURN_IF_ERROR(check(s.name + "_int8", {s.rows, s.cols}, true));
      RETURN_IF_ERROR(check(s.name + "_scale", {s.rows}, false));
    } else {
      RETURN_IF_ERROR(check(s.name, hf_shape(s), false));
    }
  }
  if (int8) {
    RETURN_IF_ERROR(check(std::string(kHeadInt8) + "_int8", {c.padded_vocab(), c.channels}, true));  // (Vp, C)
    RETURN_IF_ERROR(check(std::string(kHeadInt8) + "_scale", {c.padded_vocab()}, false));
  }
  if (!by_name.empty())
    return Status::InvalidArgument(fmt::format("{}: unexpected tensor '{}' for a GPT-2 with {}", f.path(),
                                               by_name.begin()->second->name, c.str()));
  return Status::OK();
}

Status load_hf_weights(GPT& model, const io::SafetensorsFile& f) {
  const GPTConfig& c = model.config();
  // Names, shapes and dtypes: the same check load_gpt2 runs before it allocates.
  RETURN_IF_ERROR(check_hf_tensors(c, f));
  const bool int8 = f.metadata().count(kInt8Key) > 0;
  // An INT8 model (ModelUse::kInt8Inference) has no fp32 matmul weights: an
  // fp32 file's are quantized one tensor at a time below.
  const bool quantize = !int8 && model.fp32_matmul_weights_released();
  if (int8 && !model.fp32_matmul_weights_released())
    return Status::InvalidArgument(
        fmt::format("{}: an INT8 file loads into an INT8 model (ModelUse::kInt8Inference)", f.path()));
  std::vector<Slot> all = slots(c);
  if (int8 || quantize) std::erase_if(all, [](const Slot& s) { return int8_index(s) >= 0; });
  std::map<std::string, const io::TensorInfo*> by_name;
  for (const io::TensorInfo& t : f.tensors()) by_name[std::string(bare_name(t.name))] = &t;
  RETURN_IF_ERROR(model.params().try_zero());
  // A device model is filled through a host copy, uploaded once at the end.
  Arena staging;
  if (model.params().device() != Device::kCPU) {
    ASSIGN_OR_RETURN(staging, model.params().try_clone_layout(Device::kCPU));
  }
  const Arena& dst_arena = model.params().device() == Device::kCPU ? model.params() : staging;
  std::vector<float> buf;
  for (const Slot& s : all) {
    auto it = by_name.find(s.name);
    if (it == by_name.end()) return Status::InvalidArgument(fmt::format("{}: missing tensor '{}'", f.path(), s.name));
    const io::TensorInfo& t = *it->second;
    std::vector<int64_t> want = hf_shape(s);
    if (t.shape != want)
      return Status::InvalidArgument(fmt::format("{}: tensor '{}' has shape {}, the model ({}) needs {}", f.path(),
                                                 t.name, shape_str(t.shape), c.str(), shape_str(want)));
    float* dst = slot_ptr(dst_arena, s);
    if (!s.transpose) {  // straight into the arena: no copy of the largest tensor (wte)
      RETURN_IF_ERROR(f.read_f32(t.name, std::span<float>(dst, static_cast<size_t>(t.numel()))));
      continue;
    }
    buf.resize(t.numel());
    RETURN_IF_ERROR(f.read_f32(t.name, buf));
    for (int64_t i = 0; i < s.cols; i++)  // file (cols=in, rows=out) -> arena (rows, cols)
      for (int64_t o = 0; o < s.rows; o++) dst[o * s.cols + i] = buf[i * s.rows + o];
  }
  if (model.params().device() != Device::kCPU) RETURN_IF_ERROR(model.params().try_copy_from(staging));
  if (quantize) {
    // Conv1D weights are stored (in, out): each is read, transposed to (out,
    // in) and quantized per output row; the head is the tied wte.
    std::vector<const Slot*> by_index(4 * c.layers + 1, nullptr);
    std::vector<Slot> every = slots(c);
    for (const Slot& s : every)
      if (int8_index(s) >= 0) by_index[int8_index(s)] = &s;
    std::vector<float> rows;
    return model.load_int8([&](int k, int OC, int C, int8_t* w, float* scale) -> Status {
      const float* src = model.param_ptrs()[kWte];
      if (k < 4 * c.layers) {
        const Slot& s = *by_index[k];
        buf.resize(static_cast<size_t>(s.rows * s.cols));
        RETURN_IF_ERROR(f.read_f32(by_name[s.name]->name, buf));
        rows.resize(buf.size());
        for (int64_t i = 0; i < s.cols; i++)
          for (int64_t o = 0; o < s.rows; o++) rows[o * s.cols + i] = buf[i * s.rows + o];
        src = rows.data();
      }
      model.quantize_matrix_int8(src, OC, C, w, scale);
      return Status::OK();
    });
  }
  if (!int8) return Status::OK();
  // The INT8 matrices: NAME_int8 (OC, C) I8 and NAME_scale (OC) F32.
  std::vector<std::string> names(4 * c.layers + 1);
  for (const Slot& s : slots(c)) {
    if (int8_index(s) >= 0) names[int8_index(s)] = s.name;
  }
  names.back() = kHeadInt8;
  return model.load_int8([&](int k, int OC, int C, int8_t* w, float* scale) -> Status {
    auto w_it = by_name.find(names[k] + "_int8");
    auto s_it = by_name.find(names[k] + "_scale");
    if (w_it == by_name.end() || s_it == by_name.end())
      return Status::InvalidArgument(fmt::format("{}: missing tensor '{}_int8' or '{}_scale'", f.path(), names[k],
                                                 names[k]));
    const io::TensorInfo& wt = *w_it->second;
    const io::TensorInfo& st = *s_it->second;
    const std::vector<int64_t> want_w = {OC, C}, want_s = {OC};
    if (wt.dtype != io::StDType::kI8 || wt.shape != want_w)
      return Status::InvalidArgument(fmt::format("{}: tensor '{}' must be I8 of shape {} for {}", f.path(), wt.name,
                                                 shape_str(want_w), c.str()));
    if (st.shape != want_s)
      return Status::InvalidArgument(fmt::format("{}: tensor '{}' must have shape {} for {}", f.path(), st.name,
                                                 shape_str(want_s), c.str()));
    RETURN_IF_ERROR(f.read_raw(wt.name, std::as_writable_bytes(std::span<int8_t>(w, static_cast<size_t>(OC) * C))));
    RETURN_IF_ERROR(f.read_f32(st.name, std::span<float>(scale, static_cast<size_t>(OC))));
    for (int o = 0; o < OC; o++) {
      if (!(scale[o] > 0.0f) || !std::isfinite(scale[o]))
        return Status::InvalidArgument(
            fmt::format("{}: tensor '{}' holds a scale that is not a positive number at {}", f.path(), st.name, o));
    }
    for (int64_t i = 0; i < int64_t{OC} * C; i++) {
      if (w[i] == -128)
        return Status::InvalidArgument(fmt::format("{}: tensor '{}' holds -128 (codes are -127..127)", f.path(),
                                                   wt.name));
    }
    return Status::OK();
  });
}

Result<std::unique_ptr<GPT>> load_gpt2(const std::string& path, const GPTConfig* fallback, Backend backend,
                                       ModelUse use) {
  // The Llama family's folders (config.json names the architecture), and
  // GGUF files (llama.cpp's; nn/gguf_model.h).
  if (is_hf_decoder(path)) return load_hf_decoder(path, backend, use);
  if (is_gguf(path)) return load_gguf(path, backend, use);
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    ASSIGN_OR_RETURN(HfFolder folder, resolve_hf_folder(path));
    if (folder.architecture != "GPT2LMHeadModel" && !folder.architecture.empty())
      return Status::InvalidArgument(fmt::format(
          "{}: architecture '{}' is not one Tessera builds (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, "
          "GPT2LMHeadModel)",
          folder.config, folder.architecture));
    if (folder.files.size() != 1)
      return Status::InvalidArgument(fmt::format("{}: a GPT-2 folder holds one model.safetensors", path));
    return load_gpt2(folder.files[0], fallback, backend, use);
  }
  ASSIGN_OR_RETURN(io::SafetensorsFile f, io::SafetensorsFile::open(path));
  GPTConfig c;
  std::string cfg_path = hf_config_path(path);
  bool fallback_used = false;
  if (std::filesystem::exists(cfg_path)) {
    ASSIGN_OR_RETURN(c, read_hf_config(cfg_path));
  } else if (fallback) {
    c = *fallback;
    fallback_used = true;
    RETURN_IF_ERROR(c.validate());
  } else {
    return Status::InvalidArgument(
        fmt::format("{}: no config.json beside the weights; give the model shape with flags", path));
  }
  // A config.json that disagrees with the tensors (n_layer=100000 beside a
  // 2-layer file allocated 10 GB before it was refused: issue #18 item 1)
  // is refused before the model is allocated.
  if (Status st = check_hf_tensors(c, f); !st.ok())
    return Status::InvalidArgument(
        fmt::format("{} (the shape is from {})", st.message(), fallback_used ? "the flags" : cfg_path));
  // An INT8 file holds no fp32 matmul weights: only the INT8 tier reads it.
  if (f.metadata().count(kInt8Key) > 0) {
    if (use == ModelUse::kTraining)
      return Status::InvalidArgument(fmt::format(
          "{}: an INT8 file (tessera quantize) is for inference on the CPU, not training: start from the fp32 file",
          path));
    use = ModelUse::kInt8Inference;
  }
  ASSIGN_OR_RETURN(std::unique_ptr<GPT> model, GPT::create(c, backend, ModelShard{}, nullptr, use));
  RETURN_IF_ERROR(load_hf_weights(*model, f));
  return model;
}

Result<std::vector<HfTensor>> to_hf_tensors(const GPT& model, const Arena& arena) {
  if (!model.config().gpt2()) return hf_decoder_tensors(model, arena);
  if (model.fp32_matmul_weights_released() && &arena == &model.params())
    return Status::InvalidArgument("the model's fp32 matmul weights were released or never loaded (the INT8 tier)");
  // A device arena is read through one host copy.
  Arena host;
  if (arena.device() != Device::kCPU) {
    ASSIGN_OR_RETURN(host, arena.try_clone_layout(Device::kCPU));
    RETURN_IF_ERROR(host.try_copy_from(arena));
  }
  const Arena& a = arena.device() == Device::kCPU ? arena : host;
  std::vector<HfTensor> out;
  for (const Slot& s : slots(model.config())) {
    HfTensor t{s.name, hf_shape(s), {}};
    int64_t n = s.rows * (s.cols == 0 ? 1 : s.cols);
    const float* src = slot_ptr(a, s);
    t.data.resize(n);
    if (s.transpose) {
      for (int64_t o = 0; o < s.rows; o++)
        for (int64_t i = 0; i < s.cols; i++) t.data[i * s.rows + o] = src[o * s.cols + i];
    } else {
      std::copy(src, src + n, t.data.begin());
    }
    out.push_back(std::move(t));
  }
  return out;
}

Status save_int8(const GPT& model, const std::string& path) {
  if (!model.int8()) return Status::InvalidArgument("save_int8: the model is not quantized (GPT::quantize_int8)");
  if (!model.config().gpt2()) return save_hf_decoder_int8(model, path);
  const GPTConfig& c = model.config();
  std::vector<std::string> names(4 * c.layers + 1);
  for (const Slot& s : slots(c)) {
    if (int8_index(s) >= 0) names[int8_index(s)] = s.name;
  }
  names.back() = kHeadInt8;
  // The fp32 tensors straight from the arena (INT8 models are on the CPU;
  // none of them is transposed), then the INT8 matrices.
  io::SafetensorsWriter w;
  for (const Slot& s : slots(c)) {
    if (int8_index(s) < 0) w.add(s.name, io::StDType::kF32, hf_shape(s), slot_ptr(model.params(), s));
  }
  model.for_each_int8([&](int k, int OC, int C, const int8_t* q, const float* scale) {
    w.add(names[k] + "_int8", io::StDType::kI8, {OC, C}, q);
    w.add(names[k] + "_scale", io::StDType::kF32, {OC}, scale);
  });
  w.set_metadata("format", "pt");
  w.set_metadata("producer", "tessera " TESSERA_VERSION);
  w.set_metadata(kInt8Key, kInt8Value);
  RETURN_IF_ERROR(w.write(path));
  return write_hf_config(model.config(), hf_config_path(path));
}

Status save_hf(const GPT& model, const std::string& path) {
  if (!model.config().gpt2()) return save_hf_decoder(model, path);
  ASSIGN_OR_RETURN(std::vector<HfTensor> tensors, to_hf_tensors(model, model.params()));
  io::SafetensorsWriter w;
  for (const HfTensor& t : tensors) w.add(t.name, io::StDType::kF32, t.shape, t.data.data());
  w.set_metadata("format", "pt");
  w.set_metadata("producer", "tessera " TESSERA_VERSION);
  RETURN_IF_ERROR(w.write(path));
  return write_hf_config(model.config(), hf_config_path(path));
}

}  // namespace tessera
