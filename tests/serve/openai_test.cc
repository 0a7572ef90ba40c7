// The OpenAI request checks and the text a client sees (serve/openai.h).
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "data/hf_tokenizer.h"
#include "data/tokenizer.h"
#include "serve/openai.h"

namespace tessera::serve {
namespace {

using json = nlohmann::json;

std::optional<ApiError> parse(const std::string& body, bool chat = false, CompletionRequest* out = nullptr) {
  CompletionRequest r;
  return parse_completion_request(json::parse(body), chat, ApiLimits{}, out ? out : &r);
}

TEST(ServeOpenAI, ParsesACompletionRequest) {
  CompletionRequest r;
  ASSERT_FALSE(parse(R"({"model":"m","prompt":"hi","max_tokens":7,"temperature":0.5,"top_p":0.9,"top_k":5,
                        "seed":-3,"stop":["a","bc"],"stream":true,"stream_options":{"include_usage":true},
                        "n":1,"logprobs":2,"ignore_eos":true,"user":"u","unknown_field":[1,2]})",
                     false, &r));
  EXPECT_EQ(r.model, "m");
  EXPECT_TRUE(r.prompt_is_text);
  EXPECT_EQ(r.prompt_text, "hi");
  EXPECT_EQ(*r.max_tokens, 7);
  EXPECT_FLOAT_EQ(r.sampling.temperature, 0.5f);
  EXPECT_FLOAT_EQ(r.sampling.top_p, 0.9f);
  EXPECT_EQ(r.sampling.top_k, 5);
  EXPECT_TRUE(r.seed_given);
  EXPECT_EQ(r.sampling.seed, static_cast<uint64_t>(-3));
  EXPECT_EQ(r.stop, (std::vector<std::string>{"a", "bc"}));
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_EQ(r.sampling.logprobs, 2);
  EXPECT_TRUE(r.sampling.ignore_eos);

  ASSERT_FALSE(parse(R"({"prompt":[1,2,3]})", false, &r));
  EXPECT_FALSE(r.prompt_is_text);
  EXPECT_EQ(r.prompt_ids, (std::vector<int>{1, 2, 3}));
  EXPECT_FALSE(r.max_tokens.has_value());
  ASSERT_FALSE(parse(R"({"prompt":["one"]})", false, &r));
  EXPECT_EQ(r.prompt_text, "one");
}

TEST(ServeOpenAI, ParsesAChatRequest) {
  CompletionRequest r;
  ASSERT_FALSE(parse(R"({"messages":[{"role":"system","content":"Be brief."},
                                     {"role":"user","content":[{"type":"text","text":"Hi"},{"type":"text","text":"!"}]},
                                     {"role":"assistant","content":null}],
                         "max_completion_tokens":9,"logprobs":true,"top_logprobs":3})",
                     true, &r));
  ASSERT_EQ(r.messages.size(), 3u);
  EXPECT_EQ(r.messages[1].content, "Hi!");
  EXPECT_EQ(*r.max_tokens, 9);
  EXPECT_EQ(r.sampling.logprobs, 3);
  EXPECT_TRUE(r.stop.empty());
  EXPECT_EQ(chat_prompt(r.messages), "System: Be brief.\nUser: Hi!\nAssistant: \nAssistant:");
  // Without a chat template: the plain-text format and its stop string.
  data::ByteTokenizer bytes;
  const GPTConfig model{1, 1, 8, 256, 512};
  std::vector<int> ids;
  CompletionRequest plain = r;
  ASSERT_FALSE(resolve_prompt(&plain, bytes, model, &ids));
  EXPECT_EQ(plain.stop, (std::vector<std::string>{std::string(kChatStop)}));
  EXPECT_EQ(ids.size(), chat_prompt(r.messages).size());
  // With one: the rendered text (add_generation_prompt), no added stop.
  auto tmpl = data::ChatTemplate::parse(
      "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}{% if add_generation_prompt %}<a>{% endif %}",
      "", "");
  ASSERT_TRUE(tmpl.ok()) << tmpl.status().message();
  CompletionRequest templated = r;
  ASSERT_FALSE(resolve_prompt(&templated, bytes, model, &ids, &*tmpl));
  EXPECT_TRUE(templated.stop.empty());
  const std::string want = "<system>Be brief.<user>Hi!<assistant><a>";
  ASSERT_EQ(ids.size(), want.size());
  for (size_t i = 0; i < want.size(); i++) EXPECT_EQ(ids[i], static_cast<unsigned char>(want[i]));
}

