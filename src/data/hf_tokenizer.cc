#include "data/hf_tokenizer.h"

#include <unicode/locid.h>
#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>
#include <unicode/regex.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>
#include <unicode/utext.h>

#include <algorithm>
#include <array>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <optional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/check.h"
#include "data/bpe.h"
#include "data/char_class.h"
#include "io/file.h"

namespace tessera::data {

namespace fs = std::filesystem;
using json = nlohmann::json;

// ---- UTF-8 -------------------------------------------------------------------

namespace {

// The length of the valid UTF-8 sequence at s[i] (1-4), or 0 with *bad set
// to the length of the maximal invalid subpart there (at least 1).
int utf8_seq(std::string_view s, size_t i, int* bad) {
  const auto b = [&](size_t k) { return static_cast<uint8_t>(s[k]); };
  const uint8_t c = b(i);
  *bad = 1;
  if (c < 0x80) return 1;
  int need;
  uint8_t lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) {
    need = 1;
  } else if (c >= 0xE0 && c <= 0xEF) {
    need = 2;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    need = 3;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  for (int k = 1; k <= need; k++) {
    if (i + k >= s.size() || b(i + k) < lo || b(i + k) > hi) {
      *bad = k;
      return 0;
    }
    lo = 0x80;
    hi = 0xBF;
  }
  return need + 1;
}

// The code point of the valid sequence of `len` bytes at p.
UChar32 utf8_decode(const char* p, int len) {
  const auto b = [&](int k) { return static_cast<uint32_t>(static_cast<uint8_t>(p[k])); };
  switch (len) {
    case 1: return static_cast<UChar32>(b(0));
    case 2: return static_cast<UChar32>(((b(0) & 0x1F) << 6) | (b(1) & 0x3F));
    case 3: return static_cast<UChar32>(((b(0) & 0x0F) << 12) | ((b(1) & 0x3F) << 6) | (b(2) & 0x3F));
    default: return static_cast<UChar32>(((b(0) & 0x07) << 18) | ((b(1) & 0x3F) << 12) | ((b(2) & 0x3F) << 6) | (b(3) & 0x3F));
  }
}

void utf8_append(std::string& out, UChar32 cp) {
  const uint32_t c = static_cast<uint32_t>(cp);
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c < 0x800) {
    out += static_cast<char>(0xC0 | (c >> 6));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += static_cast<char>(0xE0 | (c >> 12));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (c >> 18));
    out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  }
}

// Calls f(code point, byte offset, byte length) for each character of valid UTF-8.
// An invalid byte (not reached for text made valid by utf8_valid) counts as
// U+FFFD, so the walk stays in bounds on any input.
template <typename F>
void for_each_char(std::string_view s, F&& f) {
  for (size_t i = 0; i < s.size();) {
    int bad;
    const int len = utf8_seq(s, i, &bad);
    const UChar32 cp = len > 0 ? utf8_decode(s.data() + i, len) : UChar32{0xFFFD};
    const size_t step = static_cast<size_t>(len > 0 ? len : bad);
    f(cp, i, step);
    i += step;
  }
}

bool is_white_space(UChar32 c) { return u_isUWhiteSpace(c); }
bool is_word_char(UChar32 c) { return u_isalnum(c) || c == '_'; }

// GPT-2's byte <-> printable character map (bytes_to_unicode()).
struct ByteMap {
  std::array<std::string, 256> byte_to_text;  // byte -> UTF-8 of its character
  std::unordered_map<UChar32, uint8_t> char_to_byte;
  ByteMap() {
    int n = 0;
    for (int b = 0; b < 256; b++) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      const UChar32 cp = printable ? b : 256 + n++;
      utf8_append(byte_to_text[b], cp);
      char_to_byte[cp] = static_cast<uint8_t>(b);
    }
  }
};
const ByteMap& byte_map() {
  static const ByteMap m;
  return m;
}

// ---- JSON access with one-line errors ----------------------------------------

struct Ctx {
  std::string file;
  bool fast_split = true;
  Status err(const std::string& where, const std::string& what) const {
    return Status::InvalidArgument(fmt::format("{}: {}: {}", file, where, what));
  }
};

Result<std::string> get_string(const Ctx& c, const json& j, const std::string& where, const char* key,
                               std::optional<std::string> fallback = std::nullopt) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    if (fallback) return *fallback;
    return c.err(where, fmt::format("missing \"{}\"", key));
  }
  if (!it->is_string()) return c.err(where, fmt::format("\"{}\" must be a string", key));
  return it->get<std::string>();
}

Result<bool> get_bool(const Ctx& c, const json& j, const std::string& where, const char* key, bool fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) return c.err(where, fmt::format("\"{}\" must be true or false", key));
  return it->get<bool>();
}

Result<int64_t> get_uint(const Ctx& c, const json& j, const std::string& where, const char* key, int64_t fallback,
                         int64_t max) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_number_integer() || it->get<int64_t>() < 0 || it->get<int64_t>() > max)
    return c.err(where, fmt::format("\"{}\" must be an integer in [0, {}]", key, max));
  return it->get<int64_t>();
}

Result<std::string> get_type(const Ctx& c, const json& j, const std::string& where) {
  if (!j.is_object()) return c.err(where, "must be an object");
  return get_string(c, j, where, "type");
}

// ---- Regular expressions -----------------------------------------------------

// A pattern of the file, compiled by ICU. The files are written for the
// Rust crate's Oniguruma, whose \s is Unicode White_Space; ICU's \s is
// [\t\n\f\r\p{Z}] (no \v, no U+0085), so \s and \S are rewritten to the
// property. Immutable; a matcher is made per use (matchers are not shared
// between threads).
class Regex {
 public:
  static Result<std::unique_ptr<Regex>> compile(const Ctx& c, const std::string& where, const std::string& pattern) {
    std::string p;
    for (size_t i = 0; i < pattern.size(); i++) {
      if (pattern[i] == '\\' && i + 1 < pattern.size()) {
        const char e = pattern[i + 1];
        if (e == 's') {
          p += "\\p{White_Space}";
        } else if (e == 'S') {
          p += "\\P{White_Space}";
        } else {
          p += pattern[i];
          p += e;
        }
        i++;
      } else {
        p += pattern[i];
      }
    }
    UErrorCode st = U_ZERO_ERROR;
    UParseError pe;
    auto r = std::unique_ptr<Regex>(new Regex());
    r->pattern_.reset(icu::RegexPattern::compile(icu::UnicodeString::fromUTF8(p), 0, pe, st));
    if (U_FAILURE(st))
      return c.err(where, fmt::format("regular expression {} does not compile ({} at offset {})", json(pattern).dump(),
                                      u_errorName(st), pe.offset));
    return r;
  }

  // Byte ranges [start, end) of the non-empty matches in valid UTF-8 text.
  void find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& out) const {
    out.clear();
    UErrorCode st = U_ZERO_ERROR;
    UText* ut = utext_openUTF8(nullptr, text.data(), static_cast<int64_t>(text.size()), &st);
    std::unique_ptr<icu::RegexMatcher> m(pattern_->matcher(st));
    m->reset(ut);
    while (U_SUCCESS(st) && m->find(st)) {
      const int64_t s = m->start64(st), e = m->end64(st);
      if (U_FAILURE(st)) break;
      if (e > s) out.emplace_back(static_cast<size_t>(s), static_cast<size_t>(e));
    }
    m.reset();
    utext_close(ut);
    CHECK(U_SUCCESS(st));
  }

 private:
  Regex() = default;
  std::unique_ptr<icu::RegexPattern> pattern_;
};

// ---- The Llama 3 / Qwen split, without a regex engine ------------------------

