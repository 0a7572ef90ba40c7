#include "data/tokenizer.h"

#include <unicode/uchar.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/check.h"
#include "data/bpe.h"
#include "data/char_class.h"
#include "data/gguf_vocab.h"
#include "data/hf_tokenizer.h"

namespace tessera::data {

namespace fs = std::filesystem;

namespace {

// ---- Characters --------------------------------------------------------------

CharClass classify_icu(UChar32 cp) {
  if (u_isUWhiteSpace(cp)) return CharClass::kSpace;  // Unicode White_Space, as \s
  switch (u_charType(cp)) {
    case U_UPPERCASE_LETTER:
    case U_LOWERCASE_LETTER:
    case U_TITLECASE_LETTER:
    case U_MODIFIER_LETTER:
    case U_OTHER_LETTER:
      return CharClass::kLetter;
    case U_DECIMAL_DIGIT_NUMBER:
    case U_LETTER_NUMBER:
    case U_OTHER_NUMBER:
      return CharClass::kNumber;
    default:
      return CharClass::kOther;
  }
}

// ICU answers for the Basic Multilingual Plane, looked up once (64 KiB):
// nearly all text stays in it and a table load is cheaper than an ICU call.
CharClass classify(UChar32 cp) {
  static const std::vector<CharClass> bmp = [] {
    std::vector<CharClass> t(0x10000);
    for (UChar32 c = 0; c < 0x10000; c++) t[c] = classify_icu(c);
    return t;
  }();
  return cp < 0x10000 ? bmp[cp] : classify_icu(cp);
}

}  // namespace

Char char_at(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<uint8_t>(s[k]); };
  const uint8_t b0 = b(i);
  if (b0 < 0x80) return {classify(b0), 1};
  const size_t left = s.size() - i;
  const auto cont = [&](size_t k) { return (b(k) & 0xC0) == 0x80; };
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    if (left >= 2 && cont(i + 1)) return {classify(((b0 & 0x1F) << 6) | (b(i + 1) & 0x3F)), 2};
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    if (left >= 3 && cont(i + 1) && cont(i + 2)) {
      const uint8_t b1 = b(i + 1);
      const bool ok = (b0 == 0xE0) ? b1 >= 0xA0 : (b0 == 0xED) ? b1 <= 0x9F : true;  // overlong; surrogates
      if (ok) return {classify(((b0 & 0x0F) << 12) | ((b1 & 0x3F) << 6) | (b(i + 2) & 0x3F)), 3};
    }
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    if (left >= 4 && cont(i + 1) && cont(i + 2) && cont(i + 3)) {
      const uint8_t b1 = b(i + 1);
      const bool ok = (b0 == 0xF0) ? b1 >= 0x90 : (b0 == 0xF4) ? b1 <= 0x8F : true;  // overlong; > U+10FFFF
      if (ok)
        return {classify(((b0 & 0x07) << 18) | ((b1 & 0x3F) << 12) | ((b(i + 2) & 0x3F) << 6) | (b(i + 3) & 0x3F)),
                4};
    }
  }
  return {CharClass::kOther, 1};
}

namespace {

// The end (byte offset) of the pre-token that starts at s[i], i < s.size():
// the match of GPT-2's pattern at i, alternatives tried in order,
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
size_t pretoken_end(std::string_view s, size_t i) {
  const size_t n = s.size();
  // 's 't 're 've 'm 'll 'd (ASCII, case-sensitive).
  if (s[i] == '\'' && i + 1 < n) {
    const char c = s[i + 1];
    if (c == 's' || c == 't' || c == 'm' || c == 'd') return i + 2;
    if (i + 2 < n) {
      const std::string_view two = s.substr(i + 1, 2);
      if (two == "re" || two == "ve" || two == "ll") return i + 3;
    }
  }
  // ' ?X+' for X in letters, numbers, other: an optional U+0020, then a run
  // of one class. Only the class of the first character after the optional
  // space matters, since the three alternatives' classes are disjoint.
  size_t start = i;
  Char first = char_at(s, i);
  if (s[i] == ' ' && i + 1 < n) {
    const Char next = char_at(s, i + 1);
    if (next.cls != CharClass::kSpace) {
      start = i + 1;
      first = next;
    }
  }
  if (first.cls != CharClass::kSpace) {
    size_t end = start + first.len;
    while (end < n) {
      const Char c = char_at(s, end);
      if (c.cls != first.cls) break;
      end += c.len;
    }
    return end;
  }
  // Whitespace. \s+(?!\S): the whole run if it reaches the end of the text;
  // otherwise (a non-space follows) the run less its last character, when
  // that leaves at least one. Failing that, \s+ takes the one character.
  size_t end = i + first.len, last_start = i;
  while (end < n) {
    const Char c = char_at(s, end);
    if (c.cls != CharClass::kSpace) break;
    last_start = end;
    end += c.len;
  }
  if (end == n) return end;
  return last_start > i ? last_start : end;
}

// ---- GPT-2 vocabulary files --------------------------------------------------

// GPT-2's bytes_to_unicode(): printable Latin-1 bytes stand for themselves,
// the other 68 bytes for U+0100.. in byte order, so every token is printable.
std::array<char32_t, 256> bytes_to_unicode() {
  std::array<char32_t, 256> map{};
  char32_t next = 256;
  for (int b = 0; b < 256; b++) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    map[b] = printable ? static_cast<char32_t>(b) : next++;
  }
  return map;
}

