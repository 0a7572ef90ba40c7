#include "io/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>

#include "core/check.h"
#include "io/file.h"
#include "io/safetensors.h"

namespace tessera::io {
namespace {

// Values and tensor data are copied straight out of the file.
static_assert(std::endian::native == std::endian::little, "GGUF I/O assumes a little-endian host");

constexpr uint64_t kHeaderBytes = 24;  // magic, version, tensor count, kv count
constexpr uint64_t kDefaultAlignment = 32;
constexpr int kMaxDims = 4;
// Bounds on what a file may claim, checked before anything is allocated.
constexpr uint64_t kMaxKeyBytes = 65535;            // the spec's limit for keys
constexpr uint64_t kMaxTensorNameBytes = 65535;     // reading; the writer keeps llama.cpp's 63
constexpr uint64_t kMaxWriterNameBytes = 63;        // GGML_MAX_NAME - 1
constexpr uint64_t kMaxStringBytes = uint64_t{1} << 30;  // one value (llama.cpp's limit)
constexpr uint64_t kMaxArrayCount = uint64_t{1} << 30;   // one array (llama.cpp's limit)
constexpr int kMaxArrayDepth = 8;                   // arrays inside arrays
// The fewest bytes a metadata entry (8-byte key length, a 1-byte key, type,
// a 1-byte value) and a tensor info (length, 1-byte name, n_dims, type,
// offset) take: a count larger than the bytes left / this is refused at once.
constexpr uint64_t kMinKvBytes = 8 + 1 + 4 + 1;
constexpr uint64_t kMinTensorInfoBytes = 8 + 1 + 4 + 4 + 8;

struct TypeRow {
  uint32_t id;
  std::string_view name;
  uint32_t block_elems, block_bytes;
};
// ggml.c's type_traits (blck_size, type_size), as gguf-py's GGML_QUANT_SIZES.
constexpr TypeRow kGgmlTypes[] = {
    {0, "F32", 1, 4},          {1, "F16", 1, 2},         {2, "Q4_0", 32, 18},      {3, "Q4_1", 32, 20},
    {6, "Q5_0", 32, 22},       {7, "Q5_1", 32, 24},      {8, "Q8_0", 32, 34},      {9, "Q8_1", 32, 36},
    {10, "Q2_K", 256, 84},     {11, "Q3_K", 256, 110},   {12, "Q4_K", 256, 144},   {13, "Q5_K", 256, 176},
    {14, "Q6_K", 256, 210},    {15, "Q8_K", 256, 292},   {16, "IQ2_XXS", 256, 66}, {17, "IQ2_XS", 256, 74},
    {18, "IQ3_XXS", 256, 98},  {19, "IQ1_S", 256, 50},   {20, "IQ4_NL", 32, 18},   {21, "IQ3_S", 256, 110},
    {22, "IQ2_S", 256, 82},    {23, "IQ4_XS", 256, 136}, {24, "I8", 1, 1},         {25, "I16", 1, 2},
    {26, "I32", 1, 4},         {27, "I64", 1, 8},        {28, "F64", 1, 8},        {29, "IQ1_M", 256, 56},
    {30, "BF16", 1, 2},        {34, "TQ1_0", 256, 54},   {35, "TQ2_0", 256, 66},   {39, "MXFP4", 32, 17},
};

const TypeRow* ggml_row(uint32_t id) {
  for (const TypeRow& r : kGgmlTypes)
    if (r.id == id) return &r;
  return nullptr;
}

const TypeRow& known_row(GgmlType t) {
  const TypeRow* r = ggml_row(static_cast<uint32_t>(t));
  CHECK(r != nullptr && "GgmlType missing from kGgmlTypes");
  return *r;
}

constexpr std::string_view kValueTypeNames[] = {"u8",  "i8",     "u16",   "i16", "u32", "i32", "f32",
                                                "bool", "string", "array", "u64", "i64", "f64"};

bool value_type_known(uint32_t id) { return id < std::size(kValueTypeNames); }

bool is_unsigned(GgufType t) {
  return t == GgufType::kUint8 || t == GgufType::kUint16 || t == GgufType::kUint32 || t == GgufType::kUint64;
}
bool is_signed(GgufType t) {
  return t == GgufType::kInt8 || t == GgufType::kInt16 || t == GgufType::kInt32 || t == GgufType::kInt64;
}
bool is_float(GgufType t) { return t == GgufType::kFloat32 || t == GgufType::kFloat64; }

// The fewest file bytes one element of type t takes.
uint64_t min_value_bytes(GgufType t) {
  if (t == GgufType::kString) return 8;
  if (t == GgufType::kArray) return 4 + 8;
  return gguf_scalar_size(t);
}

// A name or key from the file for a message: quoted, bytes outside printable
// ASCII as \xNN (a key holding a newline must not break the line), long ones cut.
std::string quote(std::string_view s) {
  constexpr size_t kShown = 96;
  std::string out = "'";
  for (size_t k = 0; k < s.size() && k < kShown; ++k) {
    const unsigned char ch = static_cast<unsigned char>(s[k]);
    if (ch >= 0x20 && ch < 0x7f && ch != '\\' && ch != '\'') {
      out += static_cast<char>(ch);
    } else {
      out += fmt::format("\\x{:02x}", ch);
    }
  }
  if (s.size() > kShown) out += fmt::format("...({} bytes)", s.size());
  return out + "'";
}

std::string dims_str(const std::vector<int64_t>& ne) {
  std::string s = "[";
  for (size_t k = 0; k < ne.size(); ++k) s += (k ? ", " : "") + std::to_string(ne[k]);
  return s + "]";
}

// Reads little-endian fields off the front of the file; never past its end.
class Cursor {
 public:
  explicit Cursor(std::span<const uint8_t> b) : b_(b) {}
  uint64_t pos() const { return pos_; }
  uint64_t left() const { return b_.size() - pos_; }
  template <typename T>
  bool read(T* out) {
    if (left() < sizeof(T)) return false;
    std::memcpy(out, b_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  // The next n bytes; the caller checked n <= left().
  const uint8_t* take(uint64_t n) {
    CHECK(n <= left());
    const uint8_t* p = b_.data() + pos_;
    pos_ += n;
    return p;
  }

 private:
  std::span<const uint8_t> b_;
  uint64_t pos_ = 0;
};

Status truncated(const Cursor& c, std::string_view what, uint64_t need) {
  return Status::Corruption(
      fmt::format("file ends inside {} (byte {} needs {} bytes, {} left)", what, c.pos(), need, c.left()));
}

// A u64 length and that many bytes. `what` names the string ("the key").
Status read_string(Cursor& c, uint64_t max, std::string_view what, std::string* out) {
  uint64_t n = 0;
  if (!c.read(&n)) return truncated(c, fmt::format("the length of {}", what), 8);
  if (n > max) return Status::Corruption(fmt::format("{} is {} bytes long, more than the limit of {}", what, n, max));
  if (n > c.left())
    return Status::Corruption(fmt::format("{} is {} bytes long but only {} bytes are left at byte {}", what, n,
                                          c.left(), c.pos()));
  out->assign(reinterpret_cast<const char*>(c.take(n)), n);
  return Status::OK();
}

Status read_value(Cursor& c, uint32_t type_id, int depth, GgufValue* v);

Status read_array(Cursor& c, int depth, GgufValue* v) {
  if (depth >= kMaxArrayDepth)
    return Status::Corruption(fmt::format("arrays nest deeper than {} levels", kMaxArrayDepth));
  uint32_t elem_id = 0;
  uint64_t n = 0;
  if (!c.read(&elem_id)) return truncated(c, "an array's element type", 4);
  if (!c.read(&n)) return truncated(c, "an array's element count", 8);
  if (!value_type_known(elem_id)) return Status::Corruption(fmt::format("array of unknown value type {}", elem_id));
  const GgufType elem = static_cast<GgufType>(elem_id);
  // Every element takes at least min_value_bytes in the file: a count the
  // bytes left cannot hold is refused before anything is reserved.
  if (n > kMaxArrayCount || n > c.left() / min_value_bytes(elem))
    return Status::Corruption(fmt::format("array of {} {} cannot fit in the {} bytes left at byte {}", n,
                                          gguf_type_name(elem), c.left(), c.pos()));
  v->elem_type = elem;
  v->count = n;
  if (elem == GgufType::kString) {
    v->strings.resize(n);  // n <= left / 8: at most 4 bytes of std::string per byte of file
    for (uint64_t k = 0; k < n; ++k)
      if (Status st = read_string(c, kMaxStringBytes, "the string", &v->strings[k]); !st.ok())
        return st.With(fmt::format("element {}", k));
  } else if (elem == GgufType::kArray) {
    v->arrays.reserve(n);  // n <= left / 12: about 13 bytes of GgufValue per byte of file
    for (uint64_t k = 0; k < n; ++k) {
      GgufValue e;
      if (Status st = read_value(c, elem_id, depth + 1, &e); !st.ok()) return st.With(fmt::format("element {}", k));
      v->arrays.push_back(std::move(e));
    }
  } else {
    const uint8_t* p = c.take(n * gguf_scalar_size(elem));
    v->raw.assign(p, p + n * gguf_scalar_size(elem));
    if (elem == GgufType::kBool)
      for (uint64_t k = 0; k < n; ++k)
        if (v->raw[k] > 1) return Status::Corruption(fmt::format("bool {} of the array is {}, not 0 or 1", k, v->raw[k]));
  }
  return Status::OK();
}

Status read_value(Cursor& c, uint32_t type_id, int depth, GgufValue* v) {
  if (!value_type_known(type_id)) return Status::Corruption(fmt::format("unknown value type {}", type_id));
  const GgufType t = static_cast<GgufType>(type_id);
  v->type = t;
  if (t == GgufType::kString) return read_string(c, kMaxStringBytes, "the string", &v->str);
  if (t == GgufType::kArray) return read_array(c, depth, v);
  const size_t size = gguf_scalar_size(t);
  if (c.left() < size) return truncated(c, fmt::format("a {} value", gguf_type_name(t)), size);
  const uint8_t* p = c.take(size);
  switch (t) {
    case GgufType::kUint8: v->u = p[0]; break;
    case GgufType::kBool:
      if (p[0] > 1) return Status::Corruption(fmt::format("bool value {} is not 0 or 1", p[0]));
      v->u = p[0];
      break;
    case GgufType::kInt8: v->i = static_cast<int8_t>(p[0]); break;
    case GgufType::kUint16: { uint16_t x; std::memcpy(&x, p, 2); v->u = x; break; }
    case GgufType::kInt16: { int16_t x; std::memcpy(&x, p, 2); v->i = x; break; }
    case GgufType::kUint32: { uint32_t x; std::memcpy(&x, p, 4); v->u = x; break; }
    case GgufType::kInt32: { int32_t x; std::memcpy(&x, p, 4); v->i = x; break; }
    case GgufType::kUint64: std::memcpy(&v->u, p, 8); break;
    case GgufType::kInt64: std::memcpy(&v->i, p, 8); break;
    case GgufType::kFloat32: { float x; std::memcpy(&x, p, 4); v->f = x; break; }
    case GgufType::kFloat64: std::memcpy(&v->f, p, 8); break;
    case GgufType::kString:
    case GgufType::kArray: break;  // handled above
  }
  return Status::OK();
}

// Element k of a scalar array, widened as the scalar fields are.
GgufValue scalar_at(const GgufValue& a, uint64_t k) {
  const size_t size = gguf_scalar_size(a.elem_type);
  GgufValue v;
  v.type = a.elem_type;
  const uint8_t* p = a.raw.data() + k * size;
  switch (a.elem_type) {
    case GgufType::kUint8: case GgufType::kBool: v.u = p[0]; break;
    case GgufType::kInt8: v.i = static_cast<int8_t>(p[0]); break;
    case GgufType::kUint16: { uint16_t x; std::memcpy(&x, p, 2); v.u = x; break; }
    case GgufType::kInt16: { int16_t x; std::memcpy(&x, p, 2); v.i = x; break; }
    case GgufType::kUint32: { uint32_t x; std::memcpy(&x, p, 4); v.u = x; break; }
    case GgufType::kInt32: { int32_t x; std::memcpy(&x, p, 4); v.i = x; break; }
    case GgufType::kUint64: std::memcpy(&v.u, p, 8); break;
    case GgufType::kInt64: std::memcpy(&v.i, p, 8); break;
    case GgufType::kFloat32: { float x; std::memcpy(&x, p, 4); v.f = x; break; }
    case GgufType::kFloat64: std::memcpy(&v.f, p, 8); break;
    case GgufType::kString: case GgufType::kArray: CHECK(false && "not a scalar array");
  }
  return v;
}

// One tensor info; offset is still relative to the data section.
Status read_tensor_info(Cursor& c, uint64_t index, uint64_t alignment, GgufTensorInfo* t) {
  if (Status st = read_string(c, kMaxTensorNameBytes, "the name", &t->name); !st.ok())
    return st.With(fmt::format("tensor {}", index));
  if (t->name.empty()) return Status::Corruption(fmt::format("tensor {} has an empty name", index));
  const std::string who = "tensor " + quote(t->name);
  auto bad = [&](std::string msg) { return Status::Corruption(who + ": " + msg); };
  uint32_t n_dims = 0;
  if (!c.read(&n_dims)) return truncated(c, "the dimension count", 4).With(who);
  if (n_dims > kMaxDims) return bad(fmt::format("{} dimensions, more than {}", n_dims, kMaxDims));
  int64_t numel = 1;
  for (uint32_t j = 0; j < n_dims; ++j) {
    uint64_t d = 0;
    if (!c.read(&d)) return truncated(c, "the dimensions", 8).With(who);
    if (d > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      return bad(fmt::format("ne[{}] is {}, negative as a signed 64-bit count", j, static_cast<int64_t>(d)));
    t->ne.push_back(static_cast<int64_t>(d));
    if (__builtin_mul_overflow(numel, static_cast<int64_t>(d), &numel))
      return bad(fmt::format("element count of ne {}... overflows int64", dims_str(t->ne)));
  }
  uint32_t type_id = 0;
  if (!c.read(&type_id)) return truncated(c, "the type", 4).With(who);
  const TypeRow* row = ggml_row(type_id);
  if (row == nullptr) return bad(fmt::format("unknown ggml type {}", type_id));
  t->type = static_cast<GgmlType>(type_id);
  const int64_t ne0 = t->ne.empty() ? 1 : t->ne[0];
  if (ne0 % row->block_elems != 0)
    return bad(fmt::format("ne[0] = {} is not a multiple of {}'s block of {} elements", ne0, row->name,
                           row->block_elems));
  if (__builtin_mul_overflow(static_cast<uint64_t>(numel) / row->block_elems, row->block_bytes, &t->bytes))
    return bad("byte size overflows uint64");
  if (!c.read(&t->offset)) return truncated(c, "the offset", 8).With(who);
  if (t->offset % alignment != 0)
    return bad(fmt::format("offset {} is not a multiple of the alignment {}", t->offset, alignment));
  return Status::OK();
}

Status errno_status(const std::string& file, std::string_view what) {
  return Status::IOError(fmt::format("{}: {}: {}", file, what, std::strerror(errno)));
}

}  // namespace

// ---- types ----

std::string ggml_type_name(uint32_t id) {
  const TypeRow* r = ggml_row(id);
  return r != nullptr ? std::string(r->name) : fmt::format("type {}", id);
}
bool ggml_type_known(uint32_t id) { return ggml_row(id) != nullptr; }
uint32_t ggml_block_elems(GgmlType t) { return known_row(t).block_elems; }
uint32_t ggml_block_bytes(GgmlType t) { return known_row(t).block_bytes; }

std::string gguf_type_name(uint32_t id) {
  return value_type_known(id) ? std::string(kValueTypeNames[id]) : fmt::format("type {}", id);
}

size_t gguf_scalar_size(GgufType t) {
  switch (t) {
    case GgufType::kUint8: case GgufType::kInt8: case GgufType::kBool: return 1;
    case GgufType::kUint16: case GgufType::kInt16: return 2;
    case GgufType::kUint32: case GgufType::kInt32: case GgufType::kFloat32: return 4;
    case GgufType::kUint64: case GgufType::kInt64: case GgufType::kFloat64: return 8;
    case GgufType::kString: case GgufType::kArray: return 0;
  }
  return 0;
}

// ---- GgufValue ----

GgufValue GgufValue::from_uint(GgufType t, uint64_t v) {
  CHECK(is_unsigned(t));
  CHECK(gguf_scalar_size(t) == 8 || v < (uint64_t{1} << (8 * gguf_scalar_size(t))));
  GgufValue x;
  x.type = t;
  x.u = v;
  return x;
}

GgufValue GgufValue::from_int(GgufType t, int64_t v) {
  CHECK(is_signed(t));
  const int bits = static_cast<int>(8 * gguf_scalar_size(t));
  CHECK(bits == 64 || (v >= -(int64_t{1} << (bits - 1)) && v < (int64_t{1} << (bits - 1))));
  GgufValue x;
  x.type = t;
  x.i = v;
  return x;
}

GgufValue GgufValue::from_float(GgufType t, double v) {
  CHECK(is_float(t));
  GgufValue x;
  x.type = t;
  x.f = t == GgufType::kFloat32 ? static_cast<double>(static_cast<float>(v)) : v;
  return x;
}

GgufValue GgufValue::from_bool(bool v) {
  GgufValue x;
  x.type = GgufType::kBool;
  x.u = v ? 1 : 0;
  return x;
}

GgufValue GgufValue::from_string(std::string v) {
  GgufValue x;
  x.type = GgufType::kString;
  x.str = std::move(v);
  return x;
}

GgufValue GgufValue::array_of_raw(GgufType elem, std::vector<uint8_t> raw) {
  const size_t size = gguf_scalar_size(elem);
  CHECK(size != 0 && raw.size() % size == 0);
  if (elem == GgufType::kBool)
    for (uint8_t b : raw) CHECK(b <= 1);
  GgufValue x;
  x.type = GgufType::kArray;
  x.elem_type = elem;
  x.count = raw.size() / size;
  x.raw = std::move(raw);
  return x;
}

GgufValue GgufValue::array_of_strings(std::vector<std::string> v) {
  GgufValue x;
  x.type = GgufType::kArray;
  x.elem_type = GgufType::kString;
  x.count = v.size();
  x.strings = std::move(v);
  return x;
}

GgufValue GgufValue::array_of_arrays(std::vector<GgufValue> v) {
  for (const GgufValue& e : v) CHECK(e.type == GgufType::kArray);
  GgufValue x;
  x.type = GgufType::kArray;
  x.elem_type = GgufType::kArray;
  x.count = v.size();
  x.arrays = std::move(v);
  return x;
}

GgufValue GgufValue::array_of_floats(std::span<const float> v) {
  const auto* p = reinterpret_cast<const uint8_t*>(v.data());
  return array_of_raw(GgufType::kFloat32, std::vector<uint8_t>(p, p + v.size_bytes()));
}

GgufValue GgufValue::array_of_int32(std::span<const int32_t> v) {
  const auto* p = reinterpret_cast<const uint8_t*>(v.data());
  return array_of_raw(GgufType::kInt32, std::vector<uint8_t>(p, p + v.size_bytes()));
}

bool GgufValue::is_integer() const { return is_unsigned(type) || is_signed(type); }

std::optional<uint64_t> GgufValue::as_uint() const {
  if (is_unsigned(type)) return u;
  if (is_signed(type) && i >= 0) return static_cast<uint64_t>(i);
  return std::nullopt;
}

std::optional<int64_t> GgufValue::as_int() const {
  if (is_signed(type)) return i;
  if (is_unsigned(type) && u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
    return static_cast<int64_t>(u);
  return std::nullopt;
}

std::optional<double> GgufValue::as_float() const {
  if (is_float(type)) return f;
  return std::nullopt;
}

std::string GgufValue::type_str() const {
  if (type != GgufType::kArray) return gguf_type_name(type);
  return "array of " + gguf_type_name(elem_type);
}

// ---- GgufTensorInfo ----

int64_t GgufTensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : ne) n *= d;
  return n;
}

std::vector<int64_t> GgufTensorInfo::shape() const { return std::vector<int64_t>(ne.rbegin(), ne.rend()); }

// ---- GgufFile: opening and validation ----

Result<GgufFile> GgufFile::open(const std::string& path) {
  ASSIGN_OR_RETURN(UniqueFd fd, open_regular_file(path));
  struct stat info;
  if (::fstat(fd.get(), &info) != 0) return errno_status(path, "cannot stat");
  const size_t size = static_cast<size_t>(info.st_size);
  // An empty file cannot be mapped; validate() names it as too short.
  if (size == 0) return parse(path, {});
  void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd.get(), 0);
  if (p == MAP_FAILED && errno == ENOMEM)
    return Status::ResourceExhausted(
        fmt::format("{}: cannot map its {:.1f} GB: out of memory (address space: ulimit -v?)", path, size / 1e9));
  if (p == MAP_FAILED) return errno_status(path, "cannot map");
  GgufFile f;
  f.path_ = path;
  f.mapping_ = std::shared_ptr<void>(p, [size](void* q) { ::munmap(q, size); });
  f.bytes_ = std::span<const uint8_t>(static_cast<const uint8_t*>(p), size);
  return finish(std::move(f));
}

Result<GgufFile> GgufFile::parse(std::string name, std::vector<std::byte> bytes) {
  GgufFile f;
  f.path_ = std::move(name);
  f.owned_ = std::move(bytes);
  f.bytes_ = std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(f.owned_.data()), f.owned_.size());
  return finish(std::move(f));
}

Result<GgufFile> GgufFile::finish(GgufFile f) {
  Status st;
  try {
    st = f.validate();
  } catch (const std::bad_alloc&) {  // not expected: every count is checked against the file's size first
    st = Status::ResourceExhausted("out of memory while reading the metadata");
  }
  if (!st.ok()) return st.With(f.path_);
  return f;
}

Status GgufFile::validate() {
  const uint64_t size = bytes_.size();
  const std::string too_short = fmt::format("file is {} bytes, shorter than the {}-byte GGUF header", size, kHeaderBytes);
  if (size < 4) return Status::Corruption(too_short);
  if (std::memcmp(bytes_.data(), "GGUF", 4) != 0) {
    const std::string_view magic(reinterpret_cast<const char*>(bytes_.data()), 4);
    return Status::Corruption(fmt::format("not a GGUF file: it starts with {} ({:02x} {:02x} {:02x} {:02x}), not 'GGUF'",
                                          quote(magic), bytes_[0], bytes_[1], bytes_[2], bytes_[3]));
  }
  if (size < kHeaderBytes) return Status::Corruption(too_short);
  Cursor c(bytes_);
  c.take(4);
  uint64_t tensor_count = 0, kv_count = 0;
  c.read(&version_);
  c.read(&tensor_count);
  c.read(&kv_count);
  if (version_ == 1)
    return Status::Corruption("GGUF version 1 (32-bit counts) is no longer supported; this reader reads versions 2 and 3");
  if (version_ != 0 && (version_ & 0xffffu) == 0)
    return Status::Corruption(fmt::format(
        "GGUF version {:#x} looks byte-swapped: a big-endian file? Only little-endian GGUF is supported", version_));
  if (version_ != 2 && version_ != 3)
    return Status::Corruption(fmt::format("unsupported GGUF version {} (this reader reads versions 2 and 3)", version_));
  if (kv_count > c.left() / kMinKvBytes)
    return Status::Corruption(fmt::format("metadata count {} cannot fit in the {} bytes after the header", kv_count,
                                          c.left()));
  if (tensor_count > c.left() / kMinTensorInfoBytes)
    return Status::Corruption(fmt::format("tensor count {} cannot fit in the {} bytes after the header", tensor_count,
                                          c.left()));

  // Metadata. Both counts are bounded by the file's size, so reserving is safe.
  kvs_.reserve(kv_count);
  for (uint64_t k = 0; k < kv_count; ++k) {
    GgufKv kv;
    if (Status st = read_string(c, kMaxKeyBytes, "the key", &kv.key); !st.ok())
      return st.With(fmt::format("metadata entry {}", k));
    if (kv.key.empty()) return Status::Corruption(fmt::format("metadata entry {} has an empty key", k));
    if (kv_index_.count(kv.key) != 0) return Status::Corruption("duplicate key " + quote(kv.key));
    uint32_t type_id = 0;
    if (!c.read(&type_id)) return truncated(c, "the value type", 4).With("key " + quote(kv.key));
    if (Status st = read_value(c, type_id, 0, &kv.value); !st.ok()) return st.With("key " + quote(kv.key));
    kv_index_.emplace(kv.key, kvs_.size());
    kvs_.push_back(std::move(kv));
  }
  if (const GgufValue* a = find("general.alignment"); a != nullptr) {
    if (a->type != GgufType::kUint32)
      return Status::Corruption(fmt::format("general.alignment is {}, not u32", a->type_str()));
    if (a->u == 0 || !std::has_single_bit(a->u))
      return Status::Corruption(fmt::format("general.alignment {} is not a power of two", a->u));
    alignment_ = a->u;
  }

  // Tensor infos.
  tensors_.reserve(tensor_count);
  for (uint64_t k = 0; k < tensor_count; ++k) {
    GgufTensorInfo t;
    RETURN_IF_ERROR(read_tensor_info(c, k, alignment_, &t));
    if (tensor_index_.count(t.name) != 0) return Status::Corruption("duplicate tensor name " + quote(t.name));
    tensor_index_.emplace(t.name, tensors_.size());
    tensors_.push_back(std::move(t));
  }

  // The data section starts at the next multiple of the alignment (a file
  // without tensors may end before it: llama.cpp's writer pads, its reader
  // does not ask for the padding then).
  data_offset_ = (c.pos() + alignment_ - 1) / alignment_ * alignment_;  // pos <= size < 2^63, alignment <= 2^31
  if (tensors_.empty()) {
    data_offset_ = std::min(data_offset_, size);
    return Status::OK();
  }
  if (data_offset_ > size)
    return Status::Corruption(fmt::format("the data section would start at byte {}, past the end of the file ({} bytes)",
                                          data_offset_, size));
  const uint64_t data_size = size - data_offset_;
  for (GgufTensorInfo& t : tensors_) {
    if (t.offset > data_size || t.bytes > data_size - t.offset)
      return Status::Corruption(fmt::format(
          "tensor {}: its {} bytes at offset {} of the data section (which starts at byte {}) run past the end of "
          "the file ({} bytes)", quote(t.name), t.bytes, t.offset, data_offset_, size));
    t.offset += data_offset_;
  }
  // No two tensors share a byte (empty tensors own none).
  std::vector<const GgufTensorInfo*> by_offset;
  for (const GgufTensorInfo& t : tensors_)
    if (t.bytes != 0) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(),
            [](const GgufTensorInfo* a, const GgufTensorInfo* b) { return a->offset < b->offset; });
  for (size_t k = 1; k < by_offset.size(); ++k) {
    const GgufTensorInfo& a = *by_offset[k - 1];
    const GgufTensorInfo& b = *by_offset[k];
    if (b.offset < a.offset + a.bytes)
      return Status::Corruption(fmt::format("tensors {} (bytes [{}, {})) and {} (bytes [{}, {})) overlap", quote(a.name),
                                            a.offset, a.offset + a.bytes, quote(b.name), b.offset, b.offset + b.bytes));
  }
  return Status::OK();
}

