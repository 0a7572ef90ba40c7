#include "io/safetensors.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <random>

#include <gtest/gtest.h>

#include "tensor/dtype.h"

namespace tessera::io {
namespace {

namespace fs = std::filesystem;
using namespace std::string_view_literals;

// EXPECT_TRUE(contains(message, "magic")) prints the message on failure.
testing::AssertionResult contains(const std::string& text, std::string_view part) {
  if (text.find(part) != std::string::npos) return testing::AssertionSuccess();
  return testing::AssertionFailure() << "'" << text << "' does not contain '" << part << "'";
}

// 8-byte little-endian length, then the header text as given, then data.
std::string st_bytes(std::string_view header, std::string_view data = "") {
  uint64_t n = header.size();
  std::string out(reinterpret_cast<const char*>(&n), 8);
  out += header;
  out += data;
  return out;
}

std::vector<std::byte> to_bytes(std::string_view s) {
  std::vector<std::byte> out(s.size());
  if (!s.empty()) std::memcpy(out.data(), s.data(), s.size());
  return out;
}

class SafetensorsTest : public testing::Test {
 protected:
  void SetUp() override {
    const testing::TestInfo* info = testing::UnitTest::GetInstance()->current_test_info();
    const std::string unique = std::string(info->name()) + "_" + std::to_string(::getpid());
    dir_ = fs::path(testing::TempDir()) / ("tessera_st_" + unique);
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(std::string_view name) const { return (dir_ / name).string(); }

  std::string write_file(std::string_view name, std::string_view bytes) const {
    std::string p = path(name);
    std::ofstream(p, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    return p;
  }

  static std::string read_all(const std::string& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }

  // Opens a hand-made file that must be rejected as corrupt; the message must
  // name the file and contain `keyword`.
  void expect_corrupt(std::string_view bytes, std::string_view keyword) const {
    std::string p = write_file("bad.safetensors", bytes);
    Result<SafetensorsFile> f = SafetensorsFile::open(p);
    ASSERT_FALSE(f.ok());
    EXPECT_EQ(f.status().code(), StatusCode::kCorruption);
    EXPECT_EQ(f.status().message().rfind(p + ": ", 0), 0u) << f.status().message();
    EXPECT_TRUE(contains(f.status().message(), std::string(keyword)));
    EXPECT_EQ(f.status().message().find('\n'), std::string::npos);
  }

  fs::path dir_;
};

TEST_F(SafetensorsTest, RoundTripF32AndBF16) {
  const std::vector<float> a = {1.f, -2.5f, 3.25f, 0.f, 1e-3f, 7e5f};
  std::vector<bf16> b;
  for (float x : {0.1f, -1.f, 3.14159f, 100.f}) b.push_back(f32_to_bf16(x));
  SafetensorsWriter w;
  w.add("a", StDType::kF32, {2, 3}, a.data());
  w.add("b", StDType::kBF16, {4}, b.data());
  const std::string p = path("m.safetensors");
  ASSERT_TRUE(w.write(p).ok());

  Result<SafetensorsFile> f = SafetensorsFile::open(p);
  ASSERT_TRUE(f.ok()) << f.status().message();
  ASSERT_EQ(f->tensors().size(), 2u);
  EXPECT_EQ(f->path(), p);
  const TensorInfo* ta = f->find("a");
  ASSERT_NE(ta, nullptr);
  EXPECT_EQ(ta->dtype, StDType::kF32);
  EXPECT_EQ(ta->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(ta->numel(), 6);
  std::vector<float> got(6);
  ASSERT_TRUE(f->read_f32("a", got).ok());
  EXPECT_EQ(got, a);

  const TensorInfo* tb = f->find("b");
  ASSERT_NE(tb, nullptr);
  EXPECT_EQ(tb->dtype, StDType::kBF16);
  ASSERT_EQ(f->raw(*tb).size(), 8u);
  EXPECT_EQ(std::memcmp(f->raw(*tb).data(), b.data(), 8), 0);
  got.resize(4);
  ASSERT_TRUE(f->read_f32("b", got).ok());
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(got[i], bf16_to_f32(b[i]));
}

TEST_F(SafetensorsTest, RoundTripI32RawBytes) {
  const std::vector<int32_t> ids = {-1, 0, 50256, std::numeric_limits<int32_t>::max()};
  SafetensorsWriter w;
  w.add("ids", StDType::kI32, {4}, ids.data());
  ASSERT_TRUE(w.write(path("i.safetensors")).ok());
  Result<SafetensorsFile> f = SafetensorsFile::open(path("i.safetensors"));
  ASSERT_TRUE(f.ok()) << f.status().message();
  std::span<const std::byte> raw = f->raw(*f->find("ids"));
  ASSERT_EQ(raw.size(), 16u);
  EXPECT_EQ(std::memcmp(raw.data(), ids.data(), 16), 0);
}

TEST_F(SafetensorsTest, MetadataRoundTrip) {
  SafetensorsWriter w;
  w.set_metadata("format", "pt");
  w.set_metadata("step", "42");
  ASSERT_TRUE(w.write(path("m.safetensors")).ok());
  Result<SafetensorsFile> f = SafetensorsFile::open(path("m.safetensors"));
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_TRUE(f->tensors().empty());
  EXPECT_EQ(f->metadata(), (std::map<std::string, std::string>{{"format", "pt"}, {"step", "42"}}));
}

TEST_F(SafetensorsTest, HeaderIsPaddedToMultipleOf8) {
  const float x[3] = {1, 2, 3};
  SafetensorsWriter w;
  w.add("x", StDType::kF32, {3}, x);
  ASSERT_TRUE(w.write(path("m.safetensors")).ok());
  const std::string bytes = read_all(path("m.safetensors"));
  ASSERT_GE(bytes.size(), 8u);
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ(bytes.size(), 8 + n + 12);
  EXPECT_EQ(bytes[8], '{');
  const std::string header = bytes.substr(8, n);
  EXPECT_EQ(header.find_last_not_of(' '), header.rfind('}'));
}

TEST_F(SafetensorsTest, TensorsLaidOutInOrderAdded) {
  const float z[2] = {1, 2}, a[1] = {3};
  SafetensorsWriter w;
  w.add("z", StDType::kF32, {2}, z);
  w.add("a", StDType::kF32, {1}, a);
  ASSERT_TRUE(w.write(path("m.safetensors")).ok());
  Result<SafetensorsFile> f = SafetensorsFile::open(path("m.safetensors"));
  ASSERT_TRUE(f.ok()) << f.status().message();
  ASSERT_EQ(f->tensors().size(), 2u);
  EXPECT_EQ(f->tensors()[0].name, "z");
  EXPECT_EQ(f->tensors()[0].begin, 0u);
  EXPECT_EQ(f->tensors()[1].name, "a");
  EXPECT_EQ(f->tensors()[1].begin, 8u);
}

TEST_F(SafetensorsTest, TensorsSortedByBeginOffset) {
  const std::string header = R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]},)"
                             R"("b":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
  Result<SafetensorsFile> f = SafetensorsFile::open(write_file("m.safetensors", st_bytes(header, "01234567")));
  ASSERT_TRUE(f.ok()) << f.status().message();
  ASSERT_EQ(f->tensors().size(), 2u);
  EXPECT_EQ(f->tensors()[0].name, "b");
  EXPECT_EQ(f->tensors()[1].name, "a");
}

TEST_F(SafetensorsTest, ScalarAndEmptyTensors) {
  const float s = 2.5f;
  SafetensorsWriter w;
  w.add("scalar", StDType::kF32, {}, &s);
  w.add("empty", StDType::kF32, {0, 3}, nullptr);
  ASSERT_TRUE(w.write(path("m.safetensors")).ok());
  Result<SafetensorsFile> f = SafetensorsFile::open(path("m.safetensors"));
  ASSERT_TRUE(f.ok()) << f.status().message();
  float got = 0;
  ASSERT_TRUE(f->read_f32("scalar", std::span(&got, 1)).ok());
  EXPECT_EQ(got, 2.5f);
  EXPECT_EQ(f->find("empty")->numel(), 0);
  EXPECT_TRUE(f->read_f32("empty", {}).ok());
  EXPECT_TRUE(f->raw(*f->find("empty")).empty());
}

TEST_F(SafetensorsTest, AcceptsEmptyHeaderObject) {
  Result<SafetensorsFile> f = SafetensorsFile::open(write_file("m.safetensors", st_bytes("{}")));
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_TRUE(f->tensors().empty());
  EXPECT_TRUE(f->metadata().empty());
}

// A tensor written through a Fill callback is the same bytes as one given
// by pointer; a mapped file reads the same after its pages are dropped
// (issue #30 item 3: tensor-by-tensor loading).
TEST_F(SafetensorsTest, FilledTensorsAndDroppedPagesReadTheSame) {
  std::vector<float> big(300000);
  for (size_t i = 0; i < big.size(); i++) big[i] = static_cast<float>(i) * 0.5f;
  SafetensorsWriter w;
  w.add("direct", StDType::kF32, {static_cast<int64_t>(big.size())}, big.data());
  w.add("filled", StDType::kF32, {static_cast<int64_t>(big.size())}, [&](std::span<std::byte> out) {
    EXPECT_EQ(out.size(), big.size() * 4);
    std::memcpy(out.data(), big.data(), out.size());
    return Status::OK();
  });
  w.add("small", StDType::kBF16, {2}, [](std::span<std::byte> out) {
    const bf16 v[2] = {f32_to_bf16(1.5f), f32_to_bf16(-2.0f)};
    std::memcpy(out.data(), v, out.size());
    return Status::OK();
  });
  ASSERT_TRUE(w.write(path("m.safetensors")).ok());
  Result<SafetensorsFile> f = SafetensorsFile::open(path("m.safetensors"));
  ASSERT_TRUE(f.ok()) << f.status().message();
  for (int pass = 0; pass < 2; pass++) {  // read_f32 drops the pages; the second pass faults them in again
    for (const char* name : {"direct", "filled"}) {
      std::vector<float> got(big.size());
      ASSERT_TRUE(f->read_f32(name, got).ok());
      EXPECT_EQ(got, big) << name;
    }
  }
  std::vector<float> small(2);
  ASSERT_TRUE(f->read_f32("small", small).ok());
  EXPECT_EQ(small, (std::vector<float>{1.5f, -2.0f}));
}

TEST_F(SafetensorsTest, AFailingFillWritesNothing) {
  SafetensorsWriter w;
  w.add("t", StDType::kF32, {4}, [](std::span<std::byte>) { return Status::IOError("the source went away"); });
  const Status st = w.write(path("m.safetensors"));
  EXPECT_EQ(st.code(), StatusCode::kIOError);
  EXPECT_TRUE(contains(st.message(), "tensor 't'"));
  EXPECT_FALSE(fs::exists(path("m.safetensors")));
  EXPECT_FALSE(fs::exists(path("m.safetensors.tmp")));
}

TEST_F(SafetensorsTest, WriteLeavesNoTmpFile) {
  SafetensorsWriter w;
  ASSERT_TRUE(w.write(path("m.safetensors")).ok());
  EXPECT_TRUE(fs::exists(path("m.safetensors")));
  EXPECT_FALSE(fs::exists(path("m.safetensors.tmp")));
}

TEST_F(SafetensorsTest, WriteReplacesExistingFile) {
  const float one = 1, two = 2;
  SafetensorsWriter first, second;
  first.add("old", StDType::kF32, {}, &one);
  second.add("new", StDType::kF32, {}, &two);
  ASSERT_TRUE(first.write(path("m.safetensors")).ok());
  ASSERT_TRUE(second.write(path("m.safetensors")).ok());
  Result<SafetensorsFile> f = SafetensorsFile::open(path("m.safetensors"));
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_EQ(f->find("old"), nullptr);
  EXPECT_NE(f->find("new"), nullptr);
}

TEST_F(SafetensorsTest, WriteToMissingFolderFails) {
  const std::string p = path("no/such/folder/m.safetensors");
  Status st = SafetensorsWriter().write(p);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), StatusCode::kIOError);
  EXPECT_TRUE(contains(st.message(), p));
  EXPECT_TRUE(contains(st.message(), "No such file"));
}

