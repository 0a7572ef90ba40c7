#include "serve/openai.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "data/hf_tokenizer.h"

namespace tessera::serve {

using json = nlohmann::json;

json ApiError::body() const {
  json e = {{"message", message}, {"type", type}, {"param", nullptr}, {"code", nullptr}};
  if (!param.empty()) e["param"] = param;
  if (!code.empty()) e["code"] = code;
  return json{{"error", e}};
}

namespace {

ApiError bad(const std::string& param, const std::string& message) {
  ApiError e;
  e.http = 400;
  e.param = param;
  e.message = message;
  return e;
}

const char* type_name(const json& v) {
  switch (v.type()) {
    case json::value_t::null: return "null";
    case json::value_t::boolean: return "a boolean";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned: return "an integer";
    case json::value_t::number_float: return "a number";
    case json::value_t::string: return "a string";
    case json::value_t::array: return "an array";
    case json::value_t::object: return "an object";
    default: return "something else";
  }
}

ApiError wrong_type(const std::string& field, const char* want, const json& v) {
  return bad(field, fmt::format("'{}' must be {}, not {}", field, want, type_name(v)));
}

// Integers as JSON integers only; out-of-range values are refused by range.
std::optional<ApiError> get_int(const json& body, const std::string& field, int64_t lo, int64_t hi,
                                std::optional<int64_t>* out) {
  auto it = body.find(field);
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (it->is_number_unsigned()) {
    const uint64_t u = it->get<uint64_t>();
    if (u > static_cast<uint64_t>(hi) || (lo > 0 && u < static_cast<uint64_t>(lo)))
      return bad(field, fmt::format("'{}' must be between {} and {}, got {}", field, lo, hi, u));
    *out = static_cast<int64_t>(u);
    return std::nullopt;
  }
  if (!it->is_number_integer()) return wrong_type(field, "an integer", *it);
  const int64_t v = it->get<int64_t>();
  if (v < lo || v > hi) return bad(field, fmt::format("'{}' must be between {} and {}, got {}", field, lo, hi, v));
  *out = v;
  return std::nullopt;
}

std::optional<ApiError> get_number(const json& body, const std::string& field, double lo, double hi,
                                   bool lo_open, std::optional<double>* out) {
  auto it = body.find(field);
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_number()) return wrong_type(field, "a number", *it);
  const double v = it->get<double>();
  if (!std::isfinite(v) || v < lo || v > hi || (lo_open && v == lo))
    return bad(field, fmt::format("'{}' must be in {}{}, {}], got {}", field, lo_open ? "(" : "[", lo, hi, v));
  *out = v;
  return std::nullopt;
}

std::optional<ApiError> get_bool(const json& body, const std::string& field, std::optional<bool>* out) {
  auto it = body.find(field);
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_boolean()) return wrong_type(field, "a boolean", *it);
  *out = it->get<bool>();
  return std::nullopt;
}

std::optional<ApiError> get_content(const json& m, const std::string& where, std::string* out) {
  auto it = m.find("content");
  if (it == m.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) {
    *out = it->get<std::string>();
    return std::nullopt;
  }
  if (!it->is_array()) return wrong_type(where + ".content", "a string or an array of text parts", *it);
  for (size_t i = 0; i < it->size(); i++) {
    const json& part = (*it)[i];
    const std::string p = fmt::format("{}.content[{}]", where, i);
    if (!part.is_object()) return wrong_type(p, "an object", part);
    auto type = part.find("type");
    if (type == part.end() || !type->is_string() || *type != "text")
      return bad(p + ".type", fmt::format("'{}.type' must be \"text\" (only text is served)", p));
    auto text = part.find("text");
    if (text == part.end() || !text->is_string()) return bad(p + ".text", fmt::format("'{}.text' must be a string", p));
    *out += text->get<std::string>();
  }
  return std::nullopt;
}

// A non-empty array of token ids (no more than limits allow).
std::optional<ApiError> get_token_ids(const json& a, const std::string& field, const ApiLimits& limits,
                                      std::vector<int>* out) {
  if (!a.is_array()) return wrong_type(field, "an array of token ids", a);
  if (a.size() > static_cast<size_t>(limits.max_prompt_ids))
    return bad(field, fmt::format("'{}' has {} token ids, more than the {} allowed", field, a.size(),
                                  limits.max_prompt_ids));
  for (size_t i = 0; i < a.size(); i++) {
    const json& t = a[i];
    if (!t.is_number_integer())
      return bad(field, fmt::format("'{}' must hold token ids (integers); element {} is {}", field, i, type_name(t)));
    const int64_t id = t.get<int64_t>();
    if (id < 0 || id > std::numeric_limits<int>::max())
      return bad(field, fmt::format("token id {} at {} is negative or too large", id, i));
    out->push_back(static_cast<int>(id));
  }
  if (out->empty()) return bad(field, fmt::format("'{}' must not be an empty array", field));
  return std::nullopt;
}

