// The evaluator of the Jinja subset: statements, expressions, Python's
// operators, jinja2's attribute/item lookup and scoping. Built-ins are in
// jinja_builtins.cc.
#include "data/jinja.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "core/try.h"
#include "data/jinja_eval.h"

namespace tessera::data::jinja {

// ---- Template ----------------------------------------------------------------

Result<Template> Template::parse(std::string_view source) {
  ASSIGN_OR_RETURN(std::unique_ptr<Program> program, parse_program(source));
  Template t;
  t.program_ = std::shared_ptr<const Program>(std::move(program));
  return t;
}

Result<std::string> Template::render(const nlohmann::ordered_json& context, const RenderOptions& options) const {
  Interp interp(options);
  return interp.run(*program_, context);
}

// ---- Frames ------------------------------------------------------------------

const Value* Frame::find(std::string_view name) const {
  for (const Frame* f = this; f != nullptr; f = f->parent) {
    for (const auto& [k, v] : f->vars) {
      if (k == name) return &v;
    }
  }
  return nullptr;
}

void Frame::set(const std::string& name, Value v) {
  for (auto& [k, slot] : vars) {
    if (k == name) {
      slot = std::move(v);
      return;
    }
  }
  vars.emplace_back(name, std::move(v));
}

Result<std::vector<Value>> bind_args(std::string_view fname, const CallArgs& args, const std::vector<Param>& params) {
  if (args.pos.size() > params.size()) {
    return Status::InvalidArgument(
        fmt::format("{}() takes at most {} arguments ({} given)", fname, params.size(), args.pos.size()));
  }
  std::vector<std::optional<Value>> bound(params.size());
  for (size_t i = 0; i < args.pos.size(); ++i) bound[i] = args.pos[i];
  for (const auto& [key, value] : args.kw) {
    size_t i = 0;
    while (i < params.size() && params[i].name != key) ++i;
    if (i == params.size()) {
      return Status::InvalidArgument(fmt::format("{}() got an unexpected keyword argument '{}'", fname, key));
    }
    if (bound[i]) return Status::InvalidArgument(fmt::format("{}() got multiple values for argument '{}'", fname, key));
    bound[i] = value;
  }
  std::vector<Value> out;
  out.reserve(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    if (bound[i]) {
      out.push_back(std::move(*bound[i]));
    } else if (params[i].def) {
      out.push_back(*params[i].def);
    } else {
      return Status::InvalidArgument(fmt::format("{}() missing required argument '{}'", fname, params[i].name));
    }
  }
  return out;
}

// ---- Interp: bookkeeping ------------------------------------------------------

Status Interp::charge(int64_t units) {
  work_ += units;
  if (work_ > options_.max_work) {
    return Status::InvalidArgument(fmt::format("the template does more than {} units of work (a loop that never "
                                               "ends, or input too large)", options_.max_work));
  }
  return Status::OK();
}

Result<Value> Interp::make_string(std::string s) {
  if (s.size() > kMaxOutputBytes) {
    return Status::InvalidArgument(fmt::format("a string longer than {} bytes", kMaxOutputBytes));
  }
  RETURN_IF_ERROR(charge(static_cast<int64_t>(s.size() / 16)));
  return Value::string(std::move(s));
}

Result<Value> Interp::make_list(std::vector<Value> items, bool tuple) {
  if (items.size() > kMaxListItems) {
    return Status::InvalidArgument(fmt::format("a list longer than {} items", kMaxListItems));
  }
  RETURN_IF_ERROR(charge(static_cast<int64_t>(items.size())));
  return Value::list(std::move(items), tuple);
}

Status Interp::raise(std::string message) {
  raised_ = true;
  return Status::InvalidArgument(std::move(message));
}

Status Interp::append_output(std::string& out, std::string_view text) {
  if (out.size() + text.size() > kMaxOutputBytes) {
    return Status::InvalidArgument(fmt::format("the output is longer than {} bytes", kMaxOutputBytes));
  }
  RETURN_IF_ERROR(charge(static_cast<int64_t>(text.size() / 16)));
  out.append(text);
  return Status::OK();
}

Result<std::string> Interp::run(const Program& program, const nlohmann::ordered_json& context) {
  if (!context.is_object()) return Status::InvalidArgument("chat template: the context must be a JSON object");
  Frame root;
  for (auto it = context.begin(); it != context.end(); ++it) {
    auto v = from_json(it.value());
    if (!v.ok()) return Status::InvalidArgument(fmt::format("chat template: '{}': {}", it.key(), v.status().message()));
    root.set(it.key(), std::move(v).value());
  }
  root_ = &root;
  std::string out;
  Status st = exec_body(program.body, root, out);
  if (!st.ok()) {
    if (raised_) return st;  // raise_exception(): verbatim
    std::string message = st.message();  // one line, even when it quotes text with newlines
    for (size_t at = message.find('\n'); at != std::string::npos; at = message.find('\n', at + 2)) {
      message.replace(at, 1, "\\n");
    }
    return Status::InvalidArgument(fmt::format("chat template line {}: {}", error_line_, message));
  }
  return out;
}

// ---- Statements ----------------------------------------------------------------

Status Interp::exec_body(const std::vector<Stmt>& body, Frame& frame, std::string& out) {
  for (const Stmt& s : body) {
    RETURN_IF_ERROR(exec(s, frame, out));
    if (flow_ != Flow::kNormal) return Status::OK();
  }
  return Status::OK();
}

Status Interp::assign(const std::vector<std::string>& targets, const Value& v, Frame& frame) {
  if (targets.size() == 1) {
    frame.set(targets[0], v);
    return Status::OK();
  }
  if (!v.is_list() && !v.is_string() && !v.is_dict()) {
    if (v.is_undefined()) return Status::InvalidArgument(v.undefined_message());
    return Status::InvalidArgument(fmt::format("cannot unpack non-iterable {} object", type_name(v)));
  }
  ASSIGN_OR_RETURN(std::vector<Value> items, iterate(v));
  if (items.size() < targets.size()) {
    return Status::InvalidArgument(
        fmt::format("not enough values to unpack (expected {}, got {})", targets.size(), items.size()));
  }
  if (items.size() > targets.size()) {
    return Status::InvalidArgument(fmt::format("too many values to unpack (expected {})", targets.size()));
  }
  for (size_t i = 0; i < targets.size(); ++i) frame.set(targets[i], items[i]);
  return Status::OK();
}

Status Interp::exec(const Stmt& s, Frame& frame, std::string& out) {
  RETURN_IF_ERROR(charge(1));
  if (depth_ >= kMaxEvalDepth) {
    if (error_line_ == 0) error_line_ = s.line;
    return Status::InvalidArgument(fmt::format("evaluation nested deeper than {} levels", kMaxEvalDepth));
  }
  ++depth_;
  Status st = exec_inner(s, frame, out);
  --depth_;
  if (!st.ok() && error_line_ == 0) error_line_ = s.line;
  return st;
}

Status Interp::exec_inner(const Stmt& s, Frame& frame, std::string& out) {
  Status st;
  switch (s.kind) {
    case Stmt::Kind::kText: st = append_output(out, s.text); break;
    case Stmt::Kind::kOutput: {
      auto v = eval(*s.expr, frame);
      if (!v.ok()) {
        st = v.status();
        break;
      }
      if (v->is_string()) {
        st = append_output(out, v->as_string());
      } else {
        std::string text;
        append_str(*v, text);
        st = append_output(out, text);
      }
      break;
    }
    case Stmt::Kind::kIf: {
      for (size_t i = 0; i < s.conds.size(); ++i) {
        auto c = eval(*s.conds[i], frame);
        if (!c.ok()) return c.status();
        if (truthy(*c)) return exec_body(s.bodies[i], frame, out);
      }
      return exec_body(s.else_body, frame, out);
    }
    case Stmt::Kind::kFor: st = exec_for(s, frame, out); break;
    case Stmt::Kind::kSet: {
      auto v = eval(*s.expr, frame);
      if (!v.ok()) return v.status();
      if (s.attr.empty()) {
        st = assign(s.targets, *v, frame);
        break;
      }
      const Value* target = frame.find(s.targets[0]);
      if (target == nullptr || target->kind() != Value::Kind::kNamespace) {
        st = Status::InvalidArgument("cannot assign attribute on non-namespace object");
      } else if (v->holds_namespace()) {
        st = Status::InvalidArgument("a namespace cannot be stored inside a namespace (not supported)");
      } else {
        target->as_namespace()->set(s.attr, std::move(v).value());
      }
      break;
    }
    case Stmt::Kind::kSetBlock: {
      std::string captured;
      st = exec_body(s.body, frame, captured);
      if (st.ok()) frame.set(s.targets[0], Value::string(std::move(captured)));
      break;
    }
    case Stmt::Kind::kMacro: {
      auto fn = std::make_shared<Callable>();
      fn->kind = Builtin::kMacro;
      fn->name = s.targets[0];
      fn->macro = &s;
      frame.set(s.targets[0], Value::callable(std::move(fn)));
      break;
    }
    case Stmt::Kind::kBreak: flow_ = Flow::kBreak; break;
    case Stmt::Kind::kContinue: flow_ = Flow::kContinue; break;
    case Stmt::Kind::kBlock: st = exec_body(s.body, frame, out); break;
  }
  return st;
}

Status Interp::exec_for(const Stmt& s, Frame& frame, std::string& out) {
  ASSIGN_OR_RETURN(Value iterable, eval(*s.expr, frame));
  ASSIGN_OR_RETURN(std::vector<Value> items, iterate(iterable));
  if (s.cond) {
    std::vector<Value> kept;
    for (Value& item : items) {
      RETURN_IF_ERROR(charge(1));
      Frame scope{&frame, {}};
      RETURN_IF_ERROR(assign(s.targets, item, scope));
      ASSIGN_OR_RETURN(Value keep, eval(*s.cond, scope));
      if (truthy(keep)) kept.push_back(std::move(item));
    }
    items = std::move(kept);
  }
  if (items.empty()) {
    Frame scope{&frame, {}};
    return exec_body(s.else_body, scope, out);
  }
  auto loop = std::make_shared<LoopData>();
  loop->items = std::make_shared<const std::vector<Value>>(std::move(items));
  const Value loop_value = Value::loop(loop);
  for (size_t i = 0; i < loop->items->size(); ++i) {
    RETURN_IF_ERROR(charge(1));
    loop->index0 = i;
    Frame scope{&frame, {}};
    RETURN_IF_ERROR(assign(s.targets, (*loop->items)[i], scope));
    scope.set("loop", loop_value);
    RETURN_IF_ERROR(exec_body(s.body, scope, out));
    if (flow_ == Flow::kBreak) {
      flow_ = Flow::kNormal;
      break;
    }
    flow_ = Flow::kNormal;
  }
  return Status::OK();
}

// ---- Lookups -------------------------------------------------------------------

Result<Value> Interp::lookup(const std::string& name, const Frame& frame) const {
  if (const Value* v = frame.find(name)) return *v;
  static const std::vector<std::pair<std::string_view, Builtin>> kGlobals = {
      {"range", Builtin::kRange},
      {"namespace", Builtin::kNamespace},
      {"dict", Builtin::kDict},
      {"raise_exception", Builtin::kRaiseException},
      {"strftime_now", Builtin::kStrftimeNow},
  };
  for (const auto& [global, which] : kGlobals) {
    if (name == global) {
      auto fn = std::make_shared<Callable>();
      fn->kind = which;
      fn->name = name;
      return Value::callable(std::move(fn));
    }
  }
  return Value::undefined(fmt::format("'{}' is undefined", name));
}

Result<std::vector<Value>> Interp::iterate(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined: return std::vector<Value>{};
    case Value::Kind::kList:
    case Value::Kind::kTuple: return v.items();
    case Value::Kind::kDict: {
      std::vector<Value> keys;
      keys.reserve(v.as_dict().items.size());
      for (const auto& [k, item] : v.as_dict().items) keys.push_back(Value::string(k));
      return keys;
    }
    case Value::Kind::kString: {
      const std::string& s = v.as_string();
      std::vector<Value> chars;
      RETURN_IF_ERROR(charge(static_cast<int64_t>(s.size())));
      size_t i = 0;
      while (i < s.size()) {
        const size_t start = i;
        next_code_point(s, i);
        chars.push_back(Value::string(s.substr(start, i - start)));
      }
      return chars;
    }
    default: return Status::InvalidArgument(fmt::format("'{}' object is not iterable", type_name(v)));
  }
}