TEST_F(SafetensorsTest, MissingFile) {
  const std::string p = path("absent.safetensors");
  Result<SafetensorsFile> f = SafetensorsFile::open(p);
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(contains(f.status().message(), p));
}

TEST_F(SafetensorsTest, RejectsTruncatedHeaderLength) { expect_corrupt("\x10\0\0\0\0"sv, "shorter than the 8-byte"); }

TEST_F(SafetensorsTest, RejectsHeaderLongerThanFile) {
  std::string bytes = st_bytes("{}");
  bytes[0] = 100;
  expect_corrupt(bytes, "larger than the file");
}

TEST_F(SafetensorsTest, RejectsAbsurdHeaderLength) {
  std::string bytes = st_bytes("{}");
  bytes[5] = 1;  // 2^40
  expect_corrupt(bytes, "absurd");
}

// Issue #18 item 1: 50 MB of '[' took 3.8 GB and 15 s to refuse; the nesting
// is now counted before the parser builds anything.
TEST_F(SafetensorsTest, RejectsDeepNestingBeforeParsing) {
  const auto t0 = std::chrono::steady_clock::now();
  expect_corrupt(st_bytes(std::string(50'000'000, '[')), "nests deeper than 3 level(s) at byte 3");
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0);
  expect_corrupt(st_bytes(R"({"a": {"dtype": "F32", "shape": [[1]], "data_offsets": [0, 4]}})"), "nests deeper");
}