std::optional<ApiError> get_resume(const json& body, const ApiLimits& limits, CompletionRequest* r) {
  auto it = body.find("resume");
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_object()) return wrong_type("resume", "an object", *it);
  CompletionRequest::Resume rs;
  auto ids = it->find("token_ids");
  if (ids == it->end()) return bad("resume.token_ids", "'resume.token_ids' is required");
  if (auto e = get_token_ids(*ids, "resume.token_ids", limits, &rs.token_ids)) return e;
  std::optional<int64_t> i64;
  auto named = [](ApiError e, const char* f) {
    e.param = f;
    return e;
  };
  if (auto e = get_int(*it, "generated", 0, static_cast<int64_t>(rs.token_ids.size()) - 1, &i64))
    return named(*e, "resume.generated");
  rs.generated = static_cast<int>(i64.value_or(0));
  i64.reset();
  if (auto e = get_int(*it, "sent_bytes", 0, int64_t{1} << 40, &i64)) return named(*e, "resume.sent_bytes");
  rs.sent_bytes = static_cast<size_t>(i64.value_or(0));
  r->resume = std::move(rs);
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> parse_completion_request(const json& body, bool chat, const ApiLimits& limits,
                                                 CompletionRequest* out) {
  CompletionRequest r;
  r.chat = chat;
  if (!body.is_object()) return bad("", fmt::format("the request body must be a JSON object, not {}", type_name(body)));

  if (auto it = body.find("model"); it != body.end() && !it->is_null()) {
    if (!it->is_string()) return wrong_type("model", "a string", *it);
    r.model = it->get<std::string>();
  }

  if (chat) {
    auto it = body.find("messages");
    if (it == body.end()) return bad("messages", "'messages' is required");
    if (!it->is_array()) return wrong_type("messages", "an array", *it);
    if (it->empty()) return bad("messages", "'messages' must not be empty");
    for (size_t i = 0; i < it->size(); i++) {
      const json& m = (*it)[i];
      const std::string where = fmt::format("messages[{}]", i);
      if (!m.is_object()) return wrong_type(where, "an object", m);
      auto role = m.find("role");
      if (role == m.end() || !role->is_string())
        return bad(where + ".role", fmt::format("'{}.role' must be a string", where));
      ChatMessage msg;
      msg.role = role->get<std::string>();
      if (msg.role == "developer") msg.role = "system";
      if (msg.role != "system" && msg.role != "user" && msg.role != "assistant")
        return bad(where + ".role",
                   fmt::format("'{}.role' must be system, user or assistant, got '{}'", where, msg.role));
      if (auto e = get_content(m, where, &msg.content)) return e;
      r.messages.push_back(std::move(msg));
    }
  } else {
    auto it = body.find("prompt");
    if (it == body.end() || it->is_null()) return bad("prompt", "'prompt' is required");
    const json* p = &*it;
    if (p->is_array() && p->size() == 1 && (*p)[0].is_string()) p = &(*p)[0];  // a batch of one
    if (p->is_string()) {
      r.prompt_text = p->get<std::string>();
    } else if (p->is_array()) {
      if (!p->empty() && ((*p)[0].is_string() || (*p)[0].is_array()))
        return bad("prompt", "a batch of prompts is not served: send one prompt per request");
      r.prompt_is_text = false;
      if (auto e = get_token_ids(*p, "prompt", limits, &r.prompt_ids)) return e;
    } else {
      return wrong_type("prompt", "a string or an array of token ids", *p);
    }
  }

  std::optional<int64_t> i64;
  const int64_t kMaxTokens = 1 << 20;
  if (auto e = get_int(body, "max_tokens", 1, kMaxTokens, &i64)) return e;
  if (i64) r.max_tokens = static_cast<int>(*i64);
  if (chat) {
    i64.reset();
    if (auto e = get_int(body, "max_completion_tokens", 1, kMaxTokens, &i64)) return e;
    if (i64) r.max_tokens = static_cast<int>(*i64);
  }
  std::optional<double> d;
  if (auto e = get_number(body, "temperature", 0.0, 2.0, false, &d)) return e;
  if (d) r.sampling.temperature = static_cast<float>(*d), r.temperature_given = true;
  d.reset();
  if (auto e = get_number(body, "top_p", 0.0, 1.0, true, &d)) return e;
  if (d) r.sampling.top_p = static_cast<float>(*d), r.top_p_given = true;
  i64.reset();
  if (auto e = get_int(body, "top_k", -1, 1 << 20, &i64)) return e;
  if (i64) r.sampling.top_k = *i64 < 0 ? 0 : static_cast<int>(*i64), r.top_k_given = true;
  i64.reset();
  if (auto e = get_int(body, "seed", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max(), &i64))
    return e;
  if (i64) {
    r.sampling.seed = static_cast<uint64_t>(*i64);
    r.seed_given = true;
  }
  i64.reset();
  if (auto e = get_int(body, "n", 1, 1 << 20, &i64)) return e;
  if (i64 && *i64 != 1) return bad("n", fmt::format("'n' must be 1 (one choice per request), got {}", *i64));
  i64.reset();
  if (auto e = get_int(body, "best_of", 1, 1 << 20, &i64)) return e;
  if (i64 && *i64 != 1) return bad("best_of", fmt::format("'best_of' must be 1, got {}", *i64));

  std::optional<bool> flag;
  if (auto e = get_bool(body, "stream", &flag)) return e;
  r.stream = flag.value_or(false);
  flag.reset();
  if (auto e = get_bool(body, "ignore_eos", &flag)) return e;
  r.sampling.ignore_eos = flag.value_or(false);
  if (auto e = get_resume(body, limits, &r)) return e;
  flag.reset();
  if (auto e = get_bool(body, "return_token_ids", &flag)) return e;
  r.return_token_ids = flag.value_or(false);
  flag.reset();
  if (auto e = get_bool(body, "echo", &flag)) return e;
  if (flag.value_or(false)) return bad("echo", "'echo' is not served");
  if (auto it = body.find("stream_options"); it != body.end() && !it->is_null()) {
    if (!it->is_object()) return wrong_type("stream_options", "an object", *it);
    flag.reset();
    if (auto e = get_bool(*it, "include_usage", &flag)) {
      e->param = "stream_options.include_usage";
      return e;
    }
    r.include_usage = flag.value_or(false);
  }
  for (const char* f : {"presence_penalty", "frequency_penalty"}) {
    d.reset();
    if (auto e = get_number(body, f, -2.0, 2.0, false, &d)) return e;
    if (d && *d != 0.0) return bad(f, fmt::format("'{}' is not served (only 0)", f));
  }
  if (auto it = body.find("logit_bias"); it != body.end() && !it->is_null()) {
    if (!it->is_object()) return wrong_type("logit_bias", "an object", *it);
    if (!it->empty()) return bad("logit_bias", "'logit_bias' is not served");
  }
  if (auto it = body.find("suffix"); it != body.end() && !it->is_null()) {
    if (!it->is_string()) return wrong_type("suffix", "a string", *it);
    if (!it->get_ref<const std::string&>().empty()) return bad("suffix", "'suffix' is not served");
  }
  if (auto it = body.find("user"); it != body.end() && !it->is_null() && !it->is_string())
    return wrong_type("user", "a string", *it);
  // Known OpenAI fields that change the answer and are not built: a 400
  // naming the field, never free text with 200 (unknown fields stay
  // ignored, as OpenAI ignores them).
  if (auto it = body.find("response_format"); it != body.end() && !it->is_null()) {
    if (!it->is_object()) return wrong_type("response_format", "an object", *it);
    const auto type = it->find("type");
    if (type == it->end() || !type->is_string())
      return bad("response_format", "'response_format' needs a string 'type'");
    if (*type != "text")
      return bad("response_format", fmt::format("'response_format' of type '{}' is not served (structured output "
                                                "is not built; only 'text')",
                                                type->get<std::string>()));
  }
  if (auto it = body.find("tools"); it != body.end() && !it->is_null()) {
    if (!it->is_array()) return wrong_type("tools", "an array", *it);
    if (!it->empty()) return bad("tools", "'tools' is not served (tool calling is not built)");
  }
  if (auto it = body.find("tool_choice"); it != body.end() && !it->is_null() && *it != "none")
    return bad("tool_choice", "'tool_choice' is not served (tool calling is not built; only 'none')");
  for (const char* f : {"functions", "function_call", "audio", "prediction", "web_search_options"}) {
    if (auto it = body.find(f); it != body.end() && !it->is_null())
      return bad(f, fmt::format("'{}' is not served", f));
  }
  if (auto it = body.find("modalities"); it != body.end() && !it->is_null()) {
    if (!it->is_array()) return wrong_type("modalities", "an array", *it);
    for (const json& m : *it)
      if (m != "text") return bad("modalities", "'modalities' other than [\"text\"] is not served");
  }

  // logprobs: an integer 0..5 for completions; a boolean plus top_logprobs
  // 0..20 for chat.
  if (chat) {
    flag.reset();
    if (auto e = get_bool(body, "logprobs", &flag)) return e;
    i64.reset();
    if (auto e = get_int(body, "top_logprobs", 0, 20, &i64)) return e;
    if (i64 && !flag.value_or(false)) return bad("top_logprobs", "'top_logprobs' needs 'logprobs': true");
    if (flag.value_or(false)) r.sampling.logprobs = static_cast<int>(i64.value_or(0));
  } else {
    i64.reset();
    if (auto e = get_int(body, "logprobs", 0, 5, &i64)) return e;
    if (i64) r.sampling.logprobs = static_cast<int>(*i64);
  }

  if (auto it = body.find("stop"); it != body.end() && !it->is_null()) {
    if (it->is_string()) {
      r.stop.push_back(it->get<std::string>());
    } else if (it->is_array()) {
      if (it->size() > static_cast<size_t>(limits.max_stop_strings))
        return bad("stop", fmt::format("'stop' has {} strings, more than {}", it->size(), limits.max_stop_strings));
      for (const json& s : *it) {
        if (!s.is_string()) return bad("stop", fmt::format("'stop' must hold strings, not {}", type_name(s)));
        r.stop.push_back(s.get<std::string>());
      }
    } else {
      return wrong_type("stop", "a string or an array of strings", *it);
    }
    for (const std::string& s : r.stop) {
      if (s.empty()) return bad("stop", "a stop string must not be empty");
      if (s.size() > limits.max_stop_bytes)
        return bad("stop", fmt::format("a stop string is {} bytes, more than {}", s.size(), limits.max_stop_bytes));
    }
  }
  *out = std::move(r);
  return std::nullopt;
}