// ---- GgufFile: metadata ----

const GgufValue* GgufFile::find(std::string_view key) const {
  auto it = kv_index_.find(key);
  return it == kv_index_.end() ? nullptr : &kvs_[it->second].value;
}

Status GgufFile::type_error(std::string_view key, const GgufValue& v, std::string_view wanted) const {
  return Status::Corruption(fmt::format("{}: key {} is {}, not {}", path_, quote(key), v.type_str(), wanted));
}

#define GGUF_FIND_OR_RETURN(v, key)                                                                      \
  const GgufValue* v = find(key);                                                                        \
  if (v == nullptr) return Status::NotFound(fmt::format("{}: no key {}", path_, quote(key)))

Result<std::string> GgufFile::get_string(std::string_view key) const {
  GGUF_FIND_OR_RETURN(v, key);
  if (v->type != GgufType::kString) return type_error(key, *v, "a string");
  return v->str;
}

Result<uint64_t> GgufFile::get_uint(std::string_view key) const {
  GGUF_FIND_OR_RETURN(v, key);
  if (!v->is_integer()) return type_error(key, *v, "an unsigned integer");
  if (std::optional<uint64_t> x = v->as_uint()) return *x;
  return Status::Corruption(fmt::format("{}: key {} is {}, not a non-negative integer", path_, quote(key), v->i));
}

