// Reading and writing GGUF files, llama.cpp's model format, versions 2 and 3
// (docs/formats/gguf.md).
//
// Layout, all little-endian: the header ("GGUF", u32 version, u64 tensor
// count, u64 key-value count), the key-value metadata, one info per tensor
// (name, dimensions, ggml type, offset), zero padding to the alignment, then
// the data section holding every tensor at its offset. Dimensions are ggml's
// `ne`: ne[0] is the innermost (contiguous) one, so a PyTorch (rows, cols)
// matrix has ne = {cols, rows}.
//
// GgufFile maps the file read-only (open()) or holds bytes given to it
// (parse()) and validates everything before returning: every length and
// count against the bytes left, every tensor's type, shape and byte range.
// Later reads never leave the buffer. The file must not be truncated while
// it is open (a read past the new end would be SIGBUS, as for every reader
// that maps). Immutable after open() and safe to read from many threads.
//
// Errors a file can cause are one line that starts with the path. Misuse of
// the writer that can only be a bug (an inconsistent GgufValue) is a CHECK.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace tessera::io {

// ---- ggml tensor types ----

// The ggml type ids this reader knows (ggml.h's enum ggml_type). Ids it does
// not list (4 and 5, 31-33 and 36-38 were removed from ggml; 40 and up are
// newer than this reader) are refused when a file is opened.
enum class GgmlType : uint32_t {
  kF32 = 0, kF16 = 1, kQ4_0 = 2, kQ4_1 = 3, kQ5_0 = 6, kQ5_1 = 7, kQ8_0 = 8, kQ8_1 = 9,
  kQ2_K = 10, kQ3_K = 11, kQ4_K = 12, kQ5_K = 13, kQ6_K = 14, kQ8_K = 15,
  kIQ2_XXS = 16, kIQ2_XS = 17, kIQ3_XXS = 18, kIQ1_S = 19, kIQ4_NL = 20, kIQ3_S = 21, kIQ2_S = 22, kIQ4_XS = 23,
  kI8 = 24, kI16 = 25, kI32 = 26, kI64 = 27, kF64 = 28, kIQ1_M = 29, kBF16 = 30,
  kTQ1_0 = 34, kTQ2_0 = 35, kMXFP4 = 39,
};

// "F32", "Q4_K", ...; "type 99" for an id this reader does not know.
std::string ggml_type_name(uint32_t id);
inline std::string ggml_type_name(GgmlType t) { return ggml_type_name(static_cast<uint32_t>(t)); }
// Whether `id` is one of GgmlType's values.
bool ggml_type_known(uint32_t id);
// Elements per block (1 for F32, 32 for Q8_0, 256 for Q4_K) and bytes per
// block (4, 34, 144). A row (ne[0] elements) is a whole number of blocks. t
// must be one of GgmlType's values (CHECK): a cast from an unchecked id is a bug.
uint32_t ggml_block_elems(GgmlType t);
uint32_t ggml_block_bytes(GgmlType t);


// ---- metadata values ----

enum class GgufType : uint32_t {
  kUint8 = 0, kInt8 = 1, kUint16 = 2, kInt16 = 3, kUint32 = 4, kInt32 = 5, kFloat32 = 6, kBool = 7,
  kString = 8, kArray = 9, kUint64 = 10, kInt64 = 11, kFloat64 = 12,
};

// "u8", "i32", "f64", "bool", "string", "array"; "type 13" for an unknown id.
std::string gguf_type_name(uint32_t id);
inline std::string gguf_type_name(GgufType t) { return gguf_type_name(static_cast<uint32_t>(t)); }
// Bytes of one scalar of type t in the file; 0 for kString and kArray.
size_t gguf_scalar_size(GgufType t);