std::string chat_prompt(const std::vector<ChatMessage>& messages) {
  std::string p;
  for (const ChatMessage& m : messages) {
    p += m.role == "system" ? "System: " : m.role == "user" ? "User: " : "Assistant: ";
    p += m.content;
    p += '\n';
  }
  p += "Assistant:";
  return p;
}

std::optional<ApiError> resolve_prompt(CompletionRequest* req, const data::Tokenizer& tok, const GPTConfig& model,
                                       std::vector<int>* ids, const data::ChatTemplate* tmpl) {
  ids->clear();
  if (req->chat && !req->resume && !tmpl) req->stop.emplace_back(kChatStop);
  if (req->resume || !(req->chat || req->prompt_is_text)) {
    *ids = req->resume ? req->resume->token_ids : req->prompt_ids;
    for (size_t i = 0; i < ids->size(); i++) {
      if ((*ids)[i] >= model.vocab)
        return bad(req->resume ? "resume.token_ids" : "prompt",
                   fmt::format("token id {} at {} is outside the model's vocabulary [0, {})", (*ids)[i], i,
                               model.vocab));
    }
  } else {
    std::string text;
    const auto* hf = dynamic_cast<const data::HfTokenizer*>(&tok);
    if (req->chat && tmpl) {
      nlohmann::ordered_json messages = nlohmann::ordered_json::array();
      for (const ChatMessage& m : req->messages) messages.push_back({{"role", m.role}, {"content", m.content}});
      data::ChatRenderOptions o;
      o.add_generation_prompt = true;
      Result<std::string> rendered = tmpl->render(messages, o);
      if (!rendered.ok()) return bad("messages", "the model's chat template: " + rendered.status().message());
      text = std::move(rendered).value();
      // As apply_chat_template(tokenize=True): the template wrote the
      // special tokens, the tokenizer adds none.
      const std::vector<uint32_t> enc =
          hf ? hf->encode(text, data::EncodeOptions{.add_special_tokens = false, .parse_special = true}) : tok.encode(text);
      for (uint32_t t : enc) ids->push_back(static_cast<int>(t));
    } else {
      text = req->chat ? chat_prompt(req->messages) : req->prompt_text;
      // A completion prompt is text as the model's tokenizer reads it: with
      // a Hugging Face tokenizer, its BOS (Llama) as transformers adds it.
      const std::vector<uint32_t> enc =
          hf && !req->chat ? hf->encode(text, data::EncodeOptions{.add_special_tokens = true}) : tok.encode(text);
      for (uint32_t t : enc) ids->push_back(static_cast<int>(t));
    }
    if (ids->empty()) ids->push_back(static_cast<int>(tok.eot()));  // an empty prompt starts a new document
  }
  const int P = static_cast<int>(ids->size());
  const std::string field = req->chat ? "messages" : "prompt";
  if (P >= model.context)
    return bad(field, fmt::format("the prompt is {} tokens; this model's maximum context length is {} tokens, "
                                  "which leaves no room to generate",
                                  P, model.context));
  if (req->max_tokens) {
    if (P + *req->max_tokens > model.context)
      return bad("max_tokens", fmt::format("this model's maximum context length is {} tokens; the prompt is {} "
                                           "tokens and max_tokens is {}",
                                           model.context, P, *req->max_tokens));
    req->sampling.max_tokens = *req->max_tokens;
  } else {
    req->sampling.max_tokens = req->chat ? model.context - P : std::min(16, model.context - P);
  }
  return std::nullopt;
}