TEST_F(SafetensorsTest, RejectsLongArrays) {
  std::string shape = "[1";
  for (int i = 0; i < 64; i++) shape += ",1";
  expect_corrupt(st_bytes(R"({"a": {"dtype": "F32", "shape": )" + shape + R"(], "data_offsets": [0, 4]}})"),
                 "has more than 64 elements");
}

TEST_F(SafetensorsTest, BracketsInsideStringsAreNotNesting) {
  std::string name(100, '[');
  name += "\\\"{{";
  Result<SafetensorsFile> f = SafetensorsFile::parse(
      "x", to_bytes(st_bytes(R"({")" + name + R"(": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})", "abcd")));
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_EQ(f->tensors().size(), 1u);
}

TEST_F(SafetensorsTest, RejectsBadJson) { expect_corrupt(st_bytes(R"({"a": {"dtype": )"), "not valid JSON"); }

TEST_F(SafetensorsTest, RejectsHeaderNotObject) { expect_corrupt(st_bytes("[1, 2]"), "not a JSON object"); }

TEST_F(SafetensorsTest, RejectsEntryNotObject) { expect_corrupt(st_bytes(R"({"a": 3})"), "not a JSON object"); }

TEST_F(SafetensorsTest, RejectsMissingDtype) {
  expect_corrupt(st_bytes(R"({"a":{"shape":[1],"data_offsets":[0,4]}})", "0123"), "missing \"dtype\"");
}