// Each bad body: a 400 naming the field.
TEST(ServeOpenAI, RefusesBadFieldsNamingThem) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"([1,2])", ""},
      {R"({"max_tokens":5})", "prompt"},
      {R"({"prompt":5})", "prompt"},
      {R"({"prompt":[]})", "prompt"},
      {R"({"prompt":[1,"a"]})", "prompt"},
      {R"({"prompt":[1,-2]})", "prompt"},
      {R"({"prompt":["a","b"]})", "prompt"},
      {R"({"prompt":"x","model":3})", "model"},
      {R"({"prompt":"x","max_tokens":-1})", "max_tokens"},
      {R"({"prompt":"x","max_tokens":0})", "max_tokens"},
      {R"({"prompt":"x","max_tokens":"5"})", "max_tokens"},
      {R"({"prompt":"x","max_tokens":2.5})", "max_tokens"},
      {R"({"prompt":"x","max_tokens":1e30})", "max_tokens"},
      {R"({"prompt":"x","max_tokens":18446744073709551615})", "max_tokens"},
      {R"({"prompt":"x","temperature":-0.1})", "temperature"},
      {R"({"prompt":"x","temperature":"hot"})", "temperature"},
      {R"({"prompt":"x","top_p":0})", "top_p"},
      {R"({"prompt":"x","top_p":1.5})", "top_p"},
      {R"({"prompt":"x","top_k":-5})", "top_k"},
      {R"({"prompt":"x","n":2})", "n"},
      {R"({"prompt":"x","best_of":3})", "best_of"},
      {R"({"prompt":"x","stream":"yes"})", "stream"},
      {R"({"prompt":"x","stream_options":{"include_usage":1}})", "stream_options.include_usage"},
      {R"({"prompt":"x","stop":7})", "stop"},
      {R"({"prompt":"x","stop":[""]})", "stop"},
      {R"({"prompt":"x","stop":["a",1]})", "stop"},
      {R"({"prompt":"x","logprobs":9})", "logprobs"},
      {R"({"prompt":"x","echo":true})", "echo"},
      {R"({"prompt":"x","presence_penalty":0.5})", "presence_penalty"},
      {R"({"prompt":"x","logit_bias":{"1":5}})", "logit_bias"},
      {R"({"prompt":"x","seed":"s"})", "seed"},
      // Known fields that change the answer and are not built (issue #30 item 6).
      {R"({"prompt":"x","response_format":{"type":"json_object"}})", "response_format"},
      {R"({"prompt":"x","response_format":{"type":"json_schema","json_schema":{}}})", "response_format"},
      {R"({"prompt":"x","response_format":"json"})", "response_format"},
      {R"({"prompt":"x","tools":[{"type":"function","function":{"name":"f"}}]})", "tools"},
      {R"({"prompt":"x","tool_choice":"auto"})", "tool_choice"},
      {R"({"prompt":"x","tool_choice":{"type":"function","function":{"name":"f"}}})", "tool_choice"},
      {R"({"prompt":"x","functions":[{"name":"f"}]})", "functions"},
      {R"({"prompt":"x","function_call":"auto"})", "function_call"},
      {R"({"prompt":"x","audio":{"voice":"alloy"}})", "audio"},
      {R"({"prompt":"x","modalities":["text","audio"]})", "modalities"},
      {R"({"prompt":"x","prediction":{"type":"content","content":"x"}})", "prediction"},
  };
  for (const auto& [body, param] : cases) {
    auto e = parse(body);
    ASSERT_TRUE(e.has_value()) << body;
    EXPECT_EQ(e->http, 400) << body;
    EXPECT_EQ(e->param, param) << body << ": " << e->message;
    EXPECT_FALSE(e->message.empty());
    const json j = e->body();
    EXPECT_TRUE(j["error"]["message"].is_string());
    EXPECT_EQ(j["error"]["type"], "invalid_request_error");
  }
  const std::vector<std::pair<std::string, std::string>> chat_cases = {
      {R"({"prompt":"x"})", "messages"},
      {R"({"messages":[]})", "messages"},
      {R"({"messages":"hi"})", "messages"},
      {R"({"messages":[{"role":"robot","content":"x"}]})", "messages[0].role"},
      {R"({"messages":[{"content":"x"}]})", "messages[0].role"},
      {R"({"messages":[{"role":"user","content":5}]})", "messages[0].content"},
      {R"({"messages":[{"role":"user","content":[{"type":"image_url"}]}]})", "messages[0].content[0].type"},
      {R"({"messages":[{"role":"user","content":"x"}],"top_logprobs":2})", "top_logprobs"},
  };
  // What does not change the answer is accepted: text output, no tools, unknown fields.
  for (const char* ok : {R"({"prompt":"x","response_format":{"type":"text"}})", R"({"prompt":"x","tools":[]})",
                         R"({"prompt":"x","tool_choice":"none"})", R"({"prompt":"x","modalities":["text"]})",
                         R"({"prompt":"x","tools":null,"service_tier":"auto","metadata":{"a":"b"}})",
                         R"({"prompt":"x","some_future_field":1})"})
    EXPECT_FALSE(parse(ok).has_value()) << ok;
  for (const auto& [body, param] : chat_cases) {
    auto e = parse(body, true);
    ASSERT_TRUE(e.has_value()) << body;
    EXPECT_EQ(e->param, param) << body << ": " << e->message;
  }
}