// ---- UTF-8 ----------------------------------------------------------------

namespace {
// Length of the UTF-8 sequence starting with lead byte b; 0 for a byte that
// cannot start one.
int utf8_length(unsigned char b) {
  if (b < 0x80) return 1;
  if (b >= 0xC2 && b <= 0xDF) return 2;
  if (b >= 0xE0 && b <= 0xEF) return 3;
  if (b >= 0xF0 && b <= 0xF4) return 4;
  return 0;
}

// Whether s[i..i+n) is a valid sequence of length n (n from utf8_length).
bool utf8_valid_at(std::string_view s, size_t i, int n) {
  if (i + n > s.size()) return false;
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[i + k]); };
  for (int k = 1; k < n; k++) {
    if ((b(k) & 0xC0) != 0x80) return false;
  }
  if (n == 3) {
    if (b(0) == 0xE0 && b(1) < 0xA0) return false;  // overlong
    if (b(0) == 0xED && b(1) >= 0xA0) return false;  // surrogates
  }
  if (n == 4) {
    if (b(0) == 0xF0 && b(1) < 0x90) return false;  // overlong
    if (b(0) == 0xF4 && b(1) >= 0x90) return false;  // past U+10FFFF
  }
  return true;
}
}  // namespace

std::string sanitize_utf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const int n = utf8_length(static_cast<unsigned char>(s[i]));
    if (n > 0 && utf8_valid_at(s, i, n)) {
      out.append(s.substr(i, n));
      i += n;
    } else {
      out += "\xEF\xBF\xBD";
      i++;
    }
  }
  return out;
}