std::string utf8_of(char32_t cp) {
  std::string out;
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    // bytes_to_unicode uses only U+0000..U+0143, so two bytes suffice there;
    // three are here for completeness.
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return out;
}

Result<std::string> read_vocab_file(const fs::path& path) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec))
    return Status::NotFound(fmt::format(
        "{}: not found; run scripts/fetch-data.sh to fetch the GPT-2 vocabulary, or pass --vocab DIR",
        path.string()));
  std::ifstream in(path, std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) return Status::IOError(fmt::format("{}: cannot read", path.string()));
  return text;
}

// A vocabulary key (the bytes_to_unicode form, UTF-8) -> the bytes it
// stands for; false if it holds a character outside that alphabet.
bool key_to_bytes(std::string_view key, const std::unordered_map<std::string, uint8_t>& unicode_to_byte,
                  std::string& bytes) {
  bytes.clear();
  for (size_t i = 0; i < key.size();) {
    const int len = char_at(key, i).len;  // keys are valid UTF-8 (nlohmann checks)
    auto it = unicode_to_byte.find(std::string(key.substr(i, len)));
    if (it == unicode_to_byte.end()) return false;
    bytes += static_cast<char>(it->second);
    i += len;
  }
  return !bytes.empty();
}

}  // namespace

// ---- ByteTokenizer ----------------------------------------------------------

std::vector<uint32_t> ByteTokenizer::encode(std::string_view text) const {
  std::vector<uint32_t> out(text.size());
  for (size_t i = 0; i < text.size(); i++) {
    const uint8_t ch = static_cast<uint8_t>(text[i]);
    out[i] = ch == 0 ? uint32_t{' '} : ch;  // 0 is end-of-text only
  }
  return out;
}

std::string ByteTokenizer::decode(std::span<const uint32_t> tokens) const {
  std::string out(tokens.size(), '\0');
  for (size_t i = 0; i < tokens.size(); i++) {
    CHECK(tokens[i] < 256);
    out[i] = static_cast<char>(tokens[i]);
  }
  return out;
}

std::string ByteTokenizer::decode_token(uint32_t token) const {
  CHECK(token < 256);
  return std::string(1, static_cast<char>(token));
}

// ---- Gpt2Tokenizer ----------------------------------------------------------

