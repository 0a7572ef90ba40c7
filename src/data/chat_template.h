// Hugging Face chat templates: a tokenizer_config.json's "chat_template"
// rendered over a message list exactly as transformers'
// tokenizer.apply_chat_template(messages, tools=..., documents=...,
// add_generation_prompt=..., **kwargs) renders it (tokenize=False), through
// the Jinja subset of data/jinja.h. docs/formats/chat-template.md has the
// details; tests/reference/chat_templates.py is the python3-jinja2 oracle.
//
// What the template sees, as transformers passes it:
//   messages               the list given
//   tools, documents       the lists given, or none (transformers passes
//                          tools=None, documents=None: `tools is defined` is
//                          true and `tools is none` too)
//   add_generation_prompt  the flag
//   bos_token, eos_token, unk_token, sep_token, pad_token, cls_token,
//   mask_token, additional_special_tokens
//                          the special-tokens map: each one the config sets
//                          to a non-empty value (a string, or an AddedToken
//                          {"content": ...}); unset ones stay undefined
//   extra                  every member, as a keyword argument (overriding a
//                          special token of the same name); messages, tools,
//                          documents and add_generation_prompt cannot be
//                          given twice
//   raise_exception, strftime_now, range, namespace, dict   the globals
//
// JSON objects keep their member order (nlohmann::ordered_json): a
// template's `tojson` and `items()` print members in the order given, as
// Python's dicts do. A plain nlohmann::json converts implicitly, with its
// keys sorted.
//
// Thread safety: immutable after load/parse; render() may be called from any
// number of threads at once.
#pragma once

#include <ctime>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "data/jinja.h"

namespace tessera::data {

struct ChatRenderOptions {
  bool add_generation_prompt = false;
  nlohmann::ordered_json tools;      // null: not passed (the template sees none)
  nlohmann::ordered_json documents;  // likewise
  nlohmann::ordered_json extra = nlohmann::ordered_json::object();  // extra keyword arguments
};

class ChatTemplate {
 public:
  // path: a tokenizer_config.json file or a folder holding one.
  // template_name: for the list form [{"name": ..., "template": ...}]
  // ("" = "default"); ignored for the string form. Errors, one line each:
  // NotFound when the file is missing, when the config has no chat_template
  // (a base model, such as Llama 2's) or no template of that name;
  // Corruption for malformed JSON or wrong types; InvalidArgument
  // "<file>: chat template line N: ..." for a template outside the subset.
  static Result<ChatTemplate> load(const std::string& path, const std::string& template_name = "");
  // A template's source directly (for --chat-template FILE), with the
  // tokens; an empty token is left out of the special-tokens map.
  static Result<ChatTemplate> parse(std::string_view source, std::string bos_token, std::string eos_token);

  // messages: a JSON array (usually of {"role": ..., "content": ...}).
  // InvalidArgument when the arguments are malformed or the template fails;
  // a raise_exception(message) in the template gives message verbatim.
  Result<std::string> render(const nlohmann::ordered_json& messages, const ChatRenderOptions& options) const;

  const std::string& bos_token() const { return bos_token_; }
  const std::string& eos_token() const { return eos_token_; }
  // The special-tokens map the template sees (a JSON object).
  const nlohmann::ordered_json& special_tokens() const { return special_tokens_; }

  // Test hook: strftime_now()'s clock for render() (unset: the real time).
  void set_clock_for_testing(std::optional<std::time_t> now) { render_options_.now = now; }

 private:
  jinja::Template template_;
  std::string bos_token_;
  std::string eos_token_;
  nlohmann::ordered_json special_tokens_ = nlohmann::ordered_json::object();
  jinja::RenderOptions render_options_;
};

}  // namespace tessera::data
