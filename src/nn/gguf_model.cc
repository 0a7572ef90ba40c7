#include "nn/gguf_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <numbers>
#include <optional>
#include <set>
#include <vector>

#include <fmt/format.h>

#include "core/try.h"
#include "kernels/q4.h"

namespace tessera {

namespace {

using io::GgmlType;

// One GGUF tensor of the model: its llama.cpp name, its row-major shape
// (rows, cols) or (n), and where its elements go in Tessera's parameters
// (model/decoder.h) and, for a matmul weight, in which int4 matrix
// (GPT::load_q4's index) from which row.
struct Entry {
  std::string name;
  std::vector<int64_t> shape;
  int id = 0;
  int layer = -1;  // -1: not a per-layer tensor
  // kPlain: rows at `offset` elements into the layer's slice. kQRows and
  // kKRows: a llama model's query / key rows, permuted for llama.cpp's
  // rotary kernel (and the queries into Tessera's head order; a qwen2
  // model's are in Hugging Face's order within a head, llama.cpp's NEOX
  // rotary, and its query biases follow its query rows). kOCols: the
  // attention projection, whose columns are in Hugging Face's head order.
  enum Kind { kPlain, kQRows, kKRows, kOCols } kind = kPlain;
  int64_t offset = 0;
  int matrix = -1;   // int4 matrix index; -1 for a tensor that is not a matmul weight
  int64_t row0 = 0;  // its first row in that matrix
  bool optional = false;
};

std::vector<Entry> entries_of(const DecoderConfig& c) {
  const int64_t C = c.channels, V = c.vocab, hs = c.hs(), NH = c.heads, KV = c.kv(), F = c.ffn(), L = c.layers;
  std::vector<Entry> e;
  e.push_back({"token_embd.weight", {V, C}, kWte});
  if (c.gpt2()) {
    e.push_back({"position_embd.weight", {c.context, C}, kWpe});
    for (int l = 0; l < L; l++) {
      const std::string b = fmt::format("blk.{}.", l);
      e.push_back({b + "attn_norm.weight", {C}, kLn1W, l});
      e.push_back({b + "attn_norm.bias", {C}, kLn1B, l});
      e.push_back({b + "attn_qkv.weight", {3 * C, C}, kQkvW, l, Entry::kPlain, 0, 4 * l});
      e.push_back({b + "attn_qkv.bias", {3 * C}, kQkvB, l});
      e.push_back({b + "attn_output.weight", {C, C}, kAttProjW, l, Entry::kPlain, 0, 4 * l + 1});
      e.push_back({b + "attn_output.bias", {C}, kAttProjB, l});
      e.push_back({b + "ffn_norm.weight", {C}, kLn2W, l});
      e.push_back({b + "ffn_norm.bias", {C}, kLn2B, l});
      e.push_back({b + "ffn_up.weight", {F, C}, kFcW, l, Entry::kPlain, 0, 4 * l + 2});
      e.push_back({b + "ffn_up.bias", {F}, kFcB, l});
      e.push_back({b + "ffn_down.weight", {C, F}, kFcProjW, l, Entry::kPlain, 0, 4 * l + 3});
      e.push_back({b + "ffn_down.bias", {C}, kFcProjB, l});
    }
    e.push_back({"output_norm.weight", {C}, kLnfW});
    e.push_back({"output_norm.bias", {C}, kLnfB});
    // llama.cpp's converter writes GPT-2's tied output layer out again.
    Entry head{"output.weight", {V, C}, kWte, -1, Entry::kPlain, 0, 4 * static_cast<int>(L)};
    head.optional = true;
    e.push_back(head);
    return e;
  }
  for (int l = 0; l < L; l++) {
    const std::string b = fmt::format("blk.{}.", l);
    e.push_back({b + "attn_norm.weight", {C}, kLn1W, l});
    e.push_back({b + "attn_q.weight", {NH * hs, C}, kQkvW, l, Entry::kQRows, 0, 4 * l, 0});
    e.push_back({b + "attn_k.weight", {KV * hs, C}, kQkvW, l, Entry::kKRows, NH * hs * C, 4 * l, NH * hs});
    e.push_back({b + "attn_v.weight", {KV * hs, C}, kQkvW, l, Entry::kPlain, (NH + KV) * hs * C, 4 * l, (NH + KV) * hs});
    if (c.qkv_bias) {  // qwen2
      e.push_back({b + "attn_q.bias", {NH * hs}, kQkvB, l, Entry::kQRows, 0});
      e.push_back({b + "attn_k.bias", {KV * hs}, kQkvB, l, Entry::kKRows, NH * hs});
      e.push_back({b + "attn_v.bias", {KV * hs}, kQkvB, l, Entry::kPlain, (NH + KV) * hs});
    }
    e.push_back({b + "attn_output.weight", {C, NH * hs}, kAttProjW, l, Entry::kOCols, 0, 4 * l + 1});
    e.push_back({b + "ffn_norm.weight", {C}, kLn2W, l});
    e.push_back({b + "ffn_gate.weight", {F, C}, kFcW, l, Entry::kPlain, 0, 4 * l + 2, 0});
    e.push_back({b + "ffn_up.weight", {F, C}, kFcW, l, Entry::kPlain, F * C, 4 * l + 2, F});
    e.push_back({b + "ffn_down.weight", {C, F}, kFcProjW, l, Entry::kPlain, 0, 4 * l + 3});
  }
  e.push_back({"output_norm.weight", {C}, kLnfW});
  if (!c.tied_head) e.push_back({"output.weight", {V, C}, kLmHead, -1, Entry::kPlain, 0, 4 * static_cast<int>(L)});
  return e;
}

// Within a head of hs rows, llama.cpp's row 2i + h is Hugging Face's row
// h*hs/2 + i (convert_hf_to_gguf.py's permute).
int64_t hf_row_of_rope_row(int64_t e, int64_t hs) { return (e % 2) * (hs / 2) + e / 2; }

// Tessera's query head of Hugging Face's head h (model/decoder.h).
int64_t tessera_head(int64_t h, int64_t KV, int64_t G) { return (h % G) * KV + h / G; }

// The row of the parameter piece (Tessera's order) that file row r fills.
// A qwen2 model (the Llama family with q, k and v biases) keeps Hugging
// Face's order within each head: llama.cpp rotates its halves (NEOX).
int64_t piece_row(const DecoderConfig& c, const Entry& e, int64_t r) {
  const int64_t hs = c.hs(), KV = c.kv(), G = c.heads / KV;
  const bool neox = c.qkv_bias;
  switch (e.kind) {
    case Entry::kQRows: return tessera_head(r / hs, KV, G) * hs + (neox ? r % hs : hf_row_of_rope_row(r % hs, hs));
    case Entry::kKRows: return neox ? r : (r / hs) * hs + hf_row_of_rope_row(r % hs, hs);
    default: return r;
  }
}

// The input column (Tessera's order) that file column col multiplies.
int64_t piece_col(const DecoderConfig& c, const Entry& e, int64_t col) {
  if (e.kind != Entry::kOCols) return col;
  const int64_t hs = c.hs(), KV = c.kv(), G = c.heads / KV;
  return tessera_head(col / hs, KV, G) * hs + col % hs;
}

// Where entry e's elements start in arena a.
float* slice_of(const Arena& a, const Entry& e, int layers) {
  Tensor t = a.tensor(e.id);
  const int64_t per_layer = e.layer < 0 ? 0 : t.numel() / layers;
  return t.f32() + (e.layer < 0 ? 0 : e.layer * per_layer) + e.offset;
}

bool is_q4(GgmlType t) { return t == GgmlType::kQ4_0 || t == GgmlType::kQ4_K; }
// The other block types llama-quantize writes into 4-bit files (Q6_K
// heads, Q4_K_M's and Q4_K_S's wider attn_v and ffn_down, Q5_0 where 256
// does not divide a Q4_K row): read by their values, requantized in the
// int4 tier. (Where 256 does not divide a row llama.cpp writes Q6_K's as
// Q8_0, which makes the file fp32 / INT8 here.)
bool requantized(GgmlType t) {
  return t == GgmlType::kQ6_K || t == GgmlType::kQ5_K || t == GgmlType::kQ5_0 || t == GgmlType::kQ5_1 ||
         t == GgmlType::kQ4_1;
}
q4::Type q4_of(GgmlType t) { return t == GgmlType::kQ4_K ? q4::Type::kQ4_K : q4::Type::kQ4_0; }
GgmlType ggml_of(q4::Type t) { return t == q4::Type::kQ4_K ? GgmlType::kQ4_K : GgmlType::kQ4_0; }

// A quantized tier on the CPU keeps a Q8_0, Q4_0 or Q4_K token_embd as the
// file's rows (GPT::set_quantized_embeddings), and the fp32 table is never
// filled. The format, or nullopt where the table is kept (other types,
// models elsewhere, rows of a width the format cannot hold).
std::optional<GPT::RowFormat> kept_embedding_format(const io::GgufFile& f, const DecoderConfig& c, bool quantized_tier,
                                                    Device device) {
  const io::GgufTensorInfo* embd = f.find_tensor("token_embd.weight");
  if (embd == nullptr || !quantized_tier || device != Device::kCPU) return std::nullopt;
  switch (embd->type) {
    case GgmlType::kQ8_0:
      if (c.channels % 32 == 0) return GPT::RowFormat::kQ8_0;
      break;
    case GgmlType::kQ4_0:
    case GgmlType::kQ4_K:
      if (q4::fits(q4_of(embd->type), c.channels))
        return embd->type == GgmlType::kQ4_K ? GPT::RowFormat::kQ4_K : GPT::RowFormat::kQ4_0;
      break;
    default: break;
  }
  return std::nullopt;
}

Status keep_quantized_embeddings(const io::GgufFile& f, GPT& model, GPT::RowFormat format) {
  const io::GgufTensorInfo* embd = f.find_tensor("token_embd.weight");
  const std::span<const uint8_t> bytes = f.tensor_bytes(*embd);
  std::vector<uint8_t> rows(bytes.begin(), bytes.end());
  f.drop_tensor_pages(*embd);
  return model.set_quantized_embeddings(format, std::move(rows)).With(f.path());
}

// n rows of `cols` values of entry e in the model's column order: the rows
// themselves, or for the attention projection (kOCols, columns in Hugging
// Face's head order) the rows with their columns moved, in *moved.
const float* in_model_columns(const DecoderConfig& c, const Entry& e, const float* in, int64_t n, int64_t cols,
                              std::vector<float>* moved) {
  if (e.kind != Entry::kOCols) return in;
  moved->resize(static_cast<size_t>(n * cols));
  for (int64_t r = 0; r < n; r++)
    for (int64_t col = 0; col < cols; col++) (*moved)[r * cols + piece_col(c, e, col)] = in[r * cols + col];
  return moved->data();
}

// Tensor t as fp32, a few rows at a time (rows of ne[0] elements, about
// 4 MB of fp32 a chunk): fn(r0, n, rows) for rows r0 .. r0 + n - 1, in
// order, with *buf holding them. Loading never holds a whole large tensor
// in fp32 beside its place in the model (TinyLlama's 262 MB embeddings
// did, twice in the INT8 tier: peak 1670 MB against 1353 once loaded).
template <class F>
Status each_rows(const io::GgufFile& f, const io::GgufTensorInfo& t, std::vector<float>* buf, F&& fn) {
  const int64_t cols = t.ne.empty() ? 1 : t.ne[0], rows = t.numel() / std::max<int64_t>(cols, 1);
  const int64_t chunk = std::max<int64_t>(1, (int64_t{1} << 20) / std::max<int64_t>(cols, 1));
  const bool q4 = is_q4(t.type);
  const int64_t rb = q4 ? q4::row_bytes(q4_of(t.type), cols) : 0;
  const uint8_t* bytes = f.tensor_bytes(t).data();
  for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
    const int64_t n = std::min(chunk, rows - r0);
    buf->resize(static_cast<size_t>(n * cols));
    if (!q4) {
      RETURN_IF_ERROR(f.read_f32_rows(t, r0, std::span<float>(*buf)));
    } else {
      for (int64_t r = r0; r < r0 + n; r++) {
        RETURN_IF_ERROR(q4::check_row(q4_of(t.type), bytes + r * rb, cols)
                            .With(fmt::format("{}: tensor '{}' row {}", f.path(), t.name, r)));
        q4::dequantize_row(q4_of(t.type), buf->data() + (r - r0) * cols, bytes + r * rb, cols);
      }
      f.drop_range(bytes + r0 * rb, static_cast<size_t>(n * rb));
    }
    RETURN_IF_ERROR(fn(r0, n, static_cast<const float*>(buf->data())));
  }
  return Status::OK();
}

Result<uint64_t> get_dim(const io::GgufFile& f, const std::string& key, uint64_t max) {
  ASSIGN_OR_RETURN(uint64_t v, f.get_uint(key));
  if (v == 0 || v > max) return Status::InvalidArgument(fmt::format("{}: key '{}' is {} (1 to {})", f.path(), key, v, max));
  return v;
}

std::string shape_str(const std::vector<int64_t>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); i++) out += (i ? ", " : "") + std::to_string(v[i]);
  return out + "]";
}