TEST_F(SafetensorsTest, RejectsMissingShape) {
  expect_corrupt(st_bytes(R"({"a":{"dtype":"F32","data_offsets":[0,4]}})", "0123"), "missing \"shape\"");
}

TEST_F(SafetensorsTest, RejectsMissingDataOffsets) {
  expect_corrupt(st_bytes(R"({"a":{"dtype":"F32","shape":[1]}})", "0123"), "missing \"data_offsets\"");
}

TEST_F(SafetensorsTest, RejectsDtypeNotString) {
  expect_corrupt(st_bytes(R"({"a":{"dtype":4,"shape":[1],"data_offsets":[0,4]}})", "0123"), "not a string");
}

TEST_F(SafetensorsTest, RejectsShapeNotArray) {
  expect_corrupt(st_bytes(R"({"a":{"dtype":"F32","shape":"1","data_offsets":[0,4]}})", "0123"), "\"shape\" is not");
}

TEST_F(SafetensorsTest, RejectsFractionalDim) {
  expect_corrupt(st_bytes(R"({"a":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})", "0123"),
                 "not an array of integers");
}

TEST_F(SafetensorsTest, RejectsDataOffsetsNotPair) {
  expect_corrupt(st_bytes(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", "0123"), "two non-negative");
}

TEST_F(SafetensorsTest, RejectsNegativeOffsets) {
  expect_corrupt(st_bytes(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}})", "0123"), "non-negative");
}

TEST_F(SafetensorsTest, RejectsUnknownDtype) {
  expect_corrupt(st_bytes(R"({"a":{"dtype":"F8_E4M3","shape":[1],"data_offsets":[0,1]}})", "0"),
                 "unknown dtype 'F8_E4M3'");
}

TEST_F(SafetensorsTest, RejectsShapeMismatch) {
  expect_corrupt(st_bytes(R"({"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,12]}})", "0123456789ab"),
                 "shape mismatch");
}

