#include "data/tokenizer.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <thread>

#include <gtest/gtest.h>

namespace tessera::data {
namespace {

namespace fs = std::filesystem;

const std::string kGpt2Dir = TESSERA_TEST_DATA_DIR "/../data/raw/gpt2";

testing::AssertionResult contains(const std::string& text, std::string_view part) {
  if (text.find(part) != std::string::npos) return testing::AssertionSuccess();
  return testing::AssertionFailure() << "'" << text << "' does not contain '" << part << "'";
}

testing::AssertionResult one_line(const std::string& text) {
  if (!text.empty() && text.find('\n') == std::string::npos) return testing::AssertionSuccess();
  return testing::AssertionFailure() << "not one non-empty line: '" << text << "'";
}

// Appends code point cp as UTF-8.
void append_utf8(std::string& s, char32_t cp) {
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    s += static_cast<char>(0xE0 | (cp >> 12));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    s += static_cast<char>(0xF0 | (cp >> 18));
    s += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// A temporary folder per test.
class TempDirTest : public testing::Test {
 protected:
  void SetUp() override {
    const testing::TestInfo* info = testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::path(testing::TempDir()) /
           ("tessera_tok_" + std::string(info->name()) + "_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    if (!dir_.empty()) fs::remove_all(dir_);
  }
  void write(std::string_view name, std::string_view text) const {
    std::ofstream out(dir_ / name, std::ios::binary);
    out << text;
  }
  fs::path dir_;
};

// ---- ByteTokenizer ----------------------------------------------------------

TEST(ByteTokenizer, BytesAreTokens) {
  ByteTokenizer tok;
  EXPECT_EQ(tok.vocab_size(), 256);
  EXPECT_EQ(tok.eot(), 0u);
  EXPECT_EQ(tok.name(), "byte");
  EXPECT_EQ(tok.encode("Hi\xff"), (std::vector<uint32_t>{'H', 'i', 0xff}));
  EXPECT_TRUE(tok.encode("").empty());
}

TEST(ByteTokenizer, NulIsEncodedAsSpaceSoZeroMeansEndOfText) {
  ByteTokenizer tok;
  EXPECT_EQ(tok.encode(std::string_view("a\0b", 3)), (std::vector<uint32_t>{'a', ' ', 'b'}));
}

TEST(ByteTokenizer, RoundTripsEveryByteButNul) {
  ByteTokenizer tok;
  std::string all;
  for (int b = 1; b < 256; b++) all += static_cast<char>(b);
  EXPECT_EQ(tok.decode(tok.encode(all)), all);
  EXPECT_EQ(tok.decode_token(0xC3), "\xC3");
  EXPECT_EQ(tok.decode_token(0), std::string(1, '\0'));
}

TEST(ByteTokenizer, MadeByName) {
  Result<std::unique_ptr<Tokenizer>> tok = make_tokenizer("byte", "");
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  EXPECT_EQ((*tok)->name(), "byte");
}

TEST(Tokenizer, UnknownNameIsInvalidArgument) {
  Result<std::unique_ptr<Tokenizer>> tok = make_tokenizer("sentencepiece", "");
  ASSERT_FALSE(tok.ok());
  EXPECT_EQ(tok.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(contains(tok.status().message(), "sentencepiece"));
  EXPECT_TRUE(one_line(tok.status().message()));
}

// ---- Gpt2Tokenizer: errors (no vocabulary needed) ---------------------------

using Gpt2BpeErrors = TempDirTest;

TEST_F(Gpt2BpeErrors, MissingDirSaysHowToFetch) {
  Result<std::unique_ptr<Gpt2Tokenizer>> tok = Gpt2Tokenizer::load((dir_ / "nowhere").string());
  ASSERT_FALSE(tok.ok());
  EXPECT_EQ(tok.status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(contains(tok.status().message(), "nowhere/encoder.json"));
  EXPECT_TRUE(contains(tok.status().message(), "scripts/fetch-data.sh"));
  EXPECT_TRUE(contains(tok.status().message(), "--vocab"));
  EXPECT_TRUE(one_line(tok.status().message()));
}

TEST_F(Gpt2BpeErrors, MissingMergesFile) {
  write("encoder.json", "{}");
  Result<std::unique_ptr<Gpt2Tokenizer>> tok = Gpt2Tokenizer::load(dir_.string());
  ASSERT_FALSE(tok.ok());
  EXPECT_EQ(tok.status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(contains(tok.status().message(), "vocab.bpe"));
}

TEST_F(Gpt2BpeErrors, MalformedJson) {
  write("encoder.json", "{\"!\": 0, \"\\\"\": 1, \"#\"");
  write("vocab.bpe", "#version: 0.2\n");
  Result<std::unique_ptr<Gpt2Tokenizer>> tok = Gpt2Tokenizer::load(dir_.string());
  ASSERT_FALSE(tok.ok());
  EXPECT_EQ(tok.status().code(), StatusCode::kCorruption);
  EXPECT_TRUE(contains(tok.status().message(), "encoder.json: malformed JSON"));
  EXPECT_TRUE(one_line(tok.status().message()));
}

TEST_F(Gpt2BpeErrors, WrongVocabularySize) {
  write("encoder.json", "{\"!\": 0, \"\\\"\": 1}");
  write("vocab.bpe", "#version: 0.2\n");
  Result<std::unique_ptr<Gpt2Tokenizer>> tok = Gpt2Tokenizer::load(dir_.string());
  ASSERT_FALSE(tok.ok());
  EXPECT_EQ(tok.status().code(), StatusCode::kCorruption);
  EXPECT_TRUE(contains(tok.status().message(), "vocabulary has 2 tokens, expected 50257"));
}

// ---- Gpt2Tokenizer: with the real vocabulary --------------------------------

// Loads data/raw/gpt2 once for the suite; tests skip when it is not there.
class Gpt2Bpe : public TempDirTest {
 protected:
  static void SetUpTestSuite() {
    if (!fs::exists(fs::path(kGpt2Dir) / "encoder.json")) return;
    Result<std::unique_ptr<Gpt2Tokenizer>> loaded = Gpt2Tokenizer::load(kGpt2Dir);
    if (!loaded.ok()) {
      load_error_ = new std::string(loaded.status().message());
      return;
    }
    tok_ = std::move(loaded).value().release();
  }
  static void TearDownTestSuite() {
    delete tok_;
    tok_ = nullptr;
    delete load_error_;
    load_error_ = nullptr;
  }
  void SetUp() override {
    if (load_error_ != nullptr) FAIL() << *load_error_;
    if (tok_ == nullptr)
      GTEST_SKIP() << kGpt2Dir << " has no GPT-2 vocabulary; run scripts/fetch-data.sh";
    TempDirTest::SetUp();
  }
  void copy_vocab() const {
    fs::copy_file(fs::path(kGpt2Dir) / "encoder.json", dir_ / "encoder.json");
    fs::copy_file(fs::path(kGpt2Dir) / "vocab.bpe", dir_ / "vocab.bpe");
  }
  static std::string read(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }
  static Gpt2Tokenizer* tok_;
  static std::string* load_error_;
};
Gpt2Tokenizer* Gpt2Bpe::tok_ = nullptr;
std::string* Gpt2Bpe::load_error_ = nullptr;

struct KnownEncoding {
  std::string text;
  std::vector<uint32_t> ids;
};

// Expected ids from the reference: the `gpt-3-encoder` npm package (1.1.4),
// OpenAI's encoder.py ported to JavaScript, run with node 20 on these strings
// (require('gpt-3-encoder/Encoder.js').encode(text)). Every string here keeps
// to whitespace on which JavaScript's \s and Unicode White_Space agree.
const std::vector<KnownEncoding>& known_encodings() {
  static const std::vector<KnownEncoding> table = {
      {"Hello world", {15496, 995}},
      {" Hello", {18435}},
      {"I'm", {40, 1101}},
      {"12345", {10163, 2231}},
      {"a   b", {64, 220, 220, 275}},
      {"\n\n", {628}},
      {"こんにちは世界", {46036, 22174, 28618, 2515, 94, 31676, 10310, 244, 45911, 234}},
      {"I love 🦀 and 👍🏽!", {40, 1842, 12520, 99, 222, 290, 50169, 235, 8582, 237, 121, 0}},
      {"<|endoftext|>", {27, 91, 437, 1659, 5239, 91, 29}},
      {"  Hello  \n\n world\t!\n", {220, 18435, 220, 220, 628, 995, 197, 0, 198}},
      {"They're here, we've gone; I'll say he'd've",
       {2990, 821, 994, 11, 356, 1053, 3750, 26, 314, 1183, 910, 339, 1549, 1053}},
      {"Ünïcödé café naïve", {127, 250, 77, 26884, 66, 9101, 67, 2634, 40304, 41492}},
      {"x = 3.14159; y = -2e10", {87, 796, 513, 13, 1415, 19707, 26, 331, 796, 532, 17, 68, 940}},
      {"don't STOP'S 'tis 'rex", {9099, 470, 44934, 6, 50, 705, 48010, 705, 21510}},
      {"a  ", {64, 220, 220}},
      {" \t\n x", {220, 197, 198, 2124}},
      {"1/2 ½ Ⅻ ٣٤ 2024-01-01", {16, 14, 17, 25208, 2343, 227, 104, 18923, 96, 149, 97, 48609, 12, 486, 12, 486}},
      {"\u00a0\u3000x", {1849, 5099, 222, 87}},
      {"naïve résumé ÇA", {2616, 38776, 40560, 16345, 2634, 6184, 229, 32}},
      {"!!!???...", {10185, 28358, 986}},
      {"x\u0301y", {87, 136, 223, 88}},
      {"Привет, мир! Γειά σου κόσμε",
       {140, 253, 21169, 18849, 38857, 16843, 20375, 11, 12466, 120, 18849, 21169, 0, 7377, 241, 30950, 29945, 138,
        105, 18074, 225, 26517, 139, 227, 7377, 118, 139, 234, 38392, 34703, 30950}},
      {"🦀🦀🦀", {8582, 99, 222, 8582, 99, 222, 8582, 99, 222}},
      {"The/at jury/nn said/vbd ``/`` no/at ''/''",
       {464, 14, 265, 9002, 14, 20471, 531, 14, 85, 17457, 7559, 14, 15506, 645, 14, 265, 10148, 14, 7061}},
  };
  return table;
}

TEST_F(Gpt2Bpe, VocabSizeAndEndOfText) {
  EXPECT_EQ(tok_->vocab_size(), 50257);
  EXPECT_EQ(tok_->eot(), 50256u);
  EXPECT_EQ(tok_->name(), "gpt2");
  EXPECT_EQ(tok_->decode_token(50256), "<|endoftext|>");
  EXPECT_EQ(tok_->decode_token(198), "\n");
}

TEST_F(Gpt2Bpe, MatchesOpenAiEncoder) {
  for (const KnownEncoding& k : known_encodings()) {
    EXPECT_EQ(tok_->encode(k.text), k.ids) << "text: " << k.text;
    EXPECT_EQ(tok_->decode(k.ids), k.text);
  }
}

// Long pre-tokens take many merges; these check the merge order on them.
TEST_F(Gpt2Bpe, LongWordsMatchOpenAiEncoder) {
  std::string ab, sym;
  for (int i = 0; i < 40; i++) ab += "ab";
  for (int i = 0; i < 25; i++) sym += "=-+*";
  EXPECT_EQ(tok_->encode(ab), std::vector<uint32_t>(40, 397));
  std::vector<uint32_t> expected = {10779, 10};  // same reference as known_encodings()
  for (int i = 0; i < 24; i++) expected.insert(expected.end(), {48069, 10});
  expected.push_back(9);
  EXPECT_EQ(tok_->encode(sym), expected);
}

TEST_F(Gpt2Bpe, EmptyText) {
  EXPECT_TRUE(tok_->encode("").empty());
  EXPECT_TRUE(tok_->encode_with_special("").empty());
  EXPECT_EQ(tok_->decode({}), "");
}

TEST_F(Gpt2Bpe, EndOfTextInTextIsOrdinaryText) {
  std::vector<uint32_t> ids = tok_->encode("<|endoftext|>");
  EXPECT_EQ(ids, (std::vector<uint32_t>{27, 91, 437, 1659, 5239, 91, 29}));
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 50256), 0);
}

TEST_F(Gpt2Bpe, EncodeWithSpecialRecognisesEndOfText) {
  EXPECT_EQ(tok_->encode_with_special("<|endoftext|>"), (std::vector<uint32_t>{50256}));
  const std::string text = "Hello world<|endoftext|> Hello<|endoftext|><|endoftext|>\n\n";
  EXPECT_EQ(tok_->encode_with_special(text), (std::vector<uint32_t>{15496, 995, 50256, 18435, 50256, 50256, 628}));
  EXPECT_EQ(tok_->decode(tok_->encode_with_special(text)), text);
  // A partial marker is text.
  EXPECT_EQ(tok_->encode_with_special("<|endoftext|"), tok_->encode("<|endoftext|"));
}

TEST_F(Gpt2Bpe, RoundTripsRandomUnicode) {
  // Code points from ranges with every class the pre-tokeniser tells apart:
  // ASCII, Latin-1 (with U+0085 and U+00A0), combining marks, Cyrillic,
  // Devanagari (marks and digits), CJK, fullwidth forms, spaces, emoji and
  // skin-tone modifiers, and plane-2 ideographs.
  const std::vector<std::pair<char32_t, char32_t>> ranges = {
      {0x20, 0x7E}, {0x09, 0x0D}, {0x80, 0xFF}, {0x300, 0x36F}, {0x400, 0x4FF}, {0x900, 0x97F}, {0x2000, 0x206F},
      {0x3000, 0x30FF}, {0x4E00, 0x4FFF}, {0xFF00, 0xFFEF}, {0x1F300, 0x1F6FF}, {0x1F3FB, 0x1F3FF}, {0x20000, 0x200FF}};
  std::mt19937 rng(1234);
  for (int c = 0; c < 300; c++) {
    std::string text;
    const int len = std::uniform_int_distribution<int>(0, 60)(rng);
    for (int i = 0; i < len; i++) {
      const auto& [lo, hi] = ranges[std::uniform_int_distribution<size_t>(0, ranges.size() - 1)(rng)];
      append_utf8(text, std::uniform_int_distribution<char32_t>(lo, hi)(rng));
    }
    std::vector<uint32_t> ids = tok_->encode(text);
    ASSERT_EQ(tok_->decode(ids), text) << "case " << c;
    for (uint32_t id : ids) ASSERT_LT(id, 50256u) << "case " << c;
  }
}

TEST_F(Gpt2Bpe, RoundTripsRandomBytesIncludingInvalidUtf8) {
  std::mt19937 rng(5678);
  for (int c = 0; c < 300; c++) {
    std::string text;
    const int len = std::uniform_int_distribution<int>(0, 80)(rng);
    for (int i = 0; i < len; i++) {
      // Half the bytes from the UTF-8 lead/continuation range, so sequences
      // are often nearly valid: truncated, overlong, surrogates, > U+10FFFF.
      const int lo = (c % 2 == 0) ? 0x80 : 0x00;
      text += static_cast<char>(std::uniform_int_distribution<int>(lo, 0xFF)(rng));
    }
    ASSERT_EQ(tok_->decode(tok_->encode(text)), text) << "case " << c;
  }
  // Hand-picked invalid sequences.
  for (std::string_view bad : {"\xC0\x80", "\xED\xA0\x80", "\xF4\x90\x80\x80", "\xE2\x82", "a\xFF b", "\x80 \x80",
                               "'\xFFs", " \xF0\x9F\xA6"}) {
    EXPECT_EQ(tok_->decode(tok_->encode(bad)), bad);
  }
}

TEST_F(Gpt2Bpe, SameResultFromManyThreads) {
  std::string text;
  for (const KnownEncoding& k : known_encodings()) text += k.text + " ";
  const std::vector<uint32_t> expected = tok_->encode(text);
  std::vector<std::vector<uint32_t>> got(4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; t++)
    threads.emplace_back([&, t] {
      for (int r = 0; r < 50; r++) got[t] = tok_->encode(text);
    });
  for (std::thread& th : threads) th.join();
  for (int t = 0; t < 4; t++) EXPECT_EQ(got[t], expected);
}

TEST_F(Gpt2Bpe, MadeByNameFromDir) {
  Result<std::unique_ptr<Tokenizer>> tok = make_tokenizer("gpt2", kGpt2Dir);
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  EXPECT_EQ((*tok)->encode("Hello world"), (std::vector<uint32_t>{15496, 995}));
}

TEST_F(Gpt2Bpe, TruncatedEncoderJson) {
  copy_vocab();
  const std::string json = read(dir_ / "encoder.json");
  write("encoder.json", json.substr(0, json.size() / 2));
  Result<std::unique_ptr<Gpt2Tokenizer>> tok = Gpt2Tokenizer::load(dir_.string());
  ASSERT_FALSE(tok.ok());
  EXPECT_EQ(tok.status().code(), StatusCode::kCorruption);
  EXPECT_TRUE(contains(tok.status().message(), "encoder.json: malformed JSON"));
  EXPECT_TRUE(one_line(tok.status().message()));
}

TEST_F(Gpt2Bpe, TruncatedMerges) {
  copy_vocab();
  const std::string bpe = read(dir_ / "vocab.bpe");
  write("vocab.bpe", bpe.substr(0, bpe.find('\n', bpe.size() / 2) + 1));
  Result<std::unique_ptr<Gpt2Tokenizer>> tok = Gpt2Tokenizer::load(dir_.string());
  ASSERT_FALSE(tok.ok());
  EXPECT_EQ(tok.status().code(), StatusCode::kCorruption);
  EXPECT_TRUE(contains(tok.status().message(), "expected 50000"));
  EXPECT_TRUE(one_line(tok.status().message()));
}

TEST_F(Gpt2Bpe, MalformedMergeLine) {
  copy_vocab();
  std::string bpe = read(dir_ / "vocab.bpe");
  bpe.insert(bpe.find('\n') + 1, "Ġt\n");  // line 2: one token, no space
  write("vocab.bpe", bpe);
  Result<std::unique_ptr<Gpt2Tokenizer>> tok = Gpt2Tokenizer::load(dir_.string());
  ASSERT_FALSE(tok.ok());
  EXPECT_EQ(tok.status().code(), StatusCode::kCorruption);
  EXPECT_TRUE(contains(tok.status().message(), "vocab.bpe line 2: expected two tokens"));
  EXPECT_TRUE(one_line(tok.status().message()));
}

TEST_F(Gpt2Bpe, MergeOfUnknownToken) {
  copy_vocab();
  std::string bpe = read(dir_ / "vocab.bpe");
  bpe.insert(bpe.find('\n') + 1, "Ġt zzzzqq\n");
  write("vocab.bpe", bpe);
  Result<std::unique_ptr<Gpt2Tokenizer>> tok = Gpt2Tokenizer::load(dir_.string());
  ASSERT_FALSE(tok.ok());
  EXPECT_TRUE(contains(tok.status().message(), "vocab.bpe line 2"));
  EXPECT_TRUE(contains(tok.status().message(), "not in encoder.json"));
}

}  // namespace
}  // namespace tessera::data