// Q8_0: blocks of 32, an fp16 scale max|x| / 127 then 32 int8 codes
// round(x / d) (llama.cpp's quantize_row_q8_0_ref).
void quantize_q8_0(const float* x, int64_t n, uint8_t* out) {
  for (int64_t b = 0; b < n / 32; b++) {
    float amax = 0.0f;
    for (int j = 0; j < 32; j++) amax = std::max(amax, std::fabs(x[b * 32 + j]));
    const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    const uint16_t h = q4::f32_to_fp16(d);
    std::memcpy(out + b * 34, &h, 2);
    for (int j = 0; j < 32; j++) out[b * 34 + 2 + j] = static_cast<uint8_t>(static_cast<int8_t>(std::lround(x[b * 32 + j] * id)));
  }
}

// Llama 3's rotary scaling from a file's rope_freqs.weight (each
// frequency's divisor, as llama.cpp's converter writes them from
// config.json's rope_scaling, which the file does not keep). The divisors
// depend only on the factor (the largest, on the longest wavelengths) and
// on where the smooth part between 1 and the factor starts and ends, that
// is on original_context / low_freq_factor and original_context /
// high_freq_factor. With two or more divisors in the smooth part those two
// follow from them, and are written with low_freq_factor 1; with fewer,
// Llama 3.1's (low 1, high 4, original context 8192) are taken. Either way
// the divisors they give must be the file's.
Result<RopeScaling> llama3_scaling(const io::GgufFile& f, const io::GgufTensorInfo& t, const DecoderConfig& c) {
  const int half = c.hs() / 2;
  const std::string what = fmt::format("{}: tensor 'rope_freqs.weight'", f.path());
  if (t.type != GgmlType::kF32 || t.shape() != std::vector<int64_t>{half})
    return Status::InvalidArgument(fmt::format("{} is {} of shape {}: Llama 3's rotary scaling is {} F32 values (hs / 2)",
                                               what, io::ggml_type_name(t.type), shape_str(t.shape()), half));
  std::vector<float> got(half);
  std::memcpy(got.data(), f.tensor_bytes(t).data(), got.size() * sizeof(float));
  float factor = 1.0f;
  for (int i = 0; i < half; i++) {
    if (!std::isfinite(got[i]) || got[i] < 1.0f)
      return Status::InvalidArgument(
          fmt::format("{}: divisor {} is {} (Llama 3's divisors are 1 or more)", what, i, got[i]));
    factor = std::max(factor, got[i]);
  }
  if (factor == 1.0f) return RopeScaling{};
  DecoderConfig probe = c;
  probe.rope_scaling = RopeScaling{};
  const std::vector<float> inv = probe.rope_inv_freq();  // unscaled
  probe.rope_scaling = RopeScaling{RopeScaling::Kind::kLlama3, factor, 1.0, 4.0, 8192};
  // The smooth part: 1 / got = (1 - s) / factor + s, s = a / wavelength - b,
  // a = original_context / (high - low), b = low / (high - low).
  std::vector<int> smooth;
  for (int i = 0; i < half; i++)
    if (got[i] > 1.0f && got[i] < factor) smooth.push_back(i);
  if (smooth.size() >= 2) {
    auto s_of = [&](int i) { return (1.0 / got[i] - 1.0 / factor) / (1.0 - 1.0 / factor); };
    auto inv_wave = [&](int i) { return inv[i] / (2.0 * std::numbers::pi); };
    const int i = smooth.front(), j = smooth.back();
    const double a = (s_of(i) - s_of(j)) / (inv_wave(i) - inv_wave(j)), b = a * inv_wave(i) - s_of(i);
    if (std::isfinite(a) && std::isfinite(b) && a > 0 && b > 0 && a / b < 1e9) {
      probe.rope_scaling.high_freq_factor = 1.0 + 1.0 / b;
      probe.rope_scaling.original_context = static_cast<int>(std::lround(a / b));
      // Llama 3.1's own numbers when these are they, to the rounding.
      if (std::fabs(probe.rope_scaling.high_freq_factor - 4.0) < 1e-3 && probe.rope_scaling.original_context == 8192)
        probe.rope_scaling.high_freq_factor = 4.0;
    }
  }
  const std::vector<float> want = probe.llama3_rope_factors();
  for (int i = 0; i < half; i++)
    if (std::fabs(want[i] - got[i]) > 1e-4f * want[i])
      return Status::InvalidArgument(fmt::format(
          "{}: divisor {} is {} where Llama 3's scaling by {} (low_freq_factor 1, high_freq_factor {:g}, original "
          "context {}) gives {}: not Llama 3's rotary scaling",
          what, i, got[i], factor, probe.rope_scaling.high_freq_factor, probe.rope_scaling.original_context, want[i]));
  return probe.rope_scaling;
}

}  // namespace