Result<int64_t> GgufFile::get_int(std::string_view key) const {
  GGUF_FIND_OR_RETURN(v, key);
  if (!v->is_integer()) return type_error(key, *v, "an integer");
  if (std::optional<int64_t> x = v->as_int()) return *x;
  return Status::Corruption(fmt::format("{}: key {} is {}, more than int64 holds", path_, quote(key), v->u));
}

Result<double> GgufFile::get_float(std::string_view key) const {
  GGUF_FIND_OR_RETURN(v, key);
  if (!is_float(v->type)) return type_error(key, *v, "a float (f32 or f64)");
  return v->f;
}

Result<bool> GgufFile::get_bool(std::string_view key) const {
  GGUF_FIND_OR_RETURN(v, key);
  if (v->type != GgufType::kBool) return type_error(key, *v, "a bool");
  return v->u != 0;
}

Result<std::span<const std::string>> GgufFile::get_string_array(std::string_view key) const {
  GGUF_FIND_OR_RETURN(v, key);
  if (v->type != GgufType::kArray || v->elem_type != GgufType::kString)
    return type_error(key, *v, "an array of strings");
  return std::span<const std::string>(v->strings);
}

Result<std::vector<float>> GgufFile::get_float_array(std::string_view key) const {
  GGUF_FIND_OR_RETURN(v, key);
  if (v->type != GgufType::kArray || !is_float(v->elem_type)) return type_error(key, *v, "an array of floats");
  std::vector<float> out(v->count);
  for (uint64_t k = 0; k < v->count; ++k) out[k] = static_cast<float>(scalar_at(*v, k).f);
  return out;
}