// The pattern of Llama 3's and Qwen2/3's Split pre-tokenizer, with
// \p{N}{1,3} (Llama 3) or \p{N} (Qwen):
//   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
//    ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
// matched by hand, as tokenizer.cc matches GPT-2's: every character matches
// one alternative, so the matches tile the text. Exact against ICU's
// matching of the same pattern (tests/data/hf_tokenizer_test.cc) and so
// against the reference (cli.tokenizer_oracle); about 4x faster.
constexpr const char* kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kQwenPattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// The end of the match that starts at s[i] (i < s.size()).
size_t llama3_match_end(std::string_view s, size_t i, int max_digits) {
  const size_t n = s.size();
  const auto rn = [&](size_t k) { return s[k] == '\r' || s[k] == '\n'; };
  const auto lower = [&](size_t k) { return static_cast<char>(s[k] | 0x20); };  // ASCII letters only
  const auto run = [&](size_t k, CharClass cls) {
    while (k < n) {
      const Char c = char_at(s, k);
      if (c.cls != cls) break;
      k += static_cast<size_t>(c.len);
    }
    return k;
  };
  // (?i:'s|'t|'re|'ve|'m|'ll|'d): ASCII case folding, as ICU and the
  // reference match it.
  if (s[i] == '\'' && i + 1 < n) {
    const char a = lower(i + 1);
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
    if (i + 2 < n) {
      const char b = lower(i + 2);
      if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return i + 3;
    }
  }
  const Char c = char_at(s, i);
  const size_t next = i + static_cast<size_t>(c.len);
  // [^\r\n\p{L}\p{N}]?\p{L}+
  if (c.cls == CharClass::kLetter) return run(next, CharClass::kLetter);
  if (c.cls != CharClass::kNumber && !rn(i) && next < n && char_at(s, next).cls == CharClass::kLetter)
    return run(next, CharClass::kLetter);
  // \p{N}{1,3}
  if (c.cls == CharClass::kNumber) {
    size_t k = i;
    for (int d = 0; d < max_digits && k < n; d++) {
      const Char x = char_at(s, k);
      if (x.cls != CharClass::kNumber) break;
      k += static_cast<size_t>(x.len);
    }
    return k;
  }
  //  ?[^\s\p{L}\p{N}]+[\r\n]*
  {
    const size_t k = s[i] == ' ' ? i + 1 : i;
    if (k < n && char_at(s, k).cls == CharClass::kOther) {
      size_t e = run(k, CharClass::kOther);
      while (e < n && rn(e)) e++;
      return e;
    }
  }
  // c is white space: \s*[\r\n]+ ends after the run's last \r or \n;
  // \s+(?!\S) leaves the run's last character for the next match when a
  // non-space follows and the run has two or more; else \s+.
  size_t e = i, last_rn = std::string_view::npos, last_start = i;
  int count = 0;
  while (e < n) {
    const Char x = char_at(s, e);
    if (x.cls != CharClass::kSpace) break;
    last_start = e;
    e += static_cast<size_t>(x.len);
    count++;
    if (rn(last_start)) last_rn = e;
  }
  if (last_rn != std::string_view::npos) return last_rn;
  if (e == n || count == 1) return e;
  return last_start;
}

// ---- Normalizers ---------------------------------------------------------------

struct Normalizer {
  enum class Kind { kUnicode, kPrepend, kReplace, kLowercase, kStrip, kSequence };
  Kind kind;
  const icu::Normalizer2* unicode = nullptr;
  std::string text, content;          // Prepend: text; Replace: pattern -> content
  std::unique_ptr<Regex> regex;       // Replace with a Regex pattern
  bool strip_left = false, strip_right = false;
  std::vector<std::unique_ptr<Normalizer>> parts;

  void apply(std::string& s) const {
    switch (kind) {
      case Kind::kUnicode: {
        // On the UTF-8 itself: most text is already normalized, and the
        // check costs less than a conversion to UTF-16.
        UErrorCode st = U_ZERO_ERROR;
        if (unicode->isNormalizedUTF8(s, st) && U_SUCCESS(st)) return;
        st = U_ZERO_ERROR;
        std::string n;
        icu::StringByteSink<std::string> sink(&n, static_cast<int32_t>(s.size()));
        unicode->normalizeUTF8(0, s, sink, nullptr, st);
        CHECK(U_SUCCESS(st));
        s = std::move(n);
        return;
      }
      case Kind::kPrepend:
        if (!s.empty()) s.insert(0, text);
        return;
      case Kind::kReplace:
        s = replace_all(s);
        return;
      case Kind::kLowercase: {
        icu::UnicodeString u = icu::UnicodeString::fromUTF8(s);
        u.toLower(icu::Locale::getRoot());
        s.clear();
        u.toUTF8String(s);
        return;
      }
      case Kind::kStrip: {
        size_t b = 0, e = s.size();
        if (strip_left) {
          while (b < e) {
            int bad, len = utf8_seq(s, b, &bad);
            if (len == 0 || !is_white_space(utf8_decode(s.data() + b, len))) break;
            b += static_cast<size_t>(len);
          }
        }
        if (strip_right) {
          while (e > b) {
            size_t k = e - 1;
            while (k > b && (static_cast<uint8_t>(s[k]) & 0xC0) == 0x80) k--;
            int bad, len = utf8_seq(s, k, &bad);
            if (len == 0 || !is_white_space(utf8_decode(s.data() + k, len))) break;
            e = k;
          }
        }
        s = s.substr(b, e - b);
        return;
      }
      case Kind::kSequence:
        for (const auto& p : parts) p->apply(s);
        return;
    }
  }

  std::string replace_all(std::string_view s) const {
    std::string out;
    if (regex) {
      std::vector<std::pair<size_t, size_t>> m;
      regex->find_all(s, m);
      size_t at = 0;
      for (auto [b, e] : m) {
        out.append(s.substr(at, b - at));
        out += content;
        at = e;
      }
      out.append(s.substr(at));
      return out;
    }
    if (text.empty()) return std::string(s);
    for (size_t at = 0;;) {
      const size_t hit = s.find(text, at);
      if (hit == std::string_view::npos) {
        out.append(s.substr(at));
        return out;
      }
      out.append(s.substr(at, hit - at));
      out += content;
      at = hit + text.size();
    }
  }
};

// A Replace's or Split's {"String": ...} / {"Regex": ...} pattern.
Status parse_pattern(const Ctx& c, const json& j, const std::string& where, std::string* literal,
                     std::unique_ptr<Regex>* regex) {
  auto it = j.find("pattern");
  if (it == j.end() || !it->is_object() || it->size() != 1)
    return c.err(where, "\"pattern\" must be {\"String\": ...} or {\"Regex\": ...}");
  if (it->contains("String") && (*it)["String"].is_string()) {
    *literal = (*it)["String"].get<std::string>();
    return Status::OK();
  }
  if (it->contains("Regex") && (*it)["Regex"].is_string()) {
    ASSIGN_OR_RETURN(*regex, Regex::compile(c, where, (*it)["Regex"].get<std::string>()));
    return Status::OK();
  }
  return c.err(where, "\"pattern\" must be {\"String\": ...} or {\"Regex\": ...}");
}

constexpr int kMaxDepth = 16;  // nesting of Sequence components