TEST_F(SafetensorsTest, RejectsOffsetsOutsideFile) {
  expect_corrupt(st_bytes(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", "01234567"), "outside");
}

TEST_F(SafetensorsTest, RejectsReversedOffsets) {
  expect_corrupt(st_bytes(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[8,4]}})", "01234567"), "end before");
}

TEST_F(SafetensorsTest, RejectsOverlappingTensors) {
  const std::string header = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                             R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})";
  expect_corrupt(st_bytes(header, "0123456789ab"), "'a' [0, 8] and 'b' [4, 12] overlap");
}

TEST_F(SafetensorsTest, RejectsNegativeDim) {
  expect_corrupt(st_bytes(R"({"a":{"dtype":"F32","shape":[-1,2],"data_offsets":[0,0]}})"), "negative dimension -1");
}

TEST_F(SafetensorsTest, RejectsNumelOverflow) {
  expect_corrupt(st_bytes(R"({"a":{"dtype":"U8","shape":[4294967296,4294967296],"data_offsets":[0,0]}})"),
                 "overflows int64");
}

TEST_F(SafetensorsTest, RejectsByteSizeOverflow) {
  expect_corrupt(st_bytes(R"({"a":{"dtype":"F64","shape":[4611686018427387904],"data_offsets":[0,0]}})"),
                 "overflows uint64");
}

TEST_F(SafetensorsTest, RejectsMetadataWithNonStringValue) {
  expect_corrupt(st_bytes(R"({"__metadata__":{"step":42}})"), "__metadata__");
}

TEST_F(SafetensorsTest, ReadF32ConvertsBF16AndF16) {
  // F16 bit patterns and their exact float values.
  const uint16_t f16[] = {0x3c00, 0xc000, 0x3800, 0x7bff, 0x0001, 0x03ff, 0x8000, 0x7c00, 0xfc00};
  const float want16[] = {1.f, -2.f, 0.5f, 65504.f, std::ldexp(1.f, -24), std::ldexp(1023.f, -24), -0.f,
                          std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity()};
  const uint16_t bf[] = {0x3f80, 0xc040, 0x4049};  // 1, -3, 3.140625
  SafetensorsWriter w;
  w.add("h", StDType::kF16, {9}, f16);
  w.add("b", StDType::kBF16, {3}, bf);
  ASSERT_TRUE(w.write(path("m.safetensors")).ok());
  Result<SafetensorsFile> f = SafetensorsFile::open(path("m.safetensors"));
  ASSERT_TRUE(f.ok()) << f.status().message();

  std::vector<float> got(9);
  ASSERT_TRUE(f->read_f32("h", got).ok());
  for (size_t i = 0; i < 9; ++i) EXPECT_EQ(got[i], want16[i]) << "f16 bits " << std::hex << f16[i];
  EXPECT_TRUE(std::signbit(got[6]));
  EXPECT_TRUE(std::isnan(f16_to_f32(0x7e00)));
  got.resize(3);
  ASSERT_TRUE(f->read_f32("b", got).ok());
  EXPECT_EQ(got, (std::vector<float>{1.f, -3.f, 3.140625f}));
}

TEST_F(SafetensorsTest, ReadF32WrongSize) {
  const float x[4] = {};
  SafetensorsWriter w;
  w.add("x", StDType::kF32, {2, 2}, x);
  ASSERT_TRUE(w.write(path("m.safetensors")).ok());
  Result<SafetensorsFile> f = SafetensorsFile::open(path("m.safetensors"));
  ASSERT_TRUE(f.ok()) << f.status().message();
  std::vector<float> dst(5);
  Status st = f->read_f32("x", dst);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(contains(st.message(), "has 4 elements but the destination holds 5"));
}

