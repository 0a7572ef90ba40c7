// ChatTemplate against python3-jinja2 under Hugging Face's settings: every
// case of tests/reference/chat_templates/cases.json renders byte for byte as
// tests/reference/chat_templates/expected.json (written by
// tests/reference/chat_templates.py), and raising cases fail with the same
// message. The real templates come from scripts/fetch-data.sh
// (data/raw/tokenizers/); the tests skip without them.
#include "data/chat_template.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include <gtest/gtest.h>

namespace tessera::data {
namespace {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

const std::string kTokenizers = TESSERA_TEST_DATA_DIR "/../data/raw/tokenizers";
const std::string kReference = TESSERA_TEST_DATA_DIR "/reference/chat_templates";
constexpr std::time_t kFixedNow = 1721995200;  // chat_templates.py's FIXED_NOW

ojson read_json(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in) << path;
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return ojson::parse(text);
}

bool have_tokenizers() { return fs::exists(kTokenizers + "/qwen3/tokenizer_config.json"); }

testing::AssertionResult one_line(const std::string& text) {
  if (!text.empty() && text.find('\n') == std::string::npos) return testing::AssertionSuccess();
  return testing::AssertionFailure() << "not one non-empty line: '" << text << "'";
}

// The first byte where two texts differ, with context, for a readable failure.
std::string first_difference(const std::string& got, const std::string& want) {
  size_t i = 0;
  while (i < got.size() && i < want.size() && got[i] == want[i]) ++i;
  const size_t from = i > 40 ? i - 40 : 0;
  return "first difference at byte " + std::to_string(i) + "\n  got:  ..." + got.substr(from, 120) +
         "\n  want: ..." + want.substr(from, 120);
}

TEST(ChatTemplateOracle, EveryCaseMatchesPythonJinja) {
  if (!have_tokenizers()) GTEST_SKIP() << "no " << kTokenizers << " (run scripts/fetch-data.sh)";
  const ojson cases = read_json(kReference + "/cases.json")["cases"];
  const ojson expected = read_json(kReference + "/expected.json");
  ASSERT_GE(cases.size(), 40u);
  std::map<std::string, int> per_template;
  for (const ojson& c : cases) {
    const std::string name = c["name"].get<std::string>();
    SCOPED_TRACE(name);
    ASSERT_TRUE(expected.contains(name)) << "expected.json lacks it: rerun tests/reference/chat_templates.py";
    auto tmpl = ChatTemplate::load(kTokenizers + "/" + c["template"].get<std::string>());
    ASSERT_TRUE(tmpl.ok()) << tmpl.status().message();
    tmpl->set_clock_for_testing(kFixedNow);
    ChatRenderOptions options;
    options.add_generation_prompt = c["add_generation_prompt"].get<bool>();
    if (c.contains("tools")) options.tools = c["tools"];
    if (c.contains("documents")) options.documents = c["documents"];
    if (c.contains("extra")) options.extra = c["extra"];
    auto text = tmpl->render(c["messages"], options);
    const ojson& want = expected[name];
    if (want.contains("text")) {
      ASSERT_TRUE(text.ok()) << text.status().message();
      const std::string w = want["text"].get<std::string>();
      EXPECT_EQ(*text, w) << first_difference(*text, w);
    } else {
      ASSERT_FALSE(text.ok()) << "rendered, but python3-jinja2 raised: " << *text;
      const std::string msg = want["error"].get<std::string>();
      EXPECT_TRUE(one_line(text.status().message()));
      if (want["type"] == "TemplateError") {
        EXPECT_EQ(text.status().message(), msg);  // raise_exception(): verbatim
      } else {
        EXPECT_TRUE(text.status().message().starts_with("chat template line ")) << text.status().message();
        EXPECT_TRUE(text.status().message().ends_with(": " + msg)) << text.status().message() << " vs " << msg;
      }
    }
    ++per_template[c["template"].get<std::string>()];
  }
  for (const char* t : {"llama3", "llama3_1", "llama3_2", "qwen3"}) EXPECT_GE(per_template[t], 10) << t;
}

TEST(ChatTemplate, LoadsFolderOrFileAndReadsTokens) {
  if (!have_tokenizers()) GTEST_SKIP() << "no " << kTokenizers;
  auto from_dir = ChatTemplate::load(kTokenizers + "/llama3_2");
  ASSERT_TRUE(from_dir.ok()) << from_dir.status().message();
  EXPECT_EQ(from_dir->bos_token(), "<|begin_of_text|>");
  EXPECT_EQ(from_dir->eos_token(), "<|eot_id|>");
  auto from_file = ChatTemplate::load(kTokenizers + "/qwen3/tokenizer_config.json");
  ASSERT_TRUE(from_file.ok()) << from_file.status().message();
  EXPECT_EQ(from_file->bos_token(), "");  // null in the config: not in the map
  EXPECT_FALSE(from_file->special_tokens().contains("bos_token"));
  EXPECT_EQ(from_file->special_tokens()["pad_token"], "<|endoftext|>");
  EXPECT_EQ(from_file->special_tokens()["additional_special_tokens"][0], "<|im_start|>");
}

TEST(ChatTemplate, Llama2HasNoTemplate) {
  if (!fs::exists(kTokenizers + "/llama2/tokenizer_config.json")) GTEST_SKIP() << "no llama2 tokenizer";
  auto t = ChatTemplate::load(kTokenizers + "/llama2");
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(one_line(t.status().message()));
  EXPECT_NE(t.status().message().find("no chat_template"), std::string::npos) << t.status().message();
}

TEST(ChatTemplate, StrftimeNowUsesTheRealClockByDefault) {
  if (!have_tokenizers()) GTEST_SKIP() << "no " << kTokenizers;
  auto t = ChatTemplate::load(kTokenizers + "/llama3_2");
  ASSERT_TRUE(t.ok());
  const std::time_t before = std::time(nullptr);
  auto text = t->render(ojson::array({{{"role", "user"}, {"content", "hi"}}}), {});
  const std::time_t after = std::time(nullptr);
  ASSERT_TRUE(text.ok()) << text.status().message();
  auto date = [](std::time_t now) {
    std::tm tm{};
    localtime_r(&now, &tm);
    char buf[64];
    std::strftime(buf, sizeof(buf), "%d %b %Y", &tm);
    return std::string("Today Date: ") + buf + "\n";
  };
  EXPECT_TRUE(text->find(date(before)) != std::string::npos || text->find(date(after)) != std::string::npos)
      << *text;
}

// A temporary tokenizer_config.json per test.
class ChatTemplateFileTest : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(testing::TempDir()) /
           ("tessera_chat_" + std::string(testing::UnitTest::GetInstance()->current_test_info()->name()) + "_" +
            std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string write(const std::string& text) {
    const std::string path = (dir_ / "tokenizer_config.json").string();
    std::ofstream(path, std::ios::binary) << text;
    return path;
  }
  fs::path dir_;
};

TEST_F(ChatTemplateFileTest, NamedTemplateList) {
  write(R"({"bos_token": {"content": "<s>", "lstrip": false}, "eos_token": "</s>", "chat_template": [
    {"name": "default", "template": "D{{ bos_token }}{{ eos_token }}"},
    {"name": "tool_use", "template": "T{{ tools|length }}"}]})");
  auto def = ChatTemplate::load(dir_.string());
  ASSERT_TRUE(def.ok()) << def.status().message();
  EXPECT_EQ(def->bos_token(), "<s>");
  EXPECT_EQ(*def->render(ojson::array(), {}), "D<s></s>");
  auto tool = ChatTemplate::load(dir_.string(), "tool_use");
  ASSERT_TRUE(tool.ok());
  ChatRenderOptions options;
  options.tools = ojson::array({{{"type", "function"}}});
  EXPECT_EQ(*tool->render(ojson::array(), options), "T1");
  auto missing = ChatTemplate::load(dir_.string(), "rag");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("no chat template named 'rag' (it has: default, tool_use)"),
            std::string::npos)
      << missing.status().message();
}