Result<std::unique_ptr<Normalizer>> parse_normalizer(const Ctx& c, const json& j, const std::string& where,
                                                     int depth) {
  if (depth > kMaxDepth) return c.err(where, "Sequence nested too deep");
  ASSIGN_OR_RETURN(std::string type, get_type(c, j, where));
  auto n = std::make_unique<Normalizer>();
  UErrorCode st = U_ZERO_ERROR;
  if (type == "NFC" || type == "NFKC" || type == "NFD" || type == "NFKD") {
    n->kind = Normalizer::Kind::kUnicode;
    n->unicode = type == "NFC"    ? icu::Normalizer2::getNFCInstance(st)
                 : type == "NFKC" ? icu::Normalizer2::getNFKCInstance(st)
                 : type == "NFD"  ? icu::Normalizer2::getNFDInstance(st)
                                  : icu::Normalizer2::getNFKDInstance(st);
    if (U_FAILURE(st)) return Status::Internal(fmt::format("ICU {} normalizer: {}", type, u_errorName(st)));
  } else if (type == "Prepend") {
    n->kind = Normalizer::Kind::kPrepend;
    ASSIGN_OR_RETURN(n->text, get_string(c, j, where, "prepend"));
  } else if (type == "Replace") {
    n->kind = Normalizer::Kind::kReplace;
    RETURN_IF_ERROR(parse_pattern(c, j, where, &n->text, &n->regex));
    ASSIGN_OR_RETURN(n->content, get_string(c, j, where, "content"));
  } else if (type == "Lowercase") {
    n->kind = Normalizer::Kind::kLowercase;
  } else if (type == "Strip") {
    n->kind = Normalizer::Kind::kStrip;
    ASSIGN_OR_RETURN(n->strip_left, get_bool(c, j, where, "strip_left", true));
    ASSIGN_OR_RETURN(n->strip_right, get_bool(c, j, where, "strip_right", true));
  } else if (type == "Sequence") {
    n->kind = Normalizer::Kind::kSequence;
    auto it = j.find("normalizers");
    if (it == j.end() || !it->is_array()) return c.err(where, "Sequence needs a \"normalizers\" list");
    for (size_t i = 0; i < it->size(); i++) {
      ASSIGN_OR_RETURN(auto p, parse_normalizer(c, (*it)[i], fmt::format("{}.normalizers[{}]", where, i), depth + 1));
      n->parts.push_back(std::move(p));
    }
  } else {
    return c.err(where, fmt::format("normalizer \"{}\" is not supported (supported: NFC, NFKC, NFD, NFKD, Prepend, "
                                    "Replace, Lowercase, Strip, Sequence)", type));
  }
  return n;
}

// ---- Pre-tokenizers --------------------------------------------------------------

// A stretch of text on its way to the model; at_start: it begins the input
// (Metaspace's prepend_scheme "first").
struct Piece {
  std::string text;
  bool at_start = false;
};

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

// Cuts `text` at the given non-overlapping, sorted match ranges, as the
// crate's NormalizedString::split does.
void split_by(const Piece& p, const std::vector<std::pair<size_t, size_t>>& matches, SplitBehavior how,
              std::vector<Piece>& out) {
  const std::string& s = p.text;
  // Spans: (begin, end, is_match), covering s.
  std::vector<std::tuple<size_t, size_t, bool>> spans;
  size_t at = 0;
  for (auto [b, e] : matches) {
    if (b > at) spans.emplace_back(at, b, false);
    spans.emplace_back(b, e, true);
    at = e;
  }
  if (at < s.size()) spans.emplace_back(at, s.size(), false);
  std::vector<std::pair<size_t, size_t>> cut;
  switch (how) {
    case SplitBehavior::kRemoved:
      for (auto [b, e, m] : spans)
        if (!m) cut.emplace_back(b, e);
      break;
    case SplitBehavior::kIsolated:
      for (auto [b, e, m] : spans) cut.emplace_back(b, e);
      break;
    case SplitBehavior::kContiguous:
      for (size_t i = 0; i < spans.size(); i++) {
        auto [b, e, m] = spans[i];
        if (m && !cut.empty() && i > 0 && std::get<2>(spans[i - 1])) {
          cut.back().second = e;
        } else {
          cut.emplace_back(b, e);
        }
      }
      break;
    case SplitBehavior::kMergedWithPrevious:
      for (size_t i = 0; i < spans.size(); i++) {
        auto [b, e, m] = spans[i];
        if (m && !cut.empty() && i > 0 && !std::get<2>(spans[i - 1])) {
          cut.back().second = e;
        } else {
          cut.emplace_back(b, e);
        }
      }
      break;
    case SplitBehavior::kMergedWithNext:
      for (size_t i = 0; i < spans.size(); i++) {
        auto [b, e, m] = spans[i];
        if (!m && !cut.empty() && i > 0 && std::get<2>(spans[i - 1])) {
          cut.back().second = e;
        } else {
          cut.emplace_back(b, e);
        }
      }
      break;
  }
  for (auto [b, e] : cut)
    if (e > b) out.push_back(Piece{s.substr(b, e - b), p.at_start && b == 0});
}

struct PreTokenizer {
  enum class Kind { kByteLevel, kSplit, kMetaspace, kDigits, kWhitespaceSplit, kSequence };
  Kind kind;
  // ByteLevel
  bool add_prefix_space = false;
  std::unique_ptr<Regex> regex;  // ByteLevel's GPT-2 pattern when use_regex; Split's Regex
  // Split
  std::string literal;
  SplitBehavior behavior = SplitBehavior::kIsolated;
  // Metaspace
  std::string replacement;
  enum class Prepend { kAlways, kFirst, kNever } prepend = Prepend::kAlways;
  bool split = true;
  // Digits
  bool individual_digits = false;
  std::vector<std::unique_ptr<PreTokenizer>> parts;
  int fast_digits = 0;  // Split with Llama 3's (3) or Qwen's (1) pattern: llama3_match_end

  void matches_of(std::string_view s, std::vector<std::pair<size_t, size_t>>& m) const {
    if (fast_digits > 0) {
      m.clear();
      for (size_t i = 0; i < s.size();) {
        const size_t e = llama3_match_end(s, i, fast_digits);
        m.emplace_back(i, e);
        i = e;
      }
      return;
    }
    if (regex) {
      regex->find_all(s, m);
      return;
    }
    m.clear();
    if (literal.empty()) return;
    for (size_t at = s.find(literal); at != std::string_view::npos; at = s.find(literal, at + literal.size()))
      m.emplace_back(at, at + literal.size());
  }

  void apply(std::vector<Piece>& pieces) const {
    std::vector<Piece> out;
    std::vector<std::pair<size_t, size_t>> m;
    switch (kind) {
      case Kind::kSequence:
        for (const auto& p : parts) p->apply(pieces);
        return;
      case Kind::kByteLevel:
        for (Piece& p : pieces) {
          if (add_prefix_space && (p.text.empty() || p.text[0] != ' ')) p.text.insert(0, " ");
          std::vector<Piece> cut;
          if (regex) {
            regex->find_all(p.text, m);
            split_by(p, m, SplitBehavior::kIsolated, cut);
          } else {
            cut.push_back(std::move(p));
          }
          const ByteMap& bm = byte_map();
          for (Piece& q : cut) {
            std::string mapped;
            mapped.reserve(q.text.size() * 2);
            for (char ch : q.text) mapped += bm.byte_to_text[static_cast<uint8_t>(ch)];
            q.text = std::move(mapped);
            out.push_back(std::move(q));
          }
        }
        break;
      case Kind::kSplit:
        for (const Piece& p : pieces) {
          matches_of(p.text, m);
          split_by(p, m, behavior, out);
        }
        break;
      case Kind::kMetaspace:
        for (Piece& p : pieces) {
          std::string t;
          for (char ch : p.text) {
            if (ch == ' ') {
              t += replacement;
            } else {
              t += ch;
            }
          }
          const bool prepend_here = prepend == Prepend::kAlways || (prepend == Prepend::kFirst && p.at_start);
          if (prepend_here && t.compare(0, replacement.size(), replacement) != 0) t.insert(0, replacement);
          Piece q{std::move(t), p.at_start};
          if (split) {
            m.clear();
            for (size_t at = q.text.find(replacement); at != std::string::npos;
                 at = q.text.find(replacement, at + replacement.size()))
              m.emplace_back(at, at + replacement.size());
            split_by(q, m, SplitBehavior::kMergedWithNext, out);
          } else {
            out.push_back(std::move(q));
          }
        }
        break;
      case Kind::kDigits:
        for (const Piece& p : pieces) {
          m.clear();
          for (size_t i = 0; i < p.text.size();) {
            if (p.text[i] >= '0' && p.text[i] <= '9') {
              size_t j = i + 1;
              if (!individual_digits)
                while (j < p.text.size() && p.text[j] >= '0' && p.text[j] <= '9') j++;
              m.emplace_back(i, j);
              i = j;
            } else {
              i++;
            }
          }
          split_by(p, m, SplitBehavior::kIsolated, out);
        }
        break;
      case Kind::kWhitespaceSplit:
        for (const Piece& p : pieces) {
          m.clear();
          for_each_char(p.text, [&](UChar32 cp, size_t at, size_t len) {
            if (!is_white_space(cp)) return;
            if (!m.empty() && m.back().second == at) {
              m.back().second = at + len;
            } else {
              m.emplace_back(at, at + len);
            }
          });
          split_by(p, m, SplitBehavior::kRemoved, out);
        }
        break;
    }
    pieces = std::move(out);
  }
};

