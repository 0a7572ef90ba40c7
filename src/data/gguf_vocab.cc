#include "data/gguf_vocab.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <tuple>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/try.h"
#include "io/file.h"
#include "io/json_guard.h"

namespace tessera::data {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// llama.cpp's token types.
constexpr int32_t kNormal = 1, kControl = 3, kUserDefined = 4;

// The pre-tokenizers of the tokenizer.ggml.pre names this reader knows, as
// Hugging Face's tokenizer.json holds them (Llama 3's and Qwen2's patterns
// are those files' own).
constexpr const char* kLlama3Pattern =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
    "\\s+(?!\\S)|\\s+";
constexpr const char* kQwen2Pattern =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
    "\\s+(?!\\S)|\\s+";

json split_then_bytes(const char* pattern) {
  return {{"type", "Sequence"},
          {"pretokenizers",
           json::array({{{"type", "Split"}, {"pattern", {{"Regex", pattern}}}, {"behavior", "Isolated"}, {"invert", false}},
                        {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}}})}};
}

Result<std::string> read_text(const std::string& path) {
  RETURN_IF_ERROR(io::check_regular_file(path));
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::IOError(fmt::format("{}: cannot read", path));
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

Result<json> read_json(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, read_text(path));
  if (Status st = io::check_json_nesting(text, io::JsonLimits{}); !st.ok()) return st.With(path);
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return Status::Corruption(fmt::format("{}: not a JSON object", path));
  return j;
}

// Code point boundaries of UTF-8 text (byte offsets, the end included).
std::vector<size_t> char_bounds(const std::string& t) {
  std::vector<size_t> b;
  for (size_t i = 0; i < t.size(); i++)
    if ((static_cast<unsigned char>(t[i]) & 0xC0) != 0x80) b.push_back(i);
  b.push_back(t.size());
  return b;
}

