// HfTokenizer (data/hf_tokenizer.h): the components on small hand-made
// tokenizer.json files whose answers follow from the crate's rules, the
// refusals and fuzzed files, and streaming on the real files. Exactness on
// the real Llama and Qwen files against Hugging Face's own implementation
// is tests/cli/tokenizer_oracle.sh.
#include "data/hf_tokenizer.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace tessera::data {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using Ids = std::vector<uint32_t>;

const std::string kTokenizers = TESSERA_TEST_DATA_DIR "/../data/raw/tokenizers";

class HfTokenizerTest : public testing::Test {
 protected:
  void SetUp() override {
    const testing::TestInfo* info = testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::path(testing::TempDir()) / ("tessera_hf_" + std::string(info->name()) + "_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string write(const std::string& text, const std::string& name = "tokenizer.json") const {
    const std::string p = (dir_ / name).string();
    std::ofstream(p, std::ios::binary) << text;
    return p;
  }
  // A BPE over `vocab` (token -> id) and `merges`, with the given parts.
  static json bpe(json vocab, json merges) {
    return json{{"version", "1.0"},
                {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}, {"dropout", nullptr}}}};
  }
  std::unique_ptr<HfTokenizer> load(const json& j) {
    auto t = HfTokenizer::load(write(j.dump()));
    EXPECT_TRUE(t.ok()) << t.status().message();
    return t.ok() ? std::move(t).value() : nullptr;
  }
  // The one-line error loading j gives.
  std::string error_of(const std::string& text) {
    auto t = HfTokenizer::load(write(text));
    if (t.ok()) return "(loaded)";
    EXPECT_EQ(t.status().message().find('\n'), std::string::npos) << t.status().message();
    return t.status().message();
  }

  fs::path dir_;
};

testing::AssertionResult contains(const std::string& text, std::string_view part) {
  if (text.find(part) != std::string::npos) return testing::AssertionSuccess();
  return testing::AssertionFailure() << "'" << text << "' does not contain '" << part << "'";
}

TEST(Utf8Valid, ReplacesEachMaximalInvalidSubpart) {
  EXPECT_EQ(utf8_valid("plain é 😀"), "plain é 😀");
  EXPECT_EQ(utf8_valid("a\x80z"), "a\uFFFDz");                  // lone continuation byte
  EXPECT_EQ(utf8_valid("a\xE6\x97z"), "a\uFFFDz");              // truncated 3-byte: one subpart
  EXPECT_EQ(utf8_valid("\xC0\xAF"), "\uFFFD\uFFFD");            // overlong: two
  EXPECT_EQ(utf8_valid("\xED\xA0\x80"), "\uFFFD\uFFFD\uFFFD");  // surrogate: three
  EXPECT_EQ(utf8_valid("\xF5\x80"), "\uFFFD\uFFFD");            // past U+10FFFF
  EXPECT_EQ(utf8_valid("\xF0\x9F\x98"), "\uFFFD");              // truncated 4-byte at the end
  EXPECT_EQ(utf8_valid(""), "");
}

TEST_F(HfTokenizerTest, BpeMergesByRankAndFallsBackToBytes) {
  json j = bpe({{"<unk>", 0}, {"a", 1}, {"b", 2}, {"ab", 3}, {"<0xC3>", 4}, {"<0xA9>", 5}, {"c", 6}, {"abc", 7}},
               {"a b", "ab c"});
  j["model"]["byte_fallback"] = true;
  j["model"]["unk_token"] = "<unk>";
  j["decoder"] = {{"type", "Sequence"}, {"decoders", {{{"type", "ByteFallback"}}, {{"type", "Fuse"}}}}};
  auto t = load(j);
  ASSERT_TRUE(t);
  EXPECT_EQ(t->encode("abcab"), (Ids{7, 3}));
  EXPECT_EQ(t->encode("abé"), (Ids{3, 4, 5}));  // é = C3 A9, not in the vocabulary: its bytes
  EXPECT_EQ(t->decode(Ids{3, 4, 5}), "abé");
  EXPECT_EQ(t->decode(Ids{4}), "\uFFFD");        // a byte that is no character alone
  EXPECT_EQ(t->decode(Ids{4, 4}), "\uFFFD\uFFFD");  // one replacement per byte token, as the crate does
  EXPECT_EQ(t->decode_token(4), "\xC3");         // streaming: the raw byte, held back by the caller
  EXPECT_EQ(t->encode("a😀"), (Ids{1, 0}));       // no byte tokens for it: unk
  EXPECT_EQ(t->vocab_size(), 8);
}

