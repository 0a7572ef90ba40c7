// tessera tokenize: what a tokenizer makes of a text, as llama.cpp's
// llama-tokenize shows it; the tool the tokenizer tests and users check a
// tokenizer with (docs/formats/tokenizer.md).
//
//   tessera tokenize --tokenizer DIR < text          ids, as a JSON array
//   tessera tokenize --tokenizer DIR --decode < ids  the text of a JSON array of ids
//   tessera tokenize --tokenizer DIR --jsonl         one JSON string (or, with
//                    --decode, one JSON id array) per input line, one JSON
//                    result per output line
//   tessera tokenize --tokenizer DIR --chat MESSAGES.json [--add-generation-prompt]
//                    the folder's chat template rendered over the messages
//                    (the text on standard error), then encoded as
//                    transformers' apply_chat_template(tokenize=True) does
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "data/chat_template.h"
#include "data/hf_tokenizer.h"
#include "data/tokenizer.h"
#include "tools/commands.h"

namespace tessera::tools {

namespace {

using json = nlohmann::json;
using ordered_json = nlohmann::ordered_json;  // chat: key order is what tojson prints

struct TokenizeArgs {
  std::string tokenizer, vocab_dir, chat, chat_template, template_name, tools, kwargs;
  bool decode = false, jsonl = false, add_generation_prompt = false;
  bool no_add_special = false, split_special = false, skip_special = false;
};

constexpr size_t kMaxInputBytes = size_t{1} << 30;

Result<std::string> read_all(std::istream& in, const std::string& what) {
  std::string s;
  char buf[1 << 16];
  while (in.read(buf, sizeof(buf)) || in.gcount() > 0) {
    s.append(buf, static_cast<size_t>(in.gcount()));
    if (s.size() > kMaxInputBytes) return Status::InvalidArgument(fmt::format("{}: more than 1 GiB", what));
  }
  return s;
}

Result<ordered_json> read_json_file(const std::string& path, const std::string& flag) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::NotFound(fmt::format("{} {}: cannot read", flag, path));
  ASSIGN_OR_RETURN(std::string text, read_all(in, path));
  ordered_json j = ordered_json::parse(text, nullptr, false);
  if (j.is_discarded()) return Status::InvalidArgument(fmt::format("{} {}: not valid JSON", flag, path));
  return j;
}

// The ids of a JSON array, each checked against the vocabulary.
Result<std::vector<uint32_t>> parse_ids(const std::string& text, int vocab, const std::string& where) {
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_array())
    return Status::InvalidArgument(fmt::format("{}: expected a JSON array of token ids", where));
  std::vector<uint32_t> ids;
  ids.reserve(j.size());
  for (size_t i = 0; i < j.size(); i++) {
    if (!j[i].is_number_integer() || j[i].get<int64_t>() < 0 || j[i].get<int64_t>() >= vocab)
      return Status::InvalidArgument(
          fmt::format("{}: item {} ({}) is not a token id in [0, {})", where, i, j[i].dump(), vocab));
    ids.push_back(j[i].get<uint32_t>());
  }
  return ids;
}

std::string ids_json(const std::vector<uint32_t>& ids) {
  std::string s = "[";
  for (size_t i = 0; i < ids.size(); i++) {
    if (i) s += ',';
    s += std::to_string(ids[i]);
  }
  return s + "]";
}

