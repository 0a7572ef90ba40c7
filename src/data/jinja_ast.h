// The parsed form of a template (data/jinja.h): statements and expressions
// as a tree, built once by parse_program() (jinja_parse.cc) and walked by
// the evaluator (jinja.cc). Filter and test names are resolved to ids when
// parsing, so an unknown one is a load error naming its line.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/status.h"
#include "data/jinja_value.h"

namespace tessera::data::jinja {

// Nesting bound for the parser: blocks inside blocks, and brackets,
// parentheses, call arguments, `not` and unary minus inside each other
// (counted together), and the length of a chain of one operator (a + b +
// ..., x.a.b..., x|f|g...). Deeper templates are refused at load, so parsing
// cannot overflow the stack; evaluation has its own bound (kMaxEvalDepth).
inline constexpr int kMaxParseDepth = 64;

enum class Filter {
  kAbs, kCapitalize, kDefault, kFirst, kFloat, kIndent, kInt, kItems, kJoin, kLast, kLength, kList, kLower, kMap,
  kMax, kMin, kReject, kRejectAttr, kReplace, kReverse, kRound, kSafe, kSelect, kSelectAttr, kSort, kString, kSum,
  kTitle, kToJson, kTrim, kUnique, kUpper,
};

enum class Test {
  kBoolean, kCallable, kDefined, kDivisibleBy, kEq, kEven, kFalse, kFloat, kGe, kGt, kIn, kInteger, kIterable, kLe,
  kLower, kLt, kMapping, kNe, kNone, kNumber, kOdd, kSameAs, kSequence, kString, kTrue, kUndefined, kUpper,
};

// nullptr-free lookups: false when the name is not in the subset.
bool lookup_filter(std::string_view name, Filter* out);
bool lookup_test(std::string_view name, Test* out);

enum class BinOp { kAdd, kSub, kMul, kDiv, kFloorDiv, kMod, kPow };
enum class CmpOp { kEq, kNe, kLt, kLe, kGt, kGe, kIn, kNotIn };

struct Expr {
  enum class Kind {
    kLiteral,  // literal
    kName,     // name
    kList,     // args: items
    kTuple,    // args: items
    kDict,     // args: key, value, key, value, ...
    kAttr,     // args[0].name
    kItem,     // args[0][args[1]]
    kSlice,    // args[0][args[1]:args[2]:args[3]], each bound may be null
    kCall,     // args[0](args[1:], kwargs)
    kFilter,   // args[0] | filter(args[1:], kwargs)
    kTest,     // args[0] is [not] test(args[1:])
    kNeg, kPos, kNot,  // args[0]
    kBinary,   // args[0] op args[1]
    kCompare,  // args[0] cmp_ops[0] args[1] cmp_ops[1] args[2] ...
    kAnd, kOr, // args[0], args[1]
    kCond,     // args[0] if args[1] else args[2] (args[2] may be null)
    kConcat,   // args[0] ~ args[1] ~ ...
  };
  Kind kind = Kind::kLiteral;
  int line = 0;
  Value literal;
  std::string name;
  std::vector<std::unique_ptr<Expr>> args;
  std::vector<std::pair<std::string, std::unique_ptr<Expr>>> kwargs;
  BinOp op = BinOp::kAdd;
  std::vector<CmpOp> cmp_ops;
  Filter filter = Filter::kTrim;
  Test test = Test::kDefined;
  bool negated = false;  // `is not`
};

struct Stmt {
  enum class Kind {
    kText,      // text
    kOutput,    // {{ expr }}
    kIf,        // conds[i] -> bodies[i]; else_body
    kFor,       // for targets in expr [if cond]: body; else_body
    kSet,       // set targets = expr; or set targets[0].attr = expr
    kSetBlock,  // set targets[0] %}body{% endset
    kMacro,     // macro targets[0](params = defaults): body
    kBreak, kContinue,
    kBlock,     // a body run in place ({% generation %}: transformers' assistant-mask tag)
  };
  Kind kind = Kind::kText;
  int line = 0;
  std::string text;
  std::unique_ptr<Expr> expr;
  std::vector<std::unique_ptr<Expr>> conds;
  std::vector<std::vector<Stmt>> bodies;
  std::vector<std::string> targets;
  std::string attr;
  std::unique_ptr<Expr> cond;
  std::vector<Stmt> body;
  std::vector<Stmt> else_body;
  std::vector<std::string> params;
  std::vector<std::unique_ptr<Expr>> defaults;  // one per param, null when none
};

struct Program {
  std::vector<Stmt> body;
};

// The lexer and parser: errors are "chat template line N: ...", one line.
Result<std::unique_ptr<Program>> parse_program(std::string_view source);

// What a callable value calls.
enum class Builtin {
  kRange, kNamespace, kDict, kRaiseException, kStrftimeNow,  // globals
  kMethod,     // self.name(...)
  kMacro,      // macro->body
  kLoopCycle,  // loop.cycle(...)
};

struct Callable {
  Builtin kind = Builtin::kRange;
  std::string name;
  Value self;
  const Stmt* macro = nullptr;
};

// A for loop's state, shared by the `loop` value.
struct LoopData {
  std::shared_ptr<const std::vector<Value>> items;
  size_t index0 = 0;
};

}  // namespace tessera::data::jinja