// A SentencePiece vocabulary (tokenizer.ggml.model "llama": tokens, scores,
// types) as the tokenizer.json Hugging Face's LlamaConverter makes of it: a
// byte-fallback BPE whose merges are every split of each token into two
// tokens, ordered by the token's score, highest first (ties in id order;
// within a token by the pieces' ids), as transformers'
// SentencePieceExtractor orders them.
Result<std::unique_ptr<HfTokenizer>> spm_tokenizer(const io::GgufFile& f) {
  const std::string& path = f.path();
  ASSIGN_OR_RETURN(std::span<const std::string> tokens, f.get_string_array("tokenizer.ggml.tokens"));
  const size_t n = tokens.size();
  std::vector<float> scores(n, 0.0f);
  if (f.has("tokenizer.ggml.scores")) {
    ASSIGN_OR_RETURN(scores, f.get_float_array("tokenizer.ggml.scores"));
  }
  std::vector<int64_t> types(n, kNormal);
  if (f.has("tokenizer.ggml.token_type")) {
    ASSIGN_OR_RETURN(types, f.get_int_array("tokenizer.ggml.token_type"));
  }
  if (scores.size() != n || types.size() != n)
    return Status::InvalidArgument(
        fmt::format("{}: {} scores and {} token types for {} tokens", path, scores.size(), types.size(), n));
  std::map<std::string, int64_t> id;
  json vocab = json::object(), added = json::array();
  for (size_t i = 0; i < n; i++) {
    if (!id.emplace(tokens[i], i).second)
      return Status::InvalidArgument(fmt::format("{}: token {} ('{}') is in the vocabulary twice", path, i, tokens[i]));
    vocab[tokens[i]] = i;
    if (types[i] == kControl || types[i] == 2 /*unknown*/ || types[i] == kUserDefined)
      added.push_back({{"id", i}, {"content", tokens[i]}, {"single_word", false}, {"lstrip", false}, {"rstrip", false},
                       {"normalized", types[i] == kUserDefined}, {"special", types[i] != kUserDefined}});
  }
  struct Merge {
    int64_t l, r;
    float score;
  };
  std::vector<Merge> merges;
  for (size_t i = 0; i < n; i++) {
    if (types[i] != kNormal) continue;
    const std::string& t = tokens[i];
    const std::vector<size_t> b = char_bounds(t);
    std::vector<Merge> local;
    for (size_t k = 1; k + 1 < b.size(); k++) {
      auto l = id.find(t.substr(0, b[k])), r = id.find(t.substr(b[k]));
      if (l != id.end() && r != id.end()) local.push_back({l->second, r->second, scores[i]});
    }
    std::sort(local.begin(), local.end(), [](const Merge& a, const Merge& c) { return std::tie(a.l, a.r) < std::tie(c.l, c.r); });
    merges.insert(merges.end(), local.begin(), local.end());
  }
  std::stable_sort(merges.begin(), merges.end(), [](const Merge& a, const Merge& c) { return a.score > c.score; });
  json merge_list = json::array();
  for (const Merge& m : merges) merge_list.push_back(json::array({tokens[m.l], tokens[m.r]}));
  int64_t unk = 0, bos = 1, eos = 2;
  if (f.has("tokenizer.ggml.unknown_token_id")) unk = static_cast<int64_t>(*f.get_uint("tokenizer.ggml.unknown_token_id"));
  if (f.has("tokenizer.ggml.bos_token_id")) bos = static_cast<int64_t>(*f.get_uint("tokenizer.ggml.bos_token_id"));
  if (f.has("tokenizer.ggml.eos_token_id")) eos = static_cast<int64_t>(*f.get_uint("tokenizer.ggml.eos_token_id"));
  for (int64_t v : {unk, bos, eos})
    if (v < 0 || v >= static_cast<int64_t>(n))
      return Status::InvalidArgument(fmt::format("{}: a special token id {} past the {} tokens", path, v, n));
  bool add_bos = true, space_prefix = true;
  if (f.has("tokenizer.ggml.add_bos_token")) {
    ASSIGN_OR_RETURN(add_bos, f.get_bool("tokenizer.ggml.add_bos_token"));
  }
  if (f.has("tokenizer.ggml.add_space_prefix")) {
    ASSIGN_OR_RETURN(space_prefix, f.get_bool("tokenizer.ggml.add_space_prefix"));
  }
  json normalizers = json::array();
  if (space_prefix) normalizers.push_back({{"type", "Prepend"}, {"prepend", "\u2581"}});
  normalizers.push_back({{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\u2581"}});
  json decoders = json::array({{{"type", "Replace"}, {"pattern", {{"String", "\u2581"}}}, {"content", " "}},
                               {{"type", "ByteFallback"}},
                               {{"type", "Fuse"}}});
  if (space_prefix) decoders.push_back({{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}});
  json j = {{"version", "1.0"},
            {"added_tokens", added},
            {"normalizer", {{"type", "Sequence"}, {"normalizers", normalizers}}},
            {"pre_tokenizer", nullptr},
            {"decoder", {{"type", "Sequence"}, {"decoders", decoders}}},
            {"model",
             {{"type", "BPE"},
              {"dropout", nullptr},
              {"unk_token", tokens[unk]},
              {"fuse_unk", true},
              {"byte_fallback", true},
              {"ignore_merges", false},
              {"vocab", vocab},
              {"merges", merge_list}}}};
  json post = nullptr;
  if (add_bos)
    post = {{"type", "TemplateProcessing"},
            {"single", json::array({{{"SpecialToken", {{"id", tokens[bos]}, {"type_id", 0}}}},
                                    {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
            {"pair", json::array({{{"SpecialToken", {{"id", tokens[bos]}, {"type_id", 0}}}},
                                  {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
                                  {{"SpecialToken", {{"id", tokens[bos]}, {"type_id", 1}}}},
                                  {{"Sequence", {{"id", "B"}, {"type_id", 1}}}}})},
            {"special_tokens",
             {{tokens[bos], {{"id", tokens[bos]}, {"ids", json::array({bos})}, {"tokens", json::array({tokens[bos]})}}}}}};
  j["post_processor"] = post;
  json cfg = {{"eos_token", tokens[eos]}, {"bos_token", tokens[bos]}};
  return HfTokenizer::from_json(path + " (its tokenizer.ggml vocabulary)", fs::path(path).stem().string(), j.dump(),
                                path, cfg.dump());
}

// A byte-fallback BPE tokenizer.json (Llama 2's, TinyLlama's: converted
// from SentencePiece) as llama.cpp's SentencePiece vocabulary: the tokens,
// types (byte tokens <0xNN> 6, <unk> 2, special added tokens 3), and as
// scores the negated rank of the first merge that makes each token (0 for
// tokens no merge makes), which orders the merges as the file does.
Status write_spm_vocab(const fs::path& file, const json& j, io::GgufWriter& w) {
  const json& m = j["model"];
  const json& vocab = m.value("vocab", json::object());
  const int64_t n = static_cast<int64_t>(vocab.size());
  std::vector<std::string> tokens(n);
  std::vector<int32_t> types(n, kNormal);
  std::vector<float> scores(n, 0.0f);
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    if (!it->is_number_unsigned() || it->get<int64_t>() >= n)
      return Status::InvalidArgument(fmt::format("{}: vocabulary entry '{}' has no id below {}", file.string(), it.key(), n));
    tokens[it->get<size_t>()] = it.key();
  }
  std::map<std::string, int64_t> id;
  for (int64_t i = 0; i < n; i++) {
    id.emplace(tokens[i], i);
    const std::string& t = tokens[i];
    if (t.size() == 6 && t.starts_with("<0x") && t.ends_with(">")) types[i] = 6;
  }
  const std::string unk = m.value("unk_token", "");
  for (const json& t : j.value("added_tokens", json::array())) {
    const int64_t i = t.value("id", int64_t{-1});
    if (i < 0 || i >= n) continue;
    types[i] = t.value("content", "") == unk ? 2 : t.value("special", false) ? kControl : kUserDefined;
  }
  int64_t rank = 0;
  std::vector<bool> made(n, false);
  for (const json& mg : m.value("merges", json::array())) {
    std::string merged;
    if (mg.is_string()) {
      const std::string s = mg.get<std::string>();
      const size_t sp = s.find(' ');
      merged = sp == std::string::npos ? s : s.substr(0, sp) + s.substr(sp + 1);
    } else if (mg.is_array() && mg.size() == 2 && mg[0].is_string() && mg[1].is_string()) {
      merged = mg[0].get<std::string>() + mg[1].get<std::string>();
    }
    rank++;
    auto it = id.find(merged);
    if (it != id.end() && !made[it->second]) made[it->second] = true, scores[it->second] = -static_cast<float>(rank);
  }
  json cfg = json::object();
  std::error_code ec;
  if (fs::exists(file.parent_path() / "tokenizer_config.json", ec)) {
    ASSIGN_OR_RETURN(cfg, read_json((file.parent_path() / "tokenizer_config.json").string()));
  }
  auto id_of = [&](const char* key, int64_t fallback) -> int64_t {
    auto it = cfg.find(key);
    const std::string s = it == cfg.end() ? "" : it->is_string() ? it->get<std::string>() : it->is_object() ? it->value("content", "") : "";
    auto found = id.find(s);
    return found == id.end() ? fallback : found->second;
  };
  w.set_string("tokenizer.ggml.model", "llama");
  w.set_string("tokenizer.ggml.pre", "default");
  w.set_string_array("tokenizer.ggml.tokens", tokens);
  w.set_float_array("tokenizer.ggml.scores", scores);
  w.set_int32_array("tokenizer.ggml.token_type", types);
  auto unk_it = id.find(unk);
  w.set_uint32("tokenizer.ggml.unknown_token_id", static_cast<uint32_t>(unk_it == id.end() ? 0 : unk_it->second));
  w.set_uint32("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(id_of("bos_token", 1)));
  w.set_uint32("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(id_of("eos_token", 2)));
  w.set_bool("tokenizer.ggml.add_bos_token", cfg.value("add_bos_token", true));
  w.set_bool("tokenizer.ggml.add_eos_token", cfg.value("add_eos_token", false));
  return Status::OK();
}

}  // namespace

bool gguf_has_vocab(const io::GgufFile& f) { return f.has("tokenizer.ggml.model"); }

Result<std::unique_ptr<HfTokenizer>> gguf_tokenizer(const io::GgufFile& f) {
  const std::string& path = f.path();
  ASSIGN_OR_RETURN(std::string model, f.get_string("tokenizer.ggml.model"));
  if (model == "llama") return spm_tokenizer(f);
  if (model != "gpt2")
    return Status::InvalidArgument(fmt::format(
        "{}: tokenizer.ggml.model '{}' is not read (byte-level BPE 'gpt2' and SentencePiece 'llama' are; give "
        "--tokenizer a tokenizer.json)",
        path, model));
  std::string pre = "default";
  if (f.has("tokenizer.ggml.pre")) {
    ASSIGN_OR_RETURN(pre, f.get_string("tokenizer.ggml.pre"));
  }
  json pre_tokenizer, normalizer = nullptr;
  bool ignore_merges = false;
  if (pre == "default" || pre == "gpt-2" || pre == "gpt2") {
    pre_tokenizer = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}};
  } else if (pre == "llama-bpe" || pre == "llama3") {
    pre_tokenizer = split_then_bytes(kLlama3Pattern);
    ignore_merges = true;  // as Llama 3's tokenizer.json (and llama.cpp for llama-bpe)
  } else if (pre == "qwen2") {
    pre_tokenizer = split_then_bytes(kQwen2Pattern);
    normalizer = {{"type", "NFC"}};  // Qwen2's tokenizer.json normalizes (llama.cpp does not)
  } else {
    return Status::InvalidArgument(fmt::format(
        "{}: tokenizer.ggml.pre '{}' is not read (default, gpt-2, llama-bpe and qwen2 are)", path, pre));
  }
  ASSIGN_OR_RETURN(std::span<const std::string> tokens, f.get_string_array("tokenizer.ggml.tokens"));
  ASSIGN_OR_RETURN(std::span<const std::string> merges, f.get_string_array("tokenizer.ggml.merges"));
  std::vector<int64_t> types(tokens.size(), kNormal);
  if (f.has("tokenizer.ggml.token_type")) {
    ASSIGN_OR_RETURN(types, f.get_int_array("tokenizer.ggml.token_type"));
    if (types.size() != tokens.size())
      return Status::InvalidArgument(fmt::format("{}: {} token types for {} tokens", path, types.size(), tokens.size()));
  }
  json vocab = json::object(), added = json::array();
  for (size_t id = 0; id < tokens.size(); id++) {
    if (!vocab.emplace(tokens[id], id).second)
      return Status::InvalidArgument(fmt::format("{}: token {} ('{}') is in the vocabulary twice", path, id, tokens[id]));
    if (types[id] == kControl || types[id] == kUserDefined)
      added.push_back({{"id", id}, {"content", tokens[id]}, {"single_word", false}, {"lstrip", false},
                       {"rstrip", false}, {"normalized", types[id] != kControl}, {"special", types[id] == kControl}});
  }
  json merge_list = json::array();
  for (const std::string& m : merges) merge_list.push_back(m);
  json j = {{"version", "1.0"},
            {"added_tokens", added},
            {"normalizer", normalizer},
            {"pre_tokenizer", pre_tokenizer},
            {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}}},
            {"model",
             {{"type", "BPE"},
              {"dropout", nullptr},
              {"unk_token", nullptr},
              {"fuse_unk", false},
              {"byte_fallback", false},
              {"ignore_merges", ignore_merges},
              {"vocab", vocab},
              {"merges", merge_list}}}};
  // BOS first when the file says so (Llama 3's TemplateProcessing).
  auto token_of = [&](const char* key) -> Result<std::string> {
    ASSIGN_OR_RETURN(uint64_t id, f.get_uint(key));
    if (id >= tokens.size())
      return Status::InvalidArgument(fmt::format("{}: {} is {}, past the {} tokens", path, key, id, tokens.size()));
    return tokens[id];
  };
  bool add_bos = false;
  if (f.has("tokenizer.ggml.add_bos_token")) {
    ASSIGN_OR_RETURN(add_bos, f.get_bool("tokenizer.ggml.add_bos_token"));
  }
  json post = nullptr;
  if (add_bos && f.has("tokenizer.ggml.bos_token_id")) {
    ASSIGN_OR_RETURN(std::string bos, token_of("tokenizer.ggml.bos_token_id"));
    const int64_t id = static_cast<int64_t>(*f.get_uint("tokenizer.ggml.bos_token_id"));
    post = {{"type", "TemplateProcessing"},
            {"single", json::array({{{"SpecialToken", {{"id", bos}, {"type_id", 0}}}},
                                    {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
            {"pair", json::array({{{"SpecialToken", {{"id", bos}, {"type_id", 0}}}},
                                  {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
                                  {{"SpecialToken", {{"id", bos}, {"type_id", 1}}}},
                                  {{"Sequence", {{"id", "B"}, {"type_id", 1}}}}})},
            {"special_tokens", {{bos, {{"id", bos}, {"ids", json::array({id})}, {"tokens", json::array({bos})}}}}}};
  }
  j["post_processor"] = post;
  json cfg = json::object();
  if (f.has("tokenizer.ggml.eos_token_id")) {
    ASSIGN_OR_RETURN(std::string eos, token_of("tokenizer.ggml.eos_token_id"));
    cfg["eos_token"] = eos;
  }
  std::string name = fs::path(path).stem().string();
  return HfTokenizer::from_json(path + " (its tokenizer.ggml vocabulary)", name, j.dump(), path, cfg.dump());
}

Status write_gguf_vocab(const std::string& path, io::GgufWriter& w) {
  std::error_code ec;
  const fs::path dir = fs::is_directory(path, ec) ? fs::path(path) : fs::path(path).parent_path();
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  std::vector<std::string> merges;
  std::string pre = "gpt-2";  // llama.cpp's name for GPT-2's pattern
  bool add_bos = false;
  int64_t bos = -1, eos = -1;
  if (fs::exists(dir / "encoder.json", ec) && fs::exists(dir / "vocab.bpe", ec) && !fs::exists(dir / "tokenizer.json", ec)) {
    // GPT-2's vocabulary files: <|endoftext|> is its only control token.
    ASSIGN_OR_RETURN(json enc, read_json((dir / "encoder.json").string()));
    tokens.resize(enc.size());
    for (auto it = enc.begin(); it != enc.end(); ++it) {
      if (!it->is_number_unsigned() || it->get<uint64_t>() >= enc.size())
        return Status::InvalidArgument(fmt::format("{}: '{}' has no id below {}", (dir / "encoder.json").string(),
                                                   it.key(), enc.size()));
      tokens[it->get<size_t>()] = it.key();
    }
    types.assign(tokens.size(), kNormal);
    ASSIGN_OR_RETURN(std::string bpe, read_text((dir / "vocab.bpe").string()));
    size_t at = 0;
    while (at < bpe.size()) {
      size_t end = bpe.find('\n', at);
      if (end == std::string::npos) end = bpe.size();
      std::string line = bpe.substr(at, end - at);
      at = end + 1;
      if (line.empty() || line.starts_with("#version")) continue;
      merges.push_back(line);
    }
    for (size_t id = 0; id < tokens.size(); id++)
      if (tokens[id] == "<|endoftext|>") types[id] = kControl, bos = eos = static_cast<int64_t>(id);
  } else {
    const fs::path file = fs::is_directory(path, ec) ? fs::path(path) / "tokenizer.json" : fs::path(path);
    ASSIGN_OR_RETURN(json j, read_json(file.string()));
    const json& m = j.value("model", json::object());
    if (m.value("type", "") != "BPE")
      return Status::InvalidArgument(
          fmt::format("{}: only BPE vocabularies are written to GGUF (this one is {})", file.string(), m.value("type", "?")));
    if (m.value("byte_fallback", false)) return write_spm_vocab(file, j, w);
    const json& vocab = m.value("vocab", json::object());
    int64_t n = static_cast<int64_t>(vocab.size());
    for (const json& t : j.value("added_tokens", json::array())) n = std::max(n, t.value("id", int64_t{0}) + 1);
    tokens.assign(n, "");
    types.assign(n, kNormal);
    for (auto it = vocab.begin(); it != vocab.end(); ++it) {
      if (!it->is_number_unsigned() || it->get<int64_t>() >= n)
        return Status::InvalidArgument(fmt::format("{}: vocabulary entry '{}' has no id below {}", file.string(), it.key(), n));
      tokens[it->get<size_t>()] = it.key();
    }
    for (const json& t : j.value("added_tokens", json::array())) {
      const int64_t id = t.value("id", int64_t{-1});
      if (id < 0 || id >= n) return Status::InvalidArgument(fmt::format("{}: an added token without an id", file.string()));
      tokens[id] = t.value("content", "");
      types[id] = t.value("special", false) ? kControl : kUserDefined;
    }
    for (const json& mg : m.value("merges", json::array())) {
      if (mg.is_string()) merges.push_back(mg.get<std::string>());
      else if (mg.is_array() && mg.size() == 2 && mg[0].is_string() && mg[1].is_string())
        merges.push_back(mg[0].get<std::string>() + " " + mg[1].get<std::string>());
      else return Status::InvalidArgument(fmt::format("{}: a merge that is neither \"a b\" nor [a, b]", file.string()));
    }
    const std::string pre_text = j.value("pre_tokenizer", json::object()).dump();
    if (pre_text.find("\\\\p{N}{1,3}") != std::string::npos) pre = "llama-bpe";
    else if (pre_text.find("Split") != std::string::npos) pre = "qwen2";
    // BOS / EOS from tokenizer_config.json beside it.
    json cfg = json::object();
    if (fs::exists(file.parent_path() / "tokenizer_config.json", ec)) {
      ASSIGN_OR_RETURN(cfg, read_json((file.parent_path() / "tokenizer_config.json").string()));
    }
    auto id_of = [&](const char* key) -> int64_t {
      auto it = cfg.find(key);
      std::string s = it == cfg.end() ? "" : it->is_string() ? it->get<std::string>() : it->is_object() ? it->value("content", "") : "";
      for (int64_t id = 0; id < n && !s.empty(); id++)
        if (tokens[id] == s) return id;
      return -1;
    };
    bos = id_of("bos_token");
    eos = id_of("eos_token");
    add_bos = cfg.value("add_bos_token", bos >= 0 && j.value("post_processor", json()).dump().find("SpecialToken") != std::string::npos);
  }
  w.set_string("tokenizer.ggml.model", "gpt2");
  w.set_string("tokenizer.ggml.pre", pre);
  w.set_string_array("tokenizer.ggml.tokens", tokens);
  w.set_int32_array("tokenizer.ggml.token_type", types);
  w.set_string_array("tokenizer.ggml.merges", merges);
  if (bos >= 0) w.set_uint32("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(bos));
  if (eos >= 0) w.set_uint32("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(eos));
  w.set_bool("tokenizer.ggml.add_bos_token", add_bos);
  return Status::OK();
}

}  // namespace tessera::data
