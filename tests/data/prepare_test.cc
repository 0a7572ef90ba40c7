#include "data/prepare.h"

#include <algorithm>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "data/shard.h"

namespace tessera::data {
namespace {

namespace fs = std::filesystem;

std::string make_docs(const std::string& name, int count) {
  std::string dir = ::testing::TempDir() + "/" + name;
  fs::remove_all(dir);
  fs::create_directories(dir + "/sub");
  for (int d = 0; d < count; d++) {
    std::string path = dir + (d % 2 ? "/sub/" : "/") + "doc" + std::to_string(d) + ".txt";
    std::ofstream(path) << "document " << d << " says hello.\n";
  }
  return dir;
}

PrepareOptions options(const std::string& in, const std::string& out) {
  PrepareOptions o;
  o.inputs = {in};
  o.tokenizer = "byte";
  o.out_dir = out;
  o.val_fraction = 0.25;
  return o;
}

TEST(Prepare, ShardHeadersCountsAndValSplit) {
  std::string in = make_docs("prep_docs", 8), out = ::testing::TempDir() + "/prep_out";
  fs::remove_all(out);
  auto s = prepare_shards(options(in, out));
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(s->documents, 8);
  auto train = read_shard(out + "/train_000000.bin");
  auto val = read_shard(out + "/val_000000.bin");
  ASSERT_TRUE(train.ok() && val.ok());
  EXPECT_EQ(static_cast<int64_t>(train->size()), s->train_tokens);
  EXPECT_EQ(static_cast<int64_t>(val->size()), s->val_tokens);
  // Every 4th document (k = 1/0.25) is validation: 2 of 8. Each document is
  // its end-of-text (byte 0) and its bytes.
  EXPECT_EQ(std::count(val->begin(), val->end(), 0), 2);
  EXPECT_EQ(std::count(train->begin(), train->end(), 0), 6);
  EXPECT_EQ((*train)[0], 0u);
  int64_t text_bytes = 0;
  for (const auto& e : fs::recursive_directory_iterator(in))
    if (e.is_regular_file()) text_bytes += static_cast<int64_t>(e.file_size());
  EXPECT_EQ(s->train_tokens + s->val_tokens, text_bytes + 8);
}

TEST(Prepare, SameInputSameOutputBytes) {
  std::string in = make_docs("prep_det", 13);
  std::string a = ::testing::TempDir() + "/prep_det_a", b = ::testing::TempDir() + "/prep_det_b";
  fs::remove_all(a);
  fs::remove_all(b);
  ASSERT_TRUE(prepare_shards(options(in, a)).ok());
  ASSERT_TRUE(prepare_shards(options(in, b)).ok());
  for (const char* f : {"/train_000000.bin", "/val_000000.bin"}) {
    std::ifstream fa(a + f, std::ios::binary), fb(b + f, std::ios::binary);
    std::string sa((std::istreambuf_iterator<char>(fa)), {}), sb((std::istreambuf_iterator<char>(fb)), {});
    EXPECT_FALSE(sa.empty());
    EXPECT_EQ(sa, sb) << f;
  }
}

TEST(Prepare, SplitsIntoShardsOfAtMostShardTokens) {
  std::string in = make_docs("prep_split", 4), out = ::testing::TempDir() + "/prep_split_out";
  fs::remove_all(out);
  PrepareOptions o = options(in, out);
  o.val_fraction = 0.0;
  o.shard_tokens = 25;
  auto s = prepare_shards(o);
  ASSERT_TRUE(s.ok());
  int64_t total = 0;
  for (const std::string& p : s->shards) {
    auto t = read_shard(p);
    ASSERT_TRUE(t.ok());
    EXPECT_LE(static_cast<int64_t>(t->size()), 25);
    total += static_cast<int64_t>(t->size());
  }
  EXPECT_EQ(total, s->train_tokens);
  EXPECT_GT(s->shards.size(), 2u);
}

TEST(Prepare, BadInputs) {
  std::string out = ::testing::TempDir() + "/prep_bad";
  auto missing = prepare_shards(options(::testing::TempDir() + "/no_such_folder", out));
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("no such file"), std::string::npos);
  PrepareOptions o = options(make_docs("prep_bad_docs", 2), out);
  o.val_fraction = 1.5;
  EXPECT_FALSE(prepare_shards(o).ok());
  o.val_fraction = 0.1;
  o.tokenizer = "gpt2";
  o.vocab_dir = ::testing::TempDir() + "/no_vocab_here";
  auto no_vocab = prepare_shards(o);
  ASSERT_FALSE(no_vocab.ok());
  EXPECT_NE(no_vocab.status().message().find("no_vocab_here"), std::string::npos) << no_vocab.status().message();
}

TEST(BrownToText, DropsTagsJoinsQuotesAndPunctuation) {
  std::string tagged =
      "\n\n\tThe/at jury/nn said/vbd ``/`` no/at evidence/nn ''/'' ,/, and/cc it's/pps+bez over/rp ./.\n"
      "\n\n\tA/at (/( new/jj )/) paragraph/nn ./.\n";
  EXPECT_EQ(brown_to_text(tagged), "The jury said \"no evidence\", and it's over.\n\nA (new) paragraph.\n");
}

}  // namespace
}  // namespace tessera::data