namespace {

Value no_attribute(const Value& obj, std::string_view name) {
  return Value::undefined(fmt::format("'{}' has no attribute '{}'", object_type_repr(obj), name));
}

Value unsafe_attribute(const Value& obj, std::string_view name) {
  return Value::undefined(fmt::format("access to attribute '{}' of '{}' object is unsafe.", name, type_name(obj)));
}

Value bound_method(const Value& self, const std::string& name) {
  auto fn = std::make_shared<Callable>();
  fn->kind = Builtin::kMethod;
  fn->name = name;
  fn->self = self;
  return Value::callable(std::move(fn));
}

// Python's slice.indices() + the selection, on n items.
std::vector<size_t> slice_positions(int64_t n, std::optional<int64_t> start, std::optional<int64_t> stop,
                                    int64_t step) {
  std::vector<size_t> out;
  auto clamp = [&](std::optional<int64_t> v, int64_t dflt, int64_t lo, int64_t hi) {
    if (!v) return dflt;
    int64_t x = *v;
    if (x < 0) x += n;
    return std::max(lo, std::min(hi, x));
  };
  if (step > 0) {
    const int64_t b = clamp(start, 0, 0, n), e = clamp(stop, n, 0, n);
    for (int64_t i = b; i < e; i += step) out.push_back(static_cast<size_t>(i));
  } else {
    const int64_t b = clamp(start, n - 1, -1, n - 1), e = clamp(stop, -1, -1, n - 1);
    for (int64_t i = b; i > e; i += step) out.push_back(static_cast<size_t>(i));
  }
  return out;
}

}  // namespace