// One metadata value. Plain data: the fields that hold it depend on `type`.
//   kUint8, kUint16, kUint32, kUint64, kBool   u (a bool is 0 or 1)
//   kInt8, kInt16, kInt32, kInt64              i
//   kFloat32, kFloat64                         f
//   kString                                    str (bytes as stored; not checked to be UTF-8)
//   kArray    elem_type, count, and the elements in the one member that fits
//             elem_type: raw (scalars, little-endian as in the file,
//             count * gguf_scalar_size(elem_type) bytes), strings, or arrays.
// The factories below build consistent values; GgufWriter CHECKs that a value
// is consistent.
struct GgufValue {
  GgufType type = GgufType::kUint8;
  uint64_t u = 0;
  int64_t i = 0;
  double f = 0;
  std::string str;
  GgufType elem_type = GgufType::kUint8;
  uint64_t count = 0;
  std::vector<uint8_t> raw;
  std::vector<std::string> strings;
  std::vector<GgufValue> arrays;

  // Scalars. t must be a type of the matching kind (CHECK), and v must fit
  // it (CHECK): from_uint(kUint8, 300) is a bug.
  static GgufValue from_uint(GgufType t, uint64_t v);
  static GgufValue from_int(GgufType t, int64_t v);
  static GgufValue from_float(GgufType t, double v);  // kFloat32 stores float(v)
  static GgufValue from_bool(bool v);
  static GgufValue from_string(std::string v);
  // Arrays.
  static GgufValue array_of_raw(GgufType elem, std::vector<uint8_t> raw);  // elem a scalar type
  static GgufValue array_of_strings(std::vector<std::string> v);
  static GgufValue array_of_arrays(std::vector<GgufValue> v);  // each element a kArray
  static GgufValue array_of_floats(std::span<const float> v);
  static GgufValue array_of_int32(std::span<const int32_t> v);

  bool is_integer() const;  // a scalar of an integer type (not bool)
  // An integer scalar >= 0 / an integer scalar that fits int64 / a kFloat32 or
  // kFloat64 scalar; nullopt otherwise.
  std::optional<uint64_t> as_uint() const;
  std::optional<int64_t> as_int() const;
  std::optional<double> as_float() const;
  // "u32", "string", "array of f32", "array of array": for messages.
  std::string type_str() const;
};

struct GgufKv {
  std::string key;
  GgufValue value;
};

// ---- tensors ----

struct GgufTensorInfo {
  std::string name;
  GgmlType type = GgmlType::kF32;
  std::vector<int64_t> ne;  // 0..4 dims, ne[0] innermost; empty: one element
  uint64_t offset = 0;      // absolute, from the first byte of the file
  uint64_t bytes = 0;       // numel / block elems * block bytes
  int64_t numel() const;
  // ne reversed: the row-major (PyTorch) shape, outermost first.
  std::vector<int64_t> shape() const;
};

// n values (a multiple of 32) of Q8_0 blocks at src into dst: each block is
// an fp16 scale d and 32 int8 codes q, x = d * q (exact in fp32).
void dequantize_q8_0(const uint8_t* src, size_t n, float* dst);
// n values (a multiple of 256) of Q6_K super-blocks at src into dst, as
// ggml's dequantize_row_q6_K: 210 bytes a block, 128 low nibbles ql, 64
// bytes of high 2-bit pairs qh, 16 int8 scales of 16 values each and an
// fp16 d; x = d * scale * (q - 32) in that order (what llama-quantize
// writes for the output layer of Q4_0 and Q4_K files, and for some
// attn_v and ffn_down of Q4_K_M ones).
void dequantize_q6_k(const uint8_t* src, size_t n, float* dst);
// The other types llama-quantize writes into 4- and 5-bit files, each as
// ggml's dequantize_row_* computes it (n a multiple of the block):
//   Q5_K: 176 bytes a 256: fp16 d and dmin, Q4_K's 12 bytes of 6-bit scales
//     and mins, 32 bytes of fifth bits, 128 of nibbles; x = d*sc * q - dmin*m
//     (Q4_K_S puts some attn_v at Q5_K, Q5_K_M its matrices);
//   Q4_1: 20 bytes a 32: fp16 d and m, 16 bytes of nibbles; x = q * d + m;
//   Q5_0: 22 bytes a 32: fp16 d, 4 bytes of fifth bits, 16 of nibbles;
//     x = (q - 16) * d (llama.cpp's fallback for Q4_K where 256 does not
//     divide a row);
//   Q5_1: 24 bytes a 32: fp16 d and m, fifth bits, nibbles; x = q * d + m.
void dequantize_q5_k(const uint8_t* src, size_t n, float* dst);
void dequantize_q4_1(const uint8_t* src, size_t n, float* dst);
void dequantize_q5_0(const uint8_t* src, size_t n, float* dst);
void dequantize_q5_1(const uint8_t* src, size_t n, float* dst);
// Whether read_f32 / read_f32_rows convert type t: F32, F16, BF16, Q8_0,
// Q4_1, Q5_0, Q5_1, Q5_K and Q6_K.
bool read_by_values(GgmlType t);

