#include "data/jinja_value.h"

#include <unicode/uchar.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>

#include <fmt/format.h>

namespace tessera::data::jinja {

// ---- Value -------------------------------------------------------------------

Value::Value() : kind_(Kind::kUndefined), p_(std::make_shared<const std::string>()) {}

Value Value::undefined(std::string message) {
  Value v;
  v.p_ = std::make_shared<const std::string>(std::move(message));
  return v;
}
Value Value::none() {
  Value v;
  v.kind_ = Kind::kNone;
  v.p_ = std::monostate{};
  return v;
}
Value Value::boolean(bool b) {
  Value v;
  v.kind_ = Kind::kBool;
  v.p_ = b;
  return v;
}
Value Value::integer(int64_t i) {
  Value v;
  v.kind_ = Kind::kInt;
  v.p_ = i;
  return v;
}
Value Value::floating(double f) {
  Value v;
  v.kind_ = Kind::kFloat;
  v.p_ = f;
  return v;
}
Value Value::string(std::string s) {
  Value v;
  v.kind_ = Kind::kString;
  v.p_ = std::make_shared<const std::string>(std::move(s));
  return v;
}
Result<Value> Value::list(std::vector<Value> items, bool tuple) {
  auto data = std::make_shared<ListData>();
  int depth = 0;
  bool ns = false;
  for (const Value& item : items) {
    depth = std::max(depth, item.depth());
    ns = ns || item.holds_namespace();
  }
  if (depth + 1 > kMaxValueDepth) {
    return Status::InvalidArgument(fmt::format("values nested deeper than {} levels", kMaxValueDepth));
  }
  data->items = std::move(items);
  data->depth = depth + 1;
  data->holds_namespace = ns;
  Value v;
  v.kind_ = tuple ? Kind::kTuple : Kind::kList;
  v.p_ = std::shared_ptr<const ListData>(std::move(data));
  return v;
}
Result<Value> Value::dict(std::vector<std::pair<std::string, Value>> items) {
  auto data = std::make_shared<DictData>();
  int depth = 0;
  bool ns = false;
  for (const auto& [key, item] : items) {
    depth = std::max(depth, item.depth());
    ns = ns || item.holds_namespace();
  }
  if (depth + 1 > kMaxValueDepth) {
    return Status::InvalidArgument(fmt::format("values nested deeper than {} levels", kMaxValueDepth));
  }
  data->items = std::move(items);
  data->depth = depth + 1;
  data->holds_namespace = ns;
  Value v;
  v.kind_ = Kind::kDict;
  v.p_ = std::shared_ptr<const DictData>(std::move(data));
  return v;
}
Value Value::ns(std::shared_ptr<NamespaceData> data) {
  Value v;
  v.kind_ = Kind::kNamespace;
  v.p_ = std::move(data);
  return v;
}
Value Value::callable(std::shared_ptr<const Callable> fn) {
  Value v;
  v.kind_ = Kind::kCallable;
  v.p_ = std::move(fn);
  return v;
}
Value Value::loop(std::shared_ptr<LoopData> data) {
  Value v;
  v.kind_ = Kind::kLoop;
  v.p_ = std::move(data);
  return v;
}

const std::vector<Value>& Value::items() const { return std::get<std::shared_ptr<const ListData>>(p_)->items; }

int Value::depth() const {
  if (is_list()) return std::get<std::shared_ptr<const ListData>>(p_)->depth;
  if (is_dict()) return as_dict().depth;
  if (kind_ == Kind::kNamespace) return 1;
  return 0;
}

bool Value::holds_namespace() const {
  if (is_list()) return std::get<std::shared_ptr<const ListData>>(p_)->holds_namespace;
  if (is_dict()) return as_dict().holds_namespace;
  return kind_ == Kind::kNamespace;
}

const Value* DictData::find(std::string_view key) const {
  for (const auto& [k, v] : items) {
    if (k == key) return &v;
  }
  return nullptr;
}

Value* NamespaceData::find(std::string_view key) {
  for (auto& [k, v] : attrs) {
    if (k == key) return &v;
  }
  return nullptr;
}

void NamespaceData::set(const std::string& key, Value v) {
  if (Value* slot = find(key)) {
    *slot = std::move(v);
  } else {
    attrs.emplace_back(key, std::move(v));
  }
}

// ---- Python semantics --------------------------------------------------------

bool truthy(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone: return false;
    case Value::Kind::kBool: return v.as_bool();
    case Value::Kind::kInt: return v.as_int() != 0;
    case Value::Kind::kFloat: return v.as_double() != 0.0;
    case Value::Kind::kString: return !v.as_string().empty();
    case Value::Kind::kList:
    case Value::Kind::kTuple: return !v.items().empty();
    case Value::Kind::kDict: return !v.as_dict().items.empty();
    default: return true;
  }
}