Result<Value> Interp::getattr(const Value& obj, const std::string& name) {
  if (obj.is_undefined()) return Status::InvalidArgument(obj.undefined_message());
  if (!name.empty() && name[0] == '_') return unsafe_attribute(obj, name);
  switch (obj.kind()) {
    case Value::Kind::kDict: {
      if (has_method(obj, name)) return bound_method(obj, name);
      static const std::vector<std::string_view> kUnsafe = {"pop", "popitem", "setdefault", "update", "clear"};
      for (std::string_view u : kUnsafe) {
        if (name == u) return unsafe_attribute(obj, name);
      }
      if (const Value* v = obj.as_dict().find(name)) return *v;
      return no_attribute(obj, name);
    }
    case Value::Kind::kNamespace:
      if (Value* v = obj.as_namespace()->find(name)) return *v;
      return no_attribute(obj, name);
    case Value::Kind::kLoop: {
      const LoopData& loop = *obj.as_loop();
      const int64_t n = static_cast<int64_t>(loop.items->size());
      const int64_t i = static_cast<int64_t>(loop.index0);
      if (name == "index") return Value::integer(i + 1);
      if (name == "index0") return Value::integer(i);
      if (name == "revindex") return Value::integer(n - i);
      if (name == "revindex0") return Value::integer(n - i - 1);
      if (name == "first") return Value::boolean(i == 0);
      if (name == "last") return Value::boolean(i == n - 1);
      if (name == "length") return Value::integer(n);
      if (name == "depth") return Value::integer(1);
      if (name == "depth0") return Value::integer(0);
      if (name == "previtem") {
        return i > 0 ? (*loop.items)[i - 1] : Value::undefined("there is no previous item");
      }
      if (name == "nextitem") return i + 1 < n ? (*loop.items)[i + 1] : Value::undefined("there is no next item");
      if (name == "cycle") {
        auto fn = std::make_shared<Callable>();
        fn->kind = Builtin::kLoopCycle;
        fn->name = name;
        fn->self = obj;
        return Value::callable(std::move(fn));
      }
      return no_attribute(obj, name);
    }
    case Value::Kind::kString:
    case Value::Kind::kList:
    case Value::Kind::kTuple: {
      if (has_method(obj, name)) return bound_method(obj, name);
      static const std::vector<std::string_view> kUnsafe = {"append", "extend", "insert", "pop",
                                                            "remove", "reverse", "sort", "clear"};
      if (obj.kind() == Value::Kind::kList) {
        for (std::string_view u : kUnsafe) {
          if (name == u) return unsafe_attribute(obj, name);
        }
      }
      return no_attribute(obj, name);
    }
    default: return no_attribute(obj, name);
  }
}