Result<GgufWeights> parse_gguf_weights(const std::string& name) {
  if (name == "f32") return GgufWeights::kF32;
  if (name == "f16") return GgufWeights::kF16;
  if (name == "q8_0") return GgufWeights::kQ8_0;
  if (name == "q4_0" || name == "int4") return GgufWeights::kQ4_0;
  if (name == "q4_k" || name == "int4k") return GgufWeights::kQ4_K;
  return Status::InvalidArgument(fmt::format("GGUF tensor type '{}' (f32, f16, q8_0, q4_0 or q4_k)", name));
}

bool is_gguf(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return false;  // never open a FIFO here: it would block
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {};
  return in.read(magic, 4) && std::memcmp(magic, "GGUF", 4) == 0;
}

Result<DecoderConfig> read_gguf_config(const io::GgufFile& f) {
  ASSIGN_OR_RETURN(std::string arch, f.get_string("general.architecture"));
  if (arch != "gpt2" && arch != "llama" && arch != "qwen2")
    return Status::InvalidArgument(
        fmt::format("{}: architecture '{}' is not read (gpt2, llama and qwen2 are)", f.path(), arch));
  const io::GgufTensorInfo* embd = f.find_tensor("token_embd.weight");
  if (embd == nullptr || embd->ne.size() != 2)
    return Status::InvalidArgument(fmt::format("{}: no two-dimensional tensor 'token_embd.weight'", f.path()));
  constexpr uint64_t kMax = uint64_t{1} << 20;
  DecoderConfig c;
  auto key = [&](const char* k) { return arch + "." + k; };
  ASSIGN_OR_RETURN(uint64_t L, get_dim(f, key("block_count"), 4096));
  ASSIGN_OR_RETURN(uint64_t C, get_dim(f, key("embedding_length"), kMax));
  ASSIGN_OR_RETURN(uint64_t NH, get_dim(f, key("attention.head_count"), 4096));
  ASSIGN_OR_RETURN(uint64_t T, get_dim(f, key("context_length"), uint64_t{1} << 24));
  ASSIGN_OR_RETURN(uint64_t F, get_dim(f, key("feed_forward_length"), kMax));
  c.layers = static_cast<int>(L);
  c.channels = static_cast<int>(C);
  c.heads = static_cast<int>(NH);
  c.context = static_cast<int>(T);
  c.vocab = static_cast<int>(std::min<int64_t>(embd->ne[1], INT32_MAX));
  if (arch == "gpt2") {
    if (F != 4 * C)
      return Status::InvalidArgument(fmt::format("{}: gpt2.feed_forward_length {} is not 4 x {}", f.path(), F, C));
    if (f.has(key("attention.layer_norm_epsilon"))) {
      ASSIGN_OR_RETURN(double eps, f.get_float(key("attention.layer_norm_epsilon")));
      if (std::fabs(eps - 1e-5) > 1e-9)
        return Status::InvalidArgument(fmt::format("{}: layer_norm_epsilon {} (GPT-2's is 1e-5)", f.path(), eps));
    }
  } else {
    c.norm = Norm::kRMSNorm;
    c.positions = Positions::kRope;
    c.mlp = Mlp::kSwiGLU;
    c.qkv_bias = arch == "qwen2";
    c.bias = false;
    c.mlp_hidden = static_cast<int>(F);
    c.tied_head = f.find_tensor("output.weight") == nullptr;
    if (f.has(key("attention.head_count_kv"))) {
      ASSIGN_OR_RETURN(uint64_t KV, get_dim(f, key("attention.head_count_kv"), NH));
      c.kv_heads = static_cast<int>(KV);
    }
    if (f.has(key("attention.key_length"))) {
      ASSIGN_OR_RETURN(uint64_t hs, get_dim(f, key("attention.key_length"), kMax));
      c.head_dim = static_cast<int>(hs);
    }
    if (f.has(key("rope.dimension_count"))) {
      ASSIGN_OR_RETURN(uint64_t rd, get_dim(f, key("rope.dimension_count"), kMax));
      if (static_cast<int>(rd) != c.hs())
        return Status::InvalidArgument(fmt::format(
            "{}: rope.dimension_count {} is not the head size {} (partial rotary is not built)", f.path(), rd, c.hs()));
    }
    if (f.has(key("attention.layer_norm_rms_epsilon"))) {
      ASSIGN_OR_RETURN(double eps, f.get_float(key("attention.layer_norm_rms_epsilon")));
      c.norm_eps = static_cast<float>(eps);
    }
    if (f.has(key("rope.freq_base"))) {
      ASSIGN_OR_RETURN(c.rope_theta, f.get_float(key("rope.freq_base")));
    }
    if (f.has(key("rope.scaling.type"))) {
      ASSIGN_OR_RETURN(std::string type, f.get_string(key("rope.scaling.type")));
      if (type == "linear") {
        ASSIGN_OR_RETURN(double factor, f.get_float(key("rope.scaling.factor")));
        c.rope_scaling.kind = RopeScaling::Kind::kLinear;
        c.rope_scaling.factor = factor;
      } else if (type != "none") {
        return Status::InvalidArgument(
            fmt::format("{}: rope.scaling.type '{}' is not read (none and linear are)", f.path(), type));
      }
    }
    if (const io::GgufTensorInfo* t = f.find_tensor("rope_freqs.weight"); t != nullptr) {
      if (c.rope_scaling.kind != RopeScaling::Kind::kNone)
        return Status::InvalidArgument(
            fmt::format("{}: both rope.scaling.type and tensor 'rope_freqs.weight' scale the rotary frequencies",
                        f.path()));
      ASSIGN_OR_RETURN(c.rope_scaling, llama3_scaling(f, *t, c));
    }
  }
  if (Status st = c.validate(); !st.ok()) return st.With(f.path());
  return c;
}

