// The built-ins of the Jinja subset: filters, tests, Python's str/dict/list
// methods, and the globals (range, namespace, dict, raise_exception,
// strftime_now). Each follows jinja2 3.1's filters.py / tests.py, or
// CPython's method, on the values of jinja_value.h.
#include <unicode/locid.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>

#include <fmt/format.h>

#include "core/try.h"
#include "data/jinja_eval.h"

namespace tessera::data::jinja {
namespace {

// ---- Text helpers ------------------------------------------------------------

bool is_ascii(std::string_view s) {
  for (char c : s) {
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  }
  return true;
}

// Full Unicode case mapping (root locale), as Python's str.upper()/lower().
std::string to_upper(std::string_view s) {
  if (is_ascii(s)) {
    std::string out(s);
    for (char& c : out) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    return out;
  }
  icu::UnicodeString u = icu::UnicodeString::fromUTF8(icu::StringPiece(s.data(), static_cast<int32_t>(s.size())));
  u.toUpper(icu::Locale::getRoot());
  std::string out;
  u.toUTF8String(out);
  return out;
}

std::string to_lower(std::string_view s) {
  if (is_ascii(s)) {
    std::string out(s);
    for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return out;
  }
  icu::UnicodeString u = icu::UnicodeString::fromUTF8(icu::StringPiece(s.data(), static_cast<int32_t>(s.size())));
  u.toLower(icu::Locale::getRoot());
  std::string out;
  u.toUTF8String(out);
  return out;
}

// Python's str.title(): a cased character after an uncased one is
// titlecased, every other one lowercased (ICU's simple mappings).
std::string py_title(std::string_view s) {
  std::string out;
  bool previous_cased = false;
  size_t i = 0;
  while (i < s.size()) {
    const char32_t cp = next_code_point(s, i);
    const UChar32 mapped = previous_cased ? u_tolower(static_cast<UChar32>(cp)) : u_totitle(static_cast<UChar32>(cp));
    append_utf8(out, static_cast<char32_t>(mapped));
    previous_cased = u_hasBinaryProperty(static_cast<UChar32>(cp), UCHAR_CASED);
  }
  return out;
}

// Python's str.capitalize(): the first character titlecased, the rest lowercased.
std::string py_capitalize(std::string_view s) {
  if (s.empty()) return "";
  size_t i = 0;
  const char32_t first = next_code_point(s, i);
  std::string out;
  append_utf8(out, static_cast<char32_t>(u_totitle(static_cast<UChar32>(first))));
  out += to_lower(s.substr(i));
  return out;
}

// jinja2's title filter: words split at runs of [-\s({\[<]; each piece gets
// its first character uppercased and the rest lowercased.
std::string jinja_title(std::string_view s) {
  std::string out;
  size_t i = 0;
  auto is_sep = [](char32_t cp) {
    return cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<' || is_py_space(cp);
  };
  while (i < s.size()) {
    size_t j = i;
    const bool sep = is_sep(next_code_point(s, j));
    size_t end = i;
    while (end < s.size()) {
      size_t k = end;
      if (is_sep(next_code_point(s, k)) != sep) break;
      end = k;
    }
    std::string_view piece = s.substr(i, end - i);
    size_t first_end = 0;
    next_code_point(piece, first_end);
    out += to_upper(piece.substr(0, first_end));
    out += to_lower(piece.substr(first_end));
    i = end;
  }
  return out;
}

bool in_chars(char32_t cp, const std::u32string* chars) {
  if (chars == nullptr) return is_py_space(cp);
  return chars->find(cp) != std::u32string::npos;
}

std::u32string to_u32(std::string_view s) {
  std::u32string out;
  size_t i = 0;
  while (i < s.size()) out += next_code_point(s, i);
  return out;
}

// Python's str.strip/lstrip/rstrip: chars null = whitespace.
std::string py_strip(std::string_view s, const std::u32string* chars, bool left, bool right) {
  size_t begin = 0, end = s.size();
  if (left) {
    while (begin < end) {
      size_t j = begin;
      if (!in_chars(next_code_point(s, j), chars)) break;
      begin = j;
    }
  }
  if (right) {
    while (end > begin) {
      size_t start = end - 1;
      while (start > begin && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
      size_t j = start;
      if (!in_chars(next_code_point(s, j), chars)) break;
      end = start;
    }
  }
  return std::string(s.substr(begin, end - begin));
}

// Python's str.split(sep, maxsplit) / rsplit; sep null = runs of whitespace.
Result<std::vector<std::string>> py_split(std::string_view s, const std::string* sep, int64_t maxsplit, bool from_right) {
  std::vector<std::string> parts;
  if (sep != nullptr) {
    if (sep->empty()) return Status::InvalidArgument("empty separator");
    if (!from_right) {
      size_t start = 0;
      while (maxsplit < 0 || static_cast<int64_t>(parts.size()) < maxsplit) {
        const size_t at = s.find(*sep, start);
        if (at == std::string_view::npos) break;
        parts.emplace_back(s.substr(start, at - start));
        start = at + sep->size();
      }
      parts.emplace_back(s.substr(start));
    } else {
      size_t end = s.size();
      std::vector<std::string> rev;
      while (maxsplit < 0 || static_cast<int64_t>(rev.size()) < maxsplit) {
        if (end < sep->size()) break;
        const size_t at = s.rfind(*sep, end - sep->size());
        if (at == std::string_view::npos) break;
        rev.emplace_back(s.substr(at + sep->size(), end - at - sep->size()));
        end = at;
      }
      rev.emplace_back(s.substr(0, end));
      parts.assign(rev.rbegin(), rev.rend());
    }
    return parts;
  }
  // Whitespace runs; no empty strings.
  std::vector<std::pair<size_t, size_t>> words;
  size_t i = 0;
  while (i < s.size()) {
    size_t j = i;
    if (is_py_space(next_code_point(s, j))) {
      i = j;
      continue;
    }
    size_t end = i;
    while (end < s.size()) {
      size_t k = end;
      if (is_py_space(next_code_point(s, k))) break;
      end = k;
    }
    words.emplace_back(i, end);
    i = end;
  }
  if (maxsplit < 0 || static_cast<int64_t>(words.size()) <= maxsplit + 1) {
    for (auto [b, e] : words) parts.emplace_back(s.substr(b, e - b));
    return parts;
  }
  const size_t m = static_cast<size_t>(maxsplit);
  if (!from_right) {
    for (size_t w = 0; w < m; ++w) parts.emplace_back(s.substr(words[w].first, words[w].second - words[w].first));
    // The remainder as it is (CPython keeps its trailing whitespace).
    parts.emplace_back(s.substr(words[m].first));
  } else {
    std::vector<std::string> rev;
    for (size_t w = 0; w < m; ++w) {
      const auto [b, e] = words[words.size() - 1 - w];
      rev.emplace_back(s.substr(b, e - b));
    }
    const size_t last = words.size() - 1 - m;
    rev.emplace_back(s.substr(0, words[last].second));
    parts.assign(rev.rbegin(), rev.rend());
  }
  return parts;
}

// Python's str.splitlines() (keepends false).
std::vector<std::string> py_splitlines(std::string_view s) {
  std::vector<std::string> lines;
  size_t start = 0, i = 0;
  while (i < s.size()) {
    const size_t at = i;
    const char32_t cp = next_code_point(s, i);
    const bool brk = cp == '\n' || cp == '\r' || cp == '\v' || cp == '\f' || cp == 0x1C || cp == 0x1D ||
                     cp == 0x1E || cp == 0x85 || cp == 0x2028 || cp == 0x2029;
    if (!brk) continue;
    lines.emplace_back(s.substr(start, at - start));
    if (cp == '\r' && i < s.size() && s[i] == '\n') ++i;
    start = i;
  }
  if (start < s.size()) lines.emplace_back(s.substr(start));
  return lines;
}

std::string py_replace(std::string_view s, std::string_view old_s, std::string_view new_s, int64_t count) {
  std::string out;
  int64_t done = 0;
  if (old_s.empty()) {
    size_t i = 0;
    while (i <= s.size()) {
      if (count < 0 || done < count) {
        out += new_s;
        ++done;
      }
      if (i == s.size()) break;
      const size_t start = i;
      next_code_point(s, i);
      out.append(s.substr(start, i - start));
    }
    return out;
  }
  size_t start = 0;
  while (count < 0 || done < count) {
    const size_t at = s.find(old_s, start);
    if (at == std::string_view::npos) break;
    out.append(s.substr(start, at - start));
    out += new_s;
    start = at + old_s.size();
    ++done;
  }
  out.append(s.substr(start));
  return out;
}

// Python's int(str, base): optional sign, underscores between digits,
// surrounding whitespace; base 0 reads a 0x/0o/0b prefix.
std::optional<int64_t> parse_py_int(std::string_view text, int base) {
  std::string s = py_strip(text, nullptr, true, true);
  size_t i = 0;
  bool neg = false;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) neg = s[i++] == '-';
  auto has_prefix = [&](char p) {
    return i + 1 < s.size() && s[i] == '0' && std::tolower(static_cast<unsigned char>(s[i + 1])) == p;
  };
  if (base == 0) {
    base = has_prefix('x') ? 16 : has_prefix('o') ? 8 : has_prefix('b') ? 2 : 10;
    if (base != 10) i += 2;
  } else if ((base == 16 && has_prefix('x')) || (base == 8 && has_prefix('o')) || (base == 2 && has_prefix('b'))) {
    i += 2;
  }
  if (base < 2 || base > 36 || i >= s.size()) return std::nullopt;
  __int128 v = 0;
  bool last_digit = false;
  for (; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '_' && last_digit) {
      last_digit = false;
      continue;
    }
    int d = std::isdigit(static_cast<unsigned char>(c)) ? c - '0'
            : std::isalpha(static_cast<unsigned char>(c)) ? std::tolower(static_cast<unsigned char>(c)) - 'a' + 10
                                                          : 99;
    if (d >= base) return std::nullopt;
    v = v * base + d;
    if (v > static_cast<__int128>(INT64_MAX) + 1) return std::nullopt;
    last_digit = true;
  }
  if (!last_digit) return std::nullopt;
  if (neg) v = -v;
  if (v > INT64_MAX || v < INT64_MIN) return std::nullopt;
  return static_cast<int64_t>(v);
}

// Python's float(str).
std::optional<double> parse_py_float(std::string_view text) {
  std::string s = py_strip(text, nullptr, true, true);
  if (s.empty() || s.find_first_of("xX") != std::string::npos) return std::nullopt;
  std::string clean;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '_') {
      if (i == 0 || i + 1 >= s.size() || !std::isdigit(static_cast<unsigned char>(s[i - 1])) ||
          !std::isdigit(static_cast<unsigned char>(s[i + 1]))) {
        return std::nullopt;
      }
      continue;
    }
    clean += s[i];
  }
  char* end = nullptr;
  const double d = std::strtod(clean.c_str(), &end);
  if (end != clean.c_str() + clean.size()) return std::nullopt;
  return d;
}