TEST(ServeOpenAI, ResolvesThePromptAgainstTheModel) {
  data::ByteTokenizer tok;
  const GPTConfig model{2, 4, 64, 256, 32};
  CompletionRequest r;
  std::vector<int> ids;
  ASSERT_FALSE(parse(R"({"prompt":"abc"})", false, &r));
  ASSERT_FALSE(resolve_prompt(&r, tok, model, &ids));
  EXPECT_EQ(ids, (std::vector<int>{'a', 'b', 'c'}));
  EXPECT_EQ(r.sampling.max_tokens, 16);  // OpenAI's default
  ASSERT_FALSE(parse(R"({"prompt":""})", false, &r));
  ASSERT_FALSE(resolve_prompt(&r, tok, model, &ids));
  EXPECT_EQ(ids, (std::vector<int>{static_cast<int>(tok.eot())}));
  ASSERT_FALSE(parse(R"({"prompt":"abc","max_tokens":29})", false, &r));
  ASSERT_FALSE(resolve_prompt(&r, tok, model, &ids));
  ASSERT_FALSE(parse(R"({"prompt":"abc","max_tokens":30})", false, &r));
  auto e = resolve_prompt(&r, tok, model, &ids);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->param, "max_tokens");
  ASSERT_FALSE(parse(R"({"prompt":[1,256]})", false, &r));
  e = resolve_prompt(&r, tok, model, &ids);
  ASSERT_TRUE(e);
  EXPECT_NE(e->message.find("vocabulary"), std::string::npos);
  ASSERT_FALSE(parse(R"({"prompt":")" + std::string(32, 'x') + R"("})", false, &r));
  e = resolve_prompt(&r, tok, model, &ids);
  ASSERT_TRUE(e);
  EXPECT_NE(e->message.find("maximum context length is 32"), std::string::npos);
  // Chat without max_tokens: the rest of the context.
  ASSERT_FALSE(parse(R"({"messages":[{"role":"user","content":"hi"}]})", true, &r));
  ASSERT_FALSE(resolve_prompt(&r, tok, model, &ids));
  EXPECT_EQ(r.sampling.max_tokens, 32 - static_cast<int>(ids.size()));
}

