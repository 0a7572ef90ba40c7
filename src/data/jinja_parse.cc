// Lexer and parser of the Jinja subset, following jinja2 3.1's lexer.py and
// parser.py under Hugging Face's settings (trim_blocks, lstrip_blocks,
// loopcontrols; keep_trailing_newline off). Whitespace rules, exactly:
//   - the source's \r\n and \r become \n; one trailing \n is dropped;
//   - `{%-`, `{{-`, `{#-` strip all whitespace before the tag, `-%}`, `-}}`,
//     `-#}` all whitespace after it (Python's str.isspace set);
//   - trim_blocks: a single \n right after `%}` or `#}` is dropped (not
//     after `}}`, not after `+%}`);
//   - lstrip_blocks: spaces and tabs from the start of a line up to `{%` or
//     `{#` are dropped (not before `{{`, not before `{%+`).
#include <algorithm>
#include <charconv>
#include <cstring>
#include <unordered_map>

#include <fmt/format.h>

#include "core/try.h"
#include "data/jinja_ast.h"

namespace tessera::data::jinja {

bool lookup_filter(std::string_view name, Filter* out) {
  static const std::unordered_map<std::string_view, Filter> kFilters = {
      {"abs", Filter::kAbs},         {"capitalize", Filter::kCapitalize}, {"count", Filter::kLength},
      {"d", Filter::kDefault},       {"default", Filter::kDefault},       {"first", Filter::kFirst},
      {"float", Filter::kFloat},     {"indent", Filter::kIndent},         {"int", Filter::kInt},
      {"items", Filter::kItems},     {"join", Filter::kJoin},             {"last", Filter::kLast},
      {"length", Filter::kLength},   {"list", Filter::kList},             {"lower", Filter::kLower},
      {"map", Filter::kMap},         {"max", Filter::kMax},               {"min", Filter::kMin},
      {"reject", Filter::kReject},   {"rejectattr", Filter::kRejectAttr}, {"replace", Filter::kReplace},
      {"reverse", Filter::kReverse}, {"round", Filter::kRound},           {"safe", Filter::kSafe},
      {"select", Filter::kSelect},   {"selectattr", Filter::kSelectAttr}, {"sort", Filter::kSort},
      {"string", Filter::kString},   {"sum", Filter::kSum},               {"title", Filter::kTitle},
      {"tojson", Filter::kToJson},   {"trim", Filter::kTrim},             {"unique", Filter::kUnique},
      {"upper", Filter::kUpper},
  };
  auto it = kFilters.find(name);
  if (it == kFilters.end()) return false;
  *out = it->second;
  return true;
}

bool lookup_test(std::string_view name, Test* out) {
  static const std::unordered_map<std::string_view, Test> kTests = {
      {"boolean", Test::kBoolean}, {"callable", Test::kCallable},  {"defined", Test::kDefined},
      {"divisibleby", Test::kDivisibleBy}, {"eq", Test::kEq},      {"equalto", Test::kEq},
      {"==", Test::kEq},           {"even", Test::kEven},          {"false", Test::kFalse},
      {"float", Test::kFloat},     {"ge", Test::kGe},              {">=", Test::kGe},
      {"gt", Test::kGt},           {">", Test::kGt},               {"greaterthan", Test::kGt},
      {"in", Test::kIn},           {"integer", Test::kInteger},    {"iterable", Test::kIterable},
      {"le", Test::kLe},           {"<=", Test::kLe},              {"lower", Test::kLower},
      {"lt", Test::kLt},           {"<", Test::kLt},               {"lessthan", Test::kLt},
      {"mapping", Test::kMapping}, {"ne", Test::kNe},              {"!=", Test::kNe},
      {"none", Test::kNone},       {"number", Test::kNumber},      {"odd", Test::kOdd},
      {"sameas", Test::kSameAs},   {"sequence", Test::kSequence},  {"string", Test::kString},
      {"true", Test::kTrue},       {"undefined", Test::kUndefined}, {"upper", Test::kUpper},
  };
  auto it = kTests.find(name);
  if (it == kTests.end()) return false;
  *out = it->second;
  return true;
}

namespace {

// ---- Lexer -------------------------------------------------------------------

enum class Tok { kData, kVarBegin, kVarEnd, kBlockBegin, kBlockEnd, kName, kString, kInt, kFloat, kOp, kEof };

struct Token {
  Tok kind;
  std::string text;  // data, name, operator, decoded string literal
  int line;
  int64_t int_value = 0;
  double float_value = 0;
};

Status error_at(int line, const std::string& message) {
  return Status::InvalidArgument(fmt::format("chat template line {}: {}", line, message));
}

bool is_space_ascii(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

// Length of the Python whitespace prefix / suffix (in bytes).
size_t py_space_prefix(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    size_t j = i;
    if (!is_py_space(next_code_point(s, j))) break;
    i = j;
  }
  return i;
}

std::string_view py_rstrip(std::string_view s) {
  // Walk back code point by code point.
  size_t end = s.size();
  while (end > 0) {
    size_t start = end - 1;
    while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
    size_t j = start;
    if (!is_py_space(next_code_point(s, j))) break;
    end = start;
  }
  return s.substr(0, end);
}

class Lexer {
 public:
  explicit Lexer(std::string source) : src_(std::move(source)) {}

  Result<std::vector<Token>> run() {
    while (pos_ < src_.size()) {
      RETURN_IF_ERROR(lex_data());
    }
    tokens_.push_back(Token{Tok::kEof, "", line_at(src_.size())});
    return std::move(tokens_);
  }

 private:
  // The line of byte pos: counted incrementally (queries move forward), so
  // lexing stays linear in the source size.
  int line_at(size_t pos) {
    pos = std::min(pos, src_.size());
    while (counted_ < pos) line_ += src_[counted_++] == '\n';
    while (counted_ > pos) line_ -= src_[--counted_] == '\n';
    return line_;
  }