// GPT-2's pattern, which ByteLevel applies when use_regex.
constexpr const char* kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

Result<std::unique_ptr<PreTokenizer>> parse_pre_tokenizer(const Ctx& c, const json& j, const std::string& where,
                                                          int depth) {
  if (depth > kMaxDepth) return c.err(where, "Sequence nested too deep");
  ASSIGN_OR_RETURN(std::string type, get_type(c, j, where));
  auto p = std::make_unique<PreTokenizer>();
  if (type == "ByteLevel") {
    p->kind = PreTokenizer::Kind::kByteLevel;
    ASSIGN_OR_RETURN(p->add_prefix_space, get_bool(c, j, where, "add_prefix_space", true));
    ASSIGN_OR_RETURN(bool use_regex, get_bool(c, j, where, "use_regex", true));
    if (use_regex) {
      ASSIGN_OR_RETURN(p->regex, Regex::compile(c, where, kGpt2Pattern));
    }
  } else if (type == "Split") {
    p->kind = PreTokenizer::Kind::kSplit;
    RETURN_IF_ERROR(parse_pattern(c, j, where, &p->literal, &p->regex));
    if (p->regex && c.fast_split) {
      const std::string pattern = j["pattern"]["Regex"].get<std::string>();
      p->fast_digits = pattern == kLlama3Pattern ? 3 : pattern == kQwenPattern ? 1 : 0;
    }
    ASSIGN_OR_RETURN(std::string behavior, get_string(c, j, where, "behavior"));
    static const std::unordered_map<std::string, SplitBehavior> kBehaviors = {
        {"Removed", SplitBehavior::kRemoved},
        {"Isolated", SplitBehavior::kIsolated},
        {"MergedWithPrevious", SplitBehavior::kMergedWithPrevious},
        {"MergedWithNext", SplitBehavior::kMergedWithNext},
        {"Contiguous", SplitBehavior::kContiguous}};
    auto it = kBehaviors.find(behavior);
    if (it == kBehaviors.end()) return c.err(where, fmt::format("Split behavior \"{}\" is not one the crate has", behavior));
    p->behavior = it->second;
    ASSIGN_OR_RETURN(bool invert, get_bool(c, j, where, "invert", false));
    if (invert) return c.err(where, "Split with \"invert\": true is not supported");
  } else if (type == "Metaspace") {
    p->kind = PreTokenizer::Kind::kMetaspace;
    ASSIGN_OR_RETURN(p->replacement, get_string(c, j, where, "replacement", std::string("\u2581")));
    if (p->replacement.empty()) return c.err(where, "Metaspace \"replacement\" must not be empty");
    ASSIGN_OR_RETURN(p->split, get_bool(c, j, where, "split", true));
    if (j.contains("prepend_scheme") && !j["prepend_scheme"].is_null()) {
      ASSIGN_OR_RETURN(std::string scheme, get_string(c, j, where, "prepend_scheme"));
      if (scheme == "always") {
        p->prepend = PreTokenizer::Prepend::kAlways;
      } else if (scheme == "first") {
        p->prepend = PreTokenizer::Prepend::kFirst;
      } else if (scheme == "never") {
        p->prepend = PreTokenizer::Prepend::kNever;
      } else {
        return c.err(where, fmt::format("Metaspace prepend_scheme \"{}\": expected always, first or never", scheme));
      }
    } else {
      ASSIGN_OR_RETURN(bool add, get_bool(c, j, where, "add_prefix_space", true));
      p->prepend = add ? PreTokenizer::Prepend::kAlways : PreTokenizer::Prepend::kNever;
    }
  } else if (type == "Digits") {
    p->kind = PreTokenizer::Kind::kDigits;
    ASSIGN_OR_RETURN(p->individual_digits, get_bool(c, j, where, "individual_digits", false));
  } else if (type == "WhitespaceSplit") {
    p->kind = PreTokenizer::Kind::kWhitespaceSplit;
  } else if (type == "Sequence") {
    p->kind = PreTokenizer::Kind::kSequence;
    auto it = j.find("pretokenizers");
    if (it == j.end() || !it->is_array()) return c.err(where, "Sequence needs a \"pretokenizers\" list");
    for (size_t i = 0; i < it->size(); i++) {
      ASSIGN_OR_RETURN(auto q,
                       parse_pre_tokenizer(c, (*it)[i], fmt::format("{}.pretokenizers[{}]", where, i), depth + 1));
      p->parts.push_back(std::move(q));
    }
  } else {
    return c.err(where, fmt::format("pre-tokenizer \"{}\" is not supported (supported: ByteLevel, Split, Metaspace, "
                                    "Digits, WhitespaceSplit, Sequence)", type));
  }
  return p;
}

// ---- Decoders ----------------------------------------------------------------------

struct Decoder {
  enum class Kind { kByteLevel, kMetaspace, kByteFallback, kFuse, kStrip, kReplace, kSequence };
  Kind kind;
  std::string text, content;  // Replace: text -> content; Metaspace: text = replacement
  UChar32 strip_char = ' ';
  int64_t strip_start = 0, strip_stop = 0;
  bool prepend = true;        // Metaspace: strip the first token's leading space
  std::vector<std::unique_ptr<Decoder>> parts;

  static std::string replace(std::string_view s, const std::string& from, const std::string& to) {
    if (from.empty()) return std::string(s);
    std::string out;
    for (size_t at = 0;;) {
      const size_t hit = s.find(from, at);
      if (hit == std::string_view::npos) return out.append(s.substr(at));
      out.append(s.substr(at, hit - at)) += to;
      at = hit + from.size();
    }
  }

  // "<0xAB>" -> 0xAB, else -1.
  static int fallback_byte(std::string_view t) {
    if (t.size() != 6 || t.substr(0, 3) != "<0x" || t[5] != '>') return -1;
    int v = 0;
    for (int k = 3; k < 5; k++) {
      const char ch = t[k];
      const int d = ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'A' && ch <= 'F' ? ch - 'A' + 10 : -1;
      if (d < 0) return -1;
      v = v * 16 + d;
    }
    return v;
  }

  // A token's characters as bytes through the byte map; the token's own
  // bytes when one of its characters is not in the map (the crate's rule).
  static std::string byte_level(std::string_view t) {
    const ByteMap& bm = byte_map();
    std::string out;
    bool all = true;
    for_each_char(t, [&](UChar32 cp, size_t, size_t) {
      auto it = bm.char_to_byte.find(cp);
      if (it == bm.char_to_byte.end()) {
        all = false;
      } else {
        out += static_cast<char>(it->second);
      }
    });
    return all ? out : std::string(t);
  }