TEST_F(ChatTemplateFileTest, ToolsAndDocumentsAreNoneWhenNotGiven) {
  write(R"({"chat_template": "{{ tools is defined }} {{ tools is none }} {{ documents is none }} {{ add_generation_prompt }} {{ unk_token is defined }}"})");
  auto t = ChatTemplate::load(dir_.string());
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(*t->render(ojson::array(), {}), "True True True False False");
}

TEST_F(ChatTemplateFileTest, ExtraArgumentsOverrideSpecialTokensButNotMessages) {
  write(R"({"bos_token": "<s>", "chat_template": "{{ bos_token }}|{{ enable_thinking }}|{{ messages|length }}"})");
  auto t = ChatTemplate::load(dir_.string());
  ASSERT_TRUE(t.ok());
  ChatRenderOptions options;
  options.extra = {{"bos_token", "<B>"}, {"enable_thinking", false}};
  EXPECT_EQ(*t->render(ojson::array({1, 2}), options), "<B>|False|2");
  options.extra = {{"messages", ojson::array()}};
  auto twice = t->render(ojson::array(), options);
  ASSERT_FALSE(twice.ok());
  EXPECT_EQ(twice.status().message(), "chat template argument 'messages' is given twice");
}

TEST_F(ChatTemplateFileTest, PlainJsonConvertsWithSortedKeys) {
  write(R"({"chat_template": "{{ messages[0]|tojson }}"})");
  auto t = ChatTemplate::load(dir_.string());
  ASSERT_TRUE(t.ok());
  nlohmann::json plain = nlohmann::json::array({{{"role", "user"}, {"content", "x"}}});
  EXPECT_EQ(*t->render(plain, {}), R"({"content": "x", "role": "user"})");
  ojson ordered = ojson::array({{{"role", "user"}, {"content", "x"}}});
  EXPECT_EQ(*t->render(ordered, {}), R"({"role": "user", "content": "x"})");
}