TEST_F(HfTokenizerTest, UnknownCharactersFuseOrNot) {
  json j = bpe({{"<unk>", 0}, {"a", 1}}, json::array());
  j["model"]["unk_token"] = "<unk>";
  j["model"]["fuse_unk"] = true;
  EXPECT_EQ(load(j)->encode("xya"), (Ids{0, 1}));
  j["model"]["fuse_unk"] = false;
  EXPECT_EQ(load(j)->encode("xya"), (Ids{0, 0, 1}));
  j["model"].erase("unk_token");  // no unk token: the crate drops the character
  EXPECT_EQ(load(j)->encode("xya"), (Ids{1}));
}

TEST_F(HfTokenizerTest, IgnoreMergesTakesAWholeWordFromTheVocabulary) {
  // "abc" is in the vocabulary but no merge sequence reaches it.
  json j = bpe({{"a", 0}, {"b", 1}, {"c", 2}, {"abc", 3}, {"ab", 4}}, {"a b"});
  EXPECT_EQ(load(j)->encode("abc"), (Ids{4, 2}));
  j["model"]["ignore_merges"] = true;
  EXPECT_EQ(load(j)->encode("abc"), (Ids{3}));
}

TEST_F(HfTokenizerTest, MergesInPairForm) {
  json j = bpe({{"a", 0}, {"b", 1}, {"ab", 2}}, json::array({json::array({"a", "b"})}));
  EXPECT_EQ(load(j)->encode("abab"), (Ids{2, 2}));
}

TEST_F(HfTokenizerTest, AddedTokensLeftmostLongestWithTheirFlags) {
  json vocab = json::object();
  int id = 0;
  for (const char* c : {"a", "b", "c", "t", "s", " ", "<", ">", "m", "x"}) vocab[c] = id++;
  json j = bpe(vocab, json::array());
  j["added_tokens"] = {
      {{"id", 20}, {"content", "<m>"}, {"special", true}, {"lstrip", true}, {"rstrip", true}, {"normalized", false},
       {"single_word", false}},
      {{"id", 21}, {"content", "<mx>"}, {"special", false}, {"lstrip", false}, {"rstrip", false},
       {"normalized", false}, {"single_word", false}},
      {{"id", 22}, {"content", "cat"}, {"special", false}, {"lstrip", false}, {"rstrip", false},
       {"normalized", false}, {"single_word", true}}};
  auto t = load(j);
  ASSERT_TRUE(t);
  const EncodeOptions special{.add_special_tokens = false, .parse_special = true};
  // lstrip and rstrip take the spaces around it.
  EXPECT_EQ(t->encode("a  <m>  b", special), (Ids{0, 20, 1}));
  // Special: ordinary text unless asked.
  EXPECT_EQ(t->encode("<m>"), (Ids{6, 8, 7}));
  // Non-special added tokens always match; the longest wins.
  EXPECT_EQ(t->encode("<mx>"), (Ids{21}));
  // single_word: only between non-word characters.
  EXPECT_EQ(t->encode("a cat"), (Ids{0, 5, 22}));
  EXPECT_EQ(t->encode("cats"), (Ids{2, 0, 3, 4}));
  EXPECT_TRUE(t->is_special(20));
  EXPECT_FALSE(t->is_special(21));
  EXPECT_EQ(t->token_id("<mx>"), 21);
  EXPECT_EQ(t->token_id("nope"), -1);
  EXPECT_EQ(t->vocab_size(), 23);
  EXPECT_EQ(t->token_text(15), "");  // a hole in the ids
}