  void decode(std::vector<std::string>& tokens) const {
    switch (kind) {
      case Kind::kSequence:
        for (const auto& p : parts) p->decode(tokens);
        return;
      case Kind::kReplace:
        for (std::string& t : tokens) t = replace(t, text, content);
        return;
      case Kind::kFuse: {
        std::string all;
        for (const std::string& t : tokens) all += t;
        tokens.assign(1, std::move(all));
        return;
      }
      case Kind::kByteFallback: {
        std::vector<std::string> out;
        std::string bytes;
        int count = 0;
        const auto flush = [&] {
          if (count == 0) return;
          out.push_back(utf8_valid(bytes) == bytes ? bytes : [&] {
            std::string r;
            for (int k = 0; k < count; k++) r += "\uFFFD";
            return r;
          }());
          bytes.clear();
          count = 0;
        };
        for (std::string& t : tokens) {
          const int b = fallback_byte(t);
          if (b >= 0) {
            bytes += static_cast<char>(b);
            count++;
          } else {
            flush();
            out.push_back(std::move(t));
          }
        }
        flush();
        tokens = std::move(out);
        return;
      }
      case Kind::kStrip:
        for (std::string& t : tokens) {
          std::vector<std::pair<size_t, size_t>> chars;  // (offset, length)
          std::vector<UChar32> cps;
          for_each_char(t, [&](UChar32 cp, size_t at, size_t len) {
            chars.emplace_back(at, len);
            cps.push_back(cp);
          });
          size_t b = 0, e = cps.size();
          for (int64_t k = 0; k < strip_start && b < e && cps[b] == strip_char; k++) b++;
          for (int64_t k = 0; k < strip_stop && e > b && cps[e - 1] == strip_char; k++) e--;
          const size_t from = b < chars.size() ? chars[b].first : t.size();
          const size_t to = e < chars.size() ? chars[e].first : t.size();
          t = t.substr(from, to - from);
        }
        return;
      case Kind::kMetaspace:
        for (size_t i = 0; i < tokens.size(); i++) {
          std::string t = replace(tokens[i], text, " ");
          if (i == 0 && prepend && !t.empty() && t[0] == ' ') t.erase(0, 1);
          tokens[i] = std::move(t);
        }
        return;
      case Kind::kByteLevel: {
        std::string all;
        for (const std::string& t : tokens) all += byte_level(t);
        tokens.assign(1, utf8_valid(all));
        return;
      }
    }
  }

  // What one token contributes mid-text, as bytes (decode_token()).
  void stream(std::string& t) const {
    switch (kind) {
      case Kind::kSequence:
        for (const auto& p : parts) p->stream(t);
        return;
      case Kind::kReplace:
        t = replace(t, text, content);
        return;
      case Kind::kByteFallback: {
        const int b = fallback_byte(t);
        if (b >= 0) t = std::string(1, static_cast<char>(b));
        return;
      }
      case Kind::kMetaspace:
        t = replace(t, text, " ");
        return;
      case Kind::kByteLevel:
        t = byte_level(t);
        return;
      case Kind::kFuse:
      case Kind::kStrip:  // start and end of text only
        return;
    }
  }
};

Result<std::unique_ptr<Decoder>> parse_decoder(const Ctx& c, const json& j, const std::string& where, int depth) {
  if (depth > kMaxDepth) return c.err(where, "Sequence nested too deep");
  ASSIGN_OR_RETURN(std::string type, get_type(c, j, where));
  auto d = std::make_unique<Decoder>();
  if (type == "ByteLevel") {
    d->kind = Decoder::Kind::kByteLevel;
  } else if (type == "Metaspace") {
    d->kind = Decoder::Kind::kMetaspace;
    ASSIGN_OR_RETURN(d->text, get_string(c, j, where, "replacement", std::string("\u2581")));
    if (j.contains("prepend_scheme") && !j["prepend_scheme"].is_null()) {
      ASSIGN_OR_RETURN(std::string scheme, get_string(c, j, where, "prepend_scheme"));
      d->prepend = scheme != "never";
    } else {
      ASSIGN_OR_RETURN(d->prepend, get_bool(c, j, where, "add_prefix_space", true));
    }
  } else if (type == "ByteFallback") {
    d->kind = Decoder::Kind::kByteFallback;
  } else if (type == "Fuse") {
    d->kind = Decoder::Kind::kFuse;
  } else if (type == "Strip") {
    d->kind = Decoder::Kind::kStrip;
    ASSIGN_OR_RETURN(std::string content, get_string(c, j, where, "content"));
    UChar32 cp = -1;
    int n = 0;
    for_each_char(utf8_valid(content), [&](UChar32 ch, size_t, size_t) {
      cp = ch;
      n++;
    });
    if (n != 1) return c.err(where, "Strip \"content\" must be one character");
    d->strip_char = cp;
    ASSIGN_OR_RETURN(d->strip_start, get_uint(c, j, where, "start", 0, 1 << 20));
    ASSIGN_OR_RETURN(d->strip_stop, get_uint(c, j, where, "stop", 0, 1 << 20));
  } else if (type == "Replace") {
    d->kind = Decoder::Kind::kReplace;
    std::unique_ptr<Regex> regex;
    RETURN_IF_ERROR(parse_pattern(c, j, where, &d->text, &regex));
    if (regex) return c.err(where, "Replace decoder with a Regex pattern is not supported");
    ASSIGN_OR_RETURN(d->content, get_string(c, j, where, "content"));
  } else if (type == "Sequence") {
    d->kind = Decoder::Kind::kSequence;
    auto it = j.find("decoders");
    if (it == j.end() || !it->is_array()) return c.err(where, "Sequence needs a \"decoders\" list");
    for (size_t i = 0; i < it->size(); i++) {
      ASSIGN_OR_RETURN(auto q, parse_decoder(c, (*it)[i], fmt::format("{}.decoders[{}]", where, i), depth + 1));
      d->parts.push_back(std::move(q));
    }
  } else {
    return c.err(where, fmt::format("decoder \"{}\" is not supported (supported: ByteLevel, Metaspace, ByteFallback, "
                                    "Fuse, Strip, Replace, Sequence)", type));
  }
  return d;
}

}  // namespace

// ---- The tokenizer -------------------------------------------------------------------

struct AddedToken {
  std::string content;
  uint32_t id;
  bool special, lstrip, rstrip, normalized, single_word;
};

struct HfTokenizer::Impl {
  std::unique_ptr<Normalizer> normalizer;
  std::unique_ptr<PreTokenizer> pre_tokenizer;
  std::unique_ptr<Decoder> decoder;
  // Post-processor (TemplateProcessing's "single"): ids before and after the text.
  std::vector<uint32_t> prefix, suffix;
  // BPE.
  std::unordered_map<std::string, uint32_t> vocab;
  std::unordered_map<UChar32, uint32_t> char_id;  // one-character tokens
  struct Merge {
    uint32_t rank, merged;
  };
  std::unordered_map<uint64_t, Merge> merges;
  std::optional<uint32_t> unk;
  bool fuse_unk = false, byte_fallback = false, ignore_merges = false;
  std::array<int64_t, 256> byte_token{};  // "<0xAB>" ids (-1: none)
  // Added tokens: a byte trie for leftmost-longest matching.
  std::vector<AddedToken> added;
  struct TrieNode {
    std::unordered_map<uint8_t, int32_t> next;
    int32_t token = -1;  // index into added
  };
  std::vector<TrieNode> trie{1};
  std::array<bool, 256> first_byte{};
  bool any_normalized_added = false;
  std::vector<bool> special;       // id -> special
  std::vector<std::string> text;   // id -> token string
  bool clean_up_spaces = false;    // tokenizer_config.json clean_up_tokenization_spaces

  static uint64_t key(uint32_t a, uint32_t b) { return (uint64_t{a} << 32) | b; }

  void add_to_trie(int32_t index) {
    int32_t n = 0;
    for (char ch : added[index].content) {
      const uint8_t b = static_cast<uint8_t>(ch);
      auto it = trie[n].next.find(b);
      if (it == trie[n].next.end()) {
        trie.emplace_back();
        const int32_t m = static_cast<int32_t>(trie.size()) - 1;
        trie[n].next.emplace(b, m);
        n = m;
      } else {
        n = it->second;
      }
    }
    trie[n].token = index;
    first_byte[static_cast<uint8_t>(added[index].content[0])] = true;
  }