Status type_error_str(std::string_view fname, const Value& v) {
  return Status::InvalidArgument(fmt::format("{}: expected a string, got '{}'", fname, type_name(v)));
}

Result<int64_t> as_index(std::string_view fname, const Value& v) {
  if (!v.is_integral()) {
    return Status::InvalidArgument(
        fmt::format("{}: '{}' object cannot be interpreted as an integer", fname, type_name(v)));
  }
  return v.as_int();
}

// ---- Python's len() ------------------------------------------------------------

Result<int64_t> py_len(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined: return 0;
    case Value::Kind::kString: return static_cast<int64_t>(utf8_length(v.as_string()));
    case Value::Kind::kList:
    case Value::Kind::kTuple: return static_cast<int64_t>(v.items().size());
    case Value::Kind::kDict: return static_cast<int64_t>(v.as_dict().items.size());
    case Value::Kind::kLoop: return static_cast<int64_t>(v.as_loop()->items->size());
    default: return Status::InvalidArgument(fmt::format("object of type '{}' has no len()", type_name(v)));
  }
}

}  // namespace

// ---- Filters ---------------------------------------------------------------------

namespace {

// jinja2's make_attrgetter: "a.b.0" looks up a, then b, then item 0.
Result<Value> get_attribute_path(Interp& interp, Value item, const Value& attribute, const Value& dflt) {
  std::vector<Value> parts;
  if (attribute.is_string()) {
    static const std::string kDot = ".";
    ASSIGN_OR_RETURN(std::vector<std::string> split, py_split(attribute.as_string(), &kDot, -1, false));
    for (const std::string& part : split) {
      const bool digits = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) {
        return std::isdigit(static_cast<unsigned char>(c));
      });
      if (digits) {
        auto i = parse_py_int(part, 10);
        parts.push_back(i ? Value::integer(*i) : Value::string(part));
      } else {
        parts.push_back(Value::string(part));
      }
    }
  } else {
    parts.push_back(attribute);
  }
  for (const Value& part : parts) {
    ASSIGN_OR_RETURN(item, interp.getitem(item, part));
    if (item.is_undefined() && !dflt.is_none()) return dflt;
  }
  return item;
}

Value key_for_compare(const Value& v, bool case_sensitive) {
  if (!case_sensitive && v.is_string()) return Value::string(to_lower(v.as_string()));
  return v;
}

}  // namespace

