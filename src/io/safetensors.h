// Reading and writing Hugging Face safetensors files (docs/formats/safetensors.md).
//
// Layout: u64 little-endian header length N, N bytes of JSON header, data.
// Each header entry names a tensor with its dtype, shape and the byte range
// [begin, end) of its data, relative to the first byte after the header.
//
// SafetensorsFile holds the whole file in memory and validates every entry at
// open(), so later reads never leave the buffer. It is immutable after open()
// and safe to read from many threads at once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace tessera::io {

enum class StDType { kF32, kBF16, kF16, kF64, kI64, kI32, kI16, kI8, kU8, kU16, kBool };

// "F32", "BF16", ... as spelled in the header.
std::string_view st_dtype_name(StDType t);
// Bytes per element.
size_t st_dtype_size(StDType t);
// nullopt for a name this reader does not know (e.g. "F8_E4M3").
std::optional<StDType> parse_st_dtype(std::string_view name);

// IEEE half (raw bits) -> float, exact (subnormals, inf and NaN included).
float f16_to_f32(uint16_t h);

struct TensorInfo {
  std::string name;
  StDType dtype = StDType::kF32;
  std::vector<int64_t> shape;  // empty: a scalar (numel 1)
  uint64_t begin = 0, end = 0;  // byte range within the data region
  int64_t numel() const;
};

class SafetensorsFile {
 public:
  // Move-only: it holds the whole file.
  SafetensorsFile(SafetensorsFile&&) = default;
  SafetensorsFile& operator=(SafetensorsFile&&) = default;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  // Reads the whole file into memory and validates it. Every error is one line
  // that starts with the path.
  static Result<SafetensorsFile> open(const std::string& path);
  // The same validation over bytes already in memory; `name` stands in for the
  // path in messages.
  static Result<SafetensorsFile> parse(std::string name, std::vector<std::byte> bytes);

  const std::vector<TensorInfo>& tensors() const { return tensors_; }  // sorted by begin offset
  const TensorInfo* find(std::string_view name) const;                 // nullptr if absent
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // Copies tensor `name` into dst (numel floats), converting F32/BF16/F16 to
  // float32. Error if absent, not a float type, or dst.size() != numel.
  Status read_f32(std::string_view name, std::span<float> dst) const;
  // Raw bytes of a tensor from tensors() or find(); valid while this object lives.
  std::span<const std::byte> raw(const TensorInfo& t) const;
  const std::string& path() const { return path_; }

 private:
  SafetensorsFile() = default;
  Status validate();  // fills tensors_, index_, metadata_ from bytes_

  std::string path_;
  std::vector<std::byte> bytes_;  // the whole file
  size_t data_start_ = 0;         // 8 + header length
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> index_;  // name -> position in tensors_
  std::map<std::string, std::string> metadata_;
};

// Collects tensors, then writes them as one safetensors file. Not thread safe.
// The writer does not own tensor data: each `data` pointer must stay valid
// until write() returns.
class SafetensorsWriter {
 public:
  // data holds numel(shape) elements of dtype (BF16 as raw uint16 bits); it may
  // be null only when numel is 0. Duplicate names and negative dims are bugs.
  void add(std::string name, StDType dtype, std::vector<int64_t> shape, const void* data);
  void set_metadata(std::string key, std::string value);
  // Atomic (see write_file_atomic). The header is padded with spaces to a
  // multiple of 8 bytes; tensors are laid out in the order added.
  Status write(const std::string& path) const;

 private:
  struct Entry {
    std::string name;
    StDType dtype;
    std::vector<int64_t> shape;
    const void* data;
  };
  std::vector<Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

// File helpers shared by the on-disk formats (also used by data/shard.cc).
//
// Writes the concatenation of `pieces` to path + ".tmp", fsyncs it, renames it
// over `path` and fsyncs the folder, so readers see the old file or the new
// one, never a torn one. On error the .tmp file is removed and the Status
// names the file and strerror.
Status write_file_atomic(const std::string& path, std::span<const std::span<const std::byte>> pieces);
// The whole file. NotFound if it does not exist; InvalidArgument if it is not
// a regular file (a FIFO, a folder, a device: see io/file.h), without
// blocking; IOError otherwise.
Result<std::vector<std::byte>> read_file(const std::string& path);

}  // namespace tessera::io