bool equals(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_double() == b.as_double();
    return a.as_int() == b.as_int();
  }
  if (a.is_list() && b.is_list()) {
    if (a.kind() != b.kind()) return false;  // [1] != (1,)
    const auto& x = a.items();
    const auto& y = b.items();
    if (x.size() != y.size()) return false;
    for (size_t i = 0; i < x.size(); ++i) {
      if (!equals(x[i], y[i])) return false;
    }
    return true;
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone: return true;
    case Value::Kind::kString: return a.as_string() == b.as_string();
    case Value::Kind::kDict: {
      const auto& x = a.as_dict().items;
      const DictData& y = b.as_dict();
      if (x.size() != y.items.size()) return false;
      for (const auto& [k, v] : x) {
        const Value* other = y.find(k);
        if (other == nullptr || !equals(v, *other)) return false;
      }
      return true;
    }
    case Value::Kind::kNamespace: return a.as_namespace() == b.as_namespace();
    case Value::Kind::kLoop: return a.as_loop() == b.as_loop();
    case Value::Kind::kCallable: return &a.as_callable() == &b.as_callable();
    default: return false;
  }
}

Result<int> compare(const Value& a, const Value& b, std::string_view op) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) {
      const double x = a.as_double(), y = b.as_double();
      return x < y ? -1 : (x > y ? 1 : 0);
    }
    const int64_t x = a.as_int(), y = b.as_int();
    return x < y ? -1 : (x > y ? 1 : 0);
  }
  if (a.is_string() && b.is_string()) {
    const int c = a.as_string().compare(b.as_string());  // UTF-8 byte order is code point order
    return c < 0 ? -1 : (c > 0 ? 1 : 0);
  }
  if (a.is_list() && b.is_list() && a.kind() == b.kind()) {
    const auto& x = a.items();
    const auto& y = b.items();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (equals(x[i], y[i])) continue;
      return compare(x[i], y[i], op);
    }
    return x.size() < y.size() ? -1 : (x.size() > y.size() ? 1 : 0);
  }
  if (a.is_undefined()) return Status::InvalidArgument(a.undefined_message());
  if (b.is_undefined()) return Status::InvalidArgument(b.undefined_message());
  return Status::InvalidArgument(fmt::format("'{}' not supported between instances of '{}' and '{}'", op,
                                             type_name(a), type_name(b)));
}

std::string type_name(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined: return "Undefined";
    case Value::Kind::kNone: return "NoneType";
    case Value::Kind::kBool: return "bool";
    case Value::Kind::kInt: return "int";
    case Value::Kind::kFloat: return "float";
    case Value::Kind::kString: return "str";
    case Value::Kind::kList: return "list";
    case Value::Kind::kTuple: return "tuple";
    case Value::Kind::kDict: return "dict";
    case Value::Kind::kNamespace: return "Namespace";
    case Value::Kind::kCallable: return "function";
    case Value::Kind::kLoop: return "LoopContext";
  }
  return "object";
}

std::string object_type_repr(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kNone: return "None";
    case Value::Kind::kNamespace: return "jinja2.utils.Namespace object";
    case Value::Kind::kLoop: return "jinja2.runtime.LoopContext object";
    case Value::Kind::kUndefined: return "jinja2.runtime.Undefined object";
    default: return type_name(v) + " object";
  }
}