Result<std::unique_ptr<Gpt2Tokenizer>> Gpt2Tokenizer::load(const std::string& dir) {
  const fs::path encoder_path = fs::path(dir) / "encoder.json";
  const fs::path merges_path = fs::path(dir) / "vocab.bpe";
  ASSIGN_OR_RETURN(std::string encoder_text, read_vocab_file(encoder_path));
  ASSIGN_OR_RETURN(std::string merges_text, read_vocab_file(merges_path));
  const std::string enc_name = encoder_path.string(), bpe_name = merges_path.string();

  nlohmann::json encoder;
  try {
    encoder = nlohmann::json::parse(encoder_text);
  } catch (const nlohmann::json::parse_error& e) {
    return Status::Corruption(fmt::format("{}: malformed JSON: {}", enc_name, e.what()));
  }
  if (!encoder.is_object())
    return Status::Corruption(fmt::format("{}: expected a JSON object of token -> id", enc_name));
  if (encoder.size() != kVocabSize)
    return Status::Corruption(
        fmt::format("{}: vocabulary has {} tokens, expected {} (GPT-2)", enc_name, encoder.size(), kVocabSize));

  std::unordered_map<std::string, uint8_t> unicode_to_byte;
  const std::array<char32_t, 256> byte_unicode = bytes_to_unicode();
  for (int b = 0; b < 256; b++) unicode_to_byte[utf8_of(byte_unicode[b])] = static_cast<uint8_t>(b);

  std::unique_ptr<Gpt2Tokenizer> tok(new Gpt2Tokenizer());
  tok->token_bytes_.assign(kVocabSize, std::string());
  std::vector<bool> seen(kVocabSize, false);
  std::unordered_map<std::string, uint16_t> key_id;  // vocabulary key -> id, for vocab.bpe
  key_id.reserve(kVocabSize);
  std::string bytes;
  for (const auto& [key, value] : encoder.items()) {
    if (!value.is_number_integer() || value.get<int64_t>() < 0 || value.get<int64_t>() >= kVocabSize)
      return Status::Corruption(
          fmt::format("{}: token '{}' has id {}, expected an integer in [0, {})", enc_name, key, value.dump(), kVocabSize));
    const int id = value.get<int>();
    if (seen[id]) return Status::Corruption(fmt::format("{}: id {} is given to two tokens", enc_name, id));
    seen[id] = true;
    if (!key_to_bytes(key, unicode_to_byte, bytes))
      return Status::Corruption(
          fmt::format("{}: token '{}' is not in GPT-2's byte-to-unicode alphabet", enc_name, key));
    tok->token_bytes_[id] = bytes;
    key_id.emplace(key, static_cast<uint16_t>(id));
  }
  if (tok->token_bytes_[kEndOfText] != kEndOfTextText)
    return Status::Corruption(fmt::format("{}: id {} is not {}", enc_name, kEndOfText, kEndOfTextText));
  for (int b = 0; b < 256; b++) {
    auto it = key_id.find(utf8_of(byte_unicode[b]));
    if (it == key_id.end())
      return Status::Corruption(fmt::format("{}: no token for byte {}", enc_name, b));
    tok->byte_token_[b] = it->second;
  }

  // vocab.bpe: "#version: ..." then one merge per line, "left right", in rank
  // order. The BPE in bpe() relies on a merge's parts being single bytes or
  // made by earlier merges (true of any learned merge list), which is checked
  // here: it makes merging by a priority queue give exactly the result of
  // OpenAI's merge-lowest-rank-pair-everywhere loop.
  std::vector<int32_t> made_at(kVocabSize, -1);  // id -> rank of the merge that makes it
  for (int b = 0; b < 256; b++) made_at[tok->byte_token_[b]] = -2;  // bytes: before every merge
  const int expected_merges = kVocabSize - 256 - 1;  // every other token but end-of-text
  tok->merges_.reserve(expected_merges * 2);
  int32_t rank = 0;
  size_t pos = 0;
  int line_no = 0;
  while (pos < merges_text.size()) {
    size_t eol = merges_text.find('\n', pos);
    if (eol == std::string::npos) eol = merges_text.size();
    std::string_view line(merges_text.data() + pos, eol - pos);
    pos = eol + 1;
    line_no++;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line_no == 1 && line.starts_with("#")) continue;
    if (line.empty()) {
      if (pos >= merges_text.size()) break;  // the final newline
      return Status::Corruption(fmt::format("{} line {}: empty line", bpe_name, line_no));
    }
    const size_t sp = line.find(' ');
    if (sp == std::string_view::npos || sp == 0 || sp + 1 == line.size() ||
        line.find(' ', sp + 1) != std::string_view::npos)
      return Status::Corruption(
          fmt::format("{} line {}: expected two tokens separated by one space", bpe_name, line_no));
    const std::string left(line.substr(0, sp)), right(line.substr(sp + 1));
    auto l = key_id.find(left), r = key_id.find(right), m = key_id.find(left + right);
    if (l == key_id.end() || r == key_id.end() || m == key_id.end())
      return Status::Corruption(fmt::format("{} line {}: '{}', '{}' or '{}' is not in encoder.json", bpe_name,
                                            line_no, left, right, left + right));
    if (made_at[l->second] == -1 || made_at[r->second] == -1)
      return Status::Corruption(fmt::format("{} line {}: '{}' or '{}' is not made by an earlier merge", bpe_name,
                                            line_no, left, right));
    if (made_at[m->second] != -1)
      return Status::Corruption(fmt::format("{} line {}: '{}' is made twice", bpe_name, line_no, left + right));
    made_at[m->second] = rank;
    tok->merges_.emplace(pair_key(l->second, r->second), Merge{rank, m->second});
    rank++;
  }
  if (rank != expected_merges)
    return Status::Corruption(fmt::format("{}: {} merges, expected {} (GPT-2)", bpe_name, rank, expected_merges));
  return tok;
}

