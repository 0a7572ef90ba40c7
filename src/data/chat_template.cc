#include "data/chat_template.h"

#include <filesystem>
#include <fstream>
#include <iterator>

#include <fmt/format.h>

#include "core/try.h"

namespace tessera::data {
namespace {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

// transformers' SPECIAL_TOKENS_ATTRIBUTES, in its order.
const char* const kSpecialTokens[] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                      "pad_token", "cls_token", "mask_token"};

// A special token's text: a string, an AddedToken {"content": ...}, or null
// (-> ""). Anything else is Corruption.
Result<std::string> token_text(const ojson& v, const std::string& where) {
  if (v.is_null()) return std::string();
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  return Status::Corruption(fmt::format("{}: expected a string or {{\"content\": ...}}", where));
}

}  // namespace

Result<ChatTemplate> ChatTemplate::load(const std::string& path, const std::string& template_name) {
  fs::path file = path;
  std::error_code ec;
  if (fs::is_directory(file, ec)) file /= "tokenizer_config.json";
  const std::string name = file.string();
  std::ifstream in(file, std::ios::binary);
  if (!in) return Status::NotFound(fmt::format("{}: no such file", name));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) return Status::IOError(fmt::format("{}: cannot read", name));
  ojson config;
  try {
    config = ojson::parse(text);
  } catch (const ojson::exception& e) {
    return Status::Corruption(fmt::format("{}: malformed JSON: {}", name, e.what()));
  }
  if (!config.is_object()) return Status::Corruption(fmt::format("{}: expected a JSON object", name));

  // The template: a string, or [{"name": ..., "template": ...}, ...].
  std::string source;
  const auto it = config.find("chat_template");
  if (it == config.end() || it->is_null()) {
    return Status::NotFound(fmt::format(
        "{}: no chat_template (a base model, such as Llama 2, has none; give one with --chat-template FILE)", name));
  }
  if (it->is_string()) {
    source = it->get<std::string>();
  } else if (it->is_array()) {
    const std::string wanted = template_name.empty() ? "default" : template_name;
    std::string have;
    bool found = false;
    for (const ojson& entry : *it) {
      if (!entry.is_object() || !entry.contains("name") || !entry["name"].is_string() ||
          !entry.contains("template") || !entry["template"].is_string()) {
        return Status::Corruption(
            fmt::format("{}: chat_template: expected a list of {{\"name\": ..., \"template\": ...}}", name));
      }
      const std::string entry_name = entry["name"].get<std::string>();
      have += (have.empty() ? "" : ", ") + entry_name;
      if (entry_name == wanted && !found) {
        source = entry["template"].get<std::string>();
        found = true;
      }
    }
    if (!found) {
      return Status::NotFound(
          fmt::format("{}: no chat template named '{}' (it has: {})", name, wanted, have.empty() ? "none" : have));
    }
  } else {
    return Status::Corruption(fmt::format("{}: chat_template: expected a string or a list", name));
  }

  ChatTemplate t;
  for (const char* key : kSpecialTokens) {
    const auto tok = config.find(key);
    if (tok == config.end()) continue;
    ASSIGN_OR_RETURN(std::string value, token_text(*tok, fmt::format("{}: {}", name, key)));
    if (std::string_view(key) == "bos_token") t.bos_token_ = value;
    if (std::string_view(key) == "eos_token") t.eos_token_ = value;
    if (!value.empty()) t.special_tokens_[key] = value;  // transformers keeps the set (truthy) ones
  }
  if (const auto extra = config.find("additional_special_tokens"); extra != config.end() && !extra->is_null()) {
    if (!extra->is_array()) {
      return Status::Corruption(fmt::format("{}: additional_special_tokens: expected a list", name));
    }
    ojson list = ojson::array();
    for (const ojson& tok : *extra) {
      ASSIGN_OR_RETURN(std::string value, token_text(tok, fmt::format("{}: additional_special_tokens", name)));
      list.push_back(value);
    }
    if (!list.empty()) t.special_tokens_["additional_special_tokens"] = std::move(list);
  }
  auto parsed = jinja::Template::parse(source);
  if (!parsed.ok()) return parsed.status().With(name);
  t.template_ = std::move(parsed).value();
  return t;
}

Result<ChatTemplate> ChatTemplate::parse(std::string_view source, std::string bos_token, std::string eos_token) {
  ChatTemplate t;
  ASSIGN_OR_RETURN(t.template_, jinja::Template::parse(source));
  if (!bos_token.empty()) t.special_tokens_["bos_token"] = bos_token;
  if (!eos_token.empty()) t.special_tokens_["eos_token"] = eos_token;
  t.bos_token_ = std::move(bos_token);
  t.eos_token_ = std::move(eos_token);
  return t;
}

Result<std::string> ChatTemplate::render(const nlohmann::ordered_json& messages,
                                         const ChatRenderOptions& options) const {
  if (!messages.is_array()) return Status::InvalidArgument("chat messages: expected a JSON array");
  if (!options.tools.is_null()) {
    if (!options.tools.is_array()) return Status::InvalidArgument("chat tools: expected a JSON array");
    for (const ojson& tool : options.tools) {
      if (!tool.is_object()) return Status::InvalidArgument("chat tools: each tool must be a JSON object (a schema)");
    }
  }
  if (!options.documents.is_null()) {
    if (!options.documents.is_array()) return Status::InvalidArgument("chat documents: expected a JSON array");
    for (const ojson& doc : options.documents) {
      if (!doc.is_object()) {
        return Status::InvalidArgument("chat documents: each document must be a JSON object (title, text)");
      }
    }
  }
  if (!options.extra.is_object()) return Status::InvalidArgument("chat template arguments: expected a JSON object");
  ojson context = ojson::object();
  context["messages"] = messages;
  context["tools"] = options.tools;
  context["documents"] = options.documents;
  context["add_generation_prompt"] = options.add_generation_prompt;
  for (auto it = special_tokens_.begin(); it != special_tokens_.end(); ++it) context[it.key()] = it.value();
  for (auto it = options.extra.begin(); it != options.extra.end(); ++it) {
    const std::string& key = it.key();
    if (key == "messages" || key == "tools" || key == "documents" || key == "add_generation_prompt") {
      return Status::InvalidArgument(fmt::format("chat template argument '{}' is given twice", key));
    }
    context[key] = it.value();
  }
  return template_.render(context, render_options_);
}

}  // namespace tessera::data