Result<Value> Interp::getitem(const Value& obj, const Value& key) {
  if (obj.is_undefined()) return Status::InvalidArgument(obj.undefined_message());
  if (obj.is_dict() && key.is_string()) {
    if (const Value* v = obj.as_dict().find(key.as_string())) return *v;
  }
  if ((obj.is_list() || obj.is_string()) && key.is_integral()) {
    int64_t i = key.as_int();
    if (obj.is_list()) {
      const int64_t n = static_cast<int64_t>(obj.items().size());
      if (i < 0) i += n;
      if (i >= 0 && i < n) return obj.items()[static_cast<size_t>(i)];
    } else {
      const std::string& s = obj.as_string();
      std::vector<size_t> offsets = code_point_offsets(s);
      const int64_t n = static_cast<int64_t>(offsets.size()) - 1;
      if (i < 0) i += n;
      if (i >= 0 && i < n) {
        return Value::string(s.substr(offsets[static_cast<size_t>(i)],
                                      offsets[static_cast<size_t>(i) + 1] - offsets[static_cast<size_t>(i)]));
      }
    }
  }
  // jinja2: obj[key] failed; a string key is then tried as an attribute.
  if (key.is_string()) return getattr(obj, key.as_string());
  std::string shown;
  append_repr(key, shown);
  return Value::undefined(fmt::format("{} has no element {}", object_type_repr(obj), shown));
}

// ---- Expressions ----------------------------------------------------------------

Result<Value> Interp::eval(const Expr& e, Frame& frame) {
  if (depth_ >= kMaxEvalDepth) {
    if (error_line_ == 0) error_line_ = e.line;
    return Status::InvalidArgument(fmt::format("evaluation nested deeper than {} levels", kMaxEvalDepth));
  }
  ++depth_;
  auto r = eval_inner(e, frame);
  --depth_;
  if (!r.ok() && error_line_ == 0) error_line_ = e.line;
  return r;
}

Result<CallArgs> Interp::eval_args(const Expr& e, size_t first, Frame& frame) {
  CallArgs args;
  for (size_t i = first; i < e.args.size(); ++i) {
    ASSIGN_OR_RETURN(Value v, eval(*e.args[i], frame));
    args.pos.push_back(std::move(v));
  }
  for (const auto& [key, expr] : e.kwargs) {
    ASSIGN_OR_RETURN(Value v, eval(*expr, frame));
    args.kw.emplace_back(key, std::move(v));
  }
  return args;
}

namespace {

Status undefined_error(const Value& v) { return Status::InvalidArgument(v.undefined_message()); }

Status operand_error(std::string_view op, const Value& a, const Value& b) {
  return Status::InvalidArgument(
      fmt::format("unsupported operand type(s) for {}: '{}' and '{}'", op, type_name(a), type_name(b)));
}

double py_fmod(double a, double b) {
  double m = std::fmod(a, b);
  if (m != 0 && ((m < 0) != (b < 0))) m += b;
  return m;
}

// CPython's float floor division (float_divmod), which is not floor(x / y).
double py_floordiv(double vx, double wx) {
  double mod = std::fmod(vx, wx);
  double div = (vx - mod) / wx;
  if (mod != 0) {
    if ((wx < 0) != (mod < 0)) div -= 1.0;
  }
  if (div != 0) {
    double floordiv = std::floor(div);
    if (div - floordiv > 0.5) floordiv += 1.0;
    return floordiv;
  }
  return std::copysign(0.0, vx / wx);
}

}  // namespace