Result<std::vector<int64_t>> GgufFile::get_int_array(std::string_view key) const {
  GGUF_FIND_OR_RETURN(v, key);
  if (v->type != GgufType::kArray || !(is_unsigned(v->elem_type) || is_signed(v->elem_type)))
    return type_error(key, *v, "an array of integers");
  std::vector<int64_t> out(v->count);
  for (uint64_t k = 0; k < v->count; ++k) {
    std::optional<int64_t> x = scalar_at(*v, k).as_int();
    if (!x)
      return Status::Corruption(fmt::format("{}: key {}: element {} is {}, more than int64 holds", path_, quote(key), k,
                                            scalar_at(*v, k).u));
    out[k] = *x;
  }
  return out;
}

#undef GGUF_FIND_OR_RETURN

// ---- GgufFile: tensors ----

const GgufTensorInfo* GgufFile::find_tensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

std::span<const uint8_t> GgufFile::tensor_bytes(const GgufTensorInfo& t) const {
  // validate() guarantees this for every tensor it produced.
  CHECK(t.offset <= bytes_.size() && t.bytes <= bytes_.size() - t.offset);
  return bytes_.subspan(t.offset, t.bytes);
}

void GgufFile::drop_range(const uint8_t* p, size_t n) const {
  if (!mapping_ || n == 0) return;
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t begin = reinterpret_cast<uintptr_t>(p);
  const uintptr_t first = (begin + page - 1) / page * page, last = (begin + n) / page * page;
  // Advice only: a failure leaves the pages resident, nothing else.
  if (last > first) ::madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
}