  // Text up to the next tag, then the tag.
  Status lex_data() {
    size_t open = pos_;
    char kind = 0;
    while (true) {
      open = src_.find('{', open);
      if (open == std::string::npos || open + 1 >= src_.size()) {
        open = std::string::npos;
        break;
      }
      const char c = src_[open + 1];
      if (c == '{' || c == '%' || c == '#') {
        kind = c;
        break;
      }
      ++open;
    }
    if (open == std::string::npos) {
      emit_data(std::string_view(src_).substr(pos_));
      pos_ = src_.size();
      return Status::OK();
    }
    std::string_view text = std::string_view(src_).substr(pos_, open - pos_);
    size_t after = open + 2;
    const char sign = after < src_.size() && (src_[after] == '-' || src_[after] == '+') ? src_[after] : 0;
    if (sign) ++after;
    // {% raw %}: checked before the sign rules apply to its text, as jinja2's root rule does.
    if (kind == '%' && is_raw_begin(after)) {
      text = strip_before(text, sign, true);
      emit_data(text);
      return lex_raw(open, after);
    }
    text = strip_before(text, sign, kind != '{');
    emit_data(text);
    pos_ = after;
    if (kind == '#') return lex_comment(open);
    return lex_tag(kind == '{' ? Tok::kVarBegin : Tok::kBlockBegin, open);
  }

  std::string_view strip_before(std::string_view text, char sign, bool is_block) const {
    if (sign == '-') return py_rstrip(text);
    if (sign == '+' || !is_block) return text;
    // lstrip_blocks: only whitespace between the line start and the tag.
    const size_t nl = text.rfind('\n');
    const size_t l_pos = nl == std::string_view::npos ? 0 : nl + 1;
    if (l_pos > 0 || line_starting_) {
      std::string_view rest = text.substr(l_pos);
      if (!rest.empty() && py_space_prefix(rest) == rest.size()) return text.substr(0, l_pos);
    }
    return text;
  }

  // text: a piece of src_ (after whitespace control).
  void emit_data(std::string_view text) {
    if (!text.empty()) {
      tokens_.push_back(Token{Tok::kData, std::string(text), line_at(static_cast<size_t>(text.data() - src_.data()))});
    }
  }

  // Whether `\s*raw\s*(-%}|%})` starts at p.
  bool is_raw_begin(size_t p) const {
    while (p < src_.size() && is_space_ascii(src_[p])) ++p;
    if (src_.compare(p, 3, "raw") != 0) return false;
    p += 3;
    while (p < src_.size() && is_space_ascii(src_[p])) ++p;
    return src_.compare(p, 2, "%}") == 0 || src_.compare(p, 3, "-%}") == 0;
  }

  Status lex_raw(size_t open, size_t after) {
    const int line = line_at(open);
    size_t p = src_.find("raw", after) + 3;
    while (is_space_ascii(src_[p])) ++p;
    if (src_[p] == '-') {
      p += 3;
      while (p < src_.size()) {
        size_t j = p;
        if (!is_py_space(next_code_point(src_, j))) break;
        p = j;
      }
    } else {
      p += 2;  // no trim_blocks after raw's %} (jinja2's root raw rule)
    }
    // Find {%[-+]?\s*endraw\s*(+%}|-%}\s*|%}\n?)
    size_t search = p;
    while (true) {
      const size_t b = src_.find("{%", search);
      if (b == std::string::npos) return error_at(line, "missing end of raw directive");
      size_t q = b + 2;
      char sign = 0;
      if (q < src_.size() && (src_[q] == '-' || src_[q] == '+')) sign = src_[q++];
      while (q < src_.size() && is_space_ascii(src_[q])) ++q;
      if (src_.compare(q, 6, "endraw") != 0) {
        search = b + 2;
        continue;
      }
      q += 6;
      while (q < src_.size() && is_space_ascii(src_[q])) ++q;
      std::string_view body = std::string_view(src_).substr(p, b - p);
      body = strip_before(body, sign, true);
      emit_data(body);
      if (src_.compare(q, 3, "+%}") == 0) {
        q += 3;
      } else if (src_.compare(q, 3, "-%}") == 0) {
        q += 3;
        q += py_space_prefix(std::string_view(src_).substr(q));
      } else if (src_.compare(q, 2, "%}") == 0) {
        q += 2;
        if (q < src_.size() && src_[q] == '\n') ++q;
      } else {
        return error_at(line_at(q), "expected '%}' after 'endraw'");
      }
      line_starting_ = src_[q - 1] == '\n';
      pos_ = q;
      return Status::OK();
    }
  }

  Status lex_comment(size_t open) {
    size_t search = pos_;
    while (true) {
      const size_t end = src_.find("#}", search);
      if (end == std::string::npos) return error_at(line_at(open), "missing end of comment tag");
      size_t q = end + 2;
      const char before = end > pos_ ? src_[end - 1] : 0;
      if (before == '-') {
        q += py_space_prefix(std::string_view(src_).substr(q));
      } else if (before != '+') {
        if (q < src_.size() && src_[q] == '\n') ++q;
      }
      line_starting_ = src_[q - 1] == '\n';
      pos_ = q;
      return Status::OK();
    }
  }