Result<Value> Interp::apply_filter(Filter filter, const Value& v, const CallArgs& args) {
  switch (filter) {
    case Filter::kAbs: {
      ASSIGN_OR_RETURN(auto a, bind_args("abs", args, {}));
      if (v.is_float()) return Value::floating(std::fabs(v.as_double()));
      if (v.is_integral()) {
        if (v.as_int() == INT64_MIN) return Status::InvalidArgument("integer overflow");
        return Value::integer(std::llabs(v.as_int()));
      }
      if (v.is_undefined()) return Status::InvalidArgument(v.undefined_message());
      return Status::InvalidArgument(fmt::format("bad operand type for abs(): '{}'", type_name(v)));
    }
    case Filter::kCapitalize: return make_string(py_capitalize(to_str(v)));
    case Filter::kDefault: {
      ASSIGN_OR_RETURN(auto a, bind_args("default", args, {{"default_value", Value::string("")},
                                                           {"boolean", Value::boolean(false)}}));
      if (v.is_undefined() || (truthy(a[1]) && !truthy(v))) return a[0];
      return v;
    }
    case Filter::kFirst:
    case Filter::kLast: {
      ASSIGN_OR_RETURN(auto a, bind_args(filter == Filter::kFirst ? "first" : "last", args, {}));
      ASSIGN_OR_RETURN(std::vector<Value> items, iterate(v));
      if (items.empty()) {
        return Value::undefined(filter == Filter::kFirst ? "No first item, sequence was empty."
                                                         : "No last item, sequence was empty.");
      }
      return filter == Filter::kFirst ? items.front() : items.back();
    }
    case Filter::kFloat: {
      ASSIGN_OR_RETURN(auto a, bind_args("float", args, {{"default", Value::floating(0.0)}}));
      if (v.is_undefined()) return Status::InvalidArgument(v.undefined_message());  // float(Undefined) raises
      if (v.is_number()) return Value::floating(v.as_double());
      if (v.is_string()) {
        if (auto d = parse_py_float(v.as_string())) return Value::floating(*d);
      }
      return a[0];
    }
    case Filter::kIndent: {
      ASSIGN_OR_RETURN(auto a, bind_args("indent", args, {{"width", Value::integer(4)},
                                                          {"first", Value::boolean(false)},
                                                          {"blank", Value::boolean(false)}}));
      std::string indention;
      if (a[0].is_string()) {
        indention = a[0].as_string();
      } else {
        ASSIGN_OR_RETURN(int64_t width, as_index("indent", a[0]));
        if (width > 4096) return Status::InvalidArgument("indent: width over 4096");
        indention = std::string(static_cast<size_t>(std::max<int64_t>(width, 0)), ' ');
      }
      std::string s = to_str(v) + "\n";
      std::vector<std::string> lines = py_splitlines(s);
      std::string out;
      if (truthy(a[2])) {
        for (size_t i = 0; i < lines.size(); ++i) {
          if (i > 0) out += "\n" + indention;
          out += lines[i];
          if (out.size() > kMaxOutputBytes) return make_string(std::move(out));
        }
      } else {
        out = lines.empty() ? "" : lines[0];
        for (size_t i = 1; i < lines.size(); ++i) {
          out += "\n";
          if (!lines[i].empty()) out += indention;
          out += lines[i];
          if (out.size() > kMaxOutputBytes) return make_string(std::move(out));
        }
      }
      if (truthy(a[1])) out = indention + out;
      return make_string(std::move(out));
    }
    case Filter::kInt: {
      ASSIGN_OR_RETURN(auto a, bind_args("int", args, {{"default", Value::integer(0)}, {"base", Value::integer(10)}}));
      if (v.is_undefined()) return Status::InvalidArgument(v.undefined_message());  // int(Undefined) raises
      if (v.is_integral()) return Value::integer(v.as_int());
      if (v.is_float()) {
        const double d = std::trunc(v.as_double());
        if (!std::isfinite(d) || std::fabs(d) >= 9.2e18) return a[0];
        return Value::integer(static_cast<int64_t>(d));
      }
      if (v.is_string()) {
        ASSIGN_OR_RETURN(int64_t base, as_index("int", a[1]));
        if (auto i = parse_py_int(v.as_string(), static_cast<int>(base))) return Value::integer(*i);
        if (auto d = parse_py_float(v.as_string())) {
          const double t = std::trunc(*d);
          if (std::isfinite(t) && std::fabs(t) < 9.2e18) return Value::integer(static_cast<int64_t>(t));
        }
      }
      return a[0];
    }
    case Filter::kItems: {
      if (v.is_undefined()) return make_list({});
      if (!v.is_dict()) return Status::InvalidArgument("Can only get item pairs from a mapping.");
      std::vector<Value> pairs;
      for (const auto& [k, item] : v.as_dict().items) {
        ASSIGN_OR_RETURN(Value pair, Value::list({Value::string(k), item}, true));
        pairs.push_back(std::move(pair));
      }
      return make_list(std::move(pairs));
    }
    case Filter::kJoin: {
      ASSIGN_OR_RETURN(auto a, bind_args("join", args, {{"d", Value::string("")}, {"attribute", Value::none()}}));
      ASSIGN_OR_RETURN(std::vector<Value> items, iterate(v));
      const std::string sep = to_str(a[0]);
      std::string out;
      for (size_t i = 0; i < items.size(); ++i) {
        if (i > 0) out += sep;
        if (!a[1].is_none()) {
          ASSIGN_OR_RETURN(Value item, get_attribute_path(*this, items[i], a[1], Value::none()));
          append_str(item, out);
        } else {
          append_str(items[i], out);
        }
        if (out.size() > kMaxOutputBytes) return make_string(std::move(out));
      }
      return make_string(std::move(out));
    }
    case Filter::kLength: {
      ASSIGN_OR_RETURN(int64_t n, py_len(v));
      return Value::integer(n);
    }
    case Filter::kList: {
      ASSIGN_OR_RETURN(std::vector<Value> items, iterate(v));
      return make_list(std::move(items));
    }
    case Filter::kLower: return make_string(to_lower(to_str(v)));
    case Filter::kUpper: return make_string(to_upper(to_str(v)));
    case Filter::kMap: {
      if (!truthy(v)) return make_list({});  // jinja2: `if value:` before iterating
      ASSIGN_OR_RETURN(std::vector<Value> items, iterate(v));
      std::vector<Value> out;
      if (args.pos.empty()) {
        Value attribute = Value::none(), dflt = Value::none();
        bool have_attribute = false;
        for (const auto& [key, val] : args.kw) {
          if (key == "attribute") {
            attribute = val;
            have_attribute = true;
          } else if (key == "default") {
            dflt = val;
          } else {
            return Status::InvalidArgument(fmt::format("Unexpected keyword argument '{}'", key));
          }
        }
        if (!have_attribute) return Status::InvalidArgument("map: no filter name and no attribute= given");
        for (const Value& item : items) {
          ASSIGN_OR_RETURN(Value mapped, get_attribute_path(*this, item, attribute, dflt));
          out.push_back(std::move(mapped));
        }
        return make_list(std::move(out));
      }
      if (!args.pos[0].is_string()) return Status::InvalidArgument("map: the filter name must be a string");
      Filter inner;
      if (!lookup_filter(args.pos[0].as_string(), &inner)) {
        return Status::InvalidArgument(fmt::format("No filter named '{}'.", args.pos[0].as_string()));
      }
      CallArgs rest{std::vector<Value>(args.pos.begin() + 1, args.pos.end()), args.kw};
      for (const Value& item : items) {
        ASSIGN_OR_RETURN(Value mapped, apply_filter(inner, item, rest));
        out.push_back(std::move(mapped));
      }
      return make_list(std::move(out));
    }
    case Filter::kMax:
    case Filter::kMin: {
      ASSIGN_OR_RETURN(auto a, bind_args(filter == Filter::kMax ? "max" : "min", args,
                                         {{"case_sensitive", Value::boolean(false)}, {"attribute", Value::none()}}));
      ASSIGN_OR_RETURN(std::vector<Value> items, iterate(v));
      if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
      size_t best = 0;
      Value best_key;
      for (size_t i = 0; i < items.size(); ++i) {
        Value key = items[i];
        if (!a[1].is_none()) {
          ASSIGN_OR_RETURN(key, get_attribute_path(*this, items[i], a[1], Value::none()));
        }
        key = key_for_compare(key, truthy(a[0]));
        if (i == 0) {
          best_key = key;
          continue;
        }
        ASSIGN_OR_RETURN(int c, compare(key, best_key, filter == Filter::kMax ? ">" : "<"));
        if ((filter == Filter::kMax && c > 0) || (filter == Filter::kMin && c < 0)) {
          best = i;
          best_key = key;
        }
      }
      return items[best];
    }
    case Filter::kSelect:
    case Filter::kReject:
    case Filter::kSelectAttr:
    case Filter::kRejectAttr: {
      const bool by_attr = filter == Filter::kSelectAttr || filter == Filter::kRejectAttr;
      const bool keep_if = filter == Filter::kSelect || filter == Filter::kSelectAttr;
      if (!truthy(v)) return make_list({});  // jinja2: `if value:` before iterating
      ASSIGN_OR_RETURN(std::vector<Value> items, iterate(v));
      size_t next_arg = 0;
      Value attribute;
      if (by_attr) {
        if (args.pos.empty()) return Status::InvalidArgument("Missing parameter for attribute name");
        attribute = args.pos[next_arg++];
      }
      std::optional<Test> test;
      if (next_arg < args.pos.size()) {
        if (!args.pos[next_arg].is_string()) return Status::InvalidArgument("the test name must be a string");
        Test t;
        if (!lookup_test(args.pos[next_arg].as_string(), &t)) {
          return Status::InvalidArgument(fmt::format("No test named '{}'.", args.pos[next_arg].as_string()));
        }
        test = t;
        ++next_arg;
      }
      CallArgs test_args{std::vector<Value>(args.pos.begin() + static_cast<std::ptrdiff_t>(next_arg), args.pos.end()),
                         args.kw};
      std::vector<Value> out;
      for (const Value& item : items) {
        RETURN_IF_ERROR(charge(1));
        Value probe = item;
        if (by_attr) {
          ASSIGN_OR_RETURN(probe, get_attribute_path(*this, item, attribute, Value::none()));
        }
        bool r;
        if (test) {
          ASSIGN_OR_RETURN(r, apply_test(*test, probe, test_args));
        } else {
          r = truthy(probe);
        }
        if (r == keep_if) out.push_back(item);
      }
      return make_list(std::move(out));
    }
    case Filter::kReplace: {
      ASSIGN_OR_RETURN(auto a, bind_args("replace", args, {{"old", std::nullopt}, {"new", std::nullopt},
                                                           {"count", Value::none()}}));
      int64_t count = -1;
      if (!a[2].is_none()) {
        ASSIGN_OR_RETURN(count, as_index("replace", a[2]));
      }
      const std::string s = to_str(v), old_s = to_str(a[0]), new_s = to_str(a[1]);
      if (!new_s.empty() && s.size() / std::max<size_t>(old_s.size(), 1) * new_s.size() > kMaxOutputBytes) {
        return Status::InvalidArgument(fmt::format("a string longer than {} bytes", kMaxOutputBytes));
      }
      return make_string(py_replace(s, old_s, new_s, count));
    }
    case Filter::kReverse: {
      if (v.is_string()) {
        std::vector<size_t> offsets = code_point_offsets(v.as_string());
        std::string out;
        for (size_t i = offsets.size() - 1; i > 0; --i) {
          out.append(v.as_string(), offsets[i - 1], offsets[i] - offsets[i - 1]);
        }
        return make_string(std::move(out));
      }
      ASSIGN_OR_RETURN(std::vector<Value> items, iterate(v));
      std::reverse(items.begin(), items.end());
      return make_list(std::move(items));
    }
    case Filter::kRound: {
      ASSIGN_OR_RETURN(auto a, bind_args("round", args, {{"precision", Value::integer(0)},
                                                         {"method", Value::string("common")}}));
      ASSIGN_OR_RETURN(int64_t precision, as_index("round", a[0]));
      const std::string method = to_str(a[1]);
      if (method != "common" && method != "ceil" && method != "floor") {
        return Status::InvalidArgument("method must be common, ceil or floor");
      }
      if (!v.is_number()) return Status::InvalidArgument(fmt::format("type {} doesn't define __round__ method",
                                                                     type_name(v)));
      if (method == "common" && v.is_integral()) return Value::integer(v.as_int());
      if (precision < -300 || precision > 300) return Status::InvalidArgument("round: precision out of range");
      const double x = v.as_double();
      if (method == "common") {
        if (!std::isfinite(x)) return Value::floating(x);
        if (precision >= 0) {
          char buf[512];
          std::snprintf(buf, sizeof(buf), "%.*f", static_cast<int>(precision), x);  // exact, half-even
          return Value::floating(std::strtod(buf, nullptr));
        }
        const double scale = std::pow(10.0, static_cast<double>(-precision));
        return Value::floating(std::nearbyint(x / scale) * scale);
      }
      const double scale = std::pow(10.0, static_cast<double>(precision));
      return Value::floating((method == "ceil" ? std::ceil(x * scale) : std::floor(x * scale)) / scale);
    }
    case Filter::kSafe:
    case Filter::kString: return make_string(to_str(v));
    case Filter::kSort: {
      ASSIGN_OR_RETURN(auto a, bind_args("sort", args, {{"reverse", Value::boolean(false)},
                                                        {"case_sensitive", Value::boolean(false)},
                                                        {"attribute", Value::none()}}));
      ASSIGN_OR_RETURN(std::vector<Value> items, iterate(v));
      std::vector<std::pair<Value, Value>> keyed;  // (key, item)
      for (const Value& item : items) {
        Value key = item;
        if (!a[2].is_none()) {
          ASSIGN_OR_RETURN(key, get_attribute_path(*this, item, a[2], Value::none()));
        }
        keyed.emplace_back(key_for_compare(key, truthy(a[1])), item);
      }
      RETURN_IF_ERROR(charge(static_cast<int64_t>(keyed.size()) * 20));
      Status failure;
      const bool reverse = truthy(a[0]);
      std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& x, const auto& y) {
        if (!failure.ok()) return false;
        auto c = compare(reverse ? y.first : x.first, reverse ? x.first : y.first, "<");
        if (!c.ok()) {
          failure = c.status();
          return false;
        }
        return *c < 0;
      });
      RETURN_IF_ERROR(failure);
      std::vector<Value> out;
      for (auto& [key, item] : keyed) out.push_back(std::move(item));
      return make_list(std::move(out));
    }
    case Filter::kSum: {
      ASSIGN_OR_RETURN(auto a, bind_args("sum", args, {{"attribute", Value::none()}, {"start", Value::integer(0)}}));
      ASSIGN_OR_RETURN(std::vector<Value> items, iterate(v));
      Value total = a[1];
      for (const Value& item : items) {
        Value x = item;
        if (!a[0].is_none()) {
          ASSIGN_OR_RETURN(x, get_attribute_path(*this, item, a[0], Value::none()));
        }
        if (!total.is_number() || !x.is_number()) {
          return Status::InvalidArgument(fmt::format("unsupported operand type(s) for +: '{}' and '{}'",
                                                     type_name(total), type_name(x)));
        }
        if (total.is_float() || x.is_float()) {
          total = Value::floating(total.as_double() + x.as_double());
        } else {
          int64_t r;
          if (__builtin_add_overflow(total.as_int(), x.as_int(), &r)) return Status::InvalidArgument("integer overflow");
          total = Value::integer(r);
        }
      }
      return total;
    }
    case Filter::kTitle: return make_string(jinja_title(to_str(v)));
    case Filter::kToJson: {
      ASSIGN_OR_RETURN(auto a, bind_args("tojson", args, {{"ensure_ascii", Value::boolean(false)},
                                                          {"indent", Value::none()},
                                                          {"separators", Value::none()},
                                                          {"sort_keys", Value::boolean(false)}}));
      JsonStyle style;
      style.ensure_ascii = truthy(a[0]);
      if (!a[1].is_none()) {
        style.has_indent = true;
        if (a[1].is_string()) {
          style.indent = a[1].as_string();
        } else {
          ASSIGN_OR_RETURN(int64_t width, as_index("tojson", a[1]));
          if (width > 4096) return Status::InvalidArgument("tojson: indent over 4096");
          style.indent = std::string(static_cast<size_t>(std::max<int64_t>(width, 0)), ' ');
        }
        style.item_separator.assign(1, ',');  // (not = ",": g++ 12 -Wrestrict false positive)
      }
      if (!a[2].is_none()) {
        if (!a[2].is_list() || a[2].items().size() != 2 || !a[2].items()[0].is_string() ||
            !a[2].items()[1].is_string()) {
          return Status::InvalidArgument("tojson: separators must be a pair of strings");
        }
        style.item_separator = a[2].items()[0].as_string();
        style.key_separator = a[2].items()[1].as_string();
      }
      style.sort_keys = truthy(a[3]);
      std::string out;
      RETURN_IF_ERROR(append_json(v, style, out));
      return make_string(std::move(out));
    }
    case Filter::kTrim: {
      ASSIGN_OR_RETURN(auto a, bind_args("trim", args, {{"chars", Value::none()}}));
      if (a[0].is_none()) return make_string(py_strip(to_str(v), nullptr, true, true));
      if (!a[0].is_string()) return type_error_str("trim", a[0]);
      const std::u32string chars = to_u32(a[0].as_string());
      return make_string(py_strip(to_str(v), &chars, true, true));
    }
    case Filter::kUnique: {
      ASSIGN_OR_RETURN(auto a, bind_args("unique", args, {{"case_sensitive", Value::boolean(false)},
                                                          {"attribute", Value::none()}}));
      ASSIGN_OR_RETURN(std::vector<Value> items, iterate(v));
      std::vector<Value> seen, out;
      for (const Value& item : items) {
        Value key = item;
        if (!a[1].is_none()) {
          ASSIGN_OR_RETURN(key, get_attribute_path(*this, item, a[1], Value::none()));
        }
        key = key_for_compare(key, truthy(a[0]));
        RETURN_IF_ERROR(charge(static_cast<int64_t>(seen.size())));
        if (std::none_of(seen.begin(), seen.end(), [&](const Value& s) { return equals(s, key); })) {
          seen.push_back(key);
          out.push_back(item);
        }
      }
      return make_list(std::move(out));
    }
  }
  return Status::Internal("unknown filter");
}