TEST_F(HfTokenizerTest, NormalizedAddedTokensMatchAfterTheNormalizer) {
  json j = bpe({{"h", 0}, {"i", 1}}, json::array());
  j["normalizer"] = {{"type", "Sequence"}, {"normalizers", {{{"type", "NFKC"}}, {{"type", "Lowercase"}}}}};
  j["added_tokens"] = {{{"id", 5}, {"content", "hi"}, {"special", false}, {"lstrip", false}, {"rstrip", false},
                        {"normalized", true}, {"single_word", false}}};
  auto t = load(j);
  EXPECT_EQ(t->encode("HI"), (Ids{5}));
  EXPECT_EQ(t->encode("ｈＩ"), (Ids{5}));  // fullwidth, NFKC to "hI", then lowercase
}

TEST_F(HfTokenizerTest, MetaspaceAndDigitsAndSplitBehaviours) {
  json vocab = json::object();
  int id = 0;
  for (const char* c : {"\u2581", "a", "b", "1", "2", "-"}) vocab[c] = id++;
  vocab["\u2581a"] = id++;  // 6
  vocab["\u2581b"] = id++;  // 7
  vocab["12"] = id++;       // 8
  json j = bpe(vocab, {"\u2581 a", "\u2581 b", "1 2"});
  j["pre_tokenizer"] = {{"type", "Sequence"},
                        {"pretokenizers",
                         {{{"type", "Metaspace"}, {"replacement", "\u2581"}, {"prepend_scheme", "first"}, {"split", true}},
                          {{"type", "Digits"}, {"individual_digits", true}}}}};
  j["decoder"] = {{"type", "Metaspace"}, {"replacement", "\u2581"}, {"prepend_scheme", "first"}, {"split", true}};
  auto t = load(j);
  EXPECT_EQ(t->encode("a b12"), (Ids{6, 7, 3, 4}));  // digits one by one
  EXPECT_EQ(t->decode(Ids{6, 7}), "a b");            // the first token's prepended space goes
  EXPECT_EQ(t->decode_token(7), " b");               // mid-text it stays
  j["pre_tokenizer"]["pretokenizers"][1]["individual_digits"] = false;
  EXPECT_EQ(load(j)->encode("a b12"), (Ids{6, 7, 8}));

  // Split with a literal: Removed drops it, MergedWithPrevious keeps it on the left.
  json s = bpe({{"a", 0}, {"-", 1}, {"a-", 2}, {"-a", 3}}, {"a -"});
  s["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"String", "-"}}}, {"behavior", "Removed"}, {"invert", false}};
  EXPECT_EQ(load(s)->encode("a-a"), (Ids{0, 0}));
  s["pre_tokenizer"]["behavior"] = "MergedWithPrevious";
  EXPECT_EQ(load(s)->encode("a-a"), (Ids{2, 0}));
  s["pre_tokenizer"]["behavior"] = "Isolated";
  EXPECT_EQ(load(s)->encode("a-a"), (Ids{0, 1, 0}));
}

TEST_F(HfTokenizerTest, PostProcessorAddsBosAndEosWhenAsked) {
  json j = bpe({{"<s>", 0}, {"</s>", 1}, {"a", 2}}, json::array());
  j["added_tokens"] = {{{"id", 0}, {"content", "<s>"}, {"special", true}},
                       {{"id", 1}, {"content", "</s>"}, {"special", true}}};
  j["post_processor"] = {{"type", "TemplateProcessing"},
                         {"single", {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                                     {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
                                     {{"SpecialToken", {{"id", "</s>"}, {"type_id", 0}}}}}},
                         {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {0}}, {"tokens", {"<s>"}}}},
                                             {"</s>", {{"id", "</s>"}, {"ids", {1}}, {"tokens", {"</s>"}}}}}}};
  auto t = load(j);
  EXPECT_EQ(t->encode("a", {.add_special_tokens = true}), (Ids{0, 2, 1}));
  EXPECT_EQ(t->encode("", {.add_special_tokens = true}), (Ids{0, 1}));
  EXPECT_EQ(t->encode("a"), (Ids{2}));
  EXPECT_EQ(t->eot(), 0u);  // the post-processor's first token separates documents
  EXPECT_EQ(t->decode(Ids{0, 2, 1}, /*skip_special_tokens=*/true), "a");
}