size_t complete_utf8_prefix(std::string_view s) {
  // Only the last three bytes can start an unfinished character.
  const size_t start = s.size() > 3 ? s.size() - 3 : 0;
  for (size_t i = s.size(); i-- > start;) {
    const unsigned char b = static_cast<unsigned char>(s[i]);
    if ((b & 0xC0) == 0x80) continue;  // a continuation byte: look further back
    const int n = utf8_length(b);
    if (n > 1 && i + n > s.size()) {
      // Unfinished: keep it back if what is there so far can still be valid.
      bool ok = true;
      for (size_t k = i + 1; k < s.size(); k++) ok = ok && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80;
      return ok ? i : s.size();
    }
    return s.size();
  }
  return s.size();
}

TextAssembler::TextAssembler(std::vector<std::string> stops) : stops_(std::move(stops)) {
  for (const std::string& s : stops_) hold_ = std::max(hold_, s.size() - 1);
}

std::string TextAssembler::add(std::string_view bytes, bool* stopped) {
  *stopped = false;
  if (stopped_) {
    *stopped = true;
    return "";
  }
  pending_.append(bytes);
  // The earliest stop string in what is pending (bytes already sent cannot
  // hold one: hold_ bytes are always kept back).
  size_t cut = std::string::npos;
  for (const std::string& s : stops_) cut = std::min(cut, pending_.find(s));
  if (cut != std::string::npos) {
    stopped_ = true;
    *stopped = true;
    std::string out = sanitize_utf8(std::string_view(pending_).substr(0, cut));
    pending_.clear();
    return out;
  }
  size_t n = pending_.size() > hold_ ? pending_.size() - hold_ : 0;
  n = complete_utf8_prefix(std::string_view(pending_).substr(0, n));
  std::string out = sanitize_utf8(std::string_view(pending_).substr(0, n));
  pending_.erase(0, n);
  return out;
}

std::string TextAssembler::finish() {
  std::string out = sanitize_utf8(pending_);
  pending_.clear();
  return out;
}

std::string token_bytes(const data::Tokenizer& tok, int id) {
  if (id < 0 || id >= tok.vocab_size()) return "";
  return tok.decode_token(static_cast<uint32_t>(id));
}

}  // namespace tessera::serve