Status run(const TokenizeArgs& a) {
  ASSIGN_OR_RETURN(std::unique_ptr<data::Tokenizer> tok, data::make_tokenizer(a.tokenizer, a.vocab_dir));
  const auto* hf = dynamic_cast<const data::HfTokenizer*>(tok.get());
  const data::EncodeOptions enc{.add_special_tokens = !a.no_add_special, .parse_special = !a.split_special};
  const auto encode = [&](std::string_view text, const data::EncodeOptions& o) {
    return hf ? hf->encode(text, o) : tok->encode(text);
  };
  const auto decode = [&](const std::vector<uint32_t>& ids) {
    return hf ? hf->decode(ids, a.skip_special) : tok->decode(ids);
  };

  if (!a.chat.empty()) {
    if (a.decode || a.jsonl) return Status::InvalidArgument("--chat renders and encodes; it takes no --decode or --jsonl");
    ASSIGN_OR_RETURN(ordered_json messages, read_json_file(a.chat, "--chat"));
    data::ChatRenderOptions ro;
    ro.add_generation_prompt = a.add_generation_prompt;
    if (messages.is_object()) {  // {"messages": [...], "tools": [...], "documents": [...], ...}
      ordered_json m = messages;
      if (!m.contains("messages")) return Status::InvalidArgument("--chat: an object must hold \"messages\"");
      messages = m["messages"];
      if (m.contains("tools")) ro.tools = m["tools"];
      if (m.contains("documents")) ro.documents = m["documents"];
      for (auto it = m.begin(); it != m.end(); ++it)
        if (it.key() != "messages" && it.key() != "tools" && it.key() != "documents") ro.extra[it.key()] = *it;
    }
    if (!messages.is_array()) return Status::InvalidArgument("--chat: expected a JSON list of messages");
    if (!a.tools.empty()) {
      ASSIGN_OR_RETURN(ro.tools, read_json_file(a.tools, "--tools"));
    }
    if (!a.kwargs.empty()) {
      ordered_json k = ordered_json::parse(a.kwargs, nullptr, false);
      if (k.is_discarded() || !k.is_object())
        return Status::InvalidArgument("--kwargs: expected a JSON object of template variables");
      for (auto it = k.begin(); it != k.end(); ++it) ro.extra[it.key()] = *it;
    }
    std::unique_ptr<data::ChatTemplate> tmpl;
    if (!a.chat_template.empty()) {
      std::ifstream in(a.chat_template, std::ios::binary);
      if (!in) return Status::NotFound(fmt::format("--chat-template {}: cannot read", a.chat_template));
      ASSIGN_OR_RETURN(std::string source, read_all(in, a.chat_template));
      // The tokens a template may name: those of the folder's config when there is one.
      std::string bos, eos;
      if (hf) {
        auto cfg = data::ChatTemplate::load(a.tokenizer, a.template_name);
        if (cfg.ok()) {
          bos = cfg->bos_token();
          eos = cfg->eos_token();
        }
      }
      ASSIGN_OR_RETURN(data::ChatTemplate t, data::ChatTemplate::parse(source, bos, eos));
      tmpl = std::make_unique<data::ChatTemplate>(std::move(t));
    } else {
      if (!hf) return Status::InvalidArgument("--chat needs a Hugging Face tokenizer folder (or --chat-template FILE)");
      ASSIGN_OR_RETURN(data::ChatTemplate t, data::ChatTemplate::load(a.tokenizer, a.template_name));
      tmpl = std::make_unique<data::ChatTemplate>(std::move(t));
    }
    ASSIGN_OR_RETURN(std::string text, tmpl->render(messages, ro));
    std::fwrite(text.data(), 1, text.size(), stderr);
    std::fflush(stderr);
    const std::string out = ids_json(encode(text, {.add_special_tokens = false, .parse_special = true})) + "\n";
    std::fwrite(out.data(), 1, out.size(), stdout);
    return Status::OK();
  }

  if (a.jsonl) {
    std::string line;
    for (int64_t n = 1; std::getline(std::cin, line); n++) {
      const std::string where = fmt::format("line {}", n);
      std::string out;
      if (a.decode) {
        ASSIGN_OR_RETURN(std::vector<uint32_t> ids, parse_ids(line, tok->vocab_size(), where));
        out = json(data::utf8_valid(decode(ids))).dump() + "\n";
      } else {
        json j = json::parse(line, nullptr, false);
        if (j.is_discarded() || !j.is_string())
          return Status::InvalidArgument(fmt::format("{}: expected a JSON string", where));
        out = ids_json(encode(j.get_ref<const std::string&>(), enc)) + "\n";
      }
      std::fwrite(out.data(), 1, out.size(), stdout);
    }
    return Status::OK();
  }

  ASSIGN_OR_RETURN(std::string input, read_all(std::cin, "standard input"));
  if (a.decode) {
    ASSIGN_OR_RETURN(std::vector<uint32_t> ids, parse_ids(input, tok->vocab_size(), "standard input"));
    const std::string text = decode(ids);
    std::fwrite(text.data(), 1, text.size(), stdout);
    return Status::OK();
  }
  const std::string out = ids_json(encode(input, enc)) + "\n";
  std::fwrite(out.data(), 1, out.size(), stdout);
  return Status::OK();
}

}  // namespace

void add_tokenize_command(CLI::App& app) {
  auto a = std::make_shared<TokenizeArgs>();
  CLI::App* cmd = app.add_subcommand("tokenize", "Token ids of standard input's text (or its text, with --decode)");
  cmd->add_option("--tokenizer", a->tokenizer, "a tokenizer.json or its folder, gpt2, or byte")->required();
  cmd->add_option("--vocab", a->vocab_dir, "folder with encoder.json and vocab.bpe (gpt2)");
  cmd->add_flag("--decode", a->decode, "read a JSON array of ids, write its text");
  cmd->add_flag("--jsonl", a->jsonl, "one JSON string (or id array, with --decode) per line in, one result per line out");
  cmd->add_flag("--no-add-special", a->no_add_special, "no BOS/EOS from the post-processor (HF add_special_tokens=False)");
  cmd->add_flag("--split-special", a->split_special,
                "special-token text in the input is ordinary text (HF split_special_tokens=True)");
  cmd->add_flag("--skip-special", a->skip_special, "--decode: leave special tokens out (HF skip_special_tokens)");
  cmd->add_option("--chat", a->chat,
                  "a JSON list of messages (or an object with messages, tools, documents and template variables) "
                  "to render through the chat template, then encode");
  cmd->add_flag("--add-generation-prompt", a->add_generation_prompt, "--chat: end with the assistant's header");
  cmd->add_option("--chat-template", a->chat_template, "--chat: a Jinja template file instead of the folder's");
  cmd->add_option("--template-name", a->template_name, "--chat: which of a config's named templates (default: default)");
  cmd->add_option("--tools", a->tools, "--chat: a JSON file of tool definitions");
  cmd->add_option("--kwargs", a->kwargs, "--chat: a JSON object of extra template variables (e.g. {\"enable_thinking\": false})");
  cmd->callback([a] {
    Status st = run(*a);
    exit_code() = st.ok() ? kExitOk : fail(st);
  });
}

}  // namespace tessera::tools