namespace {

Result<Value> repeat(Interp& interp, const Value& seq, int64_t count) {
  if (count < 0) count = 0;
  if (seq.is_string()) {
    const std::string& s = seq.as_string();
    if (!s.empty() && static_cast<uint64_t>(count) > kMaxOutputBytes / s.size()) {
      return Status::InvalidArgument(fmt::format("a string longer than {} bytes", kMaxOutputBytes));
    }
    std::string out;
    out.reserve(s.size() * static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) out += s;
    return interp.make_string(std::move(out));
  }
  const auto& items = seq.items();
  if (!items.empty() && static_cast<uint64_t>(count) > kMaxListItems / items.size()) {
    return Status::InvalidArgument(fmt::format("a list longer than {} items", kMaxListItems));
  }
  std::vector<Value> out;
  for (int64_t i = 0; i < count; ++i) out.insert(out.end(), items.begin(), items.end());
  return interp.make_list(std::move(out), seq.kind() == Value::Kind::kTuple);
}

// printf-style `str % args`: %s %r %d %i and %%, without flags or widths.
Result<Value> percent_format(Interp& interp, const std::string& fmt_s, const Value& args) {
  std::vector<Value> values;
  if (args.kind() == Value::Kind::kTuple) {
    values = args.items();
  } else {
    values.push_back(args);
  }
  std::string out;
  size_t next = 0;
  for (size_t i = 0; i < fmt_s.size(); ++i) {
    if (fmt_s[i] != '%') {
      out += fmt_s[i];
      continue;
    }
    if (++i >= fmt_s.size()) return Status::InvalidArgument("incomplete format");
    const char conv = fmt_s[i];
    if (conv == '%') {
      out += '%';
      continue;
    }
    if (conv != 's' && conv != 'r' && conv != 'd' && conv != 'i') {
      return Status::InvalidArgument(fmt::format("'%{}' in a % format is not supported (only %s %r %d %i)", conv));
    }
    if (next >= values.size()) return Status::InvalidArgument("not enough arguments for format string");
    const Value& v = values[next++];
    if (conv == 's') {
      append_str(v, out);
    } else if (conv == 'r') {
      append_repr(v, out);
    } else if (v.is_integral()) {
      out += std::to_string(v.as_int());
    } else if (v.is_float() && std::isfinite(v.as_double()) && std::fabs(v.as_double()) < 9.2e18) {
      out += std::to_string(static_cast<int64_t>(v.as_double()));
    } else {
      return Status::InvalidArgument(fmt::format("%{} format: a real number is required, not {}", conv, type_name(v)));
    }
    if (out.size() > kMaxOutputBytes) return Status::InvalidArgument("a string longer than the output limit");
  }
  // CPython skips this check when the argument is a mapping-like (a list or dict).
  if (next < values.size() && !args.is_dict() && args.kind() != Value::Kind::kList && !args.is_undefined()) {
    return Status::InvalidArgument("not all arguments converted during string formatting");
  }
  return interp.make_string(std::move(out));
}

Result<Value> arith(Interp& interp, BinOp op, const Value& a, const Value& b) {
  if (op == BinOp::kMod && a.is_string()) return percent_format(interp, a.as_string(), b);
  if (a.is_undefined()) return undefined_error(a);
  if (b.is_undefined()) return undefined_error(b);
  static const char* kNames[] = {"+", "-", "*", "/", "//", "%", "**"};
  const char* name = kNames[static_cast<int>(op)];
  if (a.is_number() && b.is_number()) {
    const bool ints = a.is_integral() && b.is_integral();
    if (ints) {
      const int64_t x = a.as_int(), y = b.as_int();
      int64_t r = 0;
      switch (op) {
        case BinOp::kAdd:
          if (__builtin_add_overflow(x, y, &r)) return Status::InvalidArgument("integer overflow");
          return Value::integer(r);
        case BinOp::kSub:
          if (__builtin_sub_overflow(x, y, &r)) return Status::InvalidArgument("integer overflow");
          return Value::integer(r);
        case BinOp::kMul:
          if (__builtin_mul_overflow(x, y, &r)) return Status::InvalidArgument("integer overflow");
          return Value::integer(r);
        case BinOp::kDiv:
          if (y == 0) return Status::InvalidArgument("division by zero");
          return Value::floating(static_cast<double>(x) / static_cast<double>(y));
        case BinOp::kFloorDiv:
        case BinOp::kMod: {
          if (y == 0) return Status::InvalidArgument("integer division or modulo by zero");
          if (x == std::numeric_limits<int64_t>::min() && y == -1) return Status::InvalidArgument("integer overflow");
          int64_t q = x / y, m = x % y;
          if (m != 0 && ((m < 0) != (y < 0))) {
            --q;
            m += y;
          }
          return Value::integer(op == BinOp::kFloorDiv ? q : m);
        }
        case BinOp::kPow: {
          if (y < 0) return Value::floating(std::pow(static_cast<double>(x), static_cast<double>(y)));
          int64_t result = 1, base = x, e = y;
          while (e > 0) {
            if (e & 1) {
              if (__builtin_mul_overflow(result, base, &result)) return Status::InvalidArgument("integer overflow");
            }
            e >>= 1;
            if (e > 0 && __builtin_mul_overflow(base, base, &base)) return Status::InvalidArgument("integer overflow");
          }
          return Value::integer(result);
        }
      }
    }
    const double x = a.as_double(), y = b.as_double();
    switch (op) {
      case BinOp::kAdd: return Value::floating(x + y);
      case BinOp::kSub: return Value::floating(x - y);
      case BinOp::kMul: return Value::floating(x * y);
      case BinOp::kDiv:
        if (y == 0) return Status::InvalidArgument("float division by zero");
        return Value::floating(x / y);
      case BinOp::kFloorDiv:
        if (y == 0) return Status::InvalidArgument("float floor division by zero");
        return Value::floating(py_floordiv(x, y));
      case BinOp::kMod:
        if (y == 0) return Status::InvalidArgument("float modulo");
        return Value::floating(py_fmod(x, y));
      case BinOp::kPow: return Value::floating(std::pow(x, y));
    }
  }
  if (op == BinOp::kAdd) {
    if (a.is_string() && b.is_string()) {
      if (a.as_string().size() + b.as_string().size() > kMaxOutputBytes) {
        return Status::InvalidArgument(fmt::format("a string longer than {} bytes", kMaxOutputBytes));
      }
      return interp.make_string(a.as_string() + b.as_string());
    }
    if (a.is_list() && b.kind() == a.kind()) {
      std::vector<Value> items = a.items();
      items.insert(items.end(), b.items().begin(), b.items().end());
      return interp.make_list(std::move(items), a.kind() == Value::Kind::kTuple);
    }
    if (a.is_string() || a.is_list()) {
      return Status::InvalidArgument(
          fmt::format("can only concatenate {} (not \"{}\") to {}", type_name(a), type_name(b), type_name(a)));
    }
  }
  if (op == BinOp::kMul) {
    if ((a.is_string() || a.is_list()) && b.is_integral()) return repeat(interp, a, b.as_int());
    if ((b.is_string() || b.is_list()) && a.is_integral()) return repeat(interp, b, a.as_int());
  }
  return operand_error(name, a, b);
}

Result<bool> contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Value::Kind::kUndefined: return false;
    case Value::Kind::kString:
      if (!item.is_string()) {
        if (item.is_undefined()) return undefined_error(item);
        return Status::InvalidArgument(
            fmt::format("'in <string>' requires string as left operand, not {}", type_name(item)));
      }
      return container.as_string().find(item.as_string()) != std::string::npos;
    case Value::Kind::kList:
    case Value::Kind::kTuple:
      for (const Value& v : container.items()) {
        if (equals(v, item)) return true;
      }
      return false;
    case Value::Kind::kDict:
      if (item.is_list() && item.kind() == Value::Kind::kList) return Status::InvalidArgument("unhashable type: 'list'");
      if (item.is_dict()) return Status::InvalidArgument("unhashable type: 'dict'");
      return item.is_string() && container.as_dict().find(item.as_string()) != nullptr;
    default:
      return Status::InvalidArgument(fmt::format("argument of type '{}' is not iterable", type_name(container)));
  }
}

}  // namespace