  Status lex_tag(Tok begin, size_t open) {
    tokens_.push_back(Token{begin, "", line_at(open)});
    std::vector<char> brackets;
    while (true) {
      // Whitespace inside the tag.
      while (pos_ < src_.size() && is_space_ascii(src_[pos_])) ++pos_;
      line_at(pos_);
      if (pos_ >= src_.size()) {
        return error_at(line_at(open), begin == Tok::kVarBegin ? "unexpected end of template: '{{' is never closed"
                                                                : "unexpected end of template: '{%' is never closed");
      }
      if (brackets.empty() && lex_tag_end(begin)) return Status::OK();
      const char c = src_[pos_];
      if (std::isdigit(static_cast<unsigned char>(c))) {
        RETURN_IF_ERROR(lex_number());
      } else if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t e = pos_;
        while (e < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[e])) || src_[e] == '_')) ++e;
        tokens_.push_back(Token{Tok::kName, src_.substr(pos_, e - pos_), line_});
        pos_ = e;
      } else if (c == '\'' || c == '"') {
        RETURN_IF_ERROR(lex_string());
      } else {
        static const char* kOps[] = {"//", "**", "==", "!=", ">=", "<=", "+", "-", "/", "*", "%", "~", "[", "]",
                                     "(",  ")",  "{",  "}",  ">",  "<",  "=", ".", ":", "|", ",", ";"};
        std::string op;
        for (const char* candidate : kOps) {
          if (src_.compare(pos_, std::strlen(candidate), candidate) == 0) {
            op = candidate;
            break;
          }
        }
        if (op.empty()) {
          std::string shown = (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f)
                                  ? fmt::format("\\x{:02x}", static_cast<unsigned char>(c))
                                  : std::string(1, c);
          return error_at(line_, fmt::format("unexpected character '{}'", shown));
        }
        if (op == "(" || op == "[" || op == "{") {
          if (brackets.size() >= static_cast<size_t>(kMaxParseDepth)) {
            return error_at(line_, fmt::format("brackets nested deeper than {}", kMaxParseDepth));
          }
          brackets.push_back(op == "(" ? ')' : op == "[" ? ']' : '}');
        } else if (op == ")" || op == "]" || op == "}") {
          if (brackets.empty()) return error_at(line_, fmt::format("unexpected '{}'", op));
          if (brackets.back() != op[0]) {
            return error_at(line_, fmt::format("unexpected '{}', expected '{}'", op, brackets.back()));
          }
          brackets.pop_back();
        }
        tokens_.push_back(Token{Tok::kOp, op, line_});
        pos_ += op.size();
      }
    }
  }

  // The end of a {{ }} or {% %} tag at pos_ (brackets balanced), with its
  // whitespace rule.
  bool lex_tag_end(Tok begin) {
    std::string_view rest = std::string_view(src_).substr(pos_);
    size_t q = pos_;
    if (begin == Tok::kVarBegin) {
      if (rest.starts_with("-}}")) {
        q += 3;
        q += py_space_prefix(std::string_view(src_).substr(q));
      } else if (rest.starts_with("}}")) {
        q += 2;
      } else {
        return false;
      }
    } else {
      if (rest.starts_with("+%}")) {
        q += 3;
      } else if (rest.starts_with("-%}")) {
        q += 3;
        q += py_space_prefix(std::string_view(src_).substr(q));
      } else if (rest.starts_with("%}")) {
        q += 2;
        if (q < src_.size() && src_[q] == '\n') ++q;
      } else {
        return false;
      }
    }
    tokens_.push_back(Token{begin == Tok::kVarBegin ? Tok::kVarEnd : Tok::kBlockEnd, "", line_at(pos_)});
    line_starting_ = src_[q - 1] == '\n';
    pos_ = q;
    return true;
  }

  Status lex_number() {
    size_t e = pos_;
    auto digits = [&](size_t p) {  // (\d+_)*\d+ from p; returns the end (p when none)
      size_t q = p;
      while (q < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[q])) ||
                                 (src_[q] == '_' && q > p && q + 1 < src_.size() &&
                                  std::isdigit(static_cast<unsigned char>(src_[q + 1]))))) {
        ++q;
      }
      return q;
    };
    e = digits(pos_);
    bool is_float = false;
    if (e + 1 < src_.size() && src_[e] == '.' && std::isdigit(static_cast<unsigned char>(src_[e + 1]))) {
      e = digits(e + 1);
      is_float = true;
    }
    if (e < src_.size() && (src_[e] == 'e' || src_[e] == 'E')) {
      size_t q = e + 1;
      if (q < src_.size() && (src_[q] == '+' || src_[q] == '-')) ++q;
      const size_t end = digits(q);
      if (end > q) {
        e = end;
        is_float = true;
      }
    }
    std::string text = src_.substr(pos_, e - pos_);
    text.erase(std::remove(text.begin(), text.end(), '_'), text.end());
    Token t{is_float ? Tok::kFloat : Tok::kInt, text, line_};
    if (is_float) {
      t.float_value = std::strtod(text.c_str(), nullptr);
    } else {
      if (text.size() > 1 && text[0] == '0' && text.find_first_not_of('0') != std::string::npos) {
        return error_at(line_, fmt::format("'{}' is not a supported number (prefixed or zero-led)", text));
      }
      auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), t.int_value);
      if (ec != std::errc()) return error_at(line_, fmt::format("integer {} is too large", text));
    }
    tokens_.push_back(std::move(t));
    pos_ = e;
    return Status::OK();
  }

  // A quoted string with Python's escapes (jinja2 decodes with
  // "unicode-escape"; an unknown escape is kept as written).
  Status lex_string() {
    const char quote = src_[pos_];
    const int start_line = line_at(pos_);
    std::string value;
    size_t p = pos_ + 1;
    while (true) {
      if (p >= src_.size()) return error_at(start_line, "unterminated string");
      const char c = src_[p];
      if (c == quote) break;
      if (c != '\\') {
        value += c;
        ++p;
        continue;
      }
      if (p + 1 >= src_.size()) return error_at(start_line, "unterminated string");
      const char e = src_[p + 1];
      p += 2;
      auto hex = [&](int n) -> Result<char32_t> {
        if (p + n > src_.size()) return error_at(start_line, "truncated \\x, \\u or \\U escape");
        char32_t cp = 0;
        for (int k = 0; k < n; ++k) {
          const char h = src_[p + k];
          if (!std::isxdigit(static_cast<unsigned char>(h))) return error_at(start_line, "malformed \\x, \\u or \\U escape");
          cp = cp * 16 + static_cast<char32_t>(std::isdigit(static_cast<unsigned char>(h)) ? h - '0'
                                                                                        : (std::tolower(h) - 'a' + 10));
        }
        p += n;
        return cp;
      };
      switch (e) {
        case '\n': break;  // line continuation
        case '\\': value += '\\'; break;
        case '\'': value += '\''; break;
        case '"': value += '"'; break;
        case 'a': value += '\a'; break;
        case 'b': value += '\b'; break;
        case 'f': value += '\f'; break;
        case 'n': value += '\n'; break;
        case 'r': value += '\r'; break;
        case 't': value += '\t'; break;
        case 'v': value += '\v'; break;
        case 'x': {
          ASSIGN_OR_RETURN(char32_t cp, hex(2));
          append_utf8(value, cp);
          break;
        }
        case 'u':
        case 'U': {
          ASSIGN_OR_RETURN(char32_t cp, hex(e == 'u' ? 4 : 8));
          if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
            return error_at(start_line, "escape is not a Unicode scalar value");
          }
          append_utf8(value, cp);
          break;
        }
        case '0': case '1': case '2': case '3': case '4': case '5': case '6': case '7': {
          char32_t cp = static_cast<char32_t>(e - '0');
          for (int k = 0; k < 2 && p < src_.size() && src_[p] >= '0' && src_[p] <= '7'; ++k) {
            cp = cp * 8 + static_cast<char32_t>(src_[p++] - '0');
          }
          append_utf8(value, cp);
          break;
        }
        default:
          value += '\\';
          value += e;
      }
    }
    tokens_.push_back(Token{Tok::kString, std::move(value), start_line});
    pos_ = p + 1;
    return Status::OK();
  }

  std::string src_;
  size_t pos_ = 0;
  size_t counted_ = 0;  // line_ is the line of byte counted_
  int line_ = 1;
  bool line_starting_ = true;
  std::vector<Token> tokens_;
};