namespace {

// ggml's get_scale_min_k4: Q4_K's and Q5_K's 6-bit scale and min of
// sub-block j from the 12 packed bytes (q4::scale_min's formula; io sits
// below the kernels layer).
void scale_min_k4(int j, const uint8_t* q, int* sc, int* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// The fp16 at p (any alignment) as fp32.
float f16_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);
}

}  // namespace

void dequantize_q8_0(const uint8_t* src, size_t n, float* dst) {
  for (size_t b = 0; b < n / 32; ++b) {
    const uint8_t* block = src + 34 * b;
    const float d = f16_at(block);
    for (size_t k = 0; k < 32; ++k) dst[32 * b + k] = d * static_cast<float>(static_cast<int8_t>(block[2 + k]));
  }
}

void dequantize_q6_k(const uint8_t* src, size_t n, float* dst) {
  for (size_t b = 0; b < n / 256; ++b) {
    const uint8_t* ql = src + 210 * b;
    const uint8_t* qh = ql + 128;
    const uint8_t* sc = qh + 64;
    const float d = f16_at(sc + 16);
    float* y = dst + 256 * b;
    // Two halves of 128 values: 64 bytes of ql, 32 of qh, 8 scales each.
    for (int half = 0; half < 2; ++half, y += 128, ql += 64, qh += 32, sc += 8) {
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        auto scale = [&](int k) { return d * static_cast<float>(static_cast<int8_t>(sc[is + k])); };
        y[l] = scale(0) * static_cast<float>(q1);
        y[l + 32] = scale(2) * static_cast<float>(q2);
        y[l + 64] = scale(4) * static_cast<float>(q3);
        y[l + 96] = scale(6) * static_cast<float>(q4);
      }
    }
  }
}


