// The OpenAI-compatible request and response shapes of `tessera serve`
// (docs/serving.md): parsing and checking a /v1/completions or
// /v1/chat/completions body, the chat template, the text a client sees
// (stop strings, whole UTF-8 characters), and the JSON answers and errors.
// No HTTP here (server.h does that), so all of it is unit-tested directly.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/chat_template.h"
#include "data/tokenizer.h"
#include "serve/engine.h"

namespace tessera::serve {

// An error as OpenAI returns it: HTTP status and
// {"error": {"message", "type", "param", "code"}}.
struct ApiError {
  int http = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // the offending field, or empty
  std::string code;   // or empty
  nlohmann::json body() const;
};

struct ChatMessage {
  std::string role;  // system, user or assistant
  std::string content;
};

struct CompletionRequest {
  bool chat = false;
  std::string model;                   // empty: the served model
  bool prompt_is_text = true;
  std::string prompt_text;             // completions, prompt given as text
  std::vector<int> prompt_ids;         // completions, prompt given as ids
  std::vector<ChatMessage> messages;   // chat
  std::optional<int> max_tokens;       // empty: completions 16, chat the rest of the context
  SamplingParams sampling;             // max_tokens filled in by resolve_prompt
  bool seed_given = false;
  // Which sampling fields the body set (the rest take the model's defaults:
  // SamplingDefaults, a Hugging Face folder's generation_config.json).
  bool temperature_given = false, top_p_given = false, top_k_given = false;
  std::vector<std::string> stop;
  bool stream = false;
  bool include_usage = false;          // stream_options.include_usage
  // vLLM's extension: choices carry "token_ids" (the tokens generated; per
  // chunk when streamed) and "prompt_token_ids" (in the first chunk). The
  // router (router.h) continues a stream from them on another worker.
  bool return_token_ids = false;
  // Tessera's extension for the router: continue a sequence another worker
  // began. "resume": {"token_ids": [prompt then generated ids], "generated":
  // n, "sent_bytes": b} runs token_ids as the prompt (instead of "prompt" or
  // the chat template); the text of its last n ids goes through the stop
  // strings and UTF-8 hold-back as if generated here, and the first b bytes
  // of it (what the client already has) are not sent again.
  struct Resume {
    std::vector<int> token_ids;
    int generated = 0;
    size_t sent_bytes = 0;
  };
  std::optional<Resume> resume;
};

// What the server allows; limits beyond the model's own.
struct ApiLimits {
  int max_stop_strings = 16;
  size_t max_stop_bytes = 256;
  int max_prompt_ids = 1 << 20;
};

// Checks a parsed body field by field: known fields of the wrong type or out
// of range are a 400 naming the field; n != 1, best_of != 1, echo and
// other features not served are a 400 saying so; unknown fields are ignored
// (as OpenAI's server does).
std::optional<ApiError> parse_completion_request(const nlohmann::json& body, bool chat, const ApiLimits& limits,
                                                 CompletionRequest* out);

// The chat template (GPT-2 is no chat model; docs/serving.md): each message
// as "System: ...\n", "User: ...\n" or "Assistant: ...\n" in order, then
// "Assistant:". The stop string "\nUser:" is added to a chat request's stops
// so the model does not write the user's turn (by resolve_prompt, for models
// without a chat template).
std::string chat_prompt(const std::vector<ChatMessage>& messages);
inline constexpr std::string_view kChatStop = "\nUser:";

// The prompt's token ids (text encoded with tok; an empty text is the
// end-of-text token), checked against the model: ids in the vocabulary,
// prompt shorter than the context, prompt + max_tokens within it. Fills
// req->sampling.max_tokens.
// A chat request with the model's chat template (tmpl, non-null: a Hugging
// Face folder's tokenizer_config.json) renders the messages through it with
// add_generation_prompt and encodes the text as transformers'
// apply_chat_template does (special-token text parsed, nothing added);
// without one, chat_prompt() and the "\nUser:" stop.
std::optional<ApiError> resolve_prompt(CompletionRequest* req, const data::Tokenizer& tok, const GPTConfig& model,
                                       std::vector<int>* ids, const data::ChatTemplate* tmpl = nullptr);

// Text a client may be sent, built token by token. Holds back bytes that may
// still become a stop string or that end in an incomplete UTF-8 character;
// cuts the text before the first stop string. Invalid UTF-8 is replaced by
// U+FFFD, so everything returned is valid UTF-8, and the pieces returned by
// add() and finish() concatenate to the same text whether or not a client
// streams.
class TextAssembler {
 public:
  explicit TextAssembler(std::vector<std::string> stops);
  // Appends a token's bytes; returns the text that can now be sent. Sets
  // *stopped when a stop string appeared (the returned text ends before it;
  // nothing more will come).
  std::string add(std::string_view bytes, bool* stopped);
  // What is left at the end of the sequence.
  std::string finish();

 private:
  std::vector<std::string> stops_;
  size_t hold_ = 0;  // longest stop - 1
  std::string pending_;
  bool stopped_ = false;
};

// s with every invalid UTF-8 sequence replaced by U+FFFD.
std::string sanitize_utf8(std::string_view s);
// How many leading bytes of s end on a character boundary, leaving out an
// incomplete (possibly still growing) character at the end.
size_t complete_utf8_prefix(std::string_view s);

// The bytes of a generated id for the client ("" past the tokenizer).
std::string token_bytes(const data::Tokenizer& tok, int id);

}  // namespace tessera::serve