class GgufFile {
 public:
  // Move-only: it holds the mapping (or the bytes).
  GgufFile(GgufFile&&) = default;
  GgufFile& operator=(GgufFile&&) = default;
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  // Maps the file and validates it (a FIFO, a folder or a device is refused
  // without blocking). NotFound if it does not exist, InvalidArgument if it is
  // not a regular file, Corruption for a malformed file, IOError otherwise.
  static Result<GgufFile> open(const std::string& path);
  // The same validation over bytes already in memory; `name` stands in for
  // the path in messages.
  static Result<GgufFile> parse(std::string name, std::vector<std::byte> bytes);

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }      // 2 or 3
  uint64_t alignment() const { return alignment_; }  // general.alignment, or 32
  uint64_t data_offset() const { return data_offset_; }  // first byte of the data section

  // ---- metadata, in file order ----
  const std::vector<GgufKv>& metadata() const { return kvs_; }
  const GgufValue* find(std::string_view key) const;  // nullptr if absent
  bool has(std::string_view key) const { return find(key) != nullptr; }
  // Typed getters. NotFound "PATH: no key 'k'" when absent; Corruption
  // "PATH: key 'k' is string, not an unsigned integer" when of the wrong type.
  Result<std::string> get_string(std::string_view key) const;
  Result<uint64_t> get_uint(std::string_view key) const;  // any integer type holding a value >= 0
  Result<int64_t> get_int(std::string_view key) const;    // any integer type whose value fits int64
  Result<double> get_float(std::string_view key) const;   // f32 or f64
  Result<bool> get_bool(std::string_view key) const;
  // The array's strings; valid while this object lives.
  Result<std::span<const std::string>> get_string_array(std::string_view key) const;
  Result<std::vector<float>> get_float_array(std::string_view key) const;  // f32 or f64 elements
  Result<std::vector<int64_t>> get_int_array(std::string_view key) const;  // integer elements fitting int64

  // ---- tensors, in file order ----
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  const GgufTensorInfo* find_tensor(std::string_view name) const;  // nullptr if absent
  // The tensor's bytes as stored; valid while this object lives.
  std::span<const uint8_t> tensor_bytes(const GgufTensorInfo& t) const;
  // Once a tensor's bytes are copied out: gives the whole pages inside them
  // back (a mapped file: read again from the file if touched later; bytes
  // given to parse(): nothing).
  void drop_tensor_pages(const GgufTensorInfo& t) const {
    const std::span<const uint8_t> b = tensor_bytes(t);
    drop_range(b.data(), b.size());
  }
  // Copies tensor `name` into dst (numel floats), converting F32, F16, BF16,
  // Q8_0 (dequantized: each block's 32 int8 codes times its fp16 scale),
  // Q6_K, Q5_K, Q4_1, Q5_0 and Q5_1 (dequantize_*),
  // in ggml's element order (ne[0] fastest), giving back each block of pages
  // of a mapped file once converted. NotFound if absent; InvalidArgument for
  // another type or when dst.size() != numel.
  Status read_f32(std::string_view name, std::span<float> dst) const;
  // Rows [row0, row0 + dst.size() / ne[0]) of tensor t (a row: ne[0]
  // elements, whole blocks) into dst, converted and given back as
  // read_f32 does, so that a large tensor can be read a few rows at a time.
  // InvalidArgument for another type, or when dst is not whole rows inside
  // the tensor.
  Status read_f32_rows(const GgufTensorInfo& t, int64_t row0, std::span<float> dst) const;
  // Gives the whole pages inside [p, p + n) of a mapping back (MADV_DONTNEED);
  // p inside a tensor's bytes. Nothing for bytes given to parse().
  void drop_range(const uint8_t* p, size_t n) const;

 private:
  GgufFile() = default;
  static Result<GgufFile> finish(GgufFile f);  // validate(), errors prefixed with the path
  Status validate();                           // fills everything below from bytes_
  Status type_error(std::string_view key, const GgufValue& v, std::string_view wanted) const;

  std::string path_;
  std::vector<std::byte> owned_;     // parse()'s bytes
  std::shared_ptr<void> mapping_;    // open()'s mapping (munmap on release)
  std::span<const uint8_t> bytes_;   // the whole file: owned_ or the mapping
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<GgufKv> kvs_;
  std::map<std::string, size_t, std::less<>> kv_index_;  // key -> position in kvs_
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;  // name -> position in tensors_
};