  // Splits text into (added token index or -1, text) segments. normalized:
  // which added tokens take part (the crate matches normalized=false ones on
  // the raw text, normalized=true ones after the normalizer).
  void split_added(std::string_view s, bool normalized, bool parse_special,
                   std::vector<std::pair<int32_t, std::string>>& out) const {
    size_t start_offset = 0;
    for (size_t i = 0; i < s.size();) {
      if (!first_byte[static_cast<uint8_t>(s[i])]) {
        i++;
        continue;
      }
      int32_t n = 0, best = -1;
      size_t best_end = 0;
      for (size_t k = i; k < s.size(); k++) {
        auto it = trie[n].next.find(static_cast<uint8_t>(s[k]));
        if (it == trie[n].next.end()) break;
        n = it->second;
        if (trie[n].token >= 0 && added[trie[n].token].normalized == normalized) {
          best = trie[n].token;
          best_end = k + 1;
        }
      }
      if (best < 0) {
        i++;
        continue;
      }
      const AddedToken& t = added[best];
      size_t start = i, stop = best_end;
      i = best_end;
      if (t.special && !parse_special) continue;
      if (t.single_word) {
        bool start_space = true, stop_space = true;
        if (start > 0) {
          size_t k = start - 1;
          while (k > 0 && (static_cast<uint8_t>(s[k]) & 0xC0) == 0x80) k--;
          int bad, len = utf8_seq(s, k, &bad);
          start_space = len == 0 || !is_word_char(utf8_decode(s.data() + k, len));
        }
        if (stop < s.size()) {
          int bad, len = utf8_seq(s, stop, &bad);
          stop_space = len == 0 || !is_word_char(utf8_decode(s.data() + stop, len));
        }
        if (!start_space || !stop_space) continue;
      }
      if (t.lstrip) {
        size_t b = start;
        while (b > start_offset) {
          size_t k = b - 1;
          while (k > start_offset && (static_cast<uint8_t>(s[k]) & 0xC0) == 0x80) k--;
          int bad, len = utf8_seq(s, k, &bad);
          if (len == 0 || !is_white_space(utf8_decode(s.data() + k, len))) break;
          b = k;
        }
        start = b;
      }
      if (t.rstrip) {
        while (stop < s.size()) {
          int bad, len = utf8_seq(s, stop, &bad);
          if (len == 0 || !is_white_space(utf8_decode(s.data() + stop, len))) break;
          stop += static_cast<size_t>(len);
        }
        i = stop;
      }
      if (start > start_offset) out.emplace_back(-1, std::string(s.substr(start_offset, start - start_offset)));
      out.emplace_back(best, std::string());
      start_offset = stop;
    }
    if (start_offset < s.size()) out.emplace_back(-1, std::string(s.substr(start_offset)));
  }

  // Per-call working state of the BPE.
  struct Scratch : BpeScratch {
    std::unordered_map<std::string, std::vector<uint32_t>> cache;  // word -> its ids
  };

  void bpe(const std::string& word, Scratch& s, std::vector<uint32_t>& out) const {
    if (ignore_merges) {
      auto it = vocab.find(word);
      if (it != vocab.end()) {
        out.push_back(it->second);
        return;
      }
    }
    auto cached = s.cache.find(word);
    if (cached != s.cache.end()) {
      out.insert(out.end(), cached->second.begin(), cached->second.end());
      return;
    }
    // Initial symbols: one per character, byte fallback or unk for others.
    s.token.clear();
    bool last_unk = false;
    for_each_char(word, [&](UChar32 cp, size_t at, size_t len) {
      auto it = char_id.find(cp);
      uint32_t id;
      if (it != char_id.end()) {
        id = it->second;
      } else {
        auto v = len > 1 ? vocab.find(word.substr(at, len)) : vocab.end();  // not a one-character key
        if (v != vocab.end()) {
          id = v->second;
        } else {
          if (byte_fallback) {
            bool all = true;
            for (size_t k = 0; k < len; k++) all = all && byte_token[static_cast<uint8_t>(word[at + k])] >= 0;
            if (all) {
              for (size_t k = 0; k < len; k++)
                s.token.push_back(static_cast<uint32_t>(byte_token[static_cast<uint8_t>(word[at + k])]));
              last_unk = false;
              return;
            }
          }
          if (!unk) return;  // no unk token: the character is dropped, as the crate does
          if (fuse_unk && last_unk) return;
          s.token.push_back(*unk);
          last_unk = true;
          return;
        }
      }
      s.token.push_back(id);
      last_unk = false;
    });
    const size_t first = out.size();
    bpe_merge(s, [&](uint32_t l, uint32_t r) -> const Merge* {
      auto it = merges.find(key(l, r));
      return it == merges.end() ? nullptr : &it->second;
    }, out);
    if (word.size() <= 64 && s.cache.size() < 100000)
      s.cache.emplace(word, std::vector<uint32_t>(out.begin() + static_cast<std::ptrdiff_t>(first), out.end()));
  }

  void encode_text(std::string text, bool at_start, bool parse_special, Scratch& s, std::vector<uint32_t>& out) const {
    if (normalizer) normalizer->apply(text);
    if (any_normalized_added) {
      std::vector<std::pair<int32_t, std::string>> parts;
      split_added(text, true, parse_special, parts);
      for (size_t k = 0; k < parts.size(); k++) {
        if (parts[k].first >= 0) {
          out.push_back(added[parts[k].first].id);
        } else {
          model_text(std::move(parts[k].second), at_start && k == 0, s, out);
        }
      }
      return;
    }
    model_text(std::move(text), at_start, s, out);
  }

  void model_text(std::string text, bool at_start, Scratch& s, std::vector<uint32_t>& out) const {
    if (text.empty()) return;
    std::vector<Piece> pieces{Piece{std::move(text), at_start}};
    if (pre_tokenizer) pre_tokenizer->apply(pieces);
    for (const Piece& p : pieces) bpe(p.text, s, out);
  }
};

HfTokenizer::~HfTokenizer() = default;

std::string utf8_valid(std::string_view text) {
  size_t i = 0;
  int bad;
  while (i < text.size()) {  // fast path: valid so far
    const int len = utf8_seq(text, i, &bad);
    if (len == 0) break;
    i += static_cast<size_t>(len);
  }
  if (i == text.size()) return std::string(text);
  std::string out(text.substr(0, i));
  while (i < text.size()) {
    const int len = utf8_seq(text, i, &bad);
    if (len == 0) {
      out += "\uFFFD";
      i += static_cast<size_t>(bad);
    } else {
      out.append(text.substr(i, static_cast<size_t>(len)));
      i += static_cast<size_t>(len);
    }
  }
  return out;
}

namespace {

constexpr int64_t kMaxTokenizerBytes = int64_t{1} << 30;

// A regular file's bytes, refused past `limit`.
Result<std::string> read_json_file(const std::string& path, int64_t limit) {
  RETURN_IF_ERROR(io::check_regular_file(path));
  std::error_code ec;
  const auto size = fs::file_size(path, ec);
  if (ec) return Status::IOError(fmt::format("{}: cannot read: {}", path, ec.message()));
  if (static_cast<int64_t>(size) > limit)
    return Status::InvalidArgument(fmt::format("{}: {} bytes, more than the {} a tokenizer file may have", path, size, limit));
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::IOError(fmt::format("{}: cannot read", path));
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}
constexpr int64_t kMaxVocab = int64_t{1} << 24;

// An added token's or special token's name in tokenizer_config.json: a
// string, or an AddedToken object {"content": ...}; "" when absent.
std::string config_token(const json& cfg, const char* key) {
  auto it = cfg.find(key);
  if (it == cfg.end()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string())
    return (*it)["content"].get<std::string>();
  return "";
}

}  // namespace