void dequantize_q5_k(const uint8_t* src, size_t n, float* dst) {
  for (size_t b = 0; b < n / 256; ++b) {
    const uint8_t* block = src + 176 * b;
    const float d = f16_at(block), dmin = f16_at(block + 2);
    const uint8_t* scales = block + 4;
    const uint8_t* qh = block + 16;
    const uint8_t* ql = block + 48;
    float* y = dst + 256 * b;
    // Four pairs of sub-blocks: 32 bytes of ql (low nibbles the first
    // sub-block, high the second), the fifth bits from qh's bits 2p, 2p + 1.
    for (int p = 0; p < 4; ++p, ql += 32, y += 64) {
      int sc1, m1, sc2, m2;
      scale_min_k4(2 * p, scales, &sc1, &m1);
      scale_min_k4(2 * p + 1, scales, &sc2, &m2);
      const float d1 = d * static_cast<float>(sc1), min1 = dmin * static_cast<float>(m1);
      const float d2 = d * static_cast<float>(sc2), min2 = dmin * static_cast<float>(m2);
      for (int l = 0; l < 32; ++l) {
        const int q1 = (ql[l] & 0xF) + ((qh[l] >> (2 * p)) & 1 ? 16 : 0);
        const int q2 = (ql[l] >> 4) + ((qh[l] >> (2 * p + 1)) & 1 ? 16 : 0);
        y[l] = d1 * static_cast<float>(q1) - min1;
        y[l + 32] = d2 * static_cast<float>(q2) - min2;
      }
    }
  }
}

void dequantize_q4_1(const uint8_t* src, size_t n, float* dst) {
  for (size_t b = 0; b < n / 32; ++b) {
    const uint8_t* block = src + 20 * b;
    const float d = f16_at(block), m = f16_at(block + 2);
    for (int j = 0; j < 16; ++j) {
      dst[32 * b + j] = static_cast<float>(block[4 + j] & 0xF) * d + m;
      dst[32 * b + j + 16] = static_cast<float>(block[4 + j] >> 4) * d + m;
    }
  }
}

void dequantize_q5_0(const uint8_t* src, size_t n, float* dst) {
  for (size_t b = 0; b < n / 32; ++b) {
    const uint8_t* block = src + 22 * b;
    const float d = f16_at(block);
    uint32_t qh;
    std::memcpy(&qh, block + 2, 4);
    for (int j = 0; j < 16; ++j) {
      const int x0 = ((block[6 + j] & 0xF) | (((qh >> j) << 4) & 0x10)) - 16;
      const int x1 = ((block[6 + j] >> 4) | ((qh >> (j + 12)) & 0x10)) - 16;
      dst[32 * b + j] = static_cast<float>(x0) * d;
      dst[32 * b + j + 16] = static_cast<float>(x1) * d;
    }
  }
}

void dequantize_q5_1(const uint8_t* src, size_t n, float* dst) {
  for (size_t b = 0; b < n / 32; ++b) {
    const uint8_t* block = src + 24 * b;
    const float d = f16_at(block), m = f16_at(block + 2);
    uint32_t qh;
    std::memcpy(&qh, block + 4, 4);
    for (int j = 0; j < 16; ++j) {
      const int x0 = (block[8 + j] & 0xF) | (((qh >> j) << 4) & 0x10);
      const int x1 = (block[8 + j] >> 4) | ((qh >> (j + 12)) & 0x10);
      dst[32 * b + j] = static_cast<float>(x0) * d + m;
      dst[32 * b + j + 16] = static_cast<float>(x1) * d + m;
    }
  }
}

bool read_by_values(GgmlType t) {
  switch (t) {
    case GgmlType::kF32: case GgmlType::kF16: case GgmlType::kBF16: case GgmlType::kQ8_0:
    case GgmlType::kQ4_1: case GgmlType::kQ5_0: case GgmlType::kQ5_1: case GgmlType::kQ5_K: case GgmlType::kQ6_K:
      return true;
    default: return false;
  }
}

Status GgufFile::read_f32(std::string_view name, std::span<float> dst) const {
  const GgufTensorInfo* t = find_tensor(name);
  if (t == nullptr) return Status::NotFound(fmt::format("{}: no tensor named {}", path_, quote(name)));
  const size_t n = static_cast<size_t>(t->numel());
  if (dst.size() != n)
    return Status::InvalidArgument(fmt::format("{}: tensor {} of ne {} has {} elements but the destination holds {}",
                                               path_, quote(name), dims_str(t->ne), n, dst.size()));
  return read_f32_rows(*t, 0, dst);
}