Result<std::unique_ptr<GPT>> load_gguf(const std::string& path, Backend backend, ModelUse use) {
  ASSIGN_OR_RETURN(io::GgufFile f, io::GgufFile::open(path));
  ASSIGN_OR_RETURN(DecoderConfig c, read_gguf_config(f));
  const std::vector<Entry> entries = entries_of(c);
  // Every name, shape and type before anything is allocated.
  std::set<std::string> wanted;
  const int L = c.layers;
  // The 4-bit tier takes a file whose matmul weights are all Q4_0, Q4_K or
  // requantized types (Q6_K, Q5_K, Q5_0, Q5_1, Q4_1) with more 4-bit tensors
  // than the others (llama-quantize's Q4_K_M puts some attn_v and ffn_down
  // at Q6_K, Q4_K_S some attn_v at Q5_K): each fused matrix is the 4-bit
  // type of its tensors (Q4_K for one of the other types only), and another
  // type's tensor is requantized to it from its values.
  std::map<int, GgmlType> matrix_type;  // the 4-bit type of each int4 matrix
  int q4_tensors = 0, requantized_tensors = 0;
  bool all_q4 = true;
  for (const Entry& e : entries) {
    wanted.insert(e.name);
    const io::GgufTensorInfo* t = f.find_tensor(e.name);
    if (t == nullptr) {
      if (e.optional) continue;
      return Status::InvalidArgument(fmt::format("{}: tensor '{}' is missing (the model is {})", path, e.name, c.str()));
    }
    if (t->shape() != e.shape)
      return Status::InvalidArgument(fmt::format("{}: tensor '{}' has shape {} but {} needs {}", path, e.name,
                                                 shape_str(t->shape()), c.str(), shape_str(e.shape)));
    const GgmlType ty = t->type;
    if (!io::read_by_values(ty) && !is_q4(ty))
      return Status::InvalidArgument(fmt::format("{}: tensor '{}' is {} (F32, F16, BF16, Q8_0, Q6_K, Q5_K, Q5_0, "
                                                 "Q5_1, Q4_1, Q4_0 and Q4_K are read)",
                                                 path, e.name, io::ggml_type_name(ty)));
    if (e.matrix >= 0 && e.matrix < 4 * L) {
      if (requantized(ty)) {
        requantized_tensors++;
        continue;
      }
      if (!is_q4(ty)) {
        all_q4 = false;
        continue;
      }
      q4_tensors++;
      auto [it, added] = matrix_type.emplace(e.matrix, ty);
      if (!added && it->second != ty) all_q4 = false;  // one fused matrix, two 4-bit block types
    }
  }
  all_q4 = all_q4 && q4_tensors > requantized_tensors;
  if (all_q4)
    for (const Entry& e : entries)  // a matrix of requantized tensors only: Q4_K, or Q4_0 where 256 does not fit
      if (e.matrix >= 0 && e.matrix < 4 * L)
        matrix_type.emplace(e.matrix, q4::fits(q4::Type::kQ4_K, e.shape[1]) ? GgmlType::kQ4_K : GgmlType::kQ4_0);
  if (!c.gpt2()) wanted.insert("rope_freqs.weight");  // read with the config (read_gguf_config)
  for (const io::GgufTensorInfo& t : f.tensors())
    if (!wanted.count(t.name))
      return Status::InvalidArgument(fmt::format("{}: unexpected tensor '{}' (not part of {})", path, t.name, c.str()));
  if (all_q4 && use == ModelUse::kTraining)
    return Status::InvalidArgument(fmt::format("{}: a 4-bit GGUF file is for inference on the CPU, not training", path));
  if (all_q4 && device_of(backend) != Device::kCPU)
    return Status::InvalidArgument(fmt::format("{}: a 4-bit GGUF file runs on the CPU (--backend cpu)", path));
  // The INT8 tier from a file that is not 4-bit: each matmul weight read as
  // fp32 and quantized per output row right away (GPT::load_int8 below), so
  // the fp32 matmul weights never exist (a TinyLlama-shaped Q8_0 file peaked
  // at 5.5 GB resident when they did).
  const bool to_int8 = !all_q4 && use == ModelUse::kInt8Inference;
  const ModelUse model_use = all_q4 || to_int8 ? ModelUse::kInt8Inference : use;
  ASSIGN_OR_RETURN(std::unique_ptr<GPT> model, GPT::create(c, backend, ModelShard{}, nullptr, model_use));
  Arena host_arena;
  const bool on_host = model->device() == Device::kCPU;
  if (!on_host) {
    ASSIGN_OR_RETURN(host_arena, model->params().try_clone_layout(Device::kCPU));
  }
  Arena& a = on_host ? model->params() : host_arena;  // fresh: zero, no page resident
  // TinyLlama's fp32 table is 262 MB, the Q8_0 rows kept instead 70 MB:
  // filling the table only to give it back raised the INT8 tier's peak by it.
  const std::optional<GPT::RowFormat> kept = kept_embedding_format(f, c, to_int8 || all_q4, model->device());

  // The fp32 tensors (every one, or all but the 4-bit matmul weights), one
  // at a time, a few rows at a time. Each tensor's rows (ggml's: ne[0]
  // elements; a vector is one row) go to piece_row's rows of its slice.
  std::vector<float> buf;
  for (const Entry& e : entries) {
    const io::GgufTensorInfo* t = f.find_tensor(e.name);
    if (t == nullptr) continue;
    if (all_q4 && e.matrix >= 0) continue;  // into the int4 matrices below
    if (to_int8 && e.matrix >= 0 && (e.matrix < 4 * L || !c.gpt2())) continue;  // into the INT8 matrices below
    if (kept && e.id == kWte && e.matrix < 0) continue;  // token_embd: kept as the file's rows below
    if (c.gpt2() && e.matrix == 4 * L) {
      // GPT-2's output layer is wte: a copy at the same precision that
      // differs is another model; one at another precision (the matrices',
      // beside an F32 wte) is the tied head again.
      const io::GgufTensorInfo* embd = f.find_tensor("token_embd.weight");
      if (t->type == embd->type) {
        // 4 MB at a time, each piece's pages given back once compared.
        const std::span<const uint8_t> x = f.tensor_bytes(*t), y = f.tensor_bytes(*embd);
        constexpr size_t kPiece = size_t{4} << 20;
        for (size_t at = 0; at < x.size(); at += kPiece) {
          const size_t n = std::min(kPiece, x.size() - at);
          const bool same = std::memcmp(x.data() + at, y.data() + at, n) == 0;
          f.drop_range(x.data() + at, n);
          f.drop_range(y.data() + at, n);
          if (!same)
            return Status::InvalidArgument(fmt::format(
                "{}: 'output.weight' differs from 'token_embd.weight' (Tessera's GPT-2 ties them)", path));
        }
      }
      continue;
    }
    const int64_t cols = t->ne[0];
    const bool vector = e.shape.size() == 1;
    float* dst = slice_of(a, e, L);
    Status st = each_rows(f, *t, &buf, [&](int64_t r0, int64_t n, const float* in) -> Status {
      for (int64_t r = r0; r < r0 + n; r++) {
        float* out = dst + (vector ? 0 : piece_row(c, e, r) * cols);
        const float* row = in + (r - r0) * cols;
        if (vector && e.kind != Entry::kPlain) {  // a qwen2 query or key bias: an element a row
          for (int64_t i = 0; i < cols; i++) out[piece_row(c, e, i)] = row[i];
        } else if (e.kind == Entry::kOCols) {
          for (int64_t col = 0; col < cols; col++) out[piece_col(c, e, col)] = row[col];
        } else {
          std::copy_n(row, cols, out);
        }
      }
      return Status::OK();
    });
    RETURN_IF_ERROR(st);
  }
  if (!on_host) RETURN_IF_ERROR(model->params().try_copy_from(host_arena).With("uploading the weights"));
  if (to_int8) {
    // Matrix k from its tensors: each quantized whole (per output row, so
    // the codes are those of quantizing the assembled matrix), then its rows
    // moved as above; the head from the tied embeddings, or output.weight
    // and zero padding rows.
    std::vector<float> moved;
    std::vector<int8_t> codes;
    std::vector<float> scales;
    Status st = model->load_int8([&](int k, int OC, int K, int8_t* w, float* scale) -> Status {
      if (k == 4 * L && c.tied_head) {
        // From the file's embedding rows (the fp32 table may not be filled),
        // each quantized as the table's row is, then the padding rows.
        const io::GgufTensorInfo* embd = f.find_tensor("token_embd.weight");
        RETURN_IF_ERROR(each_rows(f, *embd, &buf, [&](int64_t r0, int64_t n, const float* in) {
          model->quantize_matrix_int8(in, static_cast<int>(n), K, w + r0 * K, scale + r0);
          return Status::OK();
        }));
        moved.assign(static_cast<size_t>(OC - c.vocab) * K, 0.0f);
        model->quantize_matrix_int8(moved.data(), OC - c.vocab, K, w + int64_t{c.vocab} * K, scale + c.vocab);
        return Status::OK();
      }
      int64_t filled = 0;
      for (const Entry& e : entries) {
        if (e.matrix != k) continue;
        const io::GgufTensorInfo* t = f.find_tensor(e.name);
        if (t == nullptr) return Status::Internal(fmt::format("tensor '{}' went missing", e.name));
        const int64_t cols = e.shape[1];
        RETURN_IF_ERROR(each_rows(f, *t, &buf, [&](int64_t r0, int64_t n, const float* in) -> Status {
          in = in_model_columns(c, e, in, n, cols, &moved);
          codes.resize(static_cast<size_t>(n * cols));
          scales.resize(static_cast<size_t>(n));
          model->quantize_matrix_int8(in, static_cast<int>(n), static_cast<int>(cols), codes.data(), scales.data());
          for (int64_t r = 0; r < n; r++) {
            const int64_t o = e.row0 + piece_row(c, e, r0 + r);
            std::copy_n(codes.data() + r * cols, cols, w + o * K);
            scale[o] = scales[r];
          }
          return Status::OK();
        }));
        filled += e.shape[0];
      }
      if (filled != OC && k < 4 * L)
        return Status::Internal(fmt::format("INT8 matrix {}: {} of its {} rows in the file's tensors", k, filled, OC));
      if (filled < OC) {
        // The head's padding rows (Vp - V): zeros, quantized as zeros are.
        moved.assign(static_cast<size_t>(OC - filled) * K, 0.0f);
        model->quantize_matrix_int8(moved.data(), static_cast<int>(OC - filled), K, w + filled * K, scale + filled);
      }
      return Status::OK();
    });
    if (!st.ok()) return st.With(path);
    if (kept) RETURN_IF_ERROR(keep_quantized_embeddings(f, *model, *kept));
    return model;
  }
  if (!all_q4) return model;

  // The int4 matrices from the file's blocks, rows moved as above; columns
  // of a grouped-query attention projection moved in whole blocks where
  // the head size allows, else gathered at run time (in_perm).
  const int64_t hs = c.hs(), KV = c.kv(), G = c.heads / KV;
  q4::Type head_type = q4_of(matrix_type.begin()->second);
  std::vector<float> moved;
  Status st = model->load_q4([&](int k, int OC, int K, GPT::Q4Matrix* m) -> Status {
    m->type = k < 4 * L ? q4_of(matrix_type.at(k)) : head_type;
    const int64_t rb = q4::row_bytes(m->type, K);
    m->w.assign(static_cast<size_t>(OC) * rb, 0);
    bool filled = false;
    for (const Entry& e : entries) {
      if (e.matrix != k) continue;
      const io::GgufTensorInfo* t = f.find_tensor(e.name);
      if (t == nullptr) continue;
      if (k == 4 * L && !is_q4(t->type)) break;  // an fp32/Q8_0/Q6_K/... head: quantized below
      if (k < 4 * L && t->type != ggml_of(m->type)) {
        // A Q6_K (Q5_K, ...) tensor of a mixed file: its values quantized to the
        // matrix's type a row at a time, columns moved as the INT8 tier
        // moves them (so no in_perm).
        const int64_t cols = e.shape[1];
        RETURN_IF_ERROR(each_rows(f, *t, &buf, [&](int64_t r0, int64_t n, const float* in) -> Status {
          in = in_model_columns(c, e, in, n, cols, &moved);
          for (int64_t r = 0; r < n; r++)
            q4::quantize_rows(m->type, m->w.data() + (e.row0 + piece_row(c, e, r0 + r)) * rb, in + r * cols, 1, K);
          return Status::OK();
        }));
        filled = true;
        continue;
      }
      if (k == 4 * L) m->type = q4_of(t->type);
      const int64_t frb = q4::row_bytes(m->type, K);
      if (k == 4 * L && frb != rb) m->w.assign(static_cast<size_t>(OC) * frb, 0);
      const std::span<const uint8_t> bytes = f.tensor_bytes(*t);
      const int64_t be = q4::block_elems(m->type), bb = q4::block_bytes(m->type);
      const bool move_blocks = e.kind == Entry::kOCols && G > 1 && hs % be == 0;
      if (e.kind == Entry::kOCols && G > 1 && !move_blocks) {
        m->in_perm.resize(K);
        for (int64_t col = 0; col < K; col++) m->in_perm[col] = static_cast<int32_t>(piece_col(c, e, col));
      }
      for (int64_t r = 0; r < e.shape[0]; r++) {
        uint8_t* out = m->w.data() + (e.row0 + piece_row(c, e, r)) * frb;
        const uint8_t* in = bytes.data() + r * frb;
        if (!move_blocks) {
          std::memcpy(out, in, frb);
        } else {
          for (int64_t b = 0; b < K / be; b++)
            std::memcpy(out + piece_col(c, e, b * be) / be * bb, in + b * bb, bb);
        }
      }
      f.drop_tensor_pages(*t);  // copied: the mapping's pages need not stay beside the copy
      filled = true;
    }
    if (filled) return Status::OK();
    // The head with no 4-bit tensor of its own: the tied embeddings' blocks
    // when token_embd is 4-bit, else the fp32 rows quantized.
    const io::GgufTensorInfo* embd = f.find_tensor("token_embd.weight");
    if (c.tied_head && is_q4(embd->type) && q4::fits(q4_of(embd->type), K)) {
      m->type = q4_of(embd->type);
      m->w.assign(static_cast<size_t>(OC) * q4::row_bytes(m->type, K), 0);
      std::memcpy(m->w.data(), f.tensor_bytes(*embd).data(), f.tensor_bytes(*embd).size());
      f.drop_tensor_pages(*embd);
      return Status::OK();
    }
    // The untied head was skipped above, and the tied one is the
    // embeddings (whose fp32 table may not be filled): the file's rows,
    // then the padding rows (past the file's) from zeros. A Q6_K head (what
    // llama-quantize writes for Q4_0 and Q4_K files) becomes Q4_K, the
    // better of the two 4-bit types, whatever the matrices are.
    const io::GgufTensorInfo* head = f.find_tensor(c.tied_head ? "token_embd.weight" : "output.weight");
    if (requantized(head->type)) m->type = q4::Type::kQ4_K;
    if (!q4::fits(m->type, K)) m->type = q4::Type::kQ4_0;
    m->w.assign(static_cast<size_t>(OC) * q4::row_bytes(m->type, K), 0);
    const int64_t hrb = q4::row_bytes(m->type, K);
    RETURN_IF_ERROR(each_rows(f, *head, &buf, [&](int64_t r0, int64_t n, const float* in) {
      q4::quantize_rows(m->type, m->w.data() + r0 * hrb, in, n, K);
      return Status::OK();
    }));
    const int64_t file_rows = head->ne[1];
    buf.assign(static_cast<size_t>(OC - file_rows) * K, 0.0f);
    q4::quantize_rows(m->type, m->w.data() + file_rows * hrb, buf.data(), OC - file_rows, K);
    return Status::OK();
  });
  if (!st.ok()) return st.With(path);
  if (kept) RETURN_IF_ERROR(keep_quantized_embeddings(f, *model, *kept));
  return model;
}