// Collects metadata and tensors, then writes one GGUF file (version 3). Not
// thread safe. Tensor bytes are given whole or produced by a callback when
// write() reaches the tensor, so a model larger than memory is written one
// tensor at a time.
class GgufWriter {
 public:
  // Setting a key again replaces its value in place (the key keeps its
  // position). Keys are written in the order first set.
  void set(std::string key, GgufValue value);
  void set_string(std::string key, std::string value);
  void set_uint32(std::string key, uint32_t value);
  void set_uint64(std::string key, uint64_t value);
  void set_int32(std::string key, int32_t value);
  void set_float32(std::string key, float value);
  void set_bool(std::string key, bool value);
  void set_string_array(std::string key, std::vector<std::string> value);
  void set_float_array(std::string key, std::span<const float> value);
  void set_int32_array(std::string key, std::span<const int32_t> value);

  // Writes exactly the tensor's bytes into `out` (numel / block elems * block
  // bytes; a buffer reused across tensors). An error aborts write().
  using BytesFn = std::function<Status(std::span<uint8_t> out)>;
  // ne: ggml order (ne[0] innermost), 0..4 dims. Names, shapes and byte counts
  // are checked by write(), not here.
  void add_tensor(std::string name, GgmlType type, std::vector<int64_t> ne, BytesFn fill);
  void add_tensor(std::string name, GgmlType type, std::vector<int64_t> ne, std::vector<uint8_t> bytes);

  // Writes path + ".tmp", fsyncs it and renames it over `path`, so readers
  // see the old file or the new one. Alignment: general.alignment if set (a
  // u32 power of two), else 32; the data section and every tensor (the last
  // one too) are zero-padded to it. InvalidArgument naming the tensor or key
  // for a bad name (empty, over 63 bytes: llama.cpp's limit), a duplicate
  // tensor, a bad shape (n_dims > 4, ne < 0, ne[0] not a multiple of the
  // block) or a byte count that does not match, found before anything is
  // created; IOError naming the file and strerror; a failing BytesFn's error
  // prefixed with the path and tensor. On error no .tmp file is left and a
  // file already at `path` is untouched.
  Status write(const std::string& path) const;

 private:
  struct Tensor {
    std::string name;
    GgmlType type;
    std::vector<int64_t> ne;
    BytesFn fill;                // set, or
    std::vector<uint8_t> bytes;  // these
  };
  std::vector<GgufKv> kvs_;
  std::vector<Tensor> tensors_;
};

}  // namespace tessera::io