// ---- Tests -----------------------------------------------------------------------

Result<bool> Interp::apply_test(Test test, const Value& v, const CallArgs& args) {
  auto one_arg = [&](std::string_view name) -> Result<Value> {
    ASSIGN_OR_RETURN(auto a, bind_args(name, args, {{"other", std::nullopt}}));
    return a[0];
  };
  auto no_args = [&](std::string_view name) -> Status {
    if (!args.pos.empty() || !args.kw.empty()) {
      return Status::InvalidArgument(fmt::format("the '{}' test takes no arguments", name));
    }
    return Status::OK();
  };
  switch (test) {
    case Test::kDefined: RETURN_IF_ERROR(no_args("defined")); return !v.is_undefined();
    case Test::kUndefined: RETURN_IF_ERROR(no_args("undefined")); return v.is_undefined();
    case Test::kNone: RETURN_IF_ERROR(no_args("none")); return v.is_none();
    case Test::kBoolean: RETURN_IF_ERROR(no_args("boolean")); return v.is_bool();
    case Test::kTrue: RETURN_IF_ERROR(no_args("true")); return v.is_bool() && v.as_bool();
    case Test::kFalse: RETURN_IF_ERROR(no_args("false")); return v.is_bool() && !v.as_bool();
    case Test::kInteger: RETURN_IF_ERROR(no_args("integer")); return v.is_int();
    case Test::kFloat: RETURN_IF_ERROR(no_args("float")); return v.is_float();
    case Test::kNumber: RETURN_IF_ERROR(no_args("number")); return v.is_number();
    case Test::kString: RETURN_IF_ERROR(no_args("string")); return v.is_string();
    case Test::kMapping: RETURN_IF_ERROR(no_args("mapping")); return v.is_dict();
    case Test::kIterable:
      RETURN_IF_ERROR(no_args("iterable"));
      return v.is_undefined() || v.is_string() || v.is_list() || v.is_dict() || v.kind() == Value::Kind::kLoop;
    case Test::kSequence:
      RETURN_IF_ERROR(no_args("sequence"));
      return v.is_undefined() || v.is_string() || v.is_list() || v.is_dict();
    case Test::kCallable:
      RETURN_IF_ERROR(no_args("callable"));
      return v.is_undefined() || v.kind() == Value::Kind::kCallable;
    case Test::kLower:
    case Test::kUpper: {
      RETURN_IF_ERROR(no_args(test == Test::kLower ? "lower" : "upper"));
      const std::string s = to_str(v);
      bool cased = false;
      size_t i = 0;
      while (i < s.size()) {
        const UChar32 cp = static_cast<UChar32>(next_code_point(s, i));
        const bool upper = u_isUUppercase(cp) || u_istitle(cp);
        const bool lower = u_isULowercase(cp);
        if (test == Test::kLower ? upper : (lower || u_istitle(cp))) return false;
        if (test == Test::kLower ? lower : upper) cased = true;
      }
      return cased;
    }
    case Test::kOdd:
    case Test::kEven: {
      RETURN_IF_ERROR(no_args("odd"));
      if (v.is_undefined()) return Status::InvalidArgument(v.undefined_message());
      if (!v.is_number()) {
        return Status::InvalidArgument(fmt::format("unsupported operand type(s) for %: '{}' and 'int'", type_name(v)));
      }
      if (v.is_float()) {
        const double m = std::fmod(v.as_double(), 2.0);
        const double r = m < 0 ? m + 2.0 : m;
        return test == Test::kOdd ? r == 1.0 : r == 0.0;
      }
      const int64_t r = ((v.as_int() % 2) + 2) % 2;
      return test == Test::kOdd ? r == 1 : r == 0;
    }
    case Test::kDivisibleBy: {
      ASSIGN_OR_RETURN(Value num, one_arg("divisibleby"));
      if (!v.is_integral() || !num.is_integral()) return Status::InvalidArgument("divisibleby: integers only");
      if (num.as_int() == 0) return Status::InvalidArgument("integer division or modulo by zero");
      if (num.as_int() == -1) return true;
      return v.as_int() % num.as_int() == 0;
    }
    case Test::kSameAs: {
      ASSIGN_OR_RETURN(Value other, one_arg("sameas"));
      if (v.kind() != other.kind()) return false;
      if (v.is_none() || v.is_undefined()) return true;
      if (v.is_bool() || v.is_int()) return v.as_int() == other.as_int();
      return equals(v, other) && (v.is_list() || v.is_dict() || v.kind() == Value::Kind::kNamespace) &&
             &v.items() == &other.items();
    }
    case Test::kIn: {
      ASSIGN_OR_RETURN(Value seq, one_arg("in"));
      if (seq.is_string()) {
        if (!v.is_string()) return Status::InvalidArgument("'in <string>' requires string as left operand");
        return seq.as_string().find(v.as_string()) != std::string::npos;
      }
      if (seq.is_dict()) return v.is_string() && seq.as_dict().find(v.as_string()) != nullptr;
      ASSIGN_OR_RETURN(std::vector<Value> items, iterate(seq));
      return std::any_of(items.begin(), items.end(), [&](const Value& x) { return equals(x, v); });
    }
    case Test::kEq: {
      ASSIGN_OR_RETURN(Value other, one_arg("eq"));
      return equals(v, other);
    }
    case Test::kNe: {
      ASSIGN_OR_RETURN(Value other, one_arg("ne"));
      return !equals(v, other);
    }
    case Test::kLt:
    case Test::kLe:
    case Test::kGt:
    case Test::kGe: {
      ASSIGN_OR_RETURN(Value other, one_arg("comparison"));
      const char* op = test == Test::kLt ? "<" : test == Test::kLe ? "<=" : test == Test::kGt ? ">" : ">=";
      ASSIGN_OR_RETURN(int c, compare(v, other, op));
      return test == Test::kLt ? c < 0 : test == Test::kLe ? c <= 0 : test == Test::kGt ? c > 0 : c >= 0;
    }
  }
  return Status::Internal("unknown test");
}