TEST(ServeOpenAI, Utf8Helpers) {
  EXPECT_EQ(sanitize_utf8("ok \xC3\xA9"), "ok \xC3\xA9");
  EXPECT_EQ(sanitize_utf8("a\xFF" "b"), "a\xEF\xBF\xBD" "b");
  EXPECT_EQ(sanitize_utf8("\xC3"), "\xEF\xBF\xBD");
  EXPECT_EQ(sanitize_utf8("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // a surrogate
  EXPECT_EQ(complete_utf8_prefix("ab\xE2\x82"), 2u);
  EXPECT_EQ(complete_utf8_prefix("ab\xE2\x82\xAC"), 5u);
  EXPECT_EQ(complete_utf8_prefix("ab\xF0"), 2u);
  EXPECT_EQ(complete_utf8_prefix("ab\xE2x"), 4u);  // cannot complete: no reason to wait
}

// Pieces a stream sends concatenate to the text a non-streamed answer has.
std::string run(TextAssembler& t, const std::vector<std::string>& tokens, std::vector<std::string>* pieces,
                bool* stopped) {
  std::string all;
  *stopped = false;
  for (const std::string& tok : tokens) {
    std::string p = t.add(tok, stopped);
    pieces->push_back(p);
    all += p;
    if (*stopped) return all;
  }
  const std::string tail = t.finish();
  pieces->push_back(tail);
  return all + tail;
}

TEST(ServeOpenAI, TextAssemblerCutsAtStopStringsAcrossTokens) {
  TextAssembler t({"END", "\n\n"});
  std::vector<std::string> pieces;
  bool stopped;
  EXPECT_EQ(run(t, {"Hello", " wor", "ld E", "N", "D and more"}, &pieces, &stopped), "Hello world ");
  EXPECT_TRUE(stopped);
  // "E" and "N" were held back until they turned out to be a stop string.
  EXPECT_EQ(pieces[0], "Hel");
  TextAssembler u({"END"});
  pieces.clear();
  EXPECT_EQ(run(u, {"E", "N", "x"}, &pieces, &stopped), "ENx");
  EXPECT_FALSE(stopped);
}

TEST(ServeOpenAI, TextAssemblerSendsWholeCharactersOnly) {
  TextAssembler t({});
  std::vector<std::string> pieces;
  bool stopped;
  // "é" (C3 A9) and "€" (E2 82 AC) split across tokens.
  EXPECT_EQ(run(t, {"caf\xC3", "\xA9 ", "\xE2", "\x82", "\xAC!", "\xFF"}, &pieces, &stopped),
            "caf\xC3\xA9 \xE2\x82\xAC!\xEF\xBF\xBD");
  EXPECT_EQ(pieces[0], "caf");
  EXPECT_EQ(pieces[1], "\xC3\xA9 ");
  EXPECT_EQ(pieces[2], "");
  EXPECT_EQ(pieces[3], "");
  EXPECT_EQ(pieces[4], "\xE2\x82\xAC!");
  for (const std::string& p : pieces) EXPECT_EQ(sanitize_utf8(p), p);
  // An unfinished character at the end becomes U+FFFD.
  TextAssembler v({});
  pieces.clear();
  EXPECT_EQ(run(v, {"x\xE2\x82"}, &pieces, &stopped), "x\xEF\xBF\xBD\xEF\xBF\xBD");
}

// What a streamed answer sends, token by token, with the real tokenizers:
// Llama 2's byte-fallback ids (<0xF0><0x9F><0xA6><0x99> for one emoji) and
// Llama 3's byte-level ids split characters across tokens. Every chunk is
// whole UTF-8, and the chunks concatenate to the tokenizer's decode of the
// whole sequence (less the start-of-text space Llama 2's decoder strips,
// which a continuation keeps), which is also what the non-streamed answer
// holds.
TEST(ServeOpenAI, StreamedTokensOfRealTokenizersConcatenateToTheirDecode) {
  const std::string dir = TESSERA_TEST_DATA_DIR "/../data/raw/tokenizers/";
  const std::string text = " Grüße 🦙 aus 𝔘𝔫𝔦 — 日本語も。 ok";
  int checked = 0;
  for (const char* name : {"llama2", "llama3"}) {
    SCOPED_TRACE(name);
    auto tok = data::HfTokenizer::load(dir + name);
    if (!tok.ok()) continue;
    const std::vector<uint32_t> ids = (*tok)->encode(text);
    // The text really is split mid-character: some id is not whole UTF-8.
    int partial = 0;
    for (uint32_t id : ids) partial += sanitize_utf8(token_bytes(**tok, static_cast<int>(id))) !=
                                       token_bytes(**tok, static_cast<int>(id));
    EXPECT_GE(partial, 4);
    TextAssembler t({});
    std::string streamed;
    bool stopped = false;
    for (uint32_t id : ids) {
      const std::string piece = t.add(token_bytes(**tok, static_cast<int>(id)), &stopped);
      EXPECT_EQ(sanitize_utf8(piece), piece);
      streamed += piece;
    }
    streamed += t.finish();
    // Llama 2's normalizer prepends a space (add_dummy_prefix), which the
    // decoder strips from the start of a text and a continuation keeps.
    const std::string lead = std::string(name) == "llama2" ? " " : "";
    EXPECT_EQ(streamed, lead + (*tok)->decode(ids));
    EXPECT_EQ(streamed, lead + text);
    checked++;
  }
  if (checked == 0) GTEST_SKIP() << dir << " is missing; run scripts/fetch-data.sh";
}

}  // namespace
}  // namespace tessera::serve