std::string format_float(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
  // Shortest round-trip digits, as Python's repr: d.ddde[+-]X.
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  bool negative = false;
  if (sci[0] == '-') {
    negative = true;
    sci.erase(0, 1);
  }
  const size_t e_pos = sci.find('e');
  std::string digits = sci.substr(0, e_pos);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  const int exp = std::stoi(sci.substr(e_pos + 1));
  std::string out = negative ? "-" : "";
  if (exp >= -4 && exp < 16) {  // Python's repr: fixed notation for -4 <= exp < 16
    if (exp >= 0) {
      if (static_cast<int>(digits.size()) <= exp + 1) {
        out += digits + std::string(exp + 1 - digits.size(), '0') + ".0";
      } else {
        out += digits.substr(0, exp + 1) + "." + digits.substr(exp + 1);
      }
    } else {
      out += "0." + std::string(-exp - 1, '0') + digits;
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  out += fmt::format("e{}{:02d}", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
  return out;
}

namespace {

// Python's str.isprintable() for one code point (ICU's categories).
bool is_printable(char32_t cp) {
  if (cp == ' ') return true;
  switch (u_charType(static_cast<UChar32>(cp))) {
    case U_CONTROL_CHAR:
    case U_FORMAT_CHAR:
    case U_SURROGATE:
    case U_PRIVATE_USE_CHAR:
    case U_UNASSIGNED:
    case U_LINE_SEPARATOR:
    case U_PARAGRAPH_SEPARATOR:
    case U_SPACE_SEPARATOR: return false;
    default: return true;
  }
}

void append_string_repr(std::string_view s, std::string& out) {
  const bool has_single = s.find('\'') != std::string_view::npos;
  const bool has_double = s.find('"') != std::string_view::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  out += quote;
  size_t i = 0;
  while (i < s.size()) {
    const char32_t cp = next_code_point(s, i);
    if (cp == static_cast<char32_t>(quote) || cp == '\\') {
      out += '\\';
      out += static_cast<char>(cp);
    } else if (cp == '\t') {
      out += "\\t";
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (cp < 0x20 || cp == 0x7f) {
      out += fmt::format("\\x{:02x}", static_cast<unsigned>(cp));
    } else if (cp < 0x80 || is_printable(cp)) {
      append_utf8(out, cp);
    } else if (cp < 0x100) {
      out += fmt::format("\\x{:02x}", static_cast<unsigned>(cp));
    } else if (cp < 0x10000) {
      out += fmt::format("\\u{:04x}", static_cast<unsigned>(cp));
    } else {
      out += fmt::format("\\U{:08x}", static_cast<unsigned>(cp));
    }
  }
  out += quote;
}

void append_json_string(std::string_view s, bool ensure_ascii, std::string& out) {
  out += '"';
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x80) {
      const size_t start = i;
      const char32_t cp = next_code_point(s, i);
      if (!ensure_ascii) {
        out.append(s.substr(start, i - start));
      } else if (cp < 0x10000) {
        out += fmt::format("\\u{:04x}", static_cast<unsigned>(cp));
      } else {
        const char32_t v = cp - 0x10000;
        out += fmt::format("\\u{:04x}\\u{:04x}", static_cast<unsigned>(0xD800 | (v >> 10)),
                           static_cast<unsigned>(0xDC00 | (v & 0x3FF)));
      }
      continue;
    }
    ++i;
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20 || (ensure_ascii && c == 0x7f)) {
          out += fmt::format("\\u{:04x}", static_cast<unsigned>(c));
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += '"';
}

}  // namespace

void append_str(const Value& v, std::string& out) {
  switch (v.kind()) {
    case Value::Kind::kUndefined: return;
    case Value::Kind::kString: out += v.as_string(); return;
    default: append_repr(v, out);
  }
}

std::string to_str(const Value& v) {
  std::string out;
  append_str(v, out);
  return out;
}

void append_repr(const Value& v, std::string& out) {
  switch (v.kind()) {
    case Value::Kind::kUndefined: out += "Undefined"; return;
    case Value::Kind::kNone: out += "None"; return;
    case Value::Kind::kBool: out += v.as_bool() ? "True" : "False"; return;
    case Value::Kind::kInt: out += std::to_string(v.as_int()); return;
    case Value::Kind::kFloat: out += format_float(v.as_double()); return;
    case Value::Kind::kString: append_string_repr(v.as_string(), out); return;
    case Value::Kind::kList:
    case Value::Kind::kTuple: {
      const bool tuple = v.kind() == Value::Kind::kTuple;
      out += tuple ? '(' : '[';
      const auto& items = v.items();
      for (size_t i = 0; i < items.size(); ++i) {
        if (i > 0) out += ", ";
        append_repr(items[i], out);
      }
      if (tuple && items.size() == 1) out += ',';
      out += tuple ? ')' : ']';
      return;
    }
    case Value::Kind::kDict: {
      out += '{';
      bool first = true;
      for (const auto& [k, item] : v.as_dict().items) {
        if (!first) out += ", ";
        first = false;
        append_string_repr(k, out);
        out += ": ";
        append_repr(item, out);
      }
      out += '}';
      return;
    }
    case Value::Kind::kNamespace: {
      out += "<Namespace {";
      bool first = true;
      for (const auto& [k, item] : v.as_namespace()->attrs) {
        if (!first) out += ", ";
        first = false;
        append_string_repr(k, out);
        out += ": ";
        append_repr(item, out);
      }
      out += "}>";
      return;
    }
    case Value::Kind::kCallable: out += "<function>"; return;
    case Value::Kind::kLoop: out += "<LoopContext>"; return;
  }
}

Status append_json(const Value& v, const JsonStyle& style, std::string& out, int level) {
  auto newline = [&](int lvl) {
    out += '\n';
    for (int i = 0; i < lvl; ++i) out += style.indent;
  };
  switch (v.kind()) {
    case Value::Kind::kNone: out += "null"; return Status::OK();
    case Value::Kind::kBool: out += v.as_bool() ? "true" : "false"; return Status::OK();
    case Value::Kind::kInt: out += std::to_string(v.as_int()); return Status::OK();
    case Value::Kind::kFloat: {
      const double d = v.as_double();
      if (std::isnan(d)) {
        out += "NaN";
      } else if (std::isinf(d)) {
        out += d < 0 ? "-Infinity" : "Infinity";
      } else {
        out += format_float(d);
      }
      return Status::OK();
    }
    case Value::Kind::kString: append_json_string(v.as_string(), style.ensure_ascii, out); return Status::OK();
    case Value::Kind::kList:
    case Value::Kind::kTuple: {
      const auto& items = v.items();
      if (items.empty()) {
        out += "[]";
        return Status::OK();
      }
      out += '[';
      for (size_t i = 0; i < items.size(); ++i) {
        if (i > 0) out += style.item_separator;
        if (style.has_indent) newline(level + 1);
        RETURN_IF_ERROR(append_json(items[i], style, out, level + 1));
      }
      if (style.has_indent) newline(level);
      out += ']';
      return Status::OK();
    }
    case Value::Kind::kDict: {
      const auto& items = v.as_dict().items;
      if (items.empty()) {
        out += "{}";
        return Status::OK();
      }
      std::vector<const std::pair<std::string, Value>*> order;
      order.reserve(items.size());
      for (const auto& item : items) order.push_back(&item);
      if (style.sort_keys) {
        std::stable_sort(order.begin(), order.end(), [](auto* a, auto* b) { return a->first < b->first; });
      }
      out += '{';
      for (size_t i = 0; i < order.size(); ++i) {
        if (i > 0) out += style.item_separator;
        if (style.has_indent) newline(level + 1);
        append_json_string(order[i]->first, style.ensure_ascii, out);
        out += style.key_separator;
        RETURN_IF_ERROR(append_json(order[i]->second, style, out, level + 1));
      }
      if (style.has_indent) newline(level);
      out += '}';
      return Status::OK();
    }
    default:
      return Status::InvalidArgument(fmt::format("Object of type {} is not JSON serializable", type_name(v)));
  }
}

namespace {

Result<Value> from_json_at(const nlohmann::ordered_json& j, int depth) {
  if (depth > kMaxValueDepth) {
    return Status::InvalidArgument(fmt::format("values nested deeper than {} levels", kMaxValueDepth));
  }
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return Value::none();
    case nlohmann::ordered_json::value_t::boolean: return Value::boolean(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return Value::integer(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      const uint64_t u = j.get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) return Status::InvalidArgument("integer too large (over 2^63-1)");
      return Value::integer(static_cast<int64_t>(u));
    }
    case nlohmann::ordered_json::value_t::number_float: return Value::floating(j.get<double>());
    case nlohmann::ordered_json::value_t::string: {
      const auto& s = j.get_ref<const std::string&>();
      if (!valid_utf8(s)) return Status::InvalidArgument("a string is not valid UTF-8");
      return Value::string(s);
    }
    case nlohmann::ordered_json::value_t::array: {
      std::vector<Value> items;
      items.reserve(j.size());
      for (const auto& e : j) {
        ASSIGN_OR_RETURN(Value item, from_json_at(e, depth + 1));
        items.push_back(std::move(item));
      }
      return Value::list(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      std::vector<std::pair<std::string, Value>> items;
      items.reserve(j.size());
      for (auto it = j.begin(); it != j.end(); ++it) {
        if (!valid_utf8(it.key())) return Status::InvalidArgument("a key is not valid UTF-8");
        ASSIGN_OR_RETURN(Value item, from_json_at(it.value(), depth + 1));
        items.emplace_back(it.key(), std::move(item));
      }
      return Value::dict(std::move(items));
    }
    default: return Status::InvalidArgument("binary JSON values are not supported");
  }
}

}  // namespace

Result<Value> from_json(const nlohmann::ordered_json& j) { return from_json_at(j, 0); }

// ---- UTF-8 -------------------------------------------------------------------

bool valid_utf8(std::string_view s) {
  size_t i = 0;
  const size_t n = s.size();
  while (i < n) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    int len;
    char32_t cp;
    if ((c & 0xE0) == 0xC0) {
      len = 2;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (i + len > n) return false;
    for (int k = 1; k < len; ++k) {
      const unsigned char cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000)) return false;
    if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += len;
  }
  return true;
}

char32_t next_code_point(std::string_view s, size_t& i) {
  const unsigned char c = static_cast<unsigned char>(s[i]);
  if (c < 0x80) {
    ++i;
    return c;
  }
  int len = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : 4;
  char32_t cp = c & (len == 2 ? 0x1F : len == 3 ? 0x0F : 0x07);
  for (int k = 1; k < len && i + k < s.size(); ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  i += len;
  return cp;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

bool is_py_space(char32_t cp) {
  // Python's str.isspace(): bidirectional class WS, B or S, or category Zs.
  switch (cp) {
    case ' ': case '\t': case '\n': case '\v': case '\f': case '\r':
    case 0x1C: case 0x1D: case 0x1E: case 0x1F: case 0x85: case 0xA0: case 0x1680:
    case 0x2028: case 0x2029: case 0x202F: case 0x205F: case 0x3000: return true;
    default: return cp >= 0x2000 && cp <= 0x200A;
  }
}

size_t utf8_length(std::string_view s) {
  size_t n = 0;
  for (char c : s) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return n;
}

std::vector<size_t> code_point_offsets(std::string_view s) {
  std::vector<size_t> offsets;
  offsets.reserve(s.size() + 1);
  for (size_t i = 0; i < s.size(); ++i) {
    if ((static_cast<unsigned char>(s[i]) & 0xC0) != 0x80) offsets.push_back(i);
  }
  offsets.push_back(s.size());
  return offsets;
}

}  // namespace tessera::data::jinja