TEST_F(HfTokenizerTest, ComponentsItDoesNotImplementAreRefusedByName) {
  json ok = bpe({{"a", 0}}, json::array());
  EXPECT_TRUE(contains(error_of(R"({"model": {"type": "WordPiece", "vocab": {}}})"), "model \"WordPiece\" is not supported"));
  EXPECT_TRUE(contains(error_of(R"({"model": {"type": "Unigram", "vocab": []}})"), "model \"Unigram\" is not supported"));
  json j = ok;
  j["post_processor"] = {{"type", "BertProcessing"}};
  EXPECT_TRUE(contains(error_of(j.dump()), "post_processor: post-processor \"BertProcessing\" is not supported"));
  j = ok;
  j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"String", "-"}}}, {"behavior", "Isolated"}, {"invert", true}};
  EXPECT_TRUE(contains(error_of(j.dump()), "\"invert\": true is not supported"));
  j = ok;
  j["normalizer"] = {{"type", "BertNormalizer"}};
  EXPECT_TRUE(contains(error_of(j.dump()), "normalizer \"BertNormalizer\" is not supported"));
  j = ok;
  j["decoder"] = {{"type", "WordPiece"}};
  EXPECT_TRUE(contains(error_of(j.dump()), "decoder \"WordPiece\" is not supported"));
  j = ok;
  j["model"]["continuing_subword_prefix"] = "##";
  EXPECT_TRUE(contains(error_of(j.dump()), "\"continuing_subword_prefix\" is not supported"));
  j = ok;
  j["model"]["dropout"] = 0.1;
  EXPECT_TRUE(contains(error_of(j.dump()), "dropout is not supported"));
}

TEST_F(HfTokenizerTest, MalformedFilesGiveOneLineNamingTheField) {
  EXPECT_TRUE(contains(error_of(""), "not valid JSON"));
  EXPECT_TRUE(contains(error_of("[1, 2"), "not valid JSON"));
  EXPECT_TRUE(contains(error_of("[]"), "top level: must be an object"));
  EXPECT_TRUE(contains(error_of("{}"), "model: missing"));
  EXPECT_TRUE(contains(error_of(R"({"model": {"type": "BPE", "vocab": [], "merges": []}})"), "model.vocab: must be an object"));
  EXPECT_TRUE(contains(error_of(R"({"model": {"type": "BPE", "vocab": {"a": -1}, "merges": []}})"),
                       "model.vocab: token \"a\": id must be an integer"));
  EXPECT_TRUE(contains(error_of(R"({"model": {"type": "BPE", "vocab": {"a": 1e300}, "merges": []}})"),
                       "id must be an integer"));
  EXPECT_TRUE(contains(error_of(R"({"model": {"type": "BPE", "vocab": {"a": 99999999999}, "merges": []}})"),
                       "id must be an integer"));
  EXPECT_TRUE(contains(error_of(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a z"]}})"),
                       "model.merges[0]: \"a z\": a part or the merged token is not in the vocabulary"));
  EXPECT_TRUE(contains(error_of(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a"]}})"),
                       "is not \"LEFT RIGHT\""));
  EXPECT_TRUE(contains(error_of(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": [7]}})"),
                       "model.merges[0]: must be"));
  EXPECT_TRUE(contains(error_of(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": [], "unk_token": "<u>"}})"),
                       "model.unk_token: \"<u>\" is not in the vocabulary"));
  EXPECT_TRUE(contains(error_of(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}, "added_tokens": [{"id": 1}]})"),
                       "added_tokens[0]: missing \"content\""));
  EXPECT_TRUE(contains(error_of(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}, "added_tokens": [{"id": "x", "content": "b"}]})"),
                       "added_tokens[0]: \"id\" must be an integer"));
  EXPECT_TRUE(contains(error_of(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}, "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "(["}, "behavior": "Isolated"}})"),
                       "does not compile"));
  EXPECT_TRUE(contains(error_of(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}, "normalizer": 5})"),
                       "normalizer: must be an object"));
  // Nesting: components past 16 deep, and JSON nested 100,000 deep.
  json n = {{"type", "Lowercase"}};
  for (int i = 0; i < 40; i++) n = {{"type", "Sequence"}, {"normalizers", json::array({n})}};
  json deep = bpe({{"a", 0}}, json::array());
  deep["normalizer"] = n;
  EXPECT_TRUE(contains(error_of(deep.dump()), "nested too deep"));
  EXPECT_NE(error_of(std::string(100000, '[') + std::string(100000, ']')), "(loaded)");
  EXPECT_TRUE(contains(HfTokenizer::load((dir_ / "none").string()).status().message(), "no such file"));
}