Result<std::unique_ptr<HfTokenizer>> HfTokenizer::load(const std::string& path_in, const HfLoadOptions& options) {
  fs::path file = path_in;
  std::error_code ec;
  if (fs::is_directory(file, ec)) file /= "tokenizer.json";
  if (!fs::exists(file, ec))
    return Status::NotFound(fmt::format("{}: no such file (a Hugging Face tokenizer.json, or a folder with one)",
                                        file.string()));
  ASSIGN_OR_RETURN(std::string bytes, read_json_file(file.string(), kMaxTokenizerBytes));
  // tokenizer_config.json beside it: the end-of-text id and decode's clean-up.
  std::string cfg_bytes;
  const fs::path cfg_path = file.parent_path() / "tokenizer_config.json";
  if (fs::exists(cfg_path, ec)) {
    ASSIGN_OR_RETURN(cfg_bytes, read_json_file(cfg_path.string(), kMaxTokenizerBytes));
  }
  std::string name = file.parent_path().filename().string();
  if (name.empty()) name = "tokenizer.json";
  return from_json(file.string(), name, bytes, cfg_path.string(), cfg_bytes, options);
}

Result<std::unique_ptr<HfTokenizer>> HfTokenizer::from_json(const std::string& path, const std::string& name,
                                                            std::string_view bytes, const std::string& cfg_path,
                                                            std::string_view cfg_bytes, const HfLoadOptions& options) {
  Ctx c{path, options.fast_split};
  json j = json::parse(bytes, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Status::Corruption(fmt::format("{}: not valid JSON", c.file));
  if (!j.is_object()) return c.err("top level", "must be an object");

  auto tok = std::unique_ptr<HfTokenizer>(new HfTokenizer());
  tok->impl_ = std::make_unique<Impl>();
  Impl& im = *tok->impl_;
  tok->path_ = path;
  tok->name_ = name;

  // Model.
  if (!j.contains("model")) return c.err("model", "missing");
  const json& m = j["model"];
  ASSIGN_OR_RETURN(std::string mtype, get_string(c, m.is_object() ? m : json::object(), "model", "type",
                                                 std::string(m.is_object() && m.contains("vocab") ? "BPE" : "")));
  if (mtype != "BPE")
    return c.err("model", fmt::format("model \"{}\" is not supported (only BPE)", mtype.empty() ? "?" : mtype));
  if (m.contains("dropout") && !m["dropout"].is_null()) return c.err("model", "BPE dropout is not supported");
  for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    ASSIGN_OR_RETURN(std::string v, get_string(c, m, "model", k, std::string()));
    if (!v.empty()) return c.err("model", fmt::format("BPE \"{}\" is not supported", k));
  }
  ASSIGN_OR_RETURN(im.fuse_unk, get_bool(c, m, "model", "fuse_unk", false));
  ASSIGN_OR_RETURN(im.byte_fallback, get_bool(c, m, "model", "byte_fallback", false));
  ASSIGN_OR_RETURN(im.ignore_merges, get_bool(c, m, "model", "ignore_merges", false));
  if (!m.contains("vocab") || !m["vocab"].is_object()) return c.err("model.vocab", "must be an object of token: id");
  int64_t max_id = -1;
  for (auto it = m["vocab"].begin(); it != m["vocab"].end(); ++it) {
    if (!it->is_number_integer() || it->get<int64_t>() < 0 || it->get<int64_t>() >= kMaxVocab)
      return c.err("model.vocab", fmt::format("token {}: id must be an integer in [0, {})", json(it.key()).dump(),
                                              kMaxVocab));
    const uint32_t id = static_cast<uint32_t>(it->get<int64_t>());
    im.vocab.emplace(it.key(), id);
    max_id = std::max<int64_t>(max_id, id);
  }
  for (const auto& [t, id] : im.vocab) {
    int n = 0;
    UChar32 cp = 0;
    for_each_char(t, [&](UChar32 ch, size_t, size_t) {
      cp = ch;
      n++;
    });
    if (n == 1 && utf8_valid(t) == t) im.char_id.emplace(cp, id);
  }
  im.byte_token.fill(-1);
  for (int b = 0; b < 256; b++) {
    auto it = im.vocab.find(fmt::format("<0x{:02X}>", b));
    if (it != im.vocab.end()) im.byte_token[b] = it->second;
  }
  {
    ASSIGN_OR_RETURN(std::string unk, get_string(c, m, "model", "unk_token", std::string()));
    if (!unk.empty()) {
      auto it = im.vocab.find(unk);
      if (it == im.vocab.end()) return c.err("model.unk_token", fmt::format("{} is not in the vocabulary", json(unk).dump()));
      im.unk = it->second;
    }
  }
  if (!m.contains("merges") || !m["merges"].is_array()) return c.err("model.merges", "must be a list");
  const json& merges = m["merges"];
  im.merges.reserve(merges.size());
  for (size_t r = 0; r < merges.size(); r++) {
    const json& e = merges[r];
    std::string left, right;
    if (e.is_string()) {
      const std::string& s = e.get_ref<const std::string&>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
        return c.err(fmt::format("model.merges[{}]", r), fmt::format("{} is not \"LEFT RIGHT\"", e.dump()));
      left = s.substr(0, sp);
      right = s.substr(sp + 1);
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      left = e[0].get<std::string>();
      right = e[1].get<std::string>();
    } else {
      return c.err(fmt::format("model.merges[{}]", r), "must be \"LEFT RIGHT\" or [LEFT, RIGHT]");
    }
    auto l = im.vocab.find(left), rr = im.vocab.find(right), mg = im.vocab.find(left + right);
    if (l == im.vocab.end() || rr == im.vocab.end() || mg == im.vocab.end())
      return c.err(fmt::format("model.merges[{}]", r),
                   fmt::format("{}: a part or the merged token is not in the vocabulary", e.dump()));
    im.merges.emplace(Impl::key(l->second, rr->second), Impl::Merge{static_cast<uint32_t>(r), mg->second});
  }

  // Added tokens.
  if (j.contains("added_tokens") && !j["added_tokens"].is_null()) {
    if (!j["added_tokens"].is_array()) return c.err("added_tokens", "must be a list");
    for (size_t i = 0; i < j["added_tokens"].size(); i++) {
      const json& a = j["added_tokens"][i];
      const std::string where = fmt::format("added_tokens[{}]", i);
      if (!a.is_object()) return c.err(where, "must be an object");
      AddedToken t;
      ASSIGN_OR_RETURN(t.content, get_string(c, a, where, "content"));
      if (t.content.empty()) return c.err(where, "\"content\" must not be empty");
      ASSIGN_OR_RETURN(int64_t id, get_uint(c, a, where, "id", -1, kMaxVocab - 1));
      if (id < 0) return c.err(where, "missing \"id\"");
      t.id = static_cast<uint32_t>(id);
      ASSIGN_OR_RETURN(t.special, get_bool(c, a, where, "special", false));
      ASSIGN_OR_RETURN(t.lstrip, get_bool(c, a, where, "lstrip", false));
      ASSIGN_OR_RETURN(t.rstrip, get_bool(c, a, where, "rstrip", false));
      ASSIGN_OR_RETURN(t.normalized, get_bool(c, a, where, "normalized", !t.special));
      ASSIGN_OR_RETURN(t.single_word, get_bool(c, a, where, "single_word", false));
      max_id = std::max<int64_t>(max_id, id);
      im.added.push_back(std::move(t));
    }
    for (size_t i = 0; i < im.added.size(); i++) {
      im.add_to_trie(static_cast<int32_t>(i));
      im.any_normalized_added = im.any_normalized_added || im.added[i].normalized;
    }
  }
  if (max_id < 0) return c.err("model.vocab", "is empty");

  // Pipeline components.
  if (j.contains("normalizer") && !j["normalizer"].is_null()) {
    ASSIGN_OR_RETURN(im.normalizer, parse_normalizer(c, j["normalizer"], "normalizer", 0));
  }
  if (j.contains("pre_tokenizer") && !j["pre_tokenizer"].is_null()) {
    ASSIGN_OR_RETURN(im.pre_tokenizer, parse_pre_tokenizer(c, j["pre_tokenizer"], "pre_tokenizer", 0));
  }
  if (j.contains("decoder") && !j["decoder"].is_null()) {
    ASSIGN_OR_RETURN(im.decoder, parse_decoder(c, j["decoder"], "decoder", 0));
  }
  if (j.contains("post_processor") && !j["post_processor"].is_null()) {
    std::function<Status(const json&, const std::string&, int)> post = [&](const json& p, const std::string& where,
                                                                        int depth) -> Status {
      if (depth > kMaxDepth) return c.err(where, "Sequence nested too deep");
      ASSIGN_OR_RETURN(std::string type, get_type(c, p, where));
      if (type == "ByteLevel") return Status::OK();  // offsets only
      if (type == "Sequence") {
        if (!p.contains("processors") || !p["processors"].is_array())
          return c.err(where, "Sequence needs a \"processors\" list");
        for (size_t i = 0; i < p["processors"].size(); i++)
          RETURN_IF_ERROR(post(p["processors"][i], fmt::format("{}.processors[{}]", where, i), depth + 1));
        return Status::OK();
      }
      if (type != "TemplateProcessing")
        return c.err(where, fmt::format("post-processor \"{}\" is not supported (supported: TemplateProcessing, "
                                        "ByteLevel, Sequence)", type));
      if (!p.contains("single") || !p["single"].is_array()) return c.err(where, "TemplateProcessing needs \"single\"");
      const json specials = p.value("special_tokens", json::object());
      if (!specials.is_object()) return c.err(where, "\"special_tokens\" must be an object");
      im.prefix.clear();
      im.suffix.clear();
      bool seen_a = false;
      for (const json& piece : p["single"]) {
        if (piece.is_object() && piece.contains("Sequence")) {
          if (seen_a) return c.err(where, "\"single\" holds the sequence twice");
          seen_a = true;
        } else if (piece.is_object() && piece.contains("SpecialToken") && piece["SpecialToken"].is_object() &&
                   piece["SpecialToken"].contains("id") && piece["SpecialToken"]["id"].is_string()) {
          const std::string name = piece["SpecialToken"]["id"].get<std::string>();
          auto it = specials.find(name);
          if (it == specials.end() || !it->is_object() || !it->contains("ids") || !(*it)["ids"].is_array())
            return c.err(where, fmt::format("special token {} has no \"ids\" in \"special_tokens\"", json(name).dump()));
          for (const json& id : (*it)["ids"]) {
            if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > max_id)
              return c.err(where, fmt::format("special token {}: id {} is not in the vocabulary", json(name).dump(),
                                              id.dump()));
            (seen_a ? im.suffix : im.prefix).push_back(id.get<uint32_t>());
          }
        } else {
          return c.err(where, fmt::format("\"single\" item {} is neither a Sequence nor a SpecialToken", piece.dump()));
        }
      }
      if (!seen_a) return c.err(where, "\"single\" lacks the sequence");
      return Status::OK();
    };
    RETURN_IF_ERROR(post(j["post_processor"], "post_processor", 0));
  }

  // Id tables.
  const size_t n = static_cast<size_t>(max_id) + 1;
  im.text.assign(n, std::string());
  im.special.assign(n, false);
  for (const auto& [t, id] : im.vocab) im.text[id] = t;
  for (const AddedToken& t : im.added) {
    im.text[t.id] = t.content;
    im.special[t.id] = t.special;
  }
  tok->id_bytes_.resize(n);
  for (size_t id = 0; id < n; id++) {
    std::string t = im.text[id];
    if (im.decoder) im.decoder->stream(t);
    tok->id_bytes_[id] = std::move(t);
  }

  // The tokenizer config: the end-of-text id and decode's clean-up.
  json cfg = json::object();
  if (!cfg_bytes.empty()) {
    cfg = json::parse(cfg_bytes, nullptr, false);
    if (cfg.is_discarded() || !cfg.is_object())
      return Status::Corruption(fmt::format("{}: not a JSON object", cfg_path));
    auto it = cfg.find("clean_up_tokenization_spaces");
    im.clean_up_spaces = it != cfg.end() && it->is_boolean() && it->get<bool>();
  }
  // Between documents: the BOS the post-processor puts first, else an
  // end-of-text token of the vocabulary, else the config's eos_token.
  int64_t eot = -1;
  if (!im.prefix.empty()) eot = im.prefix.front();
  for (const char* name : {"<|endoftext|>", "<|end_of_text|>", "</s>"})
    if (eot < 0) eot = tok->token_id(name);
  if (eot < 0) {
    const std::string eos = config_token(cfg, "eos_token");
    if (!eos.empty()) eot = tok->token_id(eos);
  }
  tok->eot_ = eot >= 0 ? static_cast<uint32_t>(eot) : 0;
  return tok;
}