// ---- Methods ---------------------------------------------------------------------

bool Interp::has_method(const Value& self, std::string_view name) {
  static const std::vector<std::string_view> kStr = {
      "startswith", "endswith", "strip", "lstrip", "rstrip", "split", "rsplit", "splitlines", "replace", "upper",
      "lower", "title", "capitalize", "format", "join", "find", "rfind", "count", "isdigit", "isspace", "isalpha",
      "isalnum", "islower", "isupper"};
  static const std::vector<std::string_view> kDict = {"get", "items", "keys", "values"};
  static const std::vector<std::string_view> kList = {"index", "count"};
  const std::vector<std::string_view>* names = self.is_string() ? &kStr
                                               : self.is_dict() ? &kDict
                                               : self.is_list() ? &kList
                                                                : nullptr;
  return names != nullptr && std::find(names->begin(), names->end(), name) != names->end();
}

namespace {

// str.format(): {} {0} {name}, {{ and }}, conversions !s and !r; no format specs.
Result<std::string> py_format(std::string_view fmt_s, const CallArgs& args) {
  std::string out;
  size_t auto_index = 0;
  bool used_auto = false, used_manual = false;
  size_t i = 0;
  while (i < fmt_s.size()) {
    const char c = fmt_s[i];
    if (c == '}') {
      if (i + 1 < fmt_s.size() && fmt_s[i + 1] == '}') {
        out += '}';
        i += 2;
        continue;
      }
      return Status::InvalidArgument("Single '}' encountered in format string");
    }
    if (c != '{') {
      out += c;
      ++i;
      continue;
    }
    if (i + 1 < fmt_s.size() && fmt_s[i + 1] == '{') {
      out += '{';
      i += 2;
      continue;
    }
    const size_t close = fmt_s.find('}', i);
    if (close == std::string_view::npos) return Status::InvalidArgument("Single '{' encountered in format string");
    std::string_view field = fmt_s.substr(i + 1, close - i - 1);
    char conversion = 0;
    if (const size_t bang = field.find('!'); bang != std::string_view::npos) {
      if (bang + 2 != field.size() || (field[bang + 1] != 'r' && field[bang + 1] != 's')) {
        return Status::InvalidArgument("format(): only the !s and !r conversions are supported");
      }
      conversion = field[bang + 1];
      field = field.substr(0, bang);
    }
    if (field.find_first_of(":.[") != std::string_view::npos) {
      return Status::InvalidArgument("format(): format specs, attributes and indexes in fields are not supported");
    }
    const Value* arg = nullptr;
    if (field.empty()) {
      if (used_manual) {
        return Status::InvalidArgument("cannot switch from manual field specification to automatic field numbering");
      }
      used_auto = true;
      if (auto_index >= args.pos.size()) {
        return Status::InvalidArgument(fmt::format("Replacement index {} out of range for positional args tuple",
                                                   auto_index));
      }
      arg = &args.pos[auto_index++];
    } else if (std::all_of(field.begin(), field.end(), [](char ch) { return std::isdigit(static_cast<unsigned char>(ch)); })) {
      if (used_auto) {
        return Status::InvalidArgument("cannot switch from automatic field numbering to manual field specification");
      }
      used_manual = true;
      const size_t idx = static_cast<size_t>(std::strtoull(std::string(field).c_str(), nullptr, 10));
      if (idx >= args.pos.size()) {
        return Status::InvalidArgument(fmt::format("Replacement index {} out of range for positional args tuple", idx));
      }
      arg = &args.pos[idx];
    } else {
      for (const auto& [key, val] : args.kw) {
        if (key == field) arg = &val;
      }
      if (arg == nullptr) return Status::InvalidArgument(fmt::format("'{}'", field));
    }
    if (conversion == 'r') {
      append_repr(*arg, out);
    } else {
      append_str(*arg, out);
    }
    if (out.size() > kMaxOutputBytes) return Status::InvalidArgument("format(): result too long");
    i = close + 1;
  }
  return out;
}

size_t code_points_before(std::string_view s, size_t byte) { return utf8_length(s.substr(0, byte)); }

}  // namespace