TEST_F(ChatTemplateFileTest, BadArgumentsAreOneLineErrors) {
  write(R"({"chat_template": "x"})");
  auto t = ChatTemplate::load(dir_.string());
  ASSERT_TRUE(t.ok());
  ChatRenderOptions options;
  EXPECT_FALSE(t->render(ojson::object(), options).ok());
  options.tools = ojson::array({"not a schema"});
  auto r = t->render(ojson::array(), options);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(one_line(r.status().message()));
  options.tools = nullptr;
  options.documents = ojson::object();
  EXPECT_FALSE(t->render(ojson::array(), options).ok());
}

TEST_F(ChatTemplateFileTest, BadConfigsAreOneLineErrors) {
  const std::vector<std::string> bad = {
      "",
      "{",
      "[1, 2]",
      R"({"chat_template": 5})",
      R"({"chat_template": [{"name": 1}]})",
      R"({"chat_template": "x", "bos_token": 7})",
      R"({"chat_template": "x", "additional_special_tokens": "x"})",
      R"({"chat_template": "{% for %}"})",
      R"({"chat_template": "{{ x|wordwrap }}"})",
      R"({"chat_template": "\n\n{% if x %}"})",
      R"({"chat_template": null})",
      std::string(R"({"chat_template": "{{ )") + std::string(5000, '[') + "\"}",
  };
  for (const std::string& text : bad) {
    SCOPED_TRACE(text.substr(0, 80));
    write(text);
    auto t = ChatTemplate::load(dir_.string());
    ASSERT_FALSE(t.ok());
    EXPECT_TRUE(one_line(t.status().message()));
  }
  write(R"({"chat_template": "a\n{{ x|wordwrap }}"})");
  auto t = ChatTemplate::load(dir_.string());
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(t.status().message().ends_with("tokenizer_config.json: chat template line 2: unknown filter 'wordwrap'"))
      << t.status().message();
  EXPECT_EQ(ChatTemplate::load((dir_ / "nowhere").string()).status().code(), StatusCode::kNotFound);
}

TEST(ChatTemplate, ParseTakesTheTokens) {
  auto t = ChatTemplate::parse("{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}{{ eos_token }}",
                               "<s>", "</s>");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->bos_token(), "<s>");
  EXPECT_EQ(*t->render(ojson::array({{{"content", "a"}}, {{"content", "b"}}}), {}), "<s>ab</s>");
  auto bad = ChatTemplate::parse("{% if %}", "", "");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(), "chat template line 1: expected an expression, got '%}'");
}

}  // namespace
}  // namespace tessera::data
