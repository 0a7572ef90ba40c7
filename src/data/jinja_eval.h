// The evaluator of the Jinja subset (jinja.cc) and what its built-ins
// (jinja_builtins.cc: filters, tests, methods, globals) use of it. Internal
// to data/jinja: include data/jinja.h instead.
//
// Errors inside the evaluator are Status messages without a location (as
// Python's exception texts: "division by zero"); the evaluator notes the
// line of the innermost node that failed and render() prefixes it, except
// for raise_exception(), whose message comes back verbatim.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "data/jinja.h"
#include "data/jinja_ast.h"

namespace tessera::data::jinja {

struct CallArgs {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
};

// A parameter of a built-in: required when def is unset.
struct Param {
  std::string_view name;
  std::optional<Value> def;
};

// Binds positional and keyword arguments to params, Python style ("tojson()
// got an unexpected keyword argument 'x'"). The result has one value per
// param.
Result<std::vector<Value>> bind_args(std::string_view fname, const CallArgs& args, const std::vector<Param>& params);

// One variable scope: the template's top level, a for loop's iteration, a
// macro call. `if` does not open one (jinja2's scoping).
struct Frame {
  Frame* parent = nullptr;
  std::vector<std::pair<std::string, Value>> vars;
  const Value* find(std::string_view name) const;
  void set(const std::string& name, Value v);
};

class Interp {
 public:
  explicit Interp(const RenderOptions& options) : options_(options) {}

  // Runs program with context's members as the top-level variables.
  Result<std::string> run(const Program& program, const nlohmann::ordered_json& context);

  // ---- for the built-ins ----
  // Counts work (loop iterations, nodes, bytes / 16); past RenderOptions::max_work, fails.
  Status charge(int64_t units);
  // A string or list built by a built-in: size-checked and charged.
  Result<Value> make_string(std::string s);
  Result<Value> make_list(std::vector<Value> items, bool tuple = false);
  // raise_exception(message): the render fails with message verbatim.
  Status raise(std::string message);

  // jinja2's environment.getattr / getitem under ImmutableSandboxedEnvironment.
  Result<Value> getattr(const Value& obj, const std::string& name);
  Result<Value> getitem(const Value& obj, const Value& key);
  // Python's iter(): list/tuple items, a string's characters, a dict's keys,
  // nothing for undefined; TypeError's message otherwise.
  Result<std::vector<Value>> iterate(const Value& v);
  Result<Value> call(const Value& fn, const CallArgs& args);

  // jinja_builtins.cc
  Result<Value> apply_filter(Filter filter, const Value& v, const CallArgs& args);
  Result<bool> apply_test(Test test, const Value& v, const CallArgs& args);
  Result<Value> call_method(const Value& self, const std::string& name, const CallArgs& args);
  Result<Value> call_global(Builtin which, const CallArgs& args);
  // Whether self (a string, list, dict or loop) has a method called name.
  static bool has_method(const Value& self, std::string_view name);

 private:
  Status exec_body(const std::vector<Stmt>& body, Frame& frame, std::string& out);
  Status exec(const Stmt& s, Frame& frame, std::string& out);
  Status exec_inner(const Stmt& s, Frame& frame, std::string& out);
  Status exec_for(const Stmt& s, Frame& frame, std::string& out);
  Status assign(const std::vector<std::string>& targets, const Value& v, Frame& frame);
  Result<Value> eval(const Expr& e, Frame& frame);
  Result<Value> eval_inner(const Expr& e, Frame& frame);
  // The larger cases of eval_inner, apart so that its stack frame (one per
  // nesting level) stays small.
  Result<Value> eval_list(const Expr& e, Frame& frame);
  Result<Value> eval_dict(const Expr& e, Frame& frame);
  Result<Value> eval_slice(const Expr& e, Frame& frame);
  Result<Value> eval_compare(const Expr& e, Frame& frame);
  Result<Value> eval_concat(const Expr& e, Frame& frame);
  Result<Value> eval_unary(const Expr& e, Frame& frame);
  Result<CallArgs> eval_args(const Expr& e, size_t first, Frame& frame);
  Result<Value> lookup(const std::string& name, const Frame& frame) const;
  Result<Value> call_macro(const Callable& fn, const CallArgs& args);
  Status append_output(std::string& out, std::string_view text);

  const RenderOptions& options_;
  Frame* root_ = nullptr;
  int64_t work_ = 0;
  int macro_depth_ = 0;
  int depth_ = 0;  // eval() and exec() calls on the stack
  enum class Flow { kNormal, kBreak, kContinue } flow_ = Flow::kNormal;
  bool raised_ = false;
  int error_line_ = 0;
};

}  // namespace tessera::data::jinja