Result<Value> Interp::call_method(const Value& self, const std::string& name, const CallArgs& args) {
  if (self.is_dict()) {
    const DictData& d = self.as_dict();
    if (name == "get") {
      if (!args.kw.empty()) return Status::InvalidArgument("get() takes no keyword arguments");
      ASSIGN_OR_RETURN(auto a, bind_args("get", args, {{"key", std::nullopt}, {"default", Value::none()}}));
      if (a[0].is_string()) {
        if (const Value* v = d.find(a[0].as_string())) return *v;
      }
      return a[1];
    }
    ASSIGN_OR_RETURN(auto a, bind_args(name, args, {}));
    std::vector<Value> out;
    for (const auto& [k, v] : d.items) {
      if (name == "keys") {
        out.push_back(Value::string(k));
      } else if (name == "values") {
        out.push_back(v);
      } else {
        ASSIGN_OR_RETURN(Value pair, Value::list({Value::string(k), v}, true));
        out.push_back(std::move(pair));
      }
    }
    return make_list(std::move(out));
  }
  if (self.is_list()) {
    ASSIGN_OR_RETURN(auto a, bind_args(name, args, {{"value", std::nullopt}}));
    const auto& items = self.items();
    if (name == "count") {
      return Value::integer(std::count_if(items.begin(), items.end(), [&](const Value& x) { return equals(x, a[0]); }));
    }
    for (size_t i = 0; i < items.size(); ++i) {
      if (equals(items[i], a[0])) return Value::integer(static_cast<int64_t>(i));
    }
    return Status::InvalidArgument("list.index(x): x not in list");
  }
  const std::string& s = self.as_string();
  if (name == "startswith" || name == "endswith") {
    if (!args.kw.empty()) return Status::InvalidArgument(fmt::format("{}() takes no keyword arguments", name));
    ASSIGN_OR_RETURN(auto a, bind_args(name, args, {{"prefix", std::nullopt}}));
    std::vector<Value> candidates;
    if (a[0].kind() == Value::Kind::kTuple) {
      candidates = a[0].items();
    } else {
      candidates.push_back(a[0]);
    }
    for (const Value& c : candidates) {
      if (!c.is_string()) {
        return Status::InvalidArgument(fmt::format("{} first arg must be str or a tuple of str, not {}", name,
                                                   type_name(c)));
      }
      if (name == "startswith" ? std::string_view(s).starts_with(c.as_string())
                               : std::string_view(s).ends_with(c.as_string())) {
        return Value::boolean(true);
      }
    }
    return Value::boolean(false);
  }
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    ASSIGN_OR_RETURN(auto a, bind_args(name, args, {{"chars", Value::none()}}));
    const bool left = name != "rstrip", right = name != "lstrip";
    if (a[0].is_none()) return make_string(py_strip(s, nullptr, left, right));
    if (!a[0].is_string()) return type_error_str(name, a[0]);
    const std::u32string chars = to_u32(a[0].as_string());
    return make_string(py_strip(s, &chars, left, right));
  }
  if (name == "split" || name == "rsplit") {
    ASSIGN_OR_RETURN(auto a, bind_args(name, args, {{"sep", Value::none()}, {"maxsplit", Value::integer(-1)}}));
    if (!a[0].is_none() && !a[0].is_string()) return type_error_str(name, a[0]);
    ASSIGN_OR_RETURN(int64_t maxsplit, as_index(name, a[1]));
    ASSIGN_OR_RETURN(std::vector<std::string> parts,
                     py_split(s, a[0].is_none() ? nullptr : &a[0].as_string(), maxsplit, name == "rsplit"));
    std::vector<Value> out;
    for (std::string& p : parts) out.push_back(Value::string(std::move(p)));
    return make_list(std::move(out));
  }
  if (name == "splitlines") {
    ASSIGN_OR_RETURN(auto a, bind_args(name, args, {}));
    std::vector<Value> out;
    for (std::string& p : py_splitlines(s)) out.push_back(Value::string(std::move(p)));
    return make_list(std::move(out));
  }
  if (name == "replace") {
    ASSIGN_OR_RETURN(auto a, bind_args(name, args, {{"old", std::nullopt}, {"new", std::nullopt},
                                                    {"count", Value::integer(-1)}}));
    if (!a[0].is_string()) return type_error_str(name, a[0]);
    if (!a[1].is_string()) return type_error_str(name, a[1]);
    ASSIGN_OR_RETURN(int64_t count, as_index(name, a[2]));
    const std::string& old_s = a[0].as_string();
    const std::string& new_s = a[1].as_string();
    if (!new_s.empty() && (s.size() + 1) / std::max<size_t>(old_s.size(), 1) * new_s.size() > kMaxOutputBytes) {
      return Status::InvalidArgument(fmt::format("a string longer than {} bytes", kMaxOutputBytes));
    }
    return make_string(py_replace(s, old_s, new_s, count));
  }
  if (name == "upper" || name == "lower" || name == "title" || name == "capitalize") {
    ASSIGN_OR_RETURN(auto a, bind_args(name, args, {}));
    return make_string(name == "upper"   ? to_upper(s)
                       : name == "lower" ? to_lower(s)
                       : name == "title" ? py_title(s)
                                         : py_capitalize(s));
  }
  if (name == "format") {
    ASSIGN_OR_RETURN(std::string out, py_format(s, args));
    return make_string(std::move(out));
  }
  if (name == "join") {
    ASSIGN_OR_RETURN(auto a, bind_args(name, args, {{"iterable", std::nullopt}}));
    ASSIGN_OR_RETURN(std::vector<Value> items, iterate(a[0]));
    std::string out;
    for (size_t i = 0; i < items.size(); ++i) {
      if (!items[i].is_string()) {
        return Status::InvalidArgument(
            fmt::format("sequence item {}: expected str instance, {} found", i, type_name(items[i])));
      }
      if (i > 0) out += s;
      out += items[i].as_string();
      if (out.size() > kMaxOutputBytes) return make_string(std::move(out));
    }
    return make_string(std::move(out));
  }
  if (name == "find" || name == "rfind" || name == "count") {
    ASSIGN_OR_RETURN(auto a, bind_args(name, args, {{"sub", std::nullopt}}));
    if (!a[0].is_string()) return type_error_str(name, a[0]);
    const std::string& sub = a[0].as_string();
    if (name == "count") {
      if (sub.empty()) return Value::integer(static_cast<int64_t>(utf8_length(s)) + 1);
      int64_t n = 0;
      for (size_t at = s.find(sub); at != std::string::npos; at = s.find(sub, at + sub.size())) ++n;
      return Value::integer(n);
    }
    const size_t at = name == "find" ? s.find(sub) : s.rfind(sub);
    return Value::integer(at == std::string::npos ? -1 : static_cast<int64_t>(code_points_before(s, at)));
  }
  // isdigit isspace isalpha isalnum islower isupper
  ASSIGN_OR_RETURN(auto a, bind_args(name, args, {}));
  if (name == "islower" || name == "isupper") {
    ASSIGN_OR_RETURN(bool r, apply_test(name == "islower" ? Test::kLower : Test::kUpper, self, {}));
    return Value::boolean(r);
  }
  if (s.empty()) return Value::boolean(false);
  size_t i = 0;
  while (i < s.size()) {
    const UChar32 cp = static_cast<UChar32>(next_code_point(s, i));
    bool ok = false;
    if (name == "isdigit") {
      const int32_t type = u_getIntPropertyValue(cp, UCHAR_NUMERIC_TYPE);
      ok = type == U_NT_DIGIT || type == U_NT_DECIMAL;
    } else if (name == "isspace") {
      ok = is_py_space(static_cast<char32_t>(cp));
    } else if (name == "isalpha") {
      ok = u_isalpha(cp);
    } else {
      ok = u_isalpha(cp) || u_getIntPropertyValue(cp, UCHAR_NUMERIC_TYPE) != U_NT_NONE;
    }
    if (!ok) return Value::boolean(false);
  }
  return Value::boolean(true);
}