// Working buffers of one encode call, reused from word to word.
struct Gpt2Tokenizer::Scratch : BpeScratch {};

void Gpt2Tokenizer::bpe(std::string_view word, Scratch& s, std::vector<uint32_t>& out) const {
  if (word.size() == 1) {
    out.push_back(byte_token_[static_cast<uint8_t>(word[0])]);
    return;
  }
  s.token.resize(word.size());
  for (size_t i = 0; i < word.size(); i++) s.token[i] = byte_token_[static_cast<uint8_t>(word[i])];
  bpe_merge(s, [&](uint32_t left, uint32_t right) -> const Merge* {
    auto it = merges_.find(pair_key(static_cast<uint16_t>(left), static_cast<uint16_t>(right)));
    return it == merges_.end() ? nullptr : &it->second;
  }, out);
}

void Gpt2Tokenizer::encode_into(std::string_view text, Scratch& scratch, std::vector<uint32_t>& out) const {
  for (size_t i = 0; i < text.size();) {
    const size_t end = pretoken_end(text, i);
    bpe(text.substr(i, end - i), scratch, out);
    i = end;
  }
}

std::vector<uint32_t> Gpt2Tokenizer::encode(std::string_view text) const {
  std::vector<uint32_t> out;
  out.reserve(text.size() / 4 + 16);
  Scratch scratch;
  encode_into(text, scratch, out);
  return out;
}

std::vector<uint32_t> Gpt2Tokenizer::encode_with_special(std::string_view text) const {
  std::vector<uint32_t> out;
  out.reserve(text.size() / 4 + 16);
  Scratch scratch;
  for (;;) {
    const size_t at = text.find(kEndOfTextText);
    encode_into(text.substr(0, at), scratch, out);
    if (at == std::string_view::npos) break;
    out.push_back(kEndOfText);
    text.remove_prefix(at + kEndOfTextText.size());
  }
  return out;
}

std::string Gpt2Tokenizer::decode(std::span<const uint32_t> tokens) const {
  std::string out;
  for (uint32_t t : tokens) {
    CHECK(t < kVocabSize);
    out += token_bytes_[t];
  }
  return out;
}

std::string Gpt2Tokenizer::decode_token(uint32_t token) const {
  CHECK(token < kVocabSize);
  return token_bytes_[token];
}

// ---- Factory ------------------------------------------------------------------

Result<std::unique_ptr<Tokenizer>> make_tokenizer(const std::string& name, const std::string& vocab_dir) {
  if (name == "byte") return std::unique_ptr<Tokenizer>(new ByteTokenizer());
  if (name == "gpt2") {
    ASSIGN_OR_RETURN(std::unique_ptr<Gpt2Tokenizer> tok,
                     Gpt2Tokenizer::load(vocab_dir.empty() ? std::string("data/raw/gpt2") : vocab_dir));
    return std::unique_ptr<Tokenizer>(std::move(tok));
  }
  std::error_code ec;
  if (name.ends_with(".gguf") && fs::is_regular_file(name, ec)) {
    // A GGUF file's own vocabulary (data/gguf_vocab.h).
    ASSIGN_OR_RETURN(io::GgufFile f, io::GgufFile::open(name));
    ASSIGN_OR_RETURN(std::unique_ptr<HfTokenizer> tok, gguf_tokenizer(f));
    return std::unique_ptr<Tokenizer>(std::move(tok));
  }
  if (name.find('/') != std::string::npos || name.ends_with(".json") || fs::exists(name, ec)) {
    ASSIGN_OR_RETURN(std::unique_ptr<HfTokenizer> tok, HfTokenizer::load(name));
    return std::unique_ptr<Tokenizer>(std::move(tok));
  }
  return Status::InvalidArgument(fmt::format(
      "unknown tokenizer '{}'; expected 'byte', 'gpt2', or the path of a tokenizer.json or of its folder", name));
}

}  // namespace tessera::data