[[gnu::noinline]] Result<Value> Interp::eval_dict(const Expr& e, Frame& frame) {
      std::vector<std::pair<std::string, Value>> items;
      for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
        ASSIGN_OR_RETURN(Value key, eval(*e.args[i], frame));
        ASSIGN_OR_RETURN(Value v, eval(*e.args[i + 1], frame));
        if (!key.is_string()) return Status::InvalidArgument("dict keys must be strings (not supported otherwise)");
        bool replaced = false;
        for (auto& [k, slot] : items) {
          if (k == key.as_string()) {
            slot = v;
            replaced = true;
          }
        }
        if (!replaced) items.emplace_back(key.as_string(), std::move(v));
      }
      return Value::dict(std::move(items));
    }

[[gnu::noinline]] Result<Value> Interp::eval_slice(const Expr& e, Frame& frame) {
      ASSIGN_OR_RETURN(Value obj, eval(*e.args[0], frame));
      std::optional<int64_t> bounds[3];
      bool bad_bound = false;
      for (int k = 0; k < 3; ++k) {
        if (!e.args[k + 1]) continue;
        ASSIGN_OR_RETURN(Value b, eval(*e.args[k + 1], frame));
        if (b.is_integral()) {
          bounds[k] = b.as_int();
        } else if (!b.is_none()) {
          bad_bound = true;
        }
      }
      if (obj.is_undefined()) return undefined_error(obj);
      const int64_t step = bounds[2].value_or(1);
      if (step == 0) return Status::InvalidArgument("slice step cannot be zero");
      if (bad_bound || !(obj.is_list() || obj.is_string())) {
        return Value::undefined(fmt::format("{} has no element slice(...)", object_type_repr(obj)));
      }
      if (obj.is_list()) {
        const auto& items = obj.items();
        std::vector<Value> out;
        for (size_t i : slice_positions(static_cast<int64_t>(items.size()), bounds[0], bounds[1], step)) {
          out.push_back(items[i]);
        }
        return make_list(std::move(out), obj.kind() == Value::Kind::kTuple);
      }
      const std::string& s = obj.as_string();
      std::vector<size_t> offsets = code_point_offsets(s);
      std::string out;
      for (size_t i : slice_positions(static_cast<int64_t>(offsets.size()) - 1, bounds[0], bounds[1], step)) {
        out.append(s, offsets[i], offsets[i + 1] - offsets[i]);
      }
      return make_string(std::move(out));
    }