// ---- Globals ---------------------------------------------------------------------

Result<Value> Interp::call_global(Builtin which, const CallArgs& args) {
  switch (which) {
    case Builtin::kRange: {
      if (!args.kw.empty()) return Status::InvalidArgument("range() takes no keyword arguments");
      if (args.pos.empty() || args.pos.size() > 3) {
        return Status::InvalidArgument(fmt::format("range expected at most 3 arguments, got {}", args.pos.size()));
      }
      int64_t bounds[3] = {0, 0, 1};
      for (size_t i = 0; i < args.pos.size(); ++i) {
        if (!args.pos[i].is_integral()) {
          return Status::InvalidArgument(
              fmt::format("'{}' object cannot be interpreted as an integer", type_name(args.pos[i])));
        }
      }
      if (args.pos.size() == 1) {
        bounds[1] = args.pos[0].as_int();
      } else {
        bounds[0] = args.pos[0].as_int();
        bounds[1] = args.pos[1].as_int();
        if (args.pos.size() == 3) bounds[2] = args.pos[2].as_int();
      }
      if (bounds[2] == 0) return Status::InvalidArgument("range() arg 3 must not be zero");
      const __int128 span = static_cast<__int128>(bounds[1]) - bounds[0];
      __int128 count = 0;
      if (bounds[2] > 0 && span > 0) count = (span + bounds[2] - 1) / bounds[2];
      if (bounds[2] < 0 && span < 0) count = (-span + (-static_cast<__int128>(bounds[2])) - 1) / -bounds[2];
      if (count > kMaxRange) {
        return Status::InvalidArgument(
            fmt::format("Range too big. The sandbox blocks ranges larger than MAX_RANGE ({}).", kMaxRange));
      }
      std::vector<Value> out;
      for (int64_t i = 0; i < static_cast<int64_t>(count); ++i) out.push_back(Value::integer(bounds[0] + i * bounds[2]));
      return make_list(std::move(out));
    }
    case Builtin::kNamespace:
    case Builtin::kDict: {
      std::vector<std::pair<std::string, Value>> items;
      if (args.pos.size() > 1) {
        return Status::InvalidArgument(fmt::format("expected at most 1 argument, got {}", args.pos.size()));
      }
      if (args.pos.size() == 1) {
        const Value& init = args.pos[0];
        if (init.is_dict()) {
          items = init.as_dict().items;
        } else {
          ASSIGN_OR_RETURN(std::vector<Value> pairs, iterate(init));
          for (const Value& p : pairs) {
            if (!p.is_list() || p.items().size() != 2 || !p.items()[0].is_string()) {
              return Status::InvalidArgument("dictionary update sequence elements must be (string, value) pairs");
            }
            items.emplace_back(p.items()[0].as_string(), p.items()[1]);
          }
        }
      }
      for (const auto& [k, v] : args.kw) {
        auto it = std::find_if(items.begin(), items.end(), [&](const auto& kv) { return kv.first == k; });
        if (it != items.end()) {
          it->second = v;
        } else {
          items.emplace_back(k, v);
        }
      }
      if (which == Builtin::kDict) return Value::dict(std::move(items));
      auto data = std::make_shared<NamespaceData>();
      for (auto& [k, v] : items) {
        if (v.holds_namespace()) {
          return Status::InvalidArgument("a namespace cannot be stored inside a namespace (not supported)");
        }
        data->set(k, std::move(v));
      }
      return Value::ns(std::move(data));
    }
    case Builtin::kRaiseException: {
      ASSIGN_OR_RETURN(auto a, bind_args("raise_exception", args, {{"message", std::nullopt}}));
      return raise(to_str(a[0]));
    }
    case Builtin::kStrftimeNow: {
      ASSIGN_OR_RETURN(auto a, bind_args("strftime_now", args, {{"format", std::nullopt}}));
      if (!a[0].is_string()) return type_error_str("strftime_now", a[0]);
      const std::string& format = a[0].as_string();
      if (format.size() > 1024) return Status::InvalidArgument("strftime_now: format longer than 1024 bytes");
      const std::time_t now = options_.now ? *options_.now : std::time(nullptr);
      std::tm tm{};
      localtime_r(&now, &tm);
      if (format.empty()) return Value::string("");
      std::string buf(256 + format.size() * 16, '\0');
      const size_t n = std::strftime(buf.data(), buf.size(), format.c_str(), &tm);
      if (n == 0) return Status::InvalidArgument("strftime_now: the formatted date is empty or too long");
      buf.resize(n);
      return make_string(std::move(buf));
    }
    default: return Status::Internal("unknown global");
  }
}

}  // namespace tessera::data::jinja
