// Reading and writing Hugging Face safetensors files (docs/formats/safetensors.md).
//
// Layout: u64 little-endian header length N, N bytes of JSON header, data.
// Each header entry names a tensor with its dtype, shape and the byte range
// [begin, end) of its data, relative to the first byte after the header.
//
// SafetensorsFile maps the file read-only (open()) or holds bytes given to
// it (parse()), and validates every entry first, so later reads never leave
// the buffer. A mapped file costs resident memory only for the pages being
// read: read_f32() gives a tensor's pages back to the system after copying it
// out (they stay in the page cache), so a loader that goes tensor by tensor
// holds at most one tensor of the file at a time (issue #30 item 3). The
// file must not be truncated while it is open (a read past the new end would
// be SIGBUS, as for every reader that maps: llama.cpp, safetensors' own).
// Immutable after open() and safe to read from many threads at once.
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
  // Move-only: it holds the mapping (or the bytes).
  SafetensorsFile(SafetensorsFile&&) = default;
  SafetensorsFile& operator=(SafetensorsFile&&) = default;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  // Maps the file and validates it. Every error is one line that starts with
  // the path (a FIFO, a folder or a device is refused without blocking).
  static Result<SafetensorsFile> open(const std::string& path);
  // The same validation over bytes already in memory; `name` stands in for the
  // path in messages.
  static Result<SafetensorsFile> parse(std::string name, std::vector<std::byte> bytes);

  const std::vector<TensorInfo>& tensors() const { return tensors_; }  // sorted by begin offset
  const TensorInfo* find(std::string_view name) const;                 // nullptr if absent
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // Copies tensor `name` into dst (numel floats), converting F32/BF16/F16 to
  // float32, giving back the pages of each block of it as it goes (so the
  // mapped tensor is never resident whole). Error if absent, not a float type, or
  // dst.size() != numel.
  Status read_f32(std::string_view name, std::span<float> dst) const;
  // Elements [first, first + dst.size()) of the tensor, in its row-major
  // order (a block of rows, for loaders that go a few rows at a time).
  Status read_f32(std::string_view name, uint64_t first, std::span<float> dst) const;
  // Bytes [first, first + dst.size()) of tensor `name` as stored, dropping
  // pages as read_f32() does. Error if absent or out of its range.
  Status read_raw(std::string_view name, std::span<std::byte> dst, uint64_t first = 0) const;
  // Raw bytes of a tensor from tensors() or find(); valid while this object lives.
  std::span<const std::byte> raw(const TensorInfo& t) const;
  const std::string& path() const { return path_; }

 private:
  SafetensorsFile() = default;
  static Result<SafetensorsFile> finish(SafetensorsFile f);  // validate(), errors prefixed with the path
  // Gives the whole pages inside [p, p + n) of the mapping back to the
  // system (MADV_DONTNEED; nothing for parse()'s bytes): a later read faults
  // them in again from the file.
  void drop_range(const std::byte* p, size_t n) const;
  Status validate();  // fills tensors_, index_, metadata_ from bytes_

  std::string path_;
  std::vector<std::byte> owned_;      // parse()'s bytes
  std::shared_ptr<void> mapping_;     // open()'s mapping (munmap on release)
  std::span<const std::byte> bytes_;  // the whole file: owned_ or the mapping
  size_t data_start_ = 0;             // 8 + header length
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
  // A tensor whose bytes `fill` writes when write() reaches it, into a
  // buffer of exactly its size (reused across such tensors): a file larger
  // than memory is written one tensor at a time.
  using Fill = std::function<Status(std::span<std::byte> out)>;
  void add(std::string name, StDType dtype, std::vector<int64_t> shape, Fill fill);
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
    Fill fill;  // set instead of data
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
// The same, for a file written piece by piece: body calls append() with each
// piece in order; an error from body or append() removes the .tmp file.
using AppendFn = std::function<Status(std::span<const std::byte>)>;
Status write_file_atomic_stream(const std::string& path, const std::function<Status(const AppendFn& append)>& body);
// The whole file. NotFound if it does not exist; InvalidArgument if it is not
// a regular file (a FIFO, a folder, a device: see io/file.h), without
// blocking; IOError otherwise.
Result<std::vector<std::byte>> read_file(const std::string& path);

}  // namespace tessera::io