// ---- Parser ------------------------------------------------------------------

using ExprPtr = std::unique_ptr<Expr>;

ExprPtr make_expr(Expr::Kind kind, int line) {
  auto e = std::make_unique<Expr>();
  e->kind = kind;
  e->line = line;
  return e;
}

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : toks_(std::move(tokens)) {}

  Result<std::unique_ptr<Program>> run() {
    auto program = std::make_unique<Program>();
    std::string end_tag;
    RETURN_IF_ERROR(parse_body({}, program->body, &end_tag, 0));
    return program;
  }

 private:
  const Token& peek(size_t ahead = 0) const { return toks_[std::min(pos_ + ahead, toks_.size() - 1)]; }
  const Token& next() {
    const Token& t = toks_[pos_];
    if (pos_ + 1 < toks_.size()) ++pos_;
    return t;
  }
  bool at_op(std::string_view op) const { return peek().kind == Tok::kOp && peek().text == op; }
  bool at_name(std::string_view name) const { return peek().kind == Tok::kName && peek().text == name; }
  bool skip_op(std::string_view op) {
    if (!at_op(op)) return false;
    next();
    return true;
  }
  bool skip_name(std::string_view name) {
    if (!at_name(name)) return false;
    next();
    return true;
  }

  static std::string describe(const Token& t) {
    switch (t.kind) {
      case Tok::kEof: return "end of template";
      case Tok::kBlockEnd: return "'%}'";
      case Tok::kVarEnd: return "'}}'";
      case Tok::kString: return "a string";
      case Tok::kInt:
      case Tok::kFloat: return "a number";
      case Tok::kName: return "'" + t.text + "'";
      case Tok::kOp: return "'" + t.text + "'";
      default: return "text";
    }
  }

  Status unexpected(std::string_view wanted) const {
    return error_at(peek().line, fmt::format("expected {}, got {}", wanted, describe(peek())));
  }
  Status expect_op(std::string_view op) {
    if (!skip_op(op)) return unexpected(fmt::format("'{}'", op));
    return Status::OK();
  }
  Status expect_block_end() {
    if (peek().kind != Tok::kBlockEnd) return unexpected("'%}'");
    next();
    return Status::OK();
  }
  Result<std::string> expect_identifier() {
    if (peek().kind != Tok::kName) return unexpected("a name");
    return next().text;
  }

  // A left-associative chain (a + b + c ...) nests in the tree as deep as it
  // is long: bounded like any nesting.
  Status chain_step(int& links) const {
    if (++links > kMaxParseDepth) {
      return error_at(peek().line, fmt::format("expression chain longer than {} operators", kMaxParseDepth));
    }
    return Status::OK();
  }

  Status enter(int depth) const {
    if (depth > kMaxParseDepth) {
      return error_at(peek().line, fmt::format("template nested deeper than {} levels", kMaxParseDepth));
    }
    return Status::OK();
  }

  // Statements until one of `ends` ({% end... %}, {% else %}, ...) or the
  // end of the template (only when ends is empty). *end_tag: which one.
  // open_line: the line of the tag that opened the block (for the error
  // when it is never closed).
  Status parse_body(const std::vector<std::string_view>& ends, std::vector<Stmt>& out, std::string* end_tag,
                    int depth, int open_line = 0) {
    RETURN_IF_ERROR(enter(depth));
    while (true) {
      const Token& t = peek();
      if (t.kind == Tok::kEof) {
        if (ends.empty()) return Status::OK();
        return error_at(open_line, fmt::format("unexpected end of template: this block is never closed with '{}'",
                                               ends.back()));
      }
      if (t.kind == Tok::kData) {
        Stmt s;
        s.kind = Stmt::Kind::kText;
        s.line = t.line;
        s.text = t.text;
        out.push_back(std::move(s));
        next();
        continue;
      }
      if (t.kind == Tok::kVarBegin) {
        next();
        Stmt s;
        s.kind = Stmt::Kind::kOutput;
        s.line = t.line;
        ASSIGN_OR_RETURN(s.expr, parse_tuple(depth + 1));
        if (peek().kind != Tok::kVarEnd) return unexpected("'}}'");
        next();
        out.push_back(std::move(s));
        continue;
      }
      if (t.kind != Tok::kBlockBegin) return unexpected("a tag");
      const Token& tag = peek(1);
      if (tag.kind != Tok::kName) {
        next();
        return unexpected("a tag name");
      }
      for (std::string_view end : ends) {
        if (tag.text == end) {
          next();
          next();
          *end_tag = tag.text;
          return Status::OK();
        }
      }
      if (tag.text.starts_with("end") || tag.text == "else" || tag.text == "elif") {
        return error_at(tag.line, fmt::format("unexpected '{}'", tag.text));
      }
      next();
      next();
      Stmt s;
      s.line = tag.line;
      RETURN_IF_ERROR(parse_statement(tag.text, s, depth + 1));
      out.push_back(std::move(s));
    }
  }

  Status parse_statement(const std::string& tag, Stmt& s, int depth) {
    if (tag == "if") return parse_if(s, depth);
    if (tag == "for") return parse_for(s, depth);
    if (tag == "set") return parse_set(s, depth);
    if (tag == "macro") return parse_macro(s, depth);
    if (tag == "break" || tag == "continue") {
      if (loop_depth_ == 0) return error_at(s.line, fmt::format("'{}' outside a for loop", tag));
      s.kind = tag == "break" ? Stmt::Kind::kBreak : Stmt::Kind::kContinue;
      return expect_block_end();
    }
    if (tag == "generation") {
      s.kind = Stmt::Kind::kBlock;
      RETURN_IF_ERROR(expect_block_end());
      std::string end;
      RETURN_IF_ERROR(parse_body({"endgeneration"}, s.body, &end, depth, s.line));
      return expect_block_end();
    }
    static const std::vector<std::string_view> kRefused = {"include", "import", "from", "extends", "block",
                                                           "call", "filter", "with", "do", "autoescape",
                                                           "trans", "pluralize", "endtrans", "debug"};
    for (std::string_view refused : kRefused) {
      if (tag == refused) return error_at(s.line, fmt::format("the '{}' tag is not supported", tag));
    }
    return error_at(s.line, fmt::format("unknown tag '{}'", tag));
  }

  Status parse_if(Stmt& s, int depth) {
    s.kind = Stmt::Kind::kIf;
    while (true) {
      ASSIGN_OR_RETURN(ExprPtr cond, parse_tuple(depth));
      RETURN_IF_ERROR(expect_block_end());
      std::vector<Stmt> body;
      std::string end;
      RETURN_IF_ERROR(parse_body({"elif", "else", "endif"}, body, &end, depth, s.line));
      s.conds.push_back(std::move(cond));
      s.bodies.push_back(std::move(body));
      if (end == "elif") continue;
      if (end == "else") {
        RETURN_IF_ERROR(expect_block_end());
        RETURN_IF_ERROR(parse_body({"endif"}, s.else_body, &end, depth, s.line));
      }
      return expect_block_end();
    }
  }

  Status parse_targets(std::vector<std::string>& targets) {
    const bool paren = skip_op("(");
    while (true) {
      ASSIGN_OR_RETURN(std::string name, expect_identifier());
      if (name == "true" || name == "false" || name == "none" || name == "True" || name == "False" ||
          name == "None") {
        return error_at(peek().line, fmt::format("cannot assign to '{}'", name));
      }
      targets.push_back(std::move(name));
      if (!skip_op(",")) break;
      if (peek().kind != Tok::kName) break;  // trailing comma
    }
    if (paren) RETURN_IF_ERROR(expect_op(")"));
    return Status::OK();
  }

  Status parse_for(Stmt& s, int depth) {
    s.kind = Stmt::Kind::kFor;
    RETURN_IF_ERROR(parse_targets(s.targets));
    if (!skip_name("in")) return unexpected("'in'");
    ASSIGN_OR_RETURN(s.expr, parse_tuple(depth, /*with_condexpr=*/false));
    if (skip_name("if")) {
      ASSIGN_OR_RETURN(s.cond, parse_expression(depth, true));
    }
    if (at_name("recursive")) return error_at(peek().line, "recursive for loops are not supported");
    RETURN_IF_ERROR(expect_block_end());
    std::string end;
    ++loop_depth_;
    Status st = parse_body({"else", "endfor"}, s.body, &end, depth, s.line);
    --loop_depth_;
    RETURN_IF_ERROR(st);
    if (end == "else") {
      RETURN_IF_ERROR(expect_block_end());
      RETURN_IF_ERROR(parse_body({"endfor"}, s.else_body, &end, depth, s.line));
    }
    return expect_block_end();
  }

  Status parse_set(Stmt& s, int depth) {
    s.kind = Stmt::Kind::kSet;
    if (peek().kind == Tok::kName && peek(1).kind == Tok::kOp && peek(1).text == ".") {
      s.targets.push_back(next().text);
      next();
      ASSIGN_OR_RETURN(s.attr, expect_identifier());
    } else {
      RETURN_IF_ERROR(parse_targets(s.targets));
    }
    if (peek().kind == Tok::kBlockEnd && s.targets.size() == 1 && s.attr.empty()) {
      s.kind = Stmt::Kind::kSetBlock;
      next();
      std::string end;
      RETURN_IF_ERROR(parse_body({"endset"}, s.body, &end, depth, s.line));
      return expect_block_end();
    }
    if (at_op("|")) return error_at(peek().line, "filters on a block set are not supported");
    RETURN_IF_ERROR(expect_op("="));
    ASSIGN_OR_RETURN(s.expr, parse_tuple(depth));
    return expect_block_end();
  }

  Status parse_macro(Stmt& s, int depth) {
    s.kind = Stmt::Kind::kMacro;
    ASSIGN_OR_RETURN(std::string name, expect_identifier());
    s.targets.push_back(std::move(name));
    RETURN_IF_ERROR(expect_op("("));
    while (!at_op(")")) {
      if (!s.params.empty()) RETURN_IF_ERROR(expect_op(","));
      if (at_op(")")) break;
      ASSIGN_OR_RETURN(std::string param, expect_identifier());
      s.params.push_back(std::move(param));
      if (skip_op("=")) {
        ASSIGN_OR_RETURN(ExprPtr def, parse_expression(depth, true));
        s.defaults.push_back(std::move(def));
      } else {
        if (!s.defaults.empty() && s.defaults.back() != nullptr) {
          return error_at(peek().line, "a parameter without a default follows one with a default");
        }
        s.defaults.push_back(nullptr);
      }
    }
    next();
    RETURN_IF_ERROR(expect_block_end());
    const int saved = loop_depth_;
    loop_depth_ = 0;  // break/continue do not cross a macro
    std::string end;
    Status st = parse_body({"endmacro"}, s.body, &end, depth, s.line);
    loop_depth_ = saved;
    RETURN_IF_ERROR(st);
    return expect_block_end();
  }

  // ---- Expressions (jinja2's precedence) ----

  // expr [, expr ...]: a tuple when there is a comma.
  Result<ExprPtr> parse_tuple(int depth, bool with_condexpr = true) {
    const int line = peek().line;
    ASSIGN_OR_RETURN(ExprPtr first, parse_expression(depth, with_condexpr));
    if (!at_op(",")) return first;
    auto tuple = make_expr(Expr::Kind::kTuple, line);
    tuple->args.push_back(std::move(first));
    while (skip_op(",")) {
      if (peek().kind == Tok::kBlockEnd || peek().kind == Tok::kVarEnd || at_op(")")) break;
      ASSIGN_OR_RETURN(ExprPtr item, parse_expression(depth, with_condexpr));
      tuple->args.push_back(std::move(item));
    }
    return tuple;
  }

  Result<ExprPtr> parse_expression(int depth, bool with_condexpr) {
    RETURN_IF_ERROR(enter(depth));
    if (!with_condexpr) return parse_or(depth);
    const int line = peek().line;
    ASSIGN_OR_RETURN(ExprPtr expr, parse_or(depth));
    int links = 0;
    while (skip_name("if")) {
      RETURN_IF_ERROR(chain_step(links));
      auto cond = make_expr(Expr::Kind::kCond, line);
      ASSIGN_OR_RETURN(ExprPtr test, parse_or(depth));
      cond->args.push_back(std::move(expr));
      cond->args.push_back(std::move(test));
      if (skip_name("else")) {
        ASSIGN_OR_RETURN(ExprPtr otherwise, parse_expression(depth + 1, true));
        cond->args.push_back(std::move(otherwise));
      } else {
        cond->args.push_back(nullptr);
      }
      expr = std::move(cond);
    }
    return expr;
  }

  Result<ExprPtr> parse_or(int depth) {
    RETURN_IF_ERROR(enter(depth));
    ASSIGN_OR_RETURN(ExprPtr left, parse_and(depth));
    int links = 0;
    while (at_name("or")) {
      RETURN_IF_ERROR(chain_step(links));
      const int line = next().line;
      ASSIGN_OR_RETURN(ExprPtr right, parse_and(depth));
      auto e = make_expr(Expr::Kind::kOr, line);
      e->args.push_back(std::move(left));
      e->args.push_back(std::move(right));
      left = std::move(e);
    }
    return left;
  }

  Result<ExprPtr> parse_and(int depth) {
    ASSIGN_OR_RETURN(ExprPtr left, parse_not(depth));
    int links = 0;
    while (at_name("and")) {
      RETURN_IF_ERROR(chain_step(links));
      const int line = next().line;
      ASSIGN_OR_RETURN(ExprPtr right, parse_not(depth));
      auto e = make_expr(Expr::Kind::kAnd, line);
      e->args.push_back(std::move(left));
      e->args.push_back(std::move(right));
      left = std::move(e);
    }
    return left;
  }

  Result<ExprPtr> parse_not(int depth) {
    RETURN_IF_ERROR(enter(depth));
    if (at_name("not")) {
      const int line = next().line;
      ASSIGN_OR_RETURN(ExprPtr operand, parse_not(depth + 1));
      auto e = make_expr(Expr::Kind::kNot, line);
      e->args.push_back(std::move(operand));
      return e;
    }
    return parse_compare(depth);
  }

  Result<ExprPtr> parse_compare(int depth) {
    const int line = peek().line;
    ASSIGN_OR_RETURN(ExprPtr first, parse_math1(depth));
    ExprPtr chain;
    while (true) {
      CmpOp op;
      if (at_op("==")) {
        op = CmpOp::kEq;
      } else if (at_op("!=")) {
        op = CmpOp::kNe;
      } else if (at_op("<")) {
        op = CmpOp::kLt;
      } else if (at_op("<=")) {
        op = CmpOp::kLe;
      } else if (at_op(">")) {
        op = CmpOp::kGt;
      } else if (at_op(">=")) {
        op = CmpOp::kGe;
      } else if (at_name("in")) {
        op = CmpOp::kIn;
      } else if (at_name("not") && peek(1).kind == Tok::kName && peek(1).text == "in") {
        next();
        op = CmpOp::kNotIn;
      } else {
        break;
      }
      next();
      ASSIGN_OR_RETURN(ExprPtr right, parse_math1(depth));
      if (!chain) {
        chain = make_expr(Expr::Kind::kCompare, line);
        chain->args.push_back(std::move(first));
      }
      chain->cmp_ops.push_back(op);
      chain->args.push_back(std::move(right));
    }
    return chain ? std::move(chain) : std::move(first);
  }

  Result<ExprPtr> binary(ExprPtr left, BinOp op, ExprPtr right, int line) {
    auto e = make_expr(Expr::Kind::kBinary, line);
    e->op = op;
    e->args.push_back(std::move(left));
    e->args.push_back(std::move(right));
    return e;
  }

  Result<ExprPtr> parse_math1(int depth) {
    RETURN_IF_ERROR(enter(depth));
    ASSIGN_OR_RETURN(ExprPtr left, parse_concat(depth));
    int links = 0;
    while (at_op("+") || at_op("-")) {
      RETURN_IF_ERROR(chain_step(links));
      const Token& t = next();
      const BinOp op = t.text == "+" ? BinOp::kAdd : BinOp::kSub;
      ASSIGN_OR_RETURN(ExprPtr right, parse_concat(depth));
      ASSIGN_OR_RETURN(left, binary(std::move(left), op, std::move(right), t.line));
    }
    return left;
  }

  Result<ExprPtr> parse_concat(int depth) {
    const int line = peek().line;
    ASSIGN_OR_RETURN(ExprPtr first, parse_math2(depth));
    if (!at_op("~")) return first;
    auto e = make_expr(Expr::Kind::kConcat, line);
    e->args.push_back(std::move(first));
    while (skip_op("~")) {
      ASSIGN_OR_RETURN(ExprPtr item, parse_math2(depth));
      e->args.push_back(std::move(item));
    }
    return e;
  }

  Result<ExprPtr> parse_math2(int depth) {
    ASSIGN_OR_RETURN(ExprPtr left, parse_pow(depth));
    int links = 0;
    while (at_op("*") || at_op("/") || at_op("//") || at_op("%")) {
      RETURN_IF_ERROR(chain_step(links));
      const Token& t = next();
      const BinOp op = t.text == "*"    ? BinOp::kMul
                       : t.text == "/"  ? BinOp::kDiv
                       : t.text == "//" ? BinOp::kFloorDiv
                                        : BinOp::kMod;
      ASSIGN_OR_RETURN(ExprPtr right, parse_pow(depth));
      ASSIGN_OR_RETURN(left, binary(std::move(left), op, std::move(right), t.line));
    }
    return left;
  }

  Result<ExprPtr> parse_pow(int depth) {
    ASSIGN_OR_RETURN(ExprPtr left, parse_unary(depth, true));
    int links = 0;
    while (at_op("**")) {
      RETURN_IF_ERROR(chain_step(links));
      const int line = next().line;
      ASSIGN_OR_RETURN(ExprPtr right, parse_unary(depth, true));
      ASSIGN_OR_RETURN(left, binary(std::move(left), BinOp::kPow, std::move(right), line));
    }
    return left;
  }

  Result<ExprPtr> parse_unary(int depth, bool with_filter) {
    RETURN_IF_ERROR(enter(depth));
    ExprPtr node;
    if (at_op("-") || at_op("+")) {
      const Token& t = next();
      ASSIGN_OR_RETURN(ExprPtr operand, parse_unary(depth + 1, false));
      node = make_expr(t.text == "-" ? Expr::Kind::kNeg : Expr::Kind::kPos, t.line);
      node->args.push_back(std::move(operand));
    } else {
      ASSIGN_OR_RETURN(node, parse_primary(depth));
    }
    ASSIGN_OR_RETURN(node, parse_postfix(std::move(node), depth));
    if (with_filter) {
      ASSIGN_OR_RETURN(node, parse_filter_expr(std::move(node), depth));
    }
    return node;
  }

  Result<ExprPtr> parse_primary(int depth) {
    RETURN_IF_ERROR(enter(depth));
    const Token& t = peek();
    switch (t.kind) {
      case Tok::kName: {
        next();
        auto e = make_expr(Expr::Kind::kLiteral, t.line);
        if (t.text == "true" || t.text == "True") {
          e->literal = Value::boolean(true);
        } else if (t.text == "false" || t.text == "False") {
          e->literal = Value::boolean(false);
        } else if (t.text == "none" || t.text == "None") {
          e->literal = Value::none();
        } else {
          e->kind = Expr::Kind::kName;
          e->name = t.text;
        }
        return e;
      }
      case Tok::kString: {
        auto e = make_expr(Expr::Kind::kLiteral, t.line);
        std::string s;
        while (peek().kind == Tok::kString) s += next().text;  // adjacent literals join
        e->literal = Value::string(std::move(s));
        return e;
      }
      case Tok::kInt: {
        next();
        auto e = make_expr(Expr::Kind::kLiteral, t.line);
        e->literal = Value::integer(t.int_value);
        return e;
      }
      case Tok::kFloat: {
        next();
        auto e = make_expr(Expr::Kind::kLiteral, t.line);
        e->literal = Value::floating(t.float_value);
        return e;
      }
      case Tok::kOp:
        if (t.text == "(") {
          next();
          if (skip_op(")")) return make_expr(Expr::Kind::kTuple, t.line);
          ASSIGN_OR_RETURN(ExprPtr first, parse_expression(depth + 1, true));
          if (skip_op(")")) return first;
          auto tuple = make_expr(Expr::Kind::kTuple, t.line);
          tuple->args.push_back(std::move(first));
          while (skip_op(",")) {
            if (at_op(")")) break;
            ASSIGN_OR_RETURN(ExprPtr item, parse_expression(depth + 1, true));
            tuple->args.push_back(std::move(item));
          }
          RETURN_IF_ERROR(expect_op(")"));
          return tuple;
        }
        if (t.text == "[") {
          next();
          auto list = make_expr(Expr::Kind::kList, t.line);
          while (!at_op("]")) {
            if (!list->args.empty()) RETURN_IF_ERROR(expect_op(","));
            if (at_op("]")) break;
            ASSIGN_OR_RETURN(ExprPtr item, parse_expression(depth + 1, true));
            list->args.push_back(std::move(item));
          }
          next();
          return list;
        }
        if (t.text == "{") {
          next();
          auto dict = make_expr(Expr::Kind::kDict, t.line);
          while (!at_op("}")) {
            if (!dict->args.empty()) RETURN_IF_ERROR(expect_op(","));
            if (at_op("}")) break;
            ASSIGN_OR_RETURN(ExprPtr key, parse_expression(depth + 1, true));
            RETURN_IF_ERROR(expect_op(":"));
            ASSIGN_OR_RETURN(ExprPtr value, parse_expression(depth + 1, true));
            dict->args.push_back(std::move(key));
            dict->args.push_back(std::move(value));
          }
          next();
          return dict;
        }
        [[fallthrough]];
      default: return unexpected("an expression");
    }
  }

  Status parse_call_args(Expr& call, int depth) {
    // '(' already consumed.
    while (!at_op(")")) {
      if (call.args.size() > 1 || !call.kwargs.empty()) RETURN_IF_ERROR(expect_op(","));
      if (at_op(")")) break;
      if (at_op("*") || at_op("**")) return error_at(peek().line, "*args and **kwargs in calls are not supported");
      if (peek().kind == Tok::kName && peek(1).kind == Tok::kOp && peek(1).text == "=") {
        std::string key = next().text;
        next();
        ASSIGN_OR_RETURN(ExprPtr value, parse_expression(depth + 1, true));
        call.kwargs.emplace_back(std::move(key), std::move(value));
      } else {
        if (!call.kwargs.empty()) return error_at(peek().line, "a positional argument follows a keyword argument");
        ASSIGN_OR_RETURN(ExprPtr value, parse_expression(depth + 1, true));
        call.args.push_back(std::move(value));
      }
    }
    next();
    return Status::OK();
  }

  Result<ExprPtr> parse_postfix(ExprPtr node, int depth) {
    int chain = 0;
    while (true) {
      if (++chain > kMaxParseDepth) return error_at(peek().line, "expression chain too long");
      if (at_op(".")) {
        const int line = next().line;
        auto e = make_expr(Expr::Kind::kAttr, line);
        if (peek().kind == Tok::kInt) {  // x.0 is x[0]
          e->kind = Expr::Kind::kItem;
          auto idx = make_expr(Expr::Kind::kLiteral, line);
          idx->literal = Value::integer(next().int_value);
          e->args.push_back(std::move(node));
          e->args.push_back(std::move(idx));
        } else {
          ASSIGN_OR_RETURN(e->name, expect_identifier());
          e->args.push_back(std::move(node));
        }
        node = std::move(e);
      } else if (at_op("[")) {
        const int line = next().line;
        ExprPtr parts[3];
        bool is_slice = false;
        for (int k = 0; k < 3; ++k) {
          if (!at_op(":") && !at_op("]")) {
            ASSIGN_OR_RETURN(parts[k], parse_expression(depth + 1, true));
          }
          if (k < 2 && skip_op(":")) {
            is_slice = true;
            continue;
          }
          break;
        }
        RETURN_IF_ERROR(expect_op("]"));
        if (is_slice) {
          auto e = make_expr(Expr::Kind::kSlice, line);
          e->args.push_back(std::move(node));
          for (auto& p : parts) e->args.push_back(std::move(p));
          node = std::move(e);
        } else {
          if (!parts[0]) return error_at(line, "empty subscript");
          auto e = make_expr(Expr::Kind::kItem, line);
          e->args.push_back(std::move(node));
          e->args.push_back(std::move(parts[0]));
          node = std::move(e);
        }
      } else if (at_op("(")) {
        const int line = next().line;
        auto e = make_expr(Expr::Kind::kCall, line);
        e->args.push_back(std::move(node));
        RETURN_IF_ERROR(parse_call_args(*e, depth));
        node = std::move(e);
      } else {
        return node;
      }
    }
  }

  Result<ExprPtr> parse_filter_expr(ExprPtr node, int depth) {
    int chain = 0;
    while (true) {
      if (++chain > kMaxParseDepth) return error_at(peek().line, "filter chain too long");
      if (at_op("|")) {
        const int line = next().line;
        ASSIGN_OR_RETURN(std::string name, expect_identifier());
        while (skip_op(".")) {
          ASSIGN_OR_RETURN(std::string part, expect_identifier());
          name += "." + part;
        }
        auto e = make_expr(Expr::Kind::kFilter, line);
        e->name = name;
        if (!lookup_filter(name, &e->filter)) return error_at(line, fmt::format("unknown filter '{}'", name));
        e->args.push_back(std::move(node));
        if (skip_op("(")) RETURN_IF_ERROR(parse_call_args(*e, depth));
        node = std::move(e);
      } else if (at_name("is")) {
        const int line = next().line;
        auto e = make_expr(Expr::Kind::kTest, line);
        e->negated = skip_name("not");
        if (peek().kind != Tok::kName) return unexpected("a test name");
        e->name = next().text;
        while (skip_op(".")) {
          ASSIGN_OR_RETURN(std::string part, expect_identifier());
          e->name += "." + part;
        }
        if (!lookup_test(e->name, &e->test)) return error_at(line, fmt::format("unknown test '{}'", e->name));
        e->args.push_back(std::move(node));
        if (skip_op("(")) {
          RETURN_IF_ERROR(parse_call_args(*e, depth));
        } else if ((peek().kind == Tok::kName && !at_name("else") && !at_name("or") && !at_name("and") &&
                    !at_name("if") && !at_name("is") && !at_name("in") && !at_name("not")) ||
                   peek().kind == Tok::kString || peek().kind == Tok::kInt || peek().kind == Tok::kFloat ||
                   at_op("[") || at_op("{")) {
          // One argument without parentheses: `is divisibleby 3`, `is sameas none`.
          ASSIGN_OR_RETURN(ExprPtr arg, parse_primary(depth + 1));
          ASSIGN_OR_RETURN(arg, parse_postfix(std::move(arg), depth + 1));
          e->args.push_back(std::move(arg));
        }
        node = std::move(e);
      } else {
        return node;
      }
    }
  }

  std::vector<Token> toks_;
  size_t pos_ = 0;
  int loop_depth_ = 0;
};

}  // namespace

Result<std::unique_ptr<Program>> parse_program(std::string_view source) {
  if (!valid_utf8(source)) return Status::InvalidArgument("chat template: not valid UTF-8");
  // jinja2: \r\n and \r are newlines; one trailing newline is dropped.
  std::string text;
  text.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      text += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      text += source[i];
    }
  }
  if (!text.empty() && text.back() == '\n') text.pop_back();
  Lexer lexer(std::move(text));
  ASSIGN_OR_RETURN(std::vector<Token> tokens, lexer.run());
  Parser parser(std::move(tokens));
  return parser.run();
}

}  // namespace tessera::data::jinja