[[gnu::noinline]] Result<Value> Interp::eval_compare(const Expr& e, Frame& frame) {
      ASSIGN_OR_RETURN(Value left, eval(*e.args[0], frame));
      for (size_t i = 0; i < e.cmp_ops.size(); ++i) {
        ASSIGN_OR_RETURN(Value right, eval(*e.args[i + 1], frame));
        bool r = false;
        switch (e.cmp_ops[i]) {
          case CmpOp::kEq: r = equals(left, right); break;
          case CmpOp::kNe: r = !equals(left, right); break;
          case CmpOp::kIn: {
            ASSIGN_OR_RETURN(r, contains(right, left));
            break;
          }
          case CmpOp::kNotIn: {
            ASSIGN_OR_RETURN(bool in, contains(right, left));
            r = !in;
            break;
          }
          default: {
            static const char* kOps[] = {"==", "!=", "<", "<=", ">", ">="};
            ASSIGN_OR_RETURN(int c, compare(left, right, kOps[static_cast<int>(e.cmp_ops[i])]));
            r = e.cmp_ops[i] == CmpOp::kLt   ? c < 0
                : e.cmp_ops[i] == CmpOp::kLe ? c <= 0
                : e.cmp_ops[i] == CmpOp::kGt ? c > 0
                                             : c >= 0;
          }
        }
        if (!r) return Value::boolean(false);
        left = std::move(right);
      }
      return Value::boolean(true);
    }

[[gnu::noinline]] Result<Value> Interp::eval_concat(const Expr& e, Frame& frame) {
      std::string out;
      for (const auto& arg : e.args) {
        ASSIGN_OR_RETURN(Value v, eval(*arg, frame));
        append_str(v, out);
        if (out.size() > kMaxOutputBytes) {
          return Status::InvalidArgument(fmt::format("a string longer than {} bytes", kMaxOutputBytes));
        }
      }
      return make_string(std::move(out));
    }

[[gnu::noinline]] Result<Value> Interp::eval_list(const Expr& e, Frame& frame) {
      std::vector<Value> items;
      items.reserve(e.args.size());
      for (const auto& arg : e.args) {
        ASSIGN_OR_RETURN(Value v, eval(*arg, frame));
        items.push_back(std::move(v));
      }
      return make_list(std::move(items), e.kind == Expr::Kind::kTuple);
    }

[[gnu::noinline]] Result<Value> Interp::eval_unary(const Expr& e, Frame& frame) {
      ASSIGN_OR_RETURN(Value v, eval(*e.args[0], frame));
      if (v.is_undefined()) return undefined_error(v);
      const bool neg = e.kind == Expr::Kind::kNeg;
      if (v.is_float()) return Value::floating(neg ? -v.as_double() : v.as_double());
      if (v.is_integral()) {
        if (neg && v.as_int() == std::numeric_limits<int64_t>::min()) {
          return Status::InvalidArgument("integer overflow");
        }
        return Value::integer(neg ? -v.as_int() : v.as_int());
      }
      return Status::InvalidArgument(
          fmt::format("bad operand type for unary {}: '{}'", neg ? '-' : '+', type_name(v)));
    }

