// A small Jinja2 interpreter: the subset of the language that Hugging Face
// chat templates (tokenizer_config.json's "chat_template") use, evaluated
// the way transformers' apply_chat_template sets jinja2 up:
// ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
// extensions=[loopcontrols]), `tojson` as json.dumps(ensure_ascii=False),
// globals raise_exception() and strftime_now(). docs/formats/chat-template.md
// lists the subset; data/chat_template.h is the Hugging Face layer on top.
//
// A template is parsed once, to a tree (Template::parse); anything outside
// the subset (an unknown filter, test or tag) is refused there, in one line
// naming the template line: "chat template line 12: unknown filter
// 'wordwrap'". render() walks the tree; its errors are one line too:
// "chat template line 7: 'None' has no attribute 'startswith'" (jinja2's own
// wording where it has one), except raise_exception(msg), whose msg comes
// back verbatim (as transformers shows a TemplateError).
//
// Bounded on any input: nesting at load (kMaxParseDepth), macro recursion,
// output size (kMaxOutputBytes), and total work (kMaxWork: loop iterations,
// evaluated expressions and bytes built), so a hostile template or message
// list ends in an error, never a crash, a hang or a stack overflow.
//
// Thread safety: a Template is immutable; render() may run on many threads
// at once (each call has its own state). Copying a Template is cheap (the
// tree is shared).
#pragma once

#include <cstddef>
#include <ctime>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace tessera::data::jinja {

struct Program;

inline constexpr size_t kMaxOutputBytes = size_t{16} << 20;  // rendered text, and any one string
inline constexpr size_t kMaxListItems = size_t{1} << 20;      // any one list built by the template
inline constexpr int kMaxMacroDepth = 32;                       // macro calls inside macro calls
inline constexpr int kMaxEvalDepth = 400;                       // expressions and statements inside each other
// Work units: a loop iteration, a statement or an expression node is one, a
// string or list built costs one per 16 bytes or per item. A 16 MiB
// conversation renders in a few million; 2^24 is about 2 s of CPU at most.
inline constexpr int64_t kMaxWork = int64_t{1} << 24;
inline constexpr int64_t kMaxRange = 100000;                     // jinja2's sandbox MAX_RANGE

struct RenderOptions {
  // strftime_now()'s clock (local time); unset: the time of the call.
  std::optional<std::time_t> now;
  // The work bound (tests lower it to reach it quickly).
  int64_t max_work = kMaxWork;
};

class Template {
 public:
  // InvalidArgument "chat template line N: ..." for a syntax error or a
  // construct outside the subset; the source must be valid UTF-8.
  static Result<Template> parse(std::string_view source);

  // context: a JSON object, each member a template variable (kept in its
  // member order: dicts iterate and print in that order, as Python's do).
  // Names it lacks are undefined; the globals range, namespace, dict,
  // raise_exception and strftime_now are there unless context shadows them.
  Result<std::string> render(const nlohmann::ordered_json& context, const RenderOptions& options = {}) const;

 private:
  std::shared_ptr<const Program> program_;
};

}  // namespace tessera::data::jinja