TEST_F(SafetensorsTest, ReadF32RejectsIntegerTensor) {
  const int32_t x[2] = {1, 2};
  SafetensorsWriter w;
  w.add("x", StDType::kI32, {2}, x);
  ASSERT_TRUE(w.write(path("m.safetensors")).ok());
  Result<SafetensorsFile> f = SafetensorsFile::open(path("m.safetensors"));
  ASSERT_TRUE(f.ok()) << f.status().message();
  std::vector<float> dst(2);
  Status st = f->read_f32("x", dst);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(contains(st.message(), "dtype I32, not a float type"));
}

TEST_F(SafetensorsTest, ReadF32MissingTensor) {
  ASSERT_TRUE(SafetensorsWriter().write(path("m.safetensors")).ok());
  Result<SafetensorsFile> f = SafetensorsFile::open(path("m.safetensors"));
  ASSERT_TRUE(f.ok()) << f.status().message();
  Status st = f->read_f32("wte.weight", {});
  EXPECT_EQ(st.code(), StatusCode::kNotFound);
  EXPECT_TRUE(contains(st.message(), "no tensor named 'wte.weight'"));
  EXPECT_EQ(f->find("wte.weight"), nullptr);
}

TEST_F(SafetensorsTest, ParseNamesItsSourceInErrors) {
  Result<SafetensorsFile> f = SafetensorsFile::parse("in-memory", to_bytes("abc"));
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().message().rfind("in-memory: ", 0), 0u);
}

// Random single-byte corruptions and truncations of the header region: open()
// must answer OK or an error, and never read out of bounds (run under ASan).
TEST_F(SafetensorsTest, FuzzedHeaderNeverCrashes) {
  std::vector<float> a(6, 1.5f);
  std::vector<bf16> b(5, f32_to_bf16(2.f));
  const uint16_t h[3] = {0x3c00, 0, 0x7bff};
  const int32_t ids[2] = {7, 8};
  SafetensorsWriter w;
  w.set_metadata("format", "pt");
  w.add("h.0.attn.c_attn.weight", StDType::kF32, {2, 3}, a.data());
  w.add("ln_f.bias", StDType::kBF16, {5}, b.data());
  w.add("half", StDType::kF16, {3}, h);
  w.add("ids", StDType::kI32, {1, 2}, ids);
  ASSERT_TRUE(w.write(path("valid.safetensors")).ok());
  const std::string valid = read_all(path("valid.safetensors"));
  uint64_t header_len = 0;
  std::memcpy(&header_len, valid.data(), 8);
  const size_t region = 8 + header_len;

  std::mt19937 rng(20240520);
  const std::string_view interesting = "\"{}[]:,-0123456789eE.\\ \0\xff"sv;
  int accepted = 0, rejected = 0;
  for (int iter = 0; iter < 2000; ++iter) {
    std::string bytes = valid;
    switch (iter % 4) {
      case 0:
      case 1:
        bytes[rng() % region] = static_cast<char>(rng() & 0xff);
        break;
      case 2:
        bytes[rng() % region] = interesting[rng() % interesting.size()];
        break;
      case 3:
        bytes.resize(rng() % (region + 1));
        break;
    }
    Result<SafetensorsFile> f = (iter % 100 == 0) ? SafetensorsFile::open(write_file("fuzz.safetensors", bytes))
                                                  : SafetensorsFile::parse("fuzz", to_bytes(bytes));
    if (!f.ok()) {
      ++rejected;
      EXPECT_FALSE(f.status().message().empty());
      continue;
    }
    ++accepted;
    for (const TensorInfo& t : f->tensors()) {
      std::span<const std::byte> raw = f->raw(t);
      EXPECT_EQ(raw.size(), t.end - t.begin);
      if (t.dtype == StDType::kF32 || t.dtype == StDType::kBF16 || t.dtype == StDType::kF16) {
        std::vector<float> dst(static_cast<size_t>(t.numel()));
        EXPECT_TRUE(f->read_f32(t.name, dst).ok());
      }
    }
  }
  EXPECT_GT(accepted, 0);
  EXPECT_GT(rejected, 0);
}

}  // namespace
}  // namespace tessera::io