Status GgufFile::read_f32_rows(const GgufTensorInfo& t, int64_t row0, std::span<float> dst) const {
  if (!read_by_values(t.type))
    return Status::InvalidArgument(fmt::format("{}: tensor {} is {}; read_f32 converts F32, F16, BF16, Q8_0, Q4_1, "
                                               "Q5_0, Q5_1, Q5_K and Q6_K only",
                                               path_, quote(t.name), ggml_type_name(t.type)));
  if (dst.empty()) return Status::OK();  // nothing to read (a tensor of no elements too)
  const size_t block_elems = ggml_block_elems(t.type), block_bytes = ggml_block_bytes(t.type);
  const int64_t row = t.ne.empty() ? 1 : t.ne[0], rows = t.numel() / std::max<int64_t>(row, 1);
  const int64_t want = row > 0 ? static_cast<int64_t>(dst.size()) / row : 0;
  if (row <= 0 || row % static_cast<int64_t>(block_elems) != 0 || static_cast<int64_t>(dst.size()) != want * row ||
      row0 < 0 || row0 > rows || want > rows - row0)
    return Status::InvalidArgument(fmt::format("{}: tensor {} of ne {}: rows {} to {} are not whole rows inside it",
                                               path_, quote(t.name), dims_str(t.ne), row0,
                                               row0 + (row > 0 ? static_cast<int64_t>(dst.size()) / row : 0)));
  const uint8_t* src = tensor_bytes(t).data() + static_cast<size_t>(row0 * row) / block_elems * block_bytes;
  const size_t n = dst.size();
  // In chunks (a whole number of blocks), each chunk's pages given back once
  // converted: a mapped tensor is resident a chunk at a time, not whole.
  constexpr size_t kChunk = size_t{4} << 20;  // elements; a multiple of 32
  for (size_t i0 = 0; i0 < n; i0 += kChunk) {
    const size_t i1 = std::min(n, i0 + kChunk);
    const uint8_t* p = src + i0 / block_elems * block_bytes;
    float* out = dst.data() + i0;
    switch (t.type) {
      case GgmlType::kF32: std::memcpy(out, p, (i1 - i0) * sizeof(float)); break;
      case GgmlType::kF16:
        for (size_t k = 0; k < i1 - i0; ++k) out[k] = f16_at(p + 2 * k);  // need not be 2-byte aligned
        break;
      case GgmlType::kBF16:
        for (size_t k = 0; k < i1 - i0; ++k) {
          uint16_t h;
          std::memcpy(&h, p + 2 * k, 2);
          out[k] = std::bit_cast<float>(static_cast<uint32_t>(h) << 16);
        }
        break;
      case GgmlType::kQ8_0: dequantize_q8_0(p, i1 - i0, out); break;
      case GgmlType::kQ6_K: dequantize_q6_k(p, i1 - i0, out); break;
      case GgmlType::kQ5_K: dequantize_q5_k(p, i1 - i0, out); break;
      case GgmlType::kQ4_1: dequantize_q4_1(p, i1 - i0, out); break;
      case GgmlType::kQ5_0: dequantize_q5_0(p, i1 - i0, out); break;
      case GgmlType::kQ5_1: dequantize_q5_1(p, i1 - i0, out); break;
      default: CHECK(false && "type checked above");
    }
    drop_range(p, (i1 - i0) / block_elems * block_bytes);
  }
  return Status::OK();
}

// ---- GgufWriter ----

namespace {

template <typename T>
void put(std::vector<uint8_t>& out, T v) {
  const auto* p = reinterpret_cast<const uint8_t*>(&v);
  out.insert(out.end(), p, p + sizeof(T));
}

void put_string(std::vector<uint8_t>& out, std::string_view s) {
  put<uint64_t>(out, s.size());
  out.insert(out.end(), s.begin(), s.end());
}

// The value as the file holds it, after its type. An inconsistent value (one
// not built by the factories) is a bug.
void put_value(std::vector<uint8_t>& out, const GgufValue& v) {
  switch (v.type) {
    case GgufType::kUint8: case GgufType::kBool: CHECK(v.u <= (v.type == GgufType::kBool ? 1u : 0xffu)); put<uint8_t>(out, static_cast<uint8_t>(v.u)); break;
    case GgufType::kInt8: CHECK(v.i >= INT8_MIN && v.i <= INT8_MAX); put<int8_t>(out, static_cast<int8_t>(v.i)); break;
    case GgufType::kUint16: CHECK(v.u <= UINT16_MAX); put<uint16_t>(out, static_cast<uint16_t>(v.u)); break;
    case GgufType::kInt16: CHECK(v.i >= INT16_MIN && v.i <= INT16_MAX); put<int16_t>(out, static_cast<int16_t>(v.i)); break;
    case GgufType::kUint32: CHECK(v.u <= UINT32_MAX); put<uint32_t>(out, static_cast<uint32_t>(v.u)); break;
    case GgufType::kInt32: CHECK(v.i >= INT32_MIN && v.i <= INT32_MAX); put<int32_t>(out, static_cast<int32_t>(v.i)); break;
    case GgufType::kUint64: put<uint64_t>(out, v.u); break;
    case GgufType::kInt64: put<int64_t>(out, v.i); break;
    case GgufType::kFloat32: put<float>(out, static_cast<float>(v.f)); break;
    case GgufType::kFloat64: put<double>(out, v.f); break;
    case GgufType::kString: put_string(out, v.str); break;
    case GgufType::kArray:
      CHECK(value_type_known(static_cast<uint32_t>(v.elem_type)));
      put<uint32_t>(out, static_cast<uint32_t>(v.elem_type));
      put<uint64_t>(out, v.count);
      if (v.elem_type == GgufType::kString) {
        CHECK(v.strings.size() == v.count);
        for (const std::string& s : v.strings) put_string(out, s);
      } else if (v.elem_type == GgufType::kArray) {
        CHECK(v.arrays.size() == v.count);
        for (const GgufValue& e : v.arrays) {
          CHECK(e.type == GgufType::kArray);
          put_value(out, e);  // nested arrays carry no type of their own: the outer elem_type says kArray
        }
      } else {
        CHECK(v.raw.size() == v.count * gguf_scalar_size(v.elem_type));
        out.insert(out.end(), v.raw.begin(), v.raw.end());
      }
      break;
  }
}

Status write_all(int fd, const uint8_t* p, size_t n, const std::string& file) {
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return errno_status(file, "write failed");
    p += w;
    n -= static_cast<size_t>(w);
  }
  return Status::OK();
}

Status write_zeros(int fd, uint64_t n, const std::string& file) {
  static const uint8_t kZeros[4096] = {};
  while (n > 0) {
    const size_t k = static_cast<size_t>(std::min<uint64_t>(n, sizeof(kZeros)));
    RETURN_IF_ERROR(write_all(fd, kZeros, k, file));
    n -= k;
  }
  return Status::OK();
}

uint64_t padding(uint64_t pos, uint64_t alignment) { return (alignment - pos % alignment) % alignment; }

}  // namespace

void GgufWriter::set(std::string key, GgufValue value) {
  for (GgufKv& kv : kvs_) {
    if (kv.key == key) {
      kv.value = std::move(value);
      return;
    }
  }
  kvs_.push_back({std::move(key), std::move(value)});
}

void GgufWriter::set_string(std::string key, std::string value) {
  set(std::move(key), GgufValue::from_string(std::move(value)));
}
void GgufWriter::set_uint32(std::string key, uint32_t value) {
  set(std::move(key), GgufValue::from_uint(GgufType::kUint32, value));
}
void GgufWriter::set_uint64(std::string key, uint64_t value) {
  set(std::move(key), GgufValue::from_uint(GgufType::kUint64, value));
}
void GgufWriter::set_int32(std::string key, int32_t value) {
  set(std::move(key), GgufValue::from_int(GgufType::kInt32, value));
}
void GgufWriter::set_float32(std::string key, float value) {
  set(std::move(key), GgufValue::from_float(GgufType::kFloat32, value));
}
void GgufWriter::set_bool(std::string key, bool value) { set(std::move(key), GgufValue::from_bool(value)); }
void GgufWriter::set_string_array(std::string key, std::vector<std::string> value) {
  set(std::move(key), GgufValue::array_of_strings(std::move(value)));
}
void GgufWriter::set_float_array(std::string key, std::span<const float> value) {
  set(std::move(key), GgufValue::array_of_floats(value));
}
void GgufWriter::set_int32_array(std::string key, std::span<const int32_t> value) {
  set(std::move(key), GgufValue::array_of_int32(value));
}