Status save_gguf(const GPT& model, const std::string& path, GgufWeights weights,
                 const std::function<Status(io::GgufWriter&)>& metadata) {
  const DecoderConfig& c = model.config();
  if (!model.whole()) return Status::InvalidArgument("save_gguf: a whole model (one rank's shard is not a file)");
  if (model.fp32_matmul_weights_released())
    return Status::InvalidArgument(
        "save_gguf: the model's fp32 matmul weights were released or never loaded (write GGUF from the fp32 model)");
  if (model.device() != Device::kCPU) return Status::InvalidArgument("save_gguf: a model on the CPU");
  if (!c.gpt2() && !(c.norm == Norm::kRMSNorm && c.positions == Positions::kRope && c.mlp == Mlp::kSwiGLU && !c.bias))
    return Status::InvalidArgument(fmt::format(
        "save_gguf: {} is neither GPT-2 nor a Llama without biases or with q, k and v biases only (GGUF's gpt2, "
        "llama and qwen2 architectures)",
        c.str()));
  const std::string arch = c.gpt2() ? "gpt2" : c.qkv_bias ? "qwen2" : "llama";
  io::GgufWriter w;
  w.set_string("general.architecture", arch);
  w.set_string("general.name", fmt::format("tessera {}", c.str()));
  // llama.cpp's llama_ftype: ALL_F32 0, MOSTLY_F16 1, MOSTLY_Q4_0 2,
  // MOSTLY_Q8_0 7, MOSTLY_Q4_K_S 14.
  const uint32_t ftype[] = {0, 1, 7, 2, 14};
  w.set_uint32("general.file_type", ftype[static_cast<int>(weights)]);
  if (weights != GgufWeights::kF32 && weights != GgufWeights::kF16) w.set_uint32("general.quantization_version", 2);
  auto key = [&](const char* k) { return arch + "." + k; };
  w.set_uint32(key("context_length"), c.context);
  w.set_uint32(key("embedding_length"), c.channels);
  w.set_uint32(key("feed_forward_length"), c.ffn());
  w.set_uint32(key("block_count"), c.layers);
  w.set_uint32(key("attention.head_count"), c.heads);
  if (c.gpt2()) {
    w.set_float32(key("attention.layer_norm_epsilon"), 1e-5f);
  } else {
    w.set_uint32(key("attention.head_count_kv"), c.kv());
    w.set_uint32(key("attention.key_length"), c.hs());
    w.set_uint32(key("attention.value_length"), c.hs());
    w.set_uint32(key("rope.dimension_count"), c.hs());
    w.set_float32(key("rope.freq_base"), static_cast<float>(c.rope_theta));
    w.set_float32(key("attention.layer_norm_rms_epsilon"), c.norm_eps);
    w.set_uint32(key("vocab_size"), c.vocab);
    if (c.rope_scaling.kind == RopeScaling::Kind::kLinear) {
      w.set_string(key("rope.scaling.type"), "linear");
      w.set_float32(key("rope.scaling.factor"), static_cast<float>(c.rope_scaling.factor));
    }
  }
  if (metadata) RETURN_IF_ERROR(metadata(w));
  if (const std::vector<float> factors = c.llama3_rope_factors(); !factors.empty()) {
    // As llama.cpp's converter writes Llama 3's scaling: the divisors alone,
    // no rope.scaling metadata (llama3_scaling reads them back).
    std::vector<uint8_t> bytes(factors.size() * sizeof(float));
    std::memcpy(bytes.data(), factors.data(), bytes.size());
    w.add_tensor("rope_freqs.weight", GgmlType::kF32, {static_cast<int64_t>(factors.size())}, std::move(bytes));
  }

  const Arena& a = model.params();
  const int L = c.layers;
  for (const Entry& e : entries_of(c)) {
    const int64_t rows = e.shape[0], cols = e.shape.size() == 2 ? e.shape[1] : 1;
    // Matmul weights in the requested type; norms, biases and learned
    // positions in F32. The embeddings: F32, except in Q8_0 files, where
    // they are Q8_0 as llama.cpp's converter writes them (the INT8 tier
    // keeps those rows, a quarter of the fp32 table), and a tied Llama's,
    // which are also its output layer.
    const bool matrix = e.matrix >= 0 || (e.id == kWte && !c.gpt2() && c.tied_head) ||
                        (e.id == kWte && weights == GgufWeights::kQ8_0);
    GgmlType type = GgmlType::kF32;
    if (matrix) {
      switch (weights) {
        case GgufWeights::kF32: type = GgmlType::kF32; break;
        case GgufWeights::kF16: type = GgmlType::kF16; break;
        case GgufWeights::kQ8_0: type = cols % 32 == 0 ? GgmlType::kQ8_0 : GgmlType::kF16; break;
        case GgufWeights::kQ4_0:
        case GgufWeights::kQ4_K: {
          const q4::Type want = weights == GgufWeights::kQ4_K ? q4::Type::kQ4_K : q4::Type::kQ4_0;
          type = q4::fits(want, cols) ? ggml_of(want) : q4::fits(q4::Type::kQ4_0, cols) ? GgmlType::kQ4_0 : GgmlType::kF16;
          break;
        }
      }
    }
    std::vector<int64_t> ne(e.shape.rbegin(), e.shape.rend());
    const Entry entry = e;
    w.add_tensor(e.name, type, ne, [&a, entry, rows, cols, type, &c, L](std::span<uint8_t> out) -> Status {
      // The tensor in file order, fp32: each file row from its piece row.
      std::vector<float> x(static_cast<size_t>(rows * cols));
      const float* src = slice_of(a, entry, L);
      for (int64_t r = 0; r < rows; r++) {
        const float* in = src + piece_row(c, entry, r) * cols;
        float* dst = x.data() + r * cols;
        if (entry.kind == Entry::kOCols) {
          for (int64_t col = 0; col < cols; col++) dst[col] = in[piece_col(c, entry, col)];
        } else {
          std::copy_n(in, cols, dst);
        }
      }
      switch (type) {
        case GgmlType::kF32: std::memcpy(out.data(), x.data(), out.size()); break;
        case GgmlType::kF16:
          for (size_t i = 0; i < x.size(); i++) {
            const uint16_t h = q4::f32_to_fp16(x[i]);
            std::memcpy(out.data() + 2 * i, &h, 2);
          }
          break;
        case GgmlType::kQ8_0: quantize_q8_0(x.data(), static_cast<int64_t>(x.size()), out.data()); break;
        default: q4::quantize_rows(q4_of(type), out.data(), x.data(), rows, cols); break;
      }
      return Status::OK();
    });
  }
  return w.write(path);
}

}  // namespace tessera