std::vector<uint32_t> HfTokenizer::encode(std::string_view text) const { return encode(text, EncodeOptions{}); }

std::vector<uint32_t> HfTokenizer::encode(std::string_view text_in, const EncodeOptions& o) const {
  const Impl& im = *impl_;
  const std::string text = utf8_valid(text_in);
  std::vector<uint32_t> out;
  out.reserve(text.size() / 3 + 8);
  if (o.add_special_tokens) out.insert(out.end(), im.prefix.begin(), im.prefix.end());
  Impl::Scratch scratch;
  std::vector<std::pair<int32_t, std::string>> parts;
  im.split_added(text, false, o.parse_special, parts);
  for (size_t k = 0; k < parts.size(); k++) {
    if (parts[k].first >= 0) {
      out.push_back(im.added[parts[k].first].id);
    } else {
      im.encode_text(std::move(parts[k].second), k == 0, o.parse_special, scratch, out);
    }
  }
  if (o.add_special_tokens) out.insert(out.end(), im.suffix.begin(), im.suffix.end());
  return out;
}

std::string HfTokenizer::decode(std::span<const uint32_t> tokens) const { return decode(tokens, false); }

std::string HfTokenizer::decode(std::span<const uint32_t> ids, bool skip_special_tokens) const {
  const Impl& im = *impl_;
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (uint32_t id : ids) {
    CHECK(id < im.text.size());
    if (skip_special_tokens && im.special[id]) continue;
    tokens.push_back(im.text[id]);
  }
  std::string out;
  if (im.decoder) {
    im.decoder->decode(tokens);
    for (const std::string& t : tokens) out += t;
  } else {
    for (size_t i = 0; i < tokens.size(); i++) out += (i ? " " : "") + tokens[i];
  }
  out = utf8_valid(out);
  if (im.clean_up_spaces) {
    // transformers' clean_up_tokenization, in its order.
    for (auto [from, to] : std::initializer_list<std::pair<const char*, const char*>>{
             {" .", "."}, {" ?", "?"}, {" !", "!"}, {" ,", ","}, {" ' ", "'"}, {" n't", "n't"}, {" 'm", "'m"},
             {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}})
      out = Decoder::replace(out, from, to);
  }
  return out;
}

std::string HfTokenizer::decode_token(uint32_t token) const {
  CHECK(token < id_bytes_.size());
  return id_bytes_[token];
}

int64_t HfTokenizer::token_id(std::string_view token) const {
  const Impl& im = *impl_;
  for (const AddedToken& t : im.added)
    if (t.content == token) return t.id;
  auto it = im.vocab.find(std::string(token));
  return it == im.vocab.end() ? int64_t{-1} : int64_t{it->second};
}

bool HfTokenizer::is_special(uint32_t id) const { return id < impl_->special.size() && impl_->special[id]; }

const std::string& HfTokenizer::token_text(uint32_t id) const {
  CHECK(id < impl_->text.size());
  return impl_->text[id];
}

}  // namespace tessera::data