Result<Value> Interp::eval_inner(const Expr& e, Frame& frame) {
  RETURN_IF_ERROR(charge(1));
  switch (e.kind) {
    case Expr::Kind::kLiteral: return e.literal;
    case Expr::Kind::kName: return lookup(e.name, frame);
    case Expr::Kind::kList:
    case Expr::Kind::kTuple: return eval_list(e, frame);
    case Expr::Kind::kDict: return eval_dict(e, frame);
    case Expr::Kind::kAttr: {
      ASSIGN_OR_RETURN(Value obj, eval(*e.args[0], frame));
      return getattr(obj, e.name);
    }
    case Expr::Kind::kItem: {
      ASSIGN_OR_RETURN(Value obj, eval(*e.args[0], frame));
      ASSIGN_OR_RETURN(Value key, eval(*e.args[1], frame));
      return getitem(obj, key);
    }
    case Expr::Kind::kSlice: return eval_slice(e, frame);
    case Expr::Kind::kCall: {
      ASSIGN_OR_RETURN(Value fn, eval(*e.args[0], frame));
      ASSIGN_OR_RETURN(CallArgs args, eval_args(e, 1, frame));
      return call(fn, args);
    }
    case Expr::Kind::kFilter: {
      ASSIGN_OR_RETURN(Value v, eval(*e.args[0], frame));
      ASSIGN_OR_RETURN(CallArgs args, eval_args(e, 1, frame));
      return apply_filter(e.filter, v, args);
    }
    case Expr::Kind::kTest: {
      ASSIGN_OR_RETURN(Value v, eval(*e.args[0], frame));
      ASSIGN_OR_RETURN(CallArgs args, eval_args(e, 1, frame));
      ASSIGN_OR_RETURN(bool r, apply_test(e.test, v, args));
      return Value::boolean(r != e.negated);
    }
    case Expr::Kind::kNeg:
    case Expr::Kind::kPos: return eval_unary(e, frame);
    case Expr::Kind::kNot: {
      ASSIGN_OR_RETURN(Value v, eval(*e.args[0], frame));
      return Value::boolean(!truthy(v));
    }
    case Expr::Kind::kBinary: {
      ASSIGN_OR_RETURN(Value a, eval(*e.args[0], frame));
      ASSIGN_OR_RETURN(Value b, eval(*e.args[1], frame));
      return arith(*this, e.op, a, b);
    }
    case Expr::Kind::kCompare: return eval_compare(e, frame);
    case Expr::Kind::kAnd: {
      ASSIGN_OR_RETURN(Value a, eval(*e.args[0], frame));
      if (!truthy(a)) return a;
      return eval(*e.args[1], frame);
    }
    case Expr::Kind::kOr: {
      ASSIGN_OR_RETURN(Value a, eval(*e.args[0], frame));
      if (truthy(a)) return a;
      return eval(*e.args[1], frame);
    }
    case Expr::Kind::kCond: {
      ASSIGN_OR_RETURN(Value c, eval(*e.args[1], frame));
      if (truthy(c)) return eval(*e.args[0], frame);
      if (e.args[2]) return eval(*e.args[2], frame);
      return Value::undefined(fmt::format(
          "the inline if-expression on line {} evaluated to false and no else section was defined.", e.line));
    }
    case Expr::Kind::kConcat: return eval_concat(e, frame);
  }
  return Status::Internal("unknown expression");
}

// ---- Calls ---------------------------------------------------------------------

Result<Value> Interp::call(const Value& fn, const CallArgs& args) {
  if (fn.is_undefined()) return undefined_error(fn);
  if (fn.kind() != Value::Kind::kCallable) {
    return Status::InvalidArgument(fmt::format("'{}' object is not callable", type_name(fn)));
  }
  const Callable& c = fn.as_callable();
  switch (c.kind) {
    case Builtin::kMethod: return call_method(c.self, c.name, args);
    case Builtin::kMacro: return call_macro(c, args);
    case Builtin::kLoopCycle: {
      if (args.pos.empty()) return Status::InvalidArgument("no items for cycling given");
      const LoopData& loop = *c.self.as_loop();
      return args.pos[loop.index0 % args.pos.size()];
    }
    default: return call_global(c.kind, args);
  }
}

Result<Value> Interp::call_macro(const Callable& fn, const CallArgs& args) {
  const Stmt& m = *fn.macro;
  if (args.pos.size() > m.params.size()) {
    return Status::InvalidArgument(
        fmt::format("macro '{}' takes not more than {} argument(s)", fn.name, m.params.size()));
  }
  if (macro_depth_ >= kMaxMacroDepth) {
    return Status::InvalidArgument(fmt::format("macro calls nested deeper than {}", kMaxMacroDepth));
  }
  Frame scope{root_, {}};
  for (size_t i = 0; i < m.params.size(); ++i) {
    const Value* given = i < args.pos.size() ? &args.pos[i] : nullptr;
    for (const auto& [key, v] : args.kw) {
      if (key == m.params[i]) {
        if (given != nullptr) {
          return Status::InvalidArgument(fmt::format("macro '{}' got multiple values for argument '{}'", fn.name, key));
        }
        given = &v;
      }
    }
    if (given != nullptr) {
      scope.set(m.params[i], *given);
    } else if (m.defaults[i]) {
      ASSIGN_OR_RETURN(Value def, eval(*m.defaults[i], scope));
      scope.set(m.params[i], std::move(def));
    } else {
      scope.set(m.params[i], Value::undefined(fmt::format("parameter '{}' was not provided", m.params[i])));
    }
  }
  for (const auto& [key, v] : args.kw) {
    if (std::find(m.params.begin(), m.params.end(), key) == m.params.end()) {
      return Status::InvalidArgument(fmt::format("macro '{}' takes no keyword argument '{}'", fn.name, key));
    }
  }
  ++macro_depth_;
  std::string out;
  Status st = exec_body(m.body, scope, out);
  --macro_depth_;
  flow_ = Flow::kNormal;
  RETURN_IF_ERROR(st);
  return Value::string(std::move(out));
}

}  // namespace tessera::data::jinja