void GgufWriter::add_tensor(std::string name, GgmlType type, std::vector<int64_t> ne, BytesFn fill) {
  CHECK(fill != nullptr);
  tensors_.push_back({std::move(name), type, std::move(ne), std::move(fill), {}});
}

void GgufWriter::add_tensor(std::string name, GgmlType type, std::vector<int64_t> ne, std::vector<uint8_t> bytes) {
  tensors_.push_back({std::move(name), type, std::move(ne), nullptr, std::move(bytes)});
}

Status GgufWriter::write(const std::string& path) const {
  auto bad = [&](std::string msg) { return Status::InvalidArgument(path + ": " + msg); };
  uint64_t alignment = kDefaultAlignment;
  for (const GgufKv& kv : kvs_) {
    if (kv.key.empty() || kv.key.size() > kMaxKeyBytes)
      return bad(fmt::format("key {} must be 1 to {} bytes long", quote(kv.key), kMaxKeyBytes));
    if (kv.key == "general.alignment") {
      if (kv.value.type != GgufType::kUint32 || kv.value.u == 0 || !std::has_single_bit(kv.value.u))
        return bad("general.alignment must be a u32 power of two");
      alignment = kv.value.u;
    }
  }

  // Tensor infos: sizes and offsets (relative to the data section, each
  // tensor padded to the alignment).
  std::vector<uint64_t> sizes, offsets;
  uint64_t offset = 0, largest_fill = 0;
  std::map<std::string_view, int> seen;
  for (const Tensor& t : tensors_) {
    const std::string who = "tensor " + quote(t.name);
    if (t.name.empty() || t.name.size() > kMaxWriterNameBytes)
      return bad(fmt::format("{}: a name must be 1 to {} bytes long (llama.cpp's limit)", who, kMaxWriterNameBytes));
    if (!seen.emplace(t.name, 0).second) return bad("duplicate tensor name " + quote(t.name));
    if (!ggml_type_known(static_cast<uint32_t>(t.type))) return bad(fmt::format("{}: unknown ggml type", who));
    if (t.ne.size() > static_cast<size_t>(kMaxDims))
      return bad(fmt::format("{}: {} dimensions, more than {}", who, t.ne.size(), kMaxDims));
    int64_t numel = 1;
    for (int64_t d : t.ne) {
      if (d < 0) return bad(fmt::format("{}: negative dimension in ne {}", who, dims_str(t.ne)));
      if (__builtin_mul_overflow(numel, d, &numel))
        return bad(fmt::format("{}: element count of ne {} overflows", who, dims_str(t.ne)));
    }
    const uint32_t block = ggml_block_elems(t.type);
    const int64_t ne0 = t.ne.empty() ? 1 : t.ne[0];
    if (ne0 % block != 0)
      return bad(fmt::format("{}: ne[0] = {} is not a multiple of {}'s block of {} elements", who, ne0,
                             ggml_type_name(t.type), block));
    uint64_t bytes = 0;
    if (__builtin_mul_overflow(static_cast<uint64_t>(numel) / block, ggml_block_bytes(t.type), &bytes))
      return bad(fmt::format("{}: byte size overflows", who));
    if (!t.fill && t.bytes.size() != bytes)
      return bad(fmt::format("{}: ne {} of {} needs {} bytes but {} were given", who, dims_str(t.ne),
                             ggml_type_name(t.type), bytes, t.bytes.size()));
    if (t.fill) largest_fill = std::max(largest_fill, bytes);
    sizes.push_back(bytes);
    offsets.push_back(offset);
    offset += bytes + padding(bytes, alignment);
  }

  std::vector<uint8_t> head;
  head.insert(head.end(), {'G', 'G', 'U', 'F'});
  put<uint32_t>(head, 3);
  put<uint64_t>(head, tensors_.size());
  put<uint64_t>(head, kvs_.size());
  for (const GgufKv& kv : kvs_) {
    put_string(head, kv.key);
    put<uint32_t>(head, static_cast<uint32_t>(kv.value.type));
    put_value(head, kv.value);
  }
  for (size_t k = 0; k < tensors_.size(); ++k) {
    const Tensor& t = tensors_[k];
    put_string(head, t.name);
    put<uint32_t>(head, static_cast<uint32_t>(t.ne.size()));
    for (int64_t d : t.ne) put<uint64_t>(head, static_cast<uint64_t>(d));
    put<uint32_t>(head, static_cast<uint32_t>(t.type));
    put<uint64_t>(head, offsets[k]);
  }
  head.resize(head.size() + padding(head.size(), alignment), 0);

  std::vector<uint8_t> buf;
  try {
    buf.resize(largest_fill);
  } catch (const std::bad_alloc&) {
    return Status::ResourceExhausted(fmt::format("{}: no memory for a {} byte tensor", path, largest_fill));
  }
  const std::string tmp = path + ".tmp";
  Status st;
  {
    UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    if (fd.get() < 0) return errno_status(tmp, "cannot create");
    st = write_all(fd.get(), head.data(), head.size(), tmp);
    for (size_t k = 0; st.ok() && k < tensors_.size(); ++k) {
      const Tensor& t = tensors_[k];
      const uint8_t* data = t.bytes.data();
      if (t.fill) {
        st = t.fill(std::span<uint8_t>(buf.data(), sizes[k])).With(fmt::format("{}: tensor {}", path, quote(t.name)));
        data = buf.data();
      }
      if (st.ok()) st = write_all(fd.get(), data, sizes[k], tmp);
      if (st.ok()) st = write_zeros(fd.get(), padding(sizes[k], alignment), tmp);
    }
    if (st.ok() && ::fsync(fd.get()) != 0) st = errno_status(tmp, "fsync failed");
    if (fd.close() != 0 && st.ok()) st = errno_status(tmp, "close failed");
  }
  if (st.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) st = errno_status(path, "cannot rename .tmp over it");
  if (!st.ok()) {
    ::unlink(tmp.c_str());
    return st;
  }
  std::string dir = std::filesystem::path(path).parent_path().string();
  return sync_dir(dir.empty() ? "." : dir);
}

}  // namespace tessera::io
