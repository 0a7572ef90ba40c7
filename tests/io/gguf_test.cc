#include "io/gguf.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <random>

#include <gtest/gtest.h>

namespace tessera::io {
namespace {

namespace fs = std::filesystem;

constexpr const char* kMem = "mem.gguf";  // parse()'s name in messages

testing::AssertionResult contains(const std::string& text, std::string_view part) {
  if (text.find(part) != std::string::npos) return testing::AssertionSuccess();
  return testing::AssertionFailure() << "'" << text << "' does not contain '" << part << "'";
}

// An error, one line, starting with "<file>: ".
testing::AssertionResult one_line_error(const Status& st, std::string_view file) {
  if (st.ok()) return testing::AssertionFailure() << "expected an error, got OK";
  const std::string& m = st.message();
  if (m.find('\n') != std::string::npos || m.find('\r') != std::string::npos)
    return testing::AssertionFailure() << "message spans lines: " << m;
  if (m.rfind(std::string(file) + ": ", 0) != 0)
    return testing::AssertionFailure() << "message does not start with '" << file << ": ': " << m;
  return testing::AssertionSuccess();
}

// Little-endian GGUF bytes, built by hand (independent of GgufWriter).
struct Bytes {
  std::vector<uint8_t> b;
  template <typename T>
  Bytes& put(T v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    b.insert(b.end(), p, p + sizeof(T));
    return *this;
  }
  Bytes& u8(uint8_t v) { return put(v); }
  Bytes& u16(uint16_t v) { return put(v); }
  Bytes& u32(uint32_t v) { return put(v); }
  Bytes& u64(uint64_t v) { return put(v); }
  Bytes& str(std::string_view s) {
    u64(s.size());
    b.insert(b.end(), s.begin(), s.end());
    return *this;
  }
  Bytes& pad_to(size_t alignment) {
    while (b.size() % alignment != 0) b.push_back(0);
    return *this;
  }
  Bytes& zeros(size_t n) {
    b.resize(b.size() + n, 0);
    return *this;
  }
  std::vector<std::byte> vec() const {
    std::vector<std::byte> out(b.size());
    if (!b.empty()) std::memcpy(out.data(), b.data(), b.size());
    return out;
  }
};

Bytes header(uint64_t n_tensors, uint64_t n_kv, uint32_t version = 3) {
  Bytes h;
  h.u8('G').u8('G').u8('U').u8('F').u32(version).u64(n_tensors).u64(n_kv);
  return h;
}

// One F32 tensor info: name, 1 dim of n, offset.
Bytes& f32_info(Bytes& b, std::string_view name, uint64_t n, uint64_t offset) {
  return b.str(name).u32(1).u64(n).u32(0).u64(offset);
}

Result<GgufFile> parse(const Bytes& b) { return GgufFile::parse(kMem, b.vec()); }

// The file must be refused with one line naming it that contains `part`.
void expect_refused(const Bytes& b, std::string_view part) {
  Result<GgufFile> f = parse(b);
  ASSERT_FALSE(f.ok());
  EXPECT_TRUE(one_line_error(f.status(), kMem));
  EXPECT_TRUE(contains(f.status().message(), part));
}

bool same_value(const GgufValue& a, const GgufValue& b) {
  if (a.type != b.type) return false;
  switch (a.type) {
    case GgufType::kUint8: case GgufType::kUint16: case GgufType::kUint32: case GgufType::kUint64:
    case GgufType::kBool: return a.u == b.u;
    case GgufType::kInt8: case GgufType::kInt16: case GgufType::kInt32: case GgufType::kInt64: return a.i == b.i;
    case GgufType::kFloat32: case GgufType::kFloat64: return a.f == b.f;
    case GgufType::kString: return a.str == b.str;
    case GgufType::kArray:
      if (a.elem_type != b.elem_type || a.count != b.count) return false;
      if (a.raw != b.raw || a.strings != b.strings || a.arrays.size() != b.arrays.size()) return false;
      for (size_t k = 0; k < a.arrays.size(); ++k)
        if (!same_value(a.arrays[k], b.arrays[k])) return false;
      return true;
  }
  return false;
}

template <typename T>
std::vector<uint8_t> raw_of(std::initializer_list<T> v) {
  std::vector<uint8_t> out(v.size() * sizeof(T));
  std::memcpy(out.data(), std::data(v), out.size());
  return out;
}

// Q8_0 blocks: per block a fp16 scale (raw bits) and 32 codes.
std::vector<uint8_t> q8_0_blocks(const std::vector<std::pair<uint16_t, std::vector<int8_t>>>& blocks) {
  std::vector<uint8_t> out;
  for (const auto& [d, q] : blocks) {
    out.push_back(static_cast<uint8_t>(d & 0xff));
    out.push_back(static_cast<uint8_t>(d >> 8));
    for (int8_t x : q) out.push_back(static_cast<uint8_t>(x));
  }
  return out;
}

class GgufTest : public testing::Test {
 protected:
  void SetUp() override {
    const testing::TestInfo* info = testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::path(testing::TempDir()) / ("tessera_gguf_" + std::string(info->name()) + "_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(std::string_view name) const { return (dir_ / name).string(); }

  static std::vector<uint8_t> read_all(const std::string& p) {
    std::ifstream in(p, std::ios::binary);
    return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
  }

  // A small valid file with several kinds of metadata and three tensors.
  Bytes small_file() {
    GgufWriter w;
    w.set_string("general.architecture", "llama");
    w.set_uint32("llama.block_count", 2);
    w.set_float32("llama.rope.freq_base", 10000.f);
    w.set_bool("flag", true);
    w.set_string_array("tokenizer.ggml.tokens", {"<s>", "a", "bc"});
    const std::vector<int32_t> types = {1, 2, 3};
    w.set_int32_array("tokenizer.ggml.token_type", types);
    w.set("nested", GgufValue::array_of_arrays({GgufValue::array_of_int32(types)}));
    w.add_tensor("a", GgmlType::kF32, {3}, raw_of<float>({1.f, 2.f, 3.f}));
    w.add_tensor("h", GgmlType::kF16, {2}, raw_of<uint16_t>({0x3c00, 0xc000}));
    w.add_tensor("q", GgmlType::kQ8_0, {32}, q8_0_blocks({{0x3800, std::vector<int8_t>(32, 3)}}));
    const std::string p = path("small.gguf");
    EXPECT_TRUE(w.write(p).ok());
    Bytes b;
    b.b = read_all(p);
    return b;
  }

  fs::path dir_;
};

// ---- round trips ----

TEST_F(GgufTest, RoundTripsEveryMetadataType) {
  const std::vector<float> floats = {1.f, -0.5f};
  const std::vector<int32_t> ints = {-1, 0, 1};
  // Every value type, as a scalar and as an array, plus nesting and empties.
  const std::vector<GgufKv> values = {
      {"u8", GgufValue::from_uint(GgufType::kUint8, 200)},
      {"i8", GgufValue::from_int(GgufType::kInt8, -100)},
      {"u16", GgufValue::from_uint(GgufType::kUint16, 60000)},
      {"i16", GgufValue::from_int(GgufType::kInt16, -30000)},
      {"u32", GgufValue::from_uint(GgufType::kUint32, 4000000000u)},
      {"i32", GgufValue::from_int(GgufType::kInt32, -2000000000)},
      {"u64", GgufValue::from_uint(GgufType::kUint64, (uint64_t{1} << 63) + 5)},
      {"i64", GgufValue::from_int(GgufType::kInt64, std::numeric_limits<int64_t>::min())},
      {"f32", GgufValue::from_float(GgufType::kFloat32, 1.5)},
      {"f64", GgufValue::from_float(GgufType::kFloat64, 1e300)},
      {"bool", GgufValue::from_bool(false)},
      {"string", GgufValue::from_string("h\xc3\xa9llo\nworld")},
      {"empty_string", GgufValue::from_string("")},
      {"arr.u8", GgufValue::array_of_raw(GgufType::kUint8, {0, 1, 255})},
      {"arr.i8", GgufValue::array_of_raw(GgufType::kInt8, raw_of<int8_t>({-128, 0, 127}))},
      {"arr.u16", GgufValue::array_of_raw(GgufType::kUint16, raw_of<uint16_t>({1, 65535}))},
      {"arr.i16", GgufValue::array_of_raw(GgufType::kInt16, raw_of<int16_t>({-1, 2}))},
      {"arr.u32", GgufValue::array_of_raw(GgufType::kUint32, raw_of<uint32_t>({7, 4000000000u}))},
      {"arr.i32", GgufValue::array_of_raw(GgufType::kInt32, raw_of<int32_t>({-7, 8}))},
      {"arr.u64", GgufValue::array_of_raw(GgufType::kUint64, raw_of<uint64_t>({0, ~uint64_t{0}}))},
      {"arr.i64", GgufValue::array_of_raw(GgufType::kInt64, raw_of<int64_t>({-5, 5}))},
      {"arr.f32", GgufValue::array_of_raw(GgufType::kFloat32, raw_of<float>({0.25f, -1.f}))},
      {"arr.f64", GgufValue::array_of_raw(GgufType::kFloat64, raw_of<double>({0.125, 3e-300}))},
      {"arr.bool", GgufValue::array_of_raw(GgufType::kBool, {1, 0, 1})},
      {"arr.string", GgufValue::array_of_strings({"a", "", "ccc"})},
      {"arr.empty", GgufValue::array_of_raw(GgufType::kUint8, {})},
      {"arr.nested", GgufValue::array_of_arrays({GgufValue::array_of_raw(GgufType::kUint16, raw_of<uint16_t>({3})),
                                                 GgufValue::array_of_strings({"x", "y"}),
                                                 GgufValue::array_of_arrays({})})},
  };
  GgufWriter w;
  for (const GgufKv& kv : values) w.set(kv.key, kv.value);
  // The typed setters, and what each must read back as.
  w.set_string("s.string", "tessera");
  w.set_uint32("s.uint32", 123);
  w.set_uint64("s.uint64", uint64_t{1} << 40);
  w.set_int32("s.int32", -9);
  w.set_float32("s.float32", 0.1f);
  w.set_bool("s.bool", true);
  w.set_string_array("s.strings", {"<s>", "</s>"});
  w.set_float_array("s.floats", floats);
  w.set_int32_array("s.ints", ints);
  w.set_uint32("s.uint32", 124);  // replaces in place
  std::vector<GgufKv> all = values;
  all.push_back({"s.string", GgufValue::from_string("tessera")});
  all.push_back({"s.uint32", GgufValue::from_uint(GgufType::kUint32, 124)});
  all.push_back({"s.uint64", GgufValue::from_uint(GgufType::kUint64, uint64_t{1} << 40)});
  all.push_back({"s.int32", GgufValue::from_int(GgufType::kInt32, -9)});
  all.push_back({"s.float32", GgufValue::from_float(GgufType::kFloat32, 0.1f)});
  all.push_back({"s.bool", GgufValue::from_bool(true)});
  all.push_back({"s.strings", GgufValue::array_of_strings({"<s>", "</s>"})});
  all.push_back({"s.floats", GgufValue::array_of_floats(floats)});
  all.push_back({"s.ints", GgufValue::array_of_int32(ints)});

  const std::string p = path("meta.gguf");
  ASSERT_TRUE(w.write(p).ok());
  Result<GgufFile> f = GgufFile::open(p);
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->alignment(), 32u);
  EXPECT_TRUE(f->tensors().empty());

  // Every value, in the order first set, equal to what was set.
  ASSERT_EQ(f->metadata().size(), all.size());
  for (size_t k = 0; k < all.size(); ++k) {
    EXPECT_EQ(f->metadata()[k].key, all[k].key);
    EXPECT_TRUE(same_value(f->metadata()[k].value, all[k].value)) << all[k].key;
    EXPECT_EQ(f->find(all[k].key), &f->metadata()[k].value);
  }

  // Typed getters.
  EXPECT_EQ(*f->get_uint("u8"), 200u);
  EXPECT_EQ(*f->get_uint("u16"), 60000u);
  EXPECT_EQ(*f->get_uint("u32"), 4000000000u);
  EXPECT_EQ(*f->get_uint("u64"), (uint64_t{1} << 63) + 5);
  EXPECT_EQ(*f->get_uint("s.uint32"), 124u);
  EXPECT_EQ(*f->get_uint("s.uint64"), uint64_t{1} << 40);
  EXPECT_EQ(*f->get_int("i8"), -100);
  EXPECT_EQ(*f->get_int("i16"), -30000);
  EXPECT_EQ(*f->get_int("i32"), -2000000000);
  EXPECT_EQ(*f->get_int("s.int32"), -9);
  EXPECT_EQ(*f->get_int("u32"), 4000000000);
  EXPECT_EQ(*f->get_float("f32"), 1.5);
  EXPECT_EQ(*f->get_float("f64"), 1e300);
  EXPECT_EQ(*f->get_float("s.float32"), static_cast<double>(0.1f));
  EXPECT_EQ(*f->get_bool("bool"), false);
  EXPECT_EQ(*f->get_bool("s.bool"), true);
  EXPECT_EQ(*f->get_string("string"), "h\xc3\xa9llo\nworld");
  EXPECT_EQ(*f->get_string("empty_string"), "");
  EXPECT_EQ(*f->get_string("s.string"), "tessera");
  Result<std::span<const std::string>> strs = f->get_string_array("arr.string");
  ASSERT_TRUE(strs.ok());
  EXPECT_EQ(std::vector<std::string>(strs->begin(), strs->end()), (std::vector<std::string>{"a", "", "ccc"}));
  EXPECT_EQ(f->get_string_array("s.strings")->size(), 2u);
  EXPECT_EQ(*f->get_float_array("arr.f32"), (std::vector<float>{0.25f, -1.f}));
  EXPECT_EQ(*f->get_float_array("arr.f64"), (std::vector<float>{0.125f, static_cast<float>(3e-300)}));
  EXPECT_EQ(*f->get_float_array("s.floats"), floats);
  EXPECT_EQ(*f->get_int_array("arr.i8"), (std::vector<int64_t>{-128, 0, 127}));
  EXPECT_EQ(*f->get_int_array("arr.u32"), (std::vector<int64_t>{7, 4000000000}));
  EXPECT_EQ(*f->get_int_array("s.ints"), (std::vector<int64_t>{-1, 0, 1}));
  EXPECT_TRUE(f->get_int_array("arr.empty")->empty());
  EXPECT_TRUE(f->has("arr.u8"));
  EXPECT_FALSE(f->has("absent"));
}

TEST_F(GgufTest, RoundTripsF32F16AndQ8_0Tensors) {
  const std::vector<uint8_t> a = raw_of<float>({1.f, -2.5f, 3.25f, 0.f, 1e-3f, 7e5f});      // ne {3, 2}
  const std::vector<uint8_t> h = raw_of<uint16_t>({0x3c00, 0x3800, 0xc000, 0x0000, 0x7bff});  // ne {5}
  std::vector<uint8_t> q;
  std::mt19937 rng(7);
  for (int k = 0; k < 2 * 2 * 34; ++k) q.push_back(static_cast<uint8_t>(rng()));  // ne {64, 2}: 4 blocks
  GgufWriter w;
  w.set_string("general.architecture", "test");
  w.add_tensor("a", GgmlType::kF32, {3, 2}, a);
  w.add_tensor("h", GgmlType::kF16, {5}, h);
  w.add_tensor("q", GgmlType::kQ8_0, {64, 2}, q);
  const std::string p = path("t.gguf");
  ASSERT_TRUE(w.write(p).ok());
  EXPECT_FALSE(fs::exists(p + ".tmp"));

  Result<GgufFile> f = GgufFile::open(p);
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_EQ(f->path(), p);
  ASSERT_EQ(f->tensors().size(), 3u);
  const std::vector<std::pair<std::string, const std::vector<uint8_t>*>> want = {{"a", &a}, {"h", &h}, {"q", &q}};
  for (size_t k = 0; k < want.size(); ++k) {
    const GgufTensorInfo& t = f->tensors()[k];
    EXPECT_EQ(t.name, want[k].first);
    EXPECT_EQ(f->find_tensor(t.name), &t);
    EXPECT_EQ(t.offset % 32, 0u) << t.name;
    EXPECT_GE(t.offset, f->data_offset());
    std::span<const uint8_t> got = f->tensor_bytes(t);
    EXPECT_EQ(std::vector<uint8_t>(got.begin(), got.end()), *want[k].second) << t.name;
  }
  const GgufTensorInfo* ta = f->find_tensor("a");
  EXPECT_EQ(ta->type, GgmlType::kF32);
  EXPECT_EQ(ta->ne, (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(ta->shape(), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(ta->numel(), 6);
  EXPECT_EQ(ta->bytes, 24u);
  EXPECT_EQ(f->find_tensor("q")->bytes, 4u * 34);
  EXPECT_EQ(f->find_tensor("q")->type, GgmlType::kQ8_0);
  EXPECT_EQ(f->find_tensor("absent"), nullptr);

  std::vector<float> got(6);
  ASSERT_TRUE(f->read_f32("a", got).ok());
  EXPECT_EQ(got, (std::vector<float>{1.f, -2.5f, 3.25f, 0.f, 1e-3f, 7e5f}));
}

TEST_F(GgufTest, StreamedTensorsAreWrittenOneAtATime) {
  GgufWriter w;
  int calls = 0;
  for (int k = 0; k < 3; ++k) {
    w.add_tensor("t" + std::to_string(k), GgmlType::kF32, {static_cast<int64_t>(5 + k)},
                 [k, &calls](std::span<uint8_t> out) {
                   ++calls;
                   EXPECT_EQ(out.size(), 4u * (5 + k));
                   for (size_t j = 0; j < out.size() / 4; ++j) {
                     const float x = static_cast<float>(100 * k + j);
                     std::memcpy(out.data() + 4 * j, &x, 4);
                   }
                   return Status::OK();
                 });
  }
  const std::string p = path("s.gguf");
  ASSERT_TRUE(w.write(p).ok());
  EXPECT_EQ(calls, 3);
  Result<GgufFile> f = GgufFile::open(p);
  ASSERT_TRUE(f.ok()) << f.status().message();
  for (int k = 0; k < 3; ++k) {
    std::vector<float> got(5 + k);
    ASSERT_TRUE(f->read_f32("t" + std::to_string(k), got).ok());
    for (size_t j = 0; j < got.size(); ++j) EXPECT_EQ(got[j], static_cast<float>(100 * k + j));
  }
}

// ---- conversions ----

TEST_F(GgufTest, ReadF32ConvertsF16) {
  // Hand-computed halves: 1, -2, 1/3 rounded, the smallest subnormal, the
  // largest normal, -inf, -0, 0.5.
  Bytes b = header(1, 0);
  f32_info(b, "h", 8, 0);
  b.b[b.b.size() - 12] = 1;  // the type field of the info: F16
  b.pad_to(32);
  for (uint16_t x : {0x3c00, 0xc000, 0x3555, 0x0001, 0x7bff, 0xfc00, 0x8000, 0x3800}) b.u16(x);
  Result<GgufFile> f = parse(b);
  ASSERT_TRUE(f.ok()) << f.status().message();
  ASSERT_EQ(f->find_tensor("h")->type, GgmlType::kF16);
  std::vector<float> got(8);
  ASSERT_TRUE(f->read_f32("h", got).ok());
  EXPECT_EQ(got[0], 1.f);
  EXPECT_EQ(got[1], -2.f);
  EXPECT_EQ(got[2], 0.333251953125f);
  EXPECT_EQ(got[3], 5.9604644775390625e-08f);  // 2^-24
  EXPECT_EQ(got[4], 65504.f);
  EXPECT_TRUE(std::isinf(got[5]) && got[5] < 0);
  EXPECT_TRUE(got[6] == 0.f && std::signbit(got[6]));
  EXPECT_EQ(got[7], 0.5f);
}

TEST_F(GgufTest, ReadF32ConvertsBF16) {
  GgufWriter w;
  w.add_tensor("b", GgmlType::kBF16, {3}, raw_of<uint16_t>({0x3f80, 0xc0a0, 0x3e20}));
  ASSERT_TRUE(w.write(path("b.gguf")).ok());
  Result<GgufFile> f = GgufFile::open(path("b.gguf"));
  ASSERT_TRUE(f.ok()) << f.status().message();
  std::vector<float> got(3);
  ASSERT_TRUE(f->read_f32("b", got).ok());
  EXPECT_EQ(got, (std::vector<float>{1.f, -5.f, 0.15625f}));
}

TEST_F(GgufTest, ReadF32DequantizesQ8_0) {
  // Block 0: d = 0.5 (0x3800), q = k - 16. Block 1: d = -2 (0xc000), q =
  // -128, 127, then 0, 1, 2, ...
  std::vector<int8_t> q0(32), q1(32);
  for (int k = 0; k < 32; ++k) q0[k] = static_cast<int8_t>(k - 16);
  q1[0] = -128;
  q1[1] = 127;
  for (int k = 2; k < 32; ++k) q1[k] = static_cast<int8_t>(k - 2);
  GgufWriter w;
  w.add_tensor("q", GgmlType::kQ8_0, {32, 2}, q8_0_blocks({{0x3800, q0}, {0xc000, q1}}));
  ASSERT_TRUE(w.write(path("q.gguf")).ok());
  Result<GgufFile> f = GgufFile::open(path("q.gguf"));
  ASSERT_TRUE(f.ok()) << f.status().message();
  std::vector<float> got(64);
  ASSERT_TRUE(f->read_f32("q", got).ok());
  for (int k = 0; k < 32; ++k) EXPECT_EQ(got[k], 0.5f * (k - 16)) << k;
  EXPECT_EQ(got[32], 256.f);
  EXPECT_EQ(got[33], -254.f);
  for (int k = 2; k < 32; ++k) EXPECT_EQ(got[32 + k], -2.f * (k - 2)) << k;
}

// read_f32_rows: any run of whole rows equals that slice of read_f32 (Q8_0
// rows of 64, two blocks each; F32 rows of 3); a run past the tensor, a
// negative first row or a part of a row is refused in one line.
TEST_F(GgufTest, ReadF32RowsReadsWholeRowsOfTheTensor) {
  std::vector<std::pair<uint16_t, std::vector<int8_t>>> blocks;
  for (int b = 0; b < 8; ++b) {
    std::vector<int8_t> q(32);
    for (int k = 0; k < 32; ++k) q[k] = static_cast<int8_t>((b * 37 + k * 11) % 255 - 127);
    blocks.push_back({static_cast<uint16_t>(0x3800 + b), q});
  }
  GgufWriter w;
  w.add_tensor("q", GgmlType::kQ8_0, {64, 4}, q8_0_blocks(blocks));
  w.add_tensor("a", GgmlType::kF32, {3, 2}, raw_of<float>({1.f, 2.f, 3.f, 4.f, 5.f, 6.f}));
  ASSERT_TRUE(w.write(path("rows.gguf")).ok());
  Result<GgufFile> f = GgufFile::open(path("rows.gguf"));
  ASSERT_TRUE(f.ok()) << f.status().message();
  std::vector<float> whole(256);
  ASSERT_TRUE(f->read_f32("q", whole).ok());
  const GgufTensorInfo& q = *f->find_tensor("q");
  for (int r0 = 0; r0 <= 4; ++r0)
    for (int n = 0; r0 + n <= 4; ++n) {
      std::vector<float> got(64 * n, -1.f);
      ASSERT_TRUE(f->read_f32_rows(q, r0, got).ok()) << r0 << " " << n;
      EXPECT_EQ(got, std::vector<float>(whole.begin() + 64 * r0, whole.begin() + 64 * (r0 + n))) << r0 << " " << n;
    }
  std::vector<float> row(3);
  ASSERT_TRUE(f->read_f32_rows(*f->find_tensor("a"), 1, row).ok());
  EXPECT_EQ(row, (std::vector<float>{4.f, 5.f, 6.f}));
  std::vector<float> two(128), part(32);
  for (auto [r0, dst] : {std::pair{3, &two}, std::pair{-1, &two}, std::pair{0, &part}}) {
    Status st = f->read_f32_rows(q, r0, *dst);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << r0;
    EXPECT_TRUE(one_line_error(st, path("rows.gguf")));
    EXPECT_TRUE(contains(st.message(), "are not whole rows inside it")) << st.message();
  }
}

TEST_F(GgufTest, ReadF32RefusesOtherTypesNamingTensorAndType) {
  GgufWriter w;
  w.add_tensor("blk.0.ffn_up.weight", GgmlType::kQ4_K, {256}, std::vector<uint8_t>(144, 0));
  ASSERT_TRUE(w.write(path("k.gguf")).ok());
  Result<GgufFile> f = GgufFile::open(path("k.gguf"));
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_EQ(f->find_tensor("blk.0.ffn_up.weight")->bytes, 144u);
  std::vector<float> got(256);
  Status st = f->read_f32("blk.0.ffn_up.weight", got);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(one_line_error(st, path("k.gguf")));
  EXPECT_TRUE(contains(st.message(), "'blk.0.ffn_up.weight' is Q4_K"));
}

TEST_F(GgufTest, ReadF32RefusesWrongSizeAndAbsentTensor) {
  Bytes b = header(1, 0);
  f32_info(b, "a", 2, 0).pad_to(32).zeros(8);
  Result<GgufFile> f = parse(b);
  ASSERT_TRUE(f.ok()) << f.status().message();
  std::vector<float> got(3);
  Status st = f->read_f32("a", got);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(one_line_error(st, kMem));
  EXPECT_TRUE(contains(st.message(), "2 elements but the destination holds 3"));
  st = f->read_f32("nope", got);
  EXPECT_EQ(st.code(), StatusCode::kNotFound);
  EXPECT_TRUE(one_line_error(st, kMem));
}

TEST(GgmlTypes, NamesAndBlockSizes) {
  EXPECT_EQ(ggml_type_name(GgmlType::kF32), "F32");
  EXPECT_EQ(ggml_type_name(GgmlType::kQ4_K), "Q4_K");
  EXPECT_EQ(ggml_type_name(GgmlType::kBF16), "BF16");
  EXPECT_EQ(ggml_type_name(99), "type 99");
  EXPECT_EQ(ggml_type_name(4), "type 4");  // Q4_2, removed from ggml
  EXPECT_FALSE(ggml_type_known(31));
  EXPECT_TRUE(ggml_type_known(39));
  const std::vector<std::tuple<GgmlType, uint32_t, uint32_t>> sizes = {
      {GgmlType::kF32, 1, 4},     {GgmlType::kF16, 1, 2},     {GgmlType::kQ4_0, 32, 18},  {GgmlType::kQ4_1, 32, 20},
      {GgmlType::kQ5_0, 32, 22},  {GgmlType::kQ5_1, 32, 24},  {GgmlType::kQ8_0, 32, 34},  {GgmlType::kQ8_1, 32, 36},
      {GgmlType::kQ2_K, 256, 84}, {GgmlType::kQ3_K, 256, 110}, {GgmlType::kQ4_K, 256, 144},
      {GgmlType::kQ5_K, 256, 176}, {GgmlType::kQ6_K, 256, 210}, {GgmlType::kQ8_K, 256, 292},
      {GgmlType::kI8, 1, 1},      {GgmlType::kI16, 1, 2},     {GgmlType::kI32, 1, 4},     {GgmlType::kI64, 1, 8},
      {GgmlType::kF64, 1, 8},     {GgmlType::kBF16, 1, 2},    {GgmlType::kIQ4_XS, 256, 136},
      {GgmlType::kMXFP4, 32, 17}};
  for (const auto& [t, elems, bytes] : sizes) {
    EXPECT_EQ(ggml_block_elems(t), elems) << ggml_type_name(t);
    EXPECT_EQ(ggml_block_bytes(t), bytes) << ggml_type_name(t);
  }
  EXPECT_EQ(gguf_type_name(GgufType::kString), "string");
  EXPECT_EQ(gguf_type_name(13), "type 13");
}

// ---- the byte layout ----

TEST_F(GgufTest, HandBuiltFileMatchesTheWritersBytes) {
  // Header, two metadata entries, one 2x4 F32 tensor (ne = {4, 2}), padding
  // to 32, the data: exactly what the spec lays out.
  Bytes b = header(1, 2);
  b.str("general.architecture").u32(8).str("llama");
  b.str("general.alignment").u32(4).u32(32);
  b.str("w").u32(2).u64(4).u64(2).u32(0).u64(0);
  const size_t infos_end = b.b.size();
  b.pad_to(32);
  const size_t data_start = b.b.size();
  for (int k = 0; k < 8; ++k) b.put<float>(static_cast<float>(k) - 3.5f);

  // Spot checks of the layout itself.
  EXPECT_EQ(std::string(b.b.begin(), b.b.begin() + 4), "GGUF");
  EXPECT_EQ(b.b[4], 3);
  EXPECT_EQ(b.b[8], 1);   // tensor count, low byte
  EXPECT_EQ(b.b[16], 2);  // kv count, low byte
  EXPECT_EQ(infos_end, 24u + (8 + 20 + 4 + 8 + 5) + (8 + 17 + 4 + 4) + (8 + 1 + 4 + 16 + 4 + 8));
  EXPECT_EQ(data_start, 160u);

  Result<GgufFile> f = parse(b);
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->alignment(), 32u);
  EXPECT_EQ(f->data_offset(), data_start);
  EXPECT_EQ(*f->get_string("general.architecture"), "llama");
  const GgufTensorInfo& t = f->tensors().at(0);
  EXPECT_EQ(t.ne, (std::vector<int64_t>{4, 2}));
  EXPECT_EQ(t.shape(), (std::vector<int64_t>{2, 4}));
  EXPECT_EQ(t.offset, data_start);
  EXPECT_EQ(t.bytes, 32u);
  std::vector<float> got(8);
  ASSERT_TRUE(f->read_f32("w", got).ok());
  for (int k = 0; k < 8; ++k) EXPECT_EQ(got[k], static_cast<float>(k) - 3.5f);

  // The writer produces the same bytes.
  GgufWriter w;
  w.set_string("general.architecture", "llama");
  w.set_uint32("general.alignment", 32);
  w.add_tensor("w", GgmlType::kF32, {4, 2}, std::vector<uint8_t>(b.b.begin() + data_start, b.b.end()));
  ASSERT_TRUE(w.write(path("w.gguf")).ok());
  EXPECT_EQ(read_all(path("w.gguf")), b.b);
}

TEST_F(GgufTest, WriterPadsDataSectionAndEveryTensorWithZeros) {
  GgufWriter w;
  w.set_uint32("general.alignment", 64);
  w.add_tensor("a", GgmlType::kF32, {3}, raw_of<float>({1.f, 2.f, 3.f}));  // 12 bytes
  w.add_tensor("b", GgmlType::kI8, {5}, std::vector<uint8_t>{1, 2, 3, 4, 5});
  const std::string p = path("pad.gguf");
  ASSERT_TRUE(w.write(p).ok());
  const std::vector<uint8_t> bytes = read_all(p);
  Result<GgufFile> f = GgufFile::open(p);
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_EQ(f->alignment(), 64u);
  EXPECT_EQ(f->data_offset() % 64, 0u);
  const GgufTensorInfo* a = f->find_tensor("a");
  const GgufTensorInfo* b = f->find_tensor("b");
  EXPECT_EQ(a->offset, f->data_offset());
  EXPECT_EQ(b->offset, a->offset + 64);
  EXPECT_EQ(bytes.size(), b->offset + 64);  // the last tensor is padded too
  for (uint64_t k = a->offset + 12; k < b->offset; ++k) EXPECT_EQ(bytes[k], 0) << k;
  for (uint64_t k = b->offset + 5; k < bytes.size(); ++k) EXPECT_EQ(bytes[k], 0) << k;
}

TEST_F(GgufTest, Version2IsAccepted) {
  Bytes b = header(0, 1, /*version=*/2);
  b.str("general.name").u32(8).str("v2");
  Result<GgufFile> f = parse(b);
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_EQ(f->version(), 2u);
}

TEST_F(GgufTest, ZeroElementTensorIsAccepted) {
  Bytes b = header(2, 0);
  b.str("empty").u32(2).u64(0).u64(4).u32(0).u64(0);
  f32_info(b, "a", 1, 0).pad_to(32).zeros(4);  // shares offset 0: the empty one owns no bytes
  Result<GgufFile> f = parse(b);
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_EQ(f->find_tensor("empty")->numel(), 0);
  EXPECT_EQ(f->find_tensor("empty")->bytes, 0u);
  std::vector<float> none;
  EXPECT_TRUE(f->read_f32("empty", none).ok());
}

TEST_F(GgufTest, NestedArraysUpToEightLevelsAreAccepted) {
  auto nested = [](int levels) {
    Bytes b = header(0, 1);
    b.str("deep").u32(9);
    for (int k = 0; k < levels; ++k) b.u32(k + 1 < levels ? 9 : 0).u64(k + 1 < levels ? 1 : 0);
    return b;
  };
  Result<GgufFile> f = parse(nested(8));
  ASSERT_TRUE(f.ok()) << f.status().message();
  expect_refused(nested(9), "arrays nest deeper than 8 levels");
}

// ---- refusals ----

TEST_F(GgufTest, BadMagic) {
  Bytes b;
  b.u8('G').u8('G').u8('J').u8('T').u32(3).u64(0).u64(0);
  expect_refused(b, "not a GGUF file: it starts with 'GGJT' (47 47 4a 54)");
}

TEST_F(GgufTest, TooShortForHeader) {
  expect_refused(Bytes{}, "file is 0 bytes, shorter than the 24-byte GGUF header");
  Bytes b;
  b.u8('G').u8('G').u8('U').u8('F').u32(3);
  expect_refused(b, "file is 8 bytes");
}

TEST_F(GgufTest, UnsupportedVersions) {
  expect_refused(header(0, 0, 1), "version 1");
  expect_refused(header(0, 0, 4), "unsupported GGUF version 4");
  expect_refused(header(0, 0, 0), "unsupported GGUF version 0");
  expect_refused(header(0, 0, 0x03000000), "big-endian");
}

TEST_F(GgufTest, HugeKvCount) { expect_refused(header(0, uint64_t{1} << 62), "metadata count 4611686018427387904 cannot fit"); }

TEST_F(GgufTest, HugeTensorCount) {
  expect_refused(header(uint64_t{1} << 60, 0), "tensor count 1152921504606846976 cannot fit");
  expect_refused(header(~uint64_t{0}, 0), "tensor count 18446744073709551615 cannot fit");
}

TEST_F(GgufTest, HugeStringLength) {
  Bytes key = header(0, 1);
  key.u64(uint64_t{1} << 60).zeros(16);
  expect_refused(key, "metadata entry 0: the key is 1152921504606846976 bytes long, more than the limit of 65535");
  Bytes value = header(0, 1);
  value.str("k").u32(8).u64(uint64_t{1} << 60);
  expect_refused(value, "key 'k': the string is 1152921504606846976 bytes long, more than the limit");
  Bytes under_limit = header(0, 1);
  under_limit.str("k").u32(8).u64(uint64_t{1} << 29).zeros(10);
  expect_refused(under_limit, "key 'k': the string is 536870912 bytes long but only 10 bytes are left");
}

TEST_F(GgufTest, HugeArrayCount) {
  Bytes b = header(0, 1);
  b.str("k").u32(9).u32(0).u64(uint64_t{1} << 60).zeros(8);
  expect_refused(b, "key 'k': array of 1152921504606846976 u8 cannot fit in the 8 bytes left");
  Bytes strings = header(0, 1);
  strings.str("k").u32(9).u32(8).u64(1000).zeros(64);  // 1000 strings need at least 8000 bytes
  expect_refused(strings, "array of 1000 string cannot fit");
  Bytes element = header(0, 1);
  element.str("k").u32(9).u32(8).u64(2).str("ok").u64(uint64_t{1} << 40);
  expect_refused(element, "key 'k': element 1: the string is 1099511627776 bytes long");
}

TEST_F(GgufTest, UnknownValueType) {
  Bytes b = header(0, 1);
  b.str("k").u32(13).u32(0);
  expect_refused(b, "key 'k': unknown value type 13");
  Bytes arr = header(0, 1);
  arr.str("k").u32(9).u32(99).u64(0);
  expect_refused(arr, "key 'k': array of unknown value type 99");
}

TEST_F(GgufTest, BoolNotZeroOrOne) {
  Bytes b = header(0, 1);
  b.str("k").u32(7).u8(2);
  expect_refused(b, "key 'k': bool value 2 is not 0 or 1");
}

TEST_F(GgufTest, EmptyKeyAndDuplicateKey) {
  Bytes empty = header(0, 1);
  empty.str("").u32(0).u8(1).zeros(8);  // room enough that the count passes the size bound
  expect_refused(empty, "metadata entry 0 has an empty key");
  Bytes dup = header(0, 2);
  dup.str("a.b").u32(0).u8(1).str("a.b").u32(4).u32(2);
  expect_refused(dup, "duplicate key 'a.b'");
}

TEST_F(GgufTest, KeysInMessagesAreEscaped) {
  Bytes b = header(0, 2);
  b.str("line\nbreak").u32(0).u8(1).str("line\nbreak").u32(0).u8(1);
  expect_refused(b, "duplicate key 'line\\x0abreak'");
}

TEST_F(GgufTest, TruncatedValue) {
  Bytes b = header(0, 1);
  b.str("k").u32(10).u32(7);  // a u64 with 4 bytes left
  expect_refused(b, "key 'k': file ends inside a u64 value");
}

TEST_F(GgufTest, NDims5) {
  Bytes b = header(1, 0);
  b.str("t").u32(5);
  for (int k = 0; k < 5; ++k) b.u64(1);
  b.u32(0).u64(0).pad_to(32).zeros(4);
  expect_refused(b, "tensor 't': 5 dimensions, more than 4");
}

TEST_F(GgufTest, NegativeDimension) {
  Bytes b = header(1, 0);
  b.str("t").u32(2).u64(4).u64(~uint64_t{0}).u32(0).u64(0);
  expect_refused(b, "tensor 't': ne[1] is -1, negative");
}

TEST_F(GgufTest, ElementCountOverflow) {
  Bytes b = header(1, 0);
  b.str("t").u32(3).u64(uint64_t{1} << 32).u64(uint64_t{1} << 31).u64(4).u32(0).u64(0);
  expect_refused(b, "tensor 't': element count");
}

TEST_F(GgufTest, UnknownGgmlType) {
  Bytes b = header(1, 0);
  b.str("blk.0.attn_q.weight").u32(1).u64(32).u32(99).u64(0);
  expect_refused(b, "tensor 'blk.0.attn_q.weight': unknown ggml type 99");
  Bytes removed = header(1, 0);
  removed.str("t").u32(1).u64(32).u32(4).u64(0);
  expect_refused(removed, "tensor 't': unknown ggml type 4");
}

TEST_F(GgufTest, RowNotAMultipleOfTheBlock) {
  Bytes b = header(1, 0);
  b.str("t").u32(2).u64(33).u64(2).u32(8).u64(0);
  expect_refused(b, "tensor 't': ne[0] = 33 is not a multiple of Q8_0's block of 32 elements");
}

TEST_F(GgufTest, MisalignedOffset) {
  Bytes b = header(2, 0);
  f32_info(b, "a", 4, 0);
  f32_info(b, "b", 4, 16).pad_to(32).zeros(64);
  expect_refused(b, "tensor 'b': offset 16 is not a multiple of the alignment 32");
}

TEST_F(GgufTest, OffsetPastTheEnd) {
  Bytes b = header(1, 0);
  f32_info(b, "a", 4, uint64_t{1} << 40).pad_to(32).zeros(16);
  expect_refused(b, "tensor 'a': its 16 bytes at offset 1099511627776");
  Bytes wrap = header(1, 0);  // offset + size wraps around 2^64
  f32_info(wrap, "a", 16, ~uint64_t{0} - 31).pad_to(32).zeros(64);
  expect_refused(wrap, "run past the end of the file");
  Bytes partly = header(1, 0);  // the last bytes are missing
  f32_info(partly, "a", 4, 0).pad_to(32).zeros(12);
  expect_refused(partly, "tensor 'a': its 16 bytes at offset 0");
}

TEST_F(GgufTest, DataSectionPastTheEnd) {
  Bytes b = header(1, 0);
  b.str("empty").u32(1).u64(0).u32(0).u64(0);  // 61 bytes: the data section would start at 64
  expect_refused(b, "the data section would start at byte 64, past the end of the file (61 bytes)");
}

TEST_F(GgufTest, OverlappingTensors) {
  Bytes b = header(2, 0);
  f32_info(b, "a", 16, 0);
  f32_info(b, "b", 16, 32).pad_to(32).zeros(96);
  expect_refused(b, "tensors 'a' (bytes [");
  expect_refused(b, "and 'b' (bytes [");
}

TEST_F(GgufTest, DuplicateTensorNameAndEmptyName) {
  Bytes b = header(2, 0);
  f32_info(b, "w", 8, 0);
  f32_info(b, "w", 8, 32).pad_to(32).zeros(64);
  expect_refused(b, "duplicate tensor name 'w'");
  Bytes empty = header(1, 0);
  f32_info(empty, "", 8, 0).pad_to(32).zeros(32);
  expect_refused(empty, "tensor 0 has an empty name");
}

TEST_F(GgufTest, BadAlignment) {
  for (uint32_t a : {0u, 3u, 48u}) {
    Bytes b = header(0, 1);
    b.str("general.alignment").u32(4).u32(a);
    expect_refused(b, "general.alignment " + std::to_string(a) + " is not a power of two");
  }
  Bytes wrong_type = header(0, 1);
  wrong_type.str("general.alignment").u32(10).u64(32);
  expect_refused(wrong_type, "general.alignment is u64, not u32");
}

TEST_F(GgufTest, AlignmentFromMetadataPlacesTheData) {
  Bytes b = header(1, 1);
  b.str("general.alignment").u32(4).u32(128);
  f32_info(b, "a", 2, 0);
  const size_t end = b.b.size();
  b.pad_to(128).put<float>(1.f).put<float>(2.f);
  Result<GgufFile> f = parse(b);
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_EQ(f->alignment(), 128u);
  EXPECT_EQ(f->data_offset(), (end + 127) / 128 * 128);
  std::vector<float> got(2);
  ASSERT_TRUE(f->read_f32("a", got).ok());
  EXPECT_EQ(got, (std::vector<float>{1.f, 2.f}));
}

// ---- fuzzing ----

TEST_F(GgufTest, TruncationAtEveryByteIsAnError) {
  const Bytes full = small_file();
  Result<GgufFile> whole = parse(full);
  ASSERT_TRUE(whole.ok()) << whole.status().message();
  uint64_t data_end = 0;  // the file is valid from here on (what follows is the last tensor's padding)
  for (const GgufTensorInfo& t : whole->tensors()) data_end = std::max(data_end, t.offset + t.bytes);
  for (size_t n = 0; n < full.b.size(); ++n) {
    Bytes cut;
    cut.b.assign(full.b.begin(), full.b.begin() + n);
    Result<GgufFile> f = parse(cut);
    if (n < data_end) {
      EXPECT_TRUE(one_line_error(f.status(), kMem)) << "truncated at " << n;
    } else {
      EXPECT_TRUE(f.ok()) << "truncated at " << n << ": " << f.status().message();
    }
  }
}

TEST_F(GgufTest, RandomByteFlipsNeverCrash) {
  const Bytes full = small_file();
  Result<GgufFile> whole = parse(full);
  ASSERT_TRUE(whole.ok()) << whole.status().message();
  const size_t meta_end = whole->data_offset();
  std::mt19937 rng(20240611);
  int parsed = 0;
  for (int iter = 0; iter < 4000; ++iter) {
    Bytes b = full;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < flips; ++k) {
      // Mostly the metadata and tensor infos, where the structure is.
      const size_t pos = rng() % 10 < 9 ? rng() % meta_end : rng() % b.b.size();
      switch (rng() % 4) {
        case 0: b.b[pos] = static_cast<uint8_t>(rng()); break;
        case 1: b.b[pos] ^= static_cast<uint8_t>(1u << (rng() % 8)); break;
        case 2: b.b[pos] = 0xff; break;
        default: b.b[pos] = 0; break;
      }
    }
    Result<GgufFile> f = parse(b);
    if (!f.ok()) {
      ASSERT_TRUE(one_line_error(f.status(), kMem)) << "iteration " << iter;
      continue;
    }
    ++parsed;
    // Whatever parsed must be safe to read in full.
    for (const GgufKv& kv : f->metadata()) {
      (void)f->get_uint(kv.key);
      (void)f->get_float_array(kv.key);
      (void)f->get_int_array(kv.key);
      (void)f->get_string_array(kv.key);
    }
    for (const GgufTensorInfo& t : f->tensors()) {
      std::span<const uint8_t> bytes = f->tensor_bytes(t);
      ASSERT_EQ(bytes.size(), t.bytes);
      ASSERT_LE(t.offset + t.bytes, b.b.size());
      if (t.numel() <= 4096) {
        std::vector<float> out(static_cast<size_t>(t.numel()));
        Status st = f->read_f32(t.name, out);
        if (!st.ok()) {
          ASSERT_TRUE(one_line_error(st, kMem));
        }
      }
    }
  }
  EXPECT_GT(parsed, 0);  // flips in the data section still parse
}

// ---- getters ----

TEST_F(GgufTest, GettersNameFileAndKey) {
  Bytes b = header(0, 4);
  b.str("s").u32(8).str("text");
  b.str("neg").u32(5).u32(static_cast<uint32_t>(-3));
  b.str("big").u32(10).u64(~uint64_t{0});
  b.str("ints").u32(9).u32(10).u64(1).u64(~uint64_t{0});
  Result<GgufFile> f = parse(b);
  ASSERT_TRUE(f.ok()) << f.status().message();

  Result<uint64_t> absent = f->get_uint("llama.block_count");
  EXPECT_EQ(absent.status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(one_line_error(absent.status(), kMem));
  EXPECT_TRUE(contains(absent.status().message(), "no key 'llama.block_count'"));

  Result<uint64_t> wrong = f->get_uint("s");
  EXPECT_EQ(wrong.status().code(), StatusCode::kCorruption);
  EXPECT_TRUE(one_line_error(wrong.status(), kMem));
  EXPECT_TRUE(contains(wrong.status().message(), "key 's' is string, not an unsigned integer"));

  EXPECT_TRUE(contains(f->get_uint("neg").status().message(), "key 'neg' is -3, not a non-negative integer"));
  EXPECT_EQ(*f->get_int("neg"), -3);
  EXPECT_TRUE(contains(f->get_int("big").status().message(), "more than int64 holds"));
  EXPECT_EQ(*f->get_uint("big"), ~uint64_t{0});
  EXPECT_TRUE(contains(f->get_int_array("ints").status().message(), "element 0 is 18446744073709551615"));
  EXPECT_TRUE(contains(f->get_float("s").status().message(), "is string, not a float"));
  EXPECT_TRUE(contains(f->get_bool("s").status().message(), "is string, not a bool"));
  EXPECT_TRUE(contains(f->get_string("neg").status().message(), "key 'neg' is i32, not a string"));
  EXPECT_TRUE(contains(f->get_string_array("ints").status().message(), "is array of u64, not an array of strings"));
  EXPECT_TRUE(contains(f->get_float_array("ints").status().message(), "not an array of floats"));
  EXPECT_TRUE(contains(f->get_int_array("s").status().message(), "is string, not an array of integers"));
  EXPECT_EQ(f->find("absent"), nullptr);
}

// ---- opening ----

TEST_F(GgufTest, OpenMissingFile) {
  Result<GgufFile> f = GgufFile::open(path("absent.gguf"));
  EXPECT_EQ(f.status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(one_line_error(f.status(), path("absent.gguf")));
}

TEST_F(GgufTest, OpenRefusesFifoAndFolderWithoutBlocking) {
  const std::string fifo = path("fifo.gguf");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  Result<GgufFile> f = GgufFile::open(fifo);
  EXPECT_EQ(f.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(one_line_error(f.status(), fifo));
  EXPECT_TRUE(contains(f.status().message(), "FIFO"));
  Result<GgufFile> d = GgufFile::open(dir_.string());
  EXPECT_EQ(d.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(contains(d.status().message(), "folder"));
}

TEST_F(GgufTest, OpenEmptyFile) {
  const std::string p = path("empty.gguf");
  std::ofstream(p).close();
  Result<GgufFile> f = GgufFile::open(p);
  EXPECT_EQ(f.status().code(), StatusCode::kCorruption);
  EXPECT_TRUE(one_line_error(f.status(), p));
}

// ---- writer refusals ----

TEST_F(GgufTest, WriterRefusesBadInputAndLeavesNoFile) {
  const std::string p = path("bad.gguf");
  auto refused = [&](const GgufWriter& w, std::string_view part) {
    Status st = w.write(p);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_TRUE(one_line_error(st, p));
    EXPECT_TRUE(contains(st.message(), part));
    EXPECT_FALSE(fs::exists(p));
    EXPECT_FALSE(fs::exists(p + ".tmp"));
  };
  {
    GgufWriter w;
    w.set_uint32("general.alignment", 3);
    refused(w, "general.alignment must be a u32 power of two");
  }
  {
    GgufWriter w;
    w.add_tensor("t", GgmlType::kF32, {3}, std::vector<uint8_t>(8));
    refused(w, "tensor 't': ne [3] of F32 needs 12 bytes but 8 were given");
  }
  {
    GgufWriter w;
    w.add_tensor("t", GgmlType::kQ8_0, {16}, std::vector<uint8_t>(17));
    refused(w, "tensor 't': ne[0] = 16 is not a multiple of Q8_0's block of 32 elements");
  }
  {
    GgufWriter w;
    w.add_tensor("t", GgmlType::kF32, {1}, std::vector<uint8_t>(4));
    w.add_tensor("t", GgmlType::kF32, {1}, std::vector<uint8_t>(4));
    refused(w, "duplicate tensor name 't'");
  }
  {
    GgufWriter w;
    w.add_tensor(std::string(64, 'x'), GgmlType::kF32, {1}, std::vector<uint8_t>(4));
    refused(w, "1 to 63 bytes long");
  }
  {
    GgufWriter w;
    w.add_tensor("t", GgmlType::kF32, {1, 1, 1, 1, 1}, std::vector<uint8_t>(4));
    refused(w, "5 dimensions, more than 4");
  }
  {
    GgufWriter w;
    w.add_tensor("t", GgmlType::kF32, {-1}, std::vector<uint8_t>{});
    refused(w, "negative dimension");
  }
  {
    GgufWriter w;
    w.set_string("", "x");
    refused(w, "key '' must be 1 to 65535 bytes long");
  }
}

TEST_F(GgufTest, AFailingFillWritesNothing) {
  GgufWriter w;
  w.add_tensor("t", GgmlType::kF32, {4}, [](std::span<uint8_t>) { return Status::IOError("disk on fire"); });
  const std::string p = path("fill.gguf");
  Status st = w.write(p);
  EXPECT_TRUE(one_line_error(st, p));
  EXPECT_TRUE(contains(st.message(), "tensor 't': disk on fire"));
  EXPECT_FALSE(fs::exists(p));
  EXPECT_FALSE(fs::exists(p + ".tmp"));
}

TEST_F(GgufTest, WriteToMissingFolderFails) {
  GgufWriter w;
  const std::string p = path("no/such/folder/x.gguf");
  Status st = w.write(p);
  EXPECT_EQ(st.code(), StatusCode::kIOError);
  EXPECT_TRUE(one_line_error(st, p + ".tmp"));
  EXPECT_TRUE(contains(st.message(), "cannot create"));
}

TEST_F(GgufTest, WriteReplacesAnExistingFile) {
  const std::string p = path("r.gguf");
  GgufWriter a;
  a.set_string("general.name", "first");
  ASSERT_TRUE(a.write(p).ok());
  GgufWriter b;
  b.set_string("general.name", "second");
  ASSERT_TRUE(b.write(p).ok());
  Result<GgufFile> f = GgufFile::open(p);
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_EQ(*f->get_string("general.name"), "second");
}

}  // namespace
}  // namespace tessera::io