// Fuzzing: a valid file cut short and with bytes changed at random either
// loads (and then encodes and decodes any text in bounds) or is one line.
TEST_F(HfTokenizerTest, FuzzedFilesNeverCrash) {
  json j = bpe({{"<unk>", 0}, {"a", 1}, {"b", 2}, {"ab", 3}, {"<0x61>", 4}}, {"a b"});
  j["model"]["byte_fallback"] = true;
  j["model"]["unk_token"] = "<unk>";
  j["normalizer"] = {{"type", "Sequence"}, {"normalizers", {{{"type", "NFC"}}, {{"type", "Prepend"}, {"prepend", "a"}}}}};
  j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "\\s+|\\p{L}+"}}}, {"behavior", "Isolated"}};
  j["decoder"] = {{"type", "Sequence"}, {"decoders", {{{"type", "ByteFallback"}}, {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}};
  j["added_tokens"] = {{{"id", 7}, {"content", "<x>"}, {"special", true}, {"lstrip", true}, {"rstrip", true}}};
  const std::string good = j.dump();
  std::mt19937 rng(29);
  int loaded = 0;
  for (int trial = 0; trial < 400; trial++) {
    std::string text = good;
    if (trial % 2 == 0) {
      text.resize(rng() % good.size());
    } else {
      for (int k = 0; k < 3; k++) text[rng() % text.size()] = static_cast<char>("\"{}[],:0a\\-9 \x80"[rng() % 15]);
    }
    auto t = HfTokenizer::load(write(text));
    if (!t.ok()) {
      EXPECT_EQ(t.status().message().find('\n'), std::string::npos);
      continue;
    }
    loaded++;
    const Ids ids = (*t)->encode("ab <x> \xff a\xe6 ba", {.add_special_tokens = true, .parse_special = true});
    for (uint32_t id : ids) ASSERT_LT(id, static_cast<uint32_t>((*t)->vocab_size()));
    (void)(*t)->decode(ids);
  }
  EXPECT_GT(loaded, 0);
}

// ---- The real files --------------------------------------------------------------

std::unique_ptr<HfTokenizer> real(const std::string& name) {
  const std::string dir = kTokenizers + "/" + name;
  if (!fs::exists(dir + "/tokenizer.json")) return nullptr;
  auto t = HfTokenizer::load(dir);
  EXPECT_TRUE(t.ok()) << t.status().message();
  return t.ok() ? std::move(t).value() : nullptr;
}

// Streaming: the bytes of each id, one after another, are the text: split
// inside characters for byte-level ids (Llama 3, Qwen3) and byte-fallback
// ids (Llama 2, where the text also gains the prepended space).
TEST(HfTokenizerReal, TokenByTokenBytesAreTheText) {
  const std::string text = "Streaming 😀 日本語 and 𠀀, tabs\t\tand  spaces.";
  bool any = false;
  for (const char* name : {"llama2", "llama3", "qwen3"}) {
    auto t = real(name);
    if (!t) continue;
    any = true;
    std::string joined;
    int partial = 0;
    for (uint32_t id : t->encode(text)) {
      const std::string b = t->decode_token(id);
      partial += utf8_valid(b) != b;
      joined += b;
    }
    EXPECT_EQ(joined, std::string(name) == "llama2" ? " " + text : text) << name;
    EXPECT_GT(partial, 0) << name << ": some id should carry part of a character";
    EXPECT_EQ(t->decode(t->encode(text)), text) << name;
  }
  if (!any) GTEST_SKIP() << kTokenizers << " is missing; run scripts/fetch-data.sh";
}

TEST(HfTokenizerReal, SizesAndEndOfText) {
  auto l3 = real("llama3_1");
  auto qw = real("qwen3");
  if (!l3 || !qw) GTEST_SKIP() << kTokenizers << " is missing; run scripts/fetch-data.sh";
  EXPECT_EQ(l3->vocab_size(), 128256);
  EXPECT_EQ(l3->eot(), 128000u);  // <|begin_of_text|>, which the post-processor puts first
  EXPECT_EQ(qw->vocab_size(), 151669);
  EXPECT_EQ(qw->eot(), 151643u);  // <|endoftext|>
  EXPECT_EQ(qw->encode("<|im_start|>user", {.parse_special = true}), (Ids{151644, 872}));
  EXPECT_EQ(qw->encode("<think>"), (Ids{151667}));  // a non-special added token: always matched
}

// The hand matcher of Llama 3's and Qwen's split equals ICU's matching of the
// same pattern, on random strings of the characters each alternative turns
// on (contractions in both cases, \r \n and other white space, digits,
// letters of several scripts, marks, symbols, 4-byte characters).
TEST(HfTokenizerReal, HandSplitEqualsTheRegex) {
  bool any = false;
  for (const char* name : {"llama3", "qwen3"}) {
    const std::string dir = kTokenizers + "/" + name;
    if (!fs::exists(dir + "/tokenizer.json")) continue;
    any = true;
    auto fast = HfTokenizer::load(dir);
    auto icu = HfTokenizer::load(dir, HfLoadOptions{.fast_split = false});
    ASSERT_TRUE(fast.ok() && icu.ok());
    const std::vector<std::string> atoms = {"'", "s", "S", "t", "re", "RE", "ve", "m", "ll", "LL", "d", "x", " ",
                                            "  ", "\t", "\r", "\n", "\r\n", "\v", "\u0085", "\u00a0", "\u3000", "1",
                                            "23", "4567", "\u0663", "\u2167", "é", "日本", "ß", "\u0301", "!", "...",
                                            "$", "😀", "\U00020000", "-", "_", "ſ", "İ", "ǅ", "\u2028"};
    std::mt19937 rng(2029);
    std::string corpus;
    for (int t = 0; t < 3000; t++) {
      std::string text;
      const int len = 1 + static_cast<int>(rng() % 12);
      for (int k = 0; k < len; k++) text += atoms[rng() % atoms.size()];
      ASSERT_EQ((*fast)->encode(text), (*icu)->encode(text)) << name << ": " << json(text).dump();
      corpus += text;
    }
    EXPECT_EQ((*fast)->encode(corpus), (*icu)->encode(corpus)) << name;
  }
  if (!any) GTEST_SKIP() << kTokenizers << " is missing; run scripts/fetch-data.sh";
}

TEST(HfTokenizerReal, ThreadsGetTheSameIds) {
  auto t = real("llama3");
  if (!t) GTEST_SKIP() << kTokenizers << " is missing; run scripts/fetch-data.sh";
  std::string text;
  for (int i = 0; i < 200; i++) text += "Line " + std::to_string(i) + ": naïve café 😀 — it's here.\n";
  const Ids want = t->encode(text);
  std::vector<Ids> got(4);
  std::vector<std::thread> threads;
  for (int k = 0; k < 4; k++) threads.emplace_back([&, k] { got[k] = t->encode(text); });
  for (auto& th : threads) th.join();
  for (const Ids& g : got) EXPECT_EQ(g, want);
}

}  // namespace
}  // namespace tessera::data
