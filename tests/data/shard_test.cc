#include "data/shard.h"

#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include <gtest/gtest.h>

namespace tessera::data {
namespace {

namespace fs = std::filesystem;

testing::AssertionResult contains(const std::string& text, std::string_view part) {
  if (text.find(part) != std::string::npos) return testing::AssertionSuccess();
  return testing::AssertionFailure() << "'" << text << "' does not contain '" << part << "'";
}

class ShardTest : public testing::Test {
 protected:
  void SetUp() override {
    const testing::TestInfo* info = testing::UnitTest::GetInstance()->current_test_info();
    const std::string unique = std::string(info->name()) + "_" + std::to_string(::getpid());
    dir_ = fs::path(testing::TempDir()) / ("tessera_shard_" + unique);
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(std::string_view name) const { return (dir_ / name).string(); }

  // A hand-made shard: header ints [magic, version, count, 0...] and `tokens`.
  std::string write_raw(std::string_view name, int32_t magic, int32_t version, int32_t count,
                        const std::vector<uint16_t>& tokens) const {
    std::array<int32_t, kShardHeaderInts> header{};
    header[0] = magic;
    header[1] = version;
    header[2] = count;
    std::string p = path(name);
    std::ofstream out(p, std::ios::binary);
    out.write(reinterpret_cast<const char*>(header.data()), sizeof(header));
    out.write(reinterpret_cast<const char*>(tokens.data()), static_cast<std::streamsize>(2 * tokens.size()));
    return p;
  }

  // Both readers must reject `p` as corrupt, naming the file and every part.
  static void expect_corrupt(const std::string& p, std::initializer_list<std::string_view> parts) {
    Result<int64_t> count = read_shard_token_count(p);
    Result<std::vector<uint32_t>> tokens = read_shard(p);
    for (const Status* st : {&count.status(), &tokens.status()}) {
      ASSERT_FALSE(st->ok());
      EXPECT_EQ(st->code(), StatusCode::kCorruption);
      EXPECT_EQ(st->message().rfind(p + ": ", 0), 0u) << st->message();
      for (std::string_view part : parts) EXPECT_TRUE(contains(st->message(), part));
    }
  }

  fs::path dir_;
};

TEST_F(ShardTest, RoundTrip) {
  std::vector<uint16_t> tokens;
  for (int i = 0; i < 1000; ++i) tokens.push_back(static_cast<uint16_t>(i * 37));
  tokens.push_back(50256);
  tokens.push_back(65535);
  const std::string p = path("train_000001.bin");
  ASSERT_TRUE(write_shard(p, tokens).ok());
  Result<std::vector<uint32_t>> got = read_shard(p);
  ASSERT_TRUE(got.ok()) << got.status().message();
  EXPECT_EQ(*got, std::vector<uint32_t>(tokens.begin(), tokens.end()));
  Result<int64_t> count = read_shard_token_count(p);
  ASSERT_TRUE(count.ok()) << count.status().message();
  EXPECT_EQ(*count, 1002);
}

// Version 2: 32-bit ids (Llama 3's 128,256, Qwen's 151,936), read back by
// the same reader; version 1 files still read (RoundTrip above).
TEST_F(ShardTest, Version2RoundTripsIdsPast65535) {
  const std::vector<uint32_t> tokens = {0, 65535, 65536, 128255, 151935, 7};
  const std::string p = path("v2.bin");
  ASSERT_TRUE(write_shard(p, tokens, 32).ok());
  std::ifstream in(p, std::ios::binary);
  const std::string bytes(std::istreambuf_iterator<char>(in), {});
  ASSERT_EQ(bytes.size(), 1024u + 4u * tokens.size());
  int32_t version;
  std::memcpy(&version, bytes.data() + 4, 4);
  EXPECT_EQ(version, kShardVersion32);
  Result<std::vector<uint32_t>> got = read_shard(p);
  ASSERT_TRUE(got.ok()) << got.status().message();
  EXPECT_EQ(*got, tokens);
  EXPECT_EQ(*read_shard_id_bytes(p), 4);
  EXPECT_EQ(shard_id_bits(256), 16);
  EXPECT_EQ(shard_id_bits(65536), 16);
  EXPECT_EQ(shard_id_bits(65537), 32);
  EXPECT_EQ(shard_id_bits(128256), 32);
  // The vocabulary check names the version-2 byte offset.
  Status st = check_token_ids(*got, 100000, p, 4);
  EXPECT_TRUE(contains(st.message(), "token id 128255 at token 3 (byte offset 1036)")) << st.message();
}

TEST_F(ShardTest, SixteenBitShardRefusesAWideId) {
  const std::string p = path("v1.bin");
  Status st = write_shard(p, std::vector<uint32_t>{1, 70000}, 16);
  ASSERT_FALSE(st.ok());
  EXPECT_TRUE(contains(st.message(), "token id 70000 at token 1 does not fit a 16-bit shard")) << st.message();
  EXPECT_FALSE(fs::exists(p));
  ASSERT_TRUE(write_shard(p, std::vector<uint32_t>{1, 65535}, 16).ok());
  EXPECT_EQ(fs::file_size(p), 1024u + 4u);
  EXPECT_EQ(*read_shard(p), (std::vector<uint32_t>{1, 65535}));
}

TEST_F(ShardTest, Version2WithAWrongSizeIsCorrupt) {
  const std::string p = write_raw("short2.bin", kShardMagic, kShardVersion32, 3, {1, 2, 3});  // 6 bytes, needs 12
  expect_corrupt(p, {"token count 3 needs a file of 1036 bytes"});
}

TEST_F(ShardTest, EmptyShard) {
  const std::string p = path("empty.bin");
  ASSERT_TRUE(write_shard(p, {}).ok());
  EXPECT_EQ(fs::file_size(p), 1024u);
  Result<std::vector<uint32_t>> got = read_shard(p);
  ASSERT_TRUE(got.ok()) << got.status().message();
  EXPECT_TRUE(got->empty());
  Result<int64_t> count = read_shard_token_count(p);
  ASSERT_TRUE(count.ok());
  EXPECT_EQ(*count, 0);
}

TEST_F(ShardTest, HeaderLayoutMatchesLlmC) {
  const std::vector<uint16_t> tokens = {1, 2, 3};
  const std::string p = path("s.bin");
  ASSERT_TRUE(write_shard(p, tokens).ok());
  std::ifstream in(p, std::ios::binary);
  const std::string bytes(std::istreambuf_iterator<char>(in), {});
  ASSERT_EQ(bytes.size(), 1024u + 6u);
  std::array<int32_t, kShardHeaderInts> header;
  std::memcpy(header.data(), bytes.data(), 1024);
  EXPECT_EQ(header[0], 20240520);
  EXPECT_EQ(header[1], 1);
  EXPECT_EQ(header[2], 3);
  for (int i = 3; i < kShardHeaderInts; ++i) EXPECT_EQ(header[i], 0) << "header int " << i;
  uint16_t second;
  std::memcpy(&second, bytes.data() + 1026, 2);
  EXPECT_EQ(second, 2);
}

TEST_F(ShardTest, WriteLeavesNoTmpFile) {
  const std::string p = path("s.bin");
  ASSERT_TRUE(write_shard(p, std::vector<uint16_t>{5}).ok());
  EXPECT_FALSE(fs::exists(p + ".tmp"));
}

TEST_F(ShardTest, WriteToMissingFolderFails) {
  const std::string p = path("missing/dir/s.bin");
  Status st = write_shard(p, std::vector<uint16_t>{5});
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), StatusCode::kIOError);
  EXPECT_TRUE(contains(st.message(), p));
}

TEST_F(ShardTest, WrongMagic) {
  expect_corrupt(write_raw("s.bin", 12345, kShardVersion, 0, {}), {"magic", "12345", "20240520"});
}

TEST_F(ShardTest, WrongVersion) {
  expect_corrupt(write_raw("s.bin", kShardMagic, 3, 0, {}), {"version 3", "expected 1 or 2"});
}

TEST_F(ShardTest, CountMismatch) {
  // 10 tokens claimed (1044 bytes needed), 5 present (1034 bytes).
  expect_corrupt(write_raw("s.bin", kShardMagic, kShardVersion, 10, {1, 2, 3, 4, 5}),
                 {"token count 10", "1044 bytes", "file is 1034 bytes"});
}

TEST_F(ShardTest, ExtraTrailingBytes) {
  expect_corrupt(write_raw("s.bin", kShardMagic, kShardVersion, 1, {1, 2}), {"token count 1", "1026", "1028"});
}

TEST_F(ShardTest, NegativeCount) {
  expect_corrupt(write_raw("s.bin", kShardMagic, kShardVersion, -3, {}), {"negative token count -3"});
}

TEST_F(ShardTest, Truncated) {
  const std::string p = path("s.bin");
  std::ofstream(p, std::ios::binary) << std::string(100, '\0');
  expect_corrupt(p, {"100 bytes", "shorter than the 1024-byte"});
}

TEST_F(ShardTest, TruncatedTokens) {
  const std::string p = path("s.bin");
  ASSERT_TRUE(write_shard(p, std::vector<uint16_t>(8, 7)).ok());
  fs::resize_file(p, 1024 + 15);
  expect_corrupt(p, {"token count 8", "1040", "1039"});
}

TEST_F(ShardTest, MissingFile) {
  const std::string p = path("absent.bin");
  for (const Status& st : {read_shard(p).status(), read_shard_token_count(p).status()}) {
    EXPECT_EQ(st.code(), StatusCode::kNotFound);
    EXPECT_TRUE(contains(st.message(), p));
  }
}

// A FIFO (or a folder) where a shard is expected is refused by name; a plain
// open() of a FIFO with no writer would block forever.
TEST_F(ShardTest, FifoAndFolderAreRefusedByName) {
  const std::string fifo = path("fifo.bin");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  for (const Status& st : {read_shard(fifo).status(), read_shard_token_count(fifo).status()})
    EXPECT_TRUE(contains(st.message(), fifo + ": is a FIFO, not a regular file"));
  const std::string dir = path("dir.bin");
  fs::create_directories(dir);
  EXPECT_TRUE(contains(read_shard(dir).status().message(), dir + ": is a folder, not a regular file"));
}

TEST(CheckTokenIds, NamesTheFileThePositionAndTheByteOffset) {
  std::vector<uint32_t> tokens(2000, 7);
  tokens[1500] = 300;
  tokens[1700] = 400;  // only the first bad one is reported
  Status st = check_token_ids(tokens, 256, "data/train_000003.bin");
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message(),
            "data/train_000003.bin: token id 300 at token 1500 (byte offset 4024) is outside the vocabulary [0, 256)");
  EXPECT_TRUE(check_token_ids(tokens, 401, "x").ok());
}

}  // namespace
}  // namespace tessera::data
