// The values of the Jinja subset (data/jinja.h): Python's objects as a chat
// template sees them, with Python's printing (str/repr), equality, ordering
// and json.dumps, so that rendered text is byte for byte what python3-jinja2
// renders.
//
//   undefined  jinja2's default Undefined: prints "", iterates empty, is
//              false; carries the message an operation on it fails with
//   none bool int (int64; overflow is an error) float (double)
//   string     UTF-8 (valid: checked where text enters); length, indexing
//              and slicing count code points, as Python's str does
//   list tuple immutable (ImmutableSandboxedEnvironment forbids mutation)
//   dict       immutable, insertion-ordered, string keys
//   namespace  the one mutable object (`set ns.x = ...`)
//   callable   a global function, a bound method, a macro
//   loop       a for loop's `loop`
//
// Containers are shared (copying a Value is a reference-count increment) and
// know their nesting depth, which is bounded (kMaxValueDepth) so that
// printing, comparing and destroying a value never recurses without bound.
// Not thread-safe: values live inside one render() call.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace tessera::data::jinja {

inline constexpr int kMaxValueDepth = 256;

class Value;
struct ListData;
struct DictData;
struct NamespaceData;
struct Callable;
struct LoopData;

class Value {
 public:
  enum class Kind : uint8_t {
    kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kTuple, kDict, kNamespace, kCallable, kLoop
  };

  Value();  // undefined, no message
  static Value undefined(std::string message);
  static Value none();
  static Value boolean(bool b);
  static Value integer(int64_t i);
  static Value floating(double f);
  static Value string(std::string s);
  // Fails (one line) when the result would nest deeper than kMaxValueDepth.
  static Result<Value> list(std::vector<Value> items, bool tuple = false);
  static Result<Value> dict(std::vector<std::pair<std::string, Value>> items);
  static Value ns(std::shared_ptr<NamespaceData> data);
  static Value callable(std::shared_ptr<const Callable> fn);
  static Value loop(std::shared_ptr<LoopData> data);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_int() const { return kind_ == Kind::kInt; }
  bool is_bool() const { return kind_ == Kind::kBool; }
  bool is_float() const { return kind_ == Kind::kFloat; }
  // int or bool (Python's bool is an int).
  bool is_integral() const { return kind_ == Kind::kInt || kind_ == Kind::kBool; }
  bool is_number() const { return is_integral() || kind_ == Kind::kFloat; }
  bool is_list() const { return kind_ == Kind::kList || kind_ == Kind::kTuple; }  // list or tuple
  bool is_dict() const { return kind_ == Kind::kDict; }

  bool as_bool() const { return std::get<bool>(p_); }
  int64_t as_int() const { return kind_ == Kind::kBool ? int64_t{as_bool()} : std::get<int64_t>(p_); }
  double as_double() const { return kind_ == Kind::kFloat ? std::get<double>(p_) : double(as_int()); }
  const std::string& as_string() const { return *std::get<std::shared_ptr<const std::string>>(p_); }
  // The message of an undefined value ("'x' is undefined").
  const std::string& undefined_message() const { return as_string(); }
  const std::vector<Value>& items() const;  // list or tuple
  const DictData& as_dict() const { return *std::get<std::shared_ptr<const DictData>>(p_); }
  const std::shared_ptr<NamespaceData>& as_namespace() const {
    return std::get<std::shared_ptr<NamespaceData>>(p_);
  }
  const Callable& as_callable() const { return *std::get<std::shared_ptr<const Callable>>(p_); }
  const std::shared_ptr<LoopData>& as_loop() const { return std::get<std::shared_ptr<LoopData>>(p_); }

  // Nesting depth: 0 for scalars, 1 + the deepest element for containers.
  int depth() const;
  // Whether a namespace is inside (namespaces may not hold namespaces, so no
  // reference cycle can form).
  bool holds_namespace() const;

 private:
  Kind kind_ = Kind::kUndefined;
  std::variant<std::monostate, bool, int64_t, double, std::shared_ptr<const std::string>,
               std::shared_ptr<const ListData>, std::shared_ptr<const DictData>, std::shared_ptr<NamespaceData>,
               std::shared_ptr<const Callable>, std::shared_ptr<LoopData>>
      p_;
};

struct ListData {
  std::vector<Value> items;
  int depth = 1;
  bool holds_namespace = false;
};

struct DictData {
  std::vector<std::pair<std::string, Value>> items;
  int depth = 1;
  bool holds_namespace = false;
  const Value* find(std::string_view key) const;
};

struct NamespaceData {
  std::vector<std::pair<std::string, Value>> attrs;
  Value* find(std::string_view key);
  void set(const std::string& key, Value v);
};

// ---- Python semantics --------------------------------------------------------

// Python truthiness (undefined is false).
bool truthy(const Value& v);
// Python ==. Undefined equals only undefined.
bool equals(const Value& a, const Value& b);
// Python <: -1, 0, 1 for numbers, strings (code point order) and lists;
// otherwise TypeError's message: "'<' not supported between instances of
// 'str' and 'int'".
Result<int> compare(const Value& a, const Value& b, std::string_view op);
// type(v).__name__: "str", "int", "NoneType", "dict", "Undefined", ...
std::string type_name(const Value& v);
// jinja2.utils.object_type_repr: "None", "dict object", "str object", ...
std::string object_type_repr(const Value& v);

// str(v) (undefined: ""); repr(v). Both append.
void append_str(const Value& v, std::string& out);
std::string to_str(const Value& v);
void append_repr(const Value& v, std::string& out);
// repr(float) and str(float): shortest round trip, Python's layout.
std::string format_float(double d);

struct JsonStyle {
  bool ensure_ascii = false;
  std::string indent;   // used when has_indent
  bool has_indent = false;
  std::string item_separator = ", ";
  std::string key_separator = ": ";
  bool sort_keys = false;
};
// json.dumps(v, ...) with Python's formatting. TypeError's message for
// values JSON cannot carry ("Object of type Undefined is not JSON
// serializable").
Status append_json(const Value& v, const JsonStyle& style, std::string& out, int level = 0);

// JSON (in its member order) -> Value. Fails beyond kMaxValueDepth.
Result<Value> from_json(const nlohmann::ordered_json& j);

// ---- UTF-8 -------------------------------------------------------------------

// Whether s is valid UTF-8 (no surrogates, no overlongs).
bool valid_utf8(std::string_view s);
// Decodes the code point at s[i] (valid UTF-8 assumed) and advances i.
char32_t next_code_point(std::string_view s, size_t& i);
void append_utf8(std::string& out, char32_t cp);
// Python's str.isspace() for one code point.
bool is_py_space(char32_t cp);
// Number of code points.
size_t utf8_length(std::string_view s);
// Byte offsets of each code point, plus s.size() at the end.
std::vector<size_t> code_point_offsets(std::string_view s);

}  // namespace tessera::data::jinja
