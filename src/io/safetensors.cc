#include "io/safetensors.h"

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

#include <nlohmann/json.hpp>

#include "core/check.h"
#include "core/try.h"
#include "io/file.h"
#include "io/json_guard.h"
#include "tensor/dtype.h"

namespace tessera::io {
namespace {

// Tensor data and the header length are copied straight out of the file.
static_assert(std::endian::native == std::endian::little, "safetensors I/O assumes a little-endian host");

using nlohmann::json;

// A header longer than this is corruption, not a model (real ones are < 1 MB;
// the reference implementation's limit).
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
// The header's shape: the root object, a tensor's entry (or "__metadata__"),
// and its "shape" and "data_offsets" arrays; no tensor has 64 dimensions.
// Checked before the DOM parser builds anything (issue #18 item 1).
constexpr io::JsonLimits kHeaderLimits{.max_depth = 3, .max_array = 64};

struct DTypeRow {
  StDType dtype;
  std::string_view name;
  size_t size;
};
constexpr DTypeRow kDTypes[] = {
    {StDType::kF32, "F32", 4}, {StDType::kBF16, "BF16", 2}, {StDType::kF16, "F16", 2},
    {StDType::kF64, "F64", 8}, {StDType::kI64, "I64", 8},   {StDType::kI32, "I32", 4},
    {StDType::kI16, "I16", 2}, {StDType::kI8, "I8", 1},     {StDType::kU8, "U8", 1},
    {StDType::kU16, "U16", 2}, {StDType::kBool, "BOOL", 1},
};

const DTypeRow& row_of(StDType t) {
  for (const DTypeRow& r : kDTypes)
    if (r.dtype == t) return r;
  CHECK(false && "StDType missing from kDTypes");
  return kDTypes[0];
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// "<file>: <what>: <strerror(errno)>", read before anything can clobber errno.
Status errno_status(const std::string& file, std::string_view what) {
  return Status::IOError(fmt::format("{}: {}: {}", file, what, std::strerror(errno)));
}

Status write_all(int fd, std::span<const std::byte> bytes, const std::string& file) {
  while (!bytes.empty()) {
    ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno_status(file, "write failed");
    bytes = bytes.subspan(static_cast<size_t>(n));
  }
  return Status::OK();
}

// Makes a rename inside the folder of `path` durable.
Status fsync_parent(const std::string& path) {
  std::string dir = std::filesystem::path(path).parent_path().string();
  if (dir.empty()) dir = ".";
  return sync_dir(dir);
}

// Reads a JSON integer that must be >= 0 and fit in int64.
bool get_nonneg(const json& j, uint64_t* out) {
  if (j.is_number_unsigned()) {
    *out = j.get<uint64_t>();
    return *out <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  }
  if (j.is_number_integer() && j.get<int64_t>() >= 0) {
    *out = static_cast<uint64_t>(j.get<int64_t>());
    return true;
  }
  return false;
}

// One header entry, checked against the size of the data region. The error
// message names the tensor; the caller prefixes the file.
Result<TensorInfo> parse_entry(const std::string& name, const json& j, uint64_t data_size) {
  auto bad = [&](std::string_view what) { return Status::Corruption(fmt::format("tensor '{}': {}", name, what)); };
  if (!j.is_object()) return bad("entry is not a JSON object");
  TensorInfo t;
  t.name = name;

  auto dt = j.find("dtype");
  if (dt == j.end()) return bad("missing \"dtype\"");
  if (!dt->is_string()) return bad("\"dtype\" is not a string");
  std::optional<StDType> dtype = parse_st_dtype(dt->get_ref<const std::string&>());
  if (!dtype) return bad(fmt::format("unknown dtype '{}'", dt->get_ref<const std::string&>()));
  t.dtype = *dtype;

  auto shape = j.find("shape");
  if (shape == j.end()) return bad("missing \"shape\"");
  if (!shape->is_array()) return bad("\"shape\" is not an array of integers");
  int64_t numel = 1;
  for (const json& d : *shape) {
    if (!d.is_number_integer()) return bad("\"shape\" is not an array of integers");
    if (!d.is_number_unsigned() && d.get<int64_t>() < 0)
      return bad(fmt::format("negative dimension {} in \"shape\"", d.get<int64_t>()));
    uint64_t dim = 0;
    if (!get_nonneg(d, &dim)) return bad("dimension overflows int64");
    t.shape.push_back(static_cast<int64_t>(dim));
    if (__builtin_mul_overflow(numel, static_cast<int64_t>(dim), &numel)) return bad("element count overflows int64");
  }

  auto offsets = j.find("data_offsets");
  if (offsets == j.end()) return bad("missing \"data_offsets\"");
  if (!offsets->is_array() || offsets->size() != 2 || !get_nonneg((*offsets)[0], &t.begin) ||
      !get_nonneg((*offsets)[1], &t.end))
    return bad("\"data_offsets\" is not an array of two non-negative integers");
  const std::string range = fmt::format("data_offsets [{}, {}]", t.begin, t.end);
  if (t.end < t.begin) return bad(range + " end before they begin");
  if (t.end > data_size) return bad(fmt::format("{} lie outside the data region ({} bytes)", range, data_size));

  uint64_t nbytes = 0;
  if (__builtin_mul_overflow(static_cast<uint64_t>(numel), st_dtype_size(t.dtype), &nbytes))
    return bad("byte size overflows uint64");
  if (t.end - t.begin != nbytes)
    return bad(fmt::format("shape mismatch: shape {} of {} needs {} bytes but {} span {}", shape_str(t.shape),
                           st_dtype_name(t.dtype), nbytes, range, t.end - t.begin));
  return t;
}

}  // namespace

std::string_view st_dtype_name(StDType t) { return row_of(t).name; }
size_t st_dtype_size(StDType t) { return row_of(t).size; }

std::optional<StDType> parse_st_dtype(std::string_view name) {
  for (const DTypeRow& r : kDTypes)
    if (r.name == name) return r.dtype;
  return std::nullopt;
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1f) {  // inf or NaN: keep the payload
    bits = sign | 0x7f800000u | (mant << 13);
  } else if (exp != 0) {  // normal: rebias 15 -> 127
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  } else if (mant == 0) {  // signed zero
    bits = sign;
  } else {  // subnormal mant * 2^-24: shift until the implicit bit appears
    exp = 113;
    while ((mant & 0x400u) == 0) {
      mant <<= 1;
      --exp;
    }
    bits = sign | (exp << 23) | ((mant & 0x3ffu) << 13);
  }
  return std::bit_cast<float>(bits);
}

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// ---- SafetensorsFile ----

Result<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
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
  // Read in order, once: the kernel may read ahead and drop behind.
  ::madvise(p, size, MADV_SEQUENTIAL);
  SafetensorsFile f;
  f.path_ = path;
  f.mapping_ = std::shared_ptr<void>(p, [size](void* q) { ::munmap(q, size); });
  f.bytes_ = std::span<const std::byte>(static_cast<const std::byte*>(p), size);
  return finish(std::move(f));
}

Result<SafetensorsFile> SafetensorsFile::parse(std::string name, std::vector<std::byte> bytes) {
  SafetensorsFile f;
  f.path_ = std::move(name);
  f.owned_ = std::move(bytes);
  f.bytes_ = std::span<const std::byte>(f.owned_);
  return finish(std::move(f));
}

Result<SafetensorsFile> SafetensorsFile::finish(SafetensorsFile f) {
  Status st;
  try {
    st = f.validate();
  } catch (const json::exception& e) {  // not expected: every access is type-checked first
    st = Status::Corruption(fmt::format("bad header: {}", e.what()));
  }
  if (!st.ok()) return st.With(f.path_);
  return f;
}

Status SafetensorsFile::validate() {
  const uint64_t size = bytes_.size();
  if (size < 8) return Status::Corruption(fmt::format("file is {} bytes, shorter than the 8-byte header length", size));
  uint64_t header_len = 0;
  std::memcpy(&header_len, bytes_.data(), 8);
  if (header_len > kMaxHeaderBytes)
    return Status::Corruption(fmt::format("header length {} is absurd (limit {} bytes)", header_len, kMaxHeaderBytes));
  if (header_len > size - 8)
    return Status::Corruption(
        fmt::format("header length {} is larger than the file ({} bytes after the length)", header_len, size - 8));
  data_start_ = 8 + header_len;
  const uint64_t data_size = size - data_start_;

  const char* text = reinterpret_cast<const char*>(bytes_.data() + 8);
  if (Status st = check_json_nesting(std::string_view(text, header_len), kHeaderLimits); !st.ok())
    return Status::Corruption(fmt::format("header is not a safetensors header: {}", st.message()));
  json header = json::parse(text, text + header_len, nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded()) return Status::Corruption("header is not valid JSON");
  if (!header.is_object()) return Status::Corruption("header is not a JSON object");

  for (const auto& [key, value] : header.items()) {
    if (key == "__metadata__") {
      if (!value.is_object()) return Status::Corruption("\"__metadata__\" is not an object of strings");
      for (const auto& [k, v] : value.items()) {
        if (!v.is_string())
          return Status::Corruption(fmt::format("\"__metadata__\" value for '{}' is not a string", k));
        metadata_[k] = v.get<std::string>();
      }
      continue;
    }
    ASSIGN_OR_RETURN(TensorInfo t, parse_entry(key, value, data_size));
    tensors_.push_back(std::move(t));
  }

  std::sort(tensors_.begin(), tensors_.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  // Sorted by begin, and no overlap so far, so the last non-empty tensor ends
  // furthest. Empty tensors own no bytes and cannot overlap anything.
  const TensorInfo* last = nullptr;
  for (const TensorInfo& t : tensors_) {
    if (t.end == t.begin) continue;
    if (last != nullptr && t.begin < last->end)
      return Status::Corruption(fmt::format("tensors '{}' [{}, {}] and '{}' [{}, {}] overlap", last->name,
                                            last->begin, last->end, t.name, t.begin, t.end));
    last = &t;
  }
  for (size_t i = 0; i < tensors_.size(); ++i) index_.emplace(tensors_[i].name, i);
  return Status::OK();
}

const TensorInfo* SafetensorsFile::find(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

std::span<const std::byte> SafetensorsFile::raw(const TensorInfo& t) const {
  // validate() guarantees this for every tensor it produced.
  CHECK(t.begin <= t.end && t.end <= bytes_.size() - data_start_);
  return bytes_.subspan(data_start_ + t.begin, t.end - t.begin);
}

void SafetensorsFile::drop_range(const std::byte* p, size_t n) const {
  if (!mapping_ || n == 0) return;
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t begin = reinterpret_cast<uintptr_t>(p);
  const uintptr_t first = (begin + page - 1) / page * page, last = (begin + n) / page * page;
  // Advice only: a failure leaves the pages resident, nothing else.
  if (last > first) ::madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
}

Status SafetensorsFile::read_raw(std::string_view name, std::span<std::byte> dst, uint64_t first) const {
  const TensorInfo* t = find(name);
  if (t == nullptr) return Status::NotFound(fmt::format("{}: no tensor named '{}'", path_, name));
  const std::span<const std::byte> r = raw(*t);
  if (first > r.size() || dst.size() > r.size() - first)
    return Status::InvalidArgument(fmt::format("{}: tensor '{}' holds {} bytes, not [{}, {})", path_, name, r.size(),
                                               first, first + dst.size()));
  constexpr size_t kBlock = size_t{16} << 20;
  for (size_t i = 0; i < dst.size(); i += kBlock) {
    const size_t n = std::min(kBlock, dst.size() - i);
    std::memcpy(dst.data() + i, r.data() + first + i, n);
    drop_range(r.data() + first + i, n);
  }
  return Status::OK();
}

Status SafetensorsFile::read_f32(std::string_view name, std::span<float> dst) const {
  const TensorInfo* t = find(name);
  if (t == nullptr) return Status::NotFound(fmt::format("{}: no tensor named '{}'", path_, name));
  const size_t n = static_cast<size_t>(t->numel());
  if (dst.size() != n)
    return Status::InvalidArgument(
        fmt::format("{}: tensor '{}' of shape {} has {} elements but the destination holds {}",
                    path_, name, shape_str(t->shape), n, dst.size()));
  return read_f32(name, 0, dst);
}

Status SafetensorsFile::read_f32(std::string_view name, uint64_t first, std::span<float> dst) const {
  const TensorInfo* t = find(name);
  if (t == nullptr) return Status::NotFound(fmt::format("{}: no tensor named '{}'", path_, name));
  if (t->dtype != StDType::kF32 && t->dtype != StDType::kBF16 && t->dtype != StDType::kF16)
    return Status::InvalidArgument(fmt::format("{}: tensor '{}' has dtype {}, not a float type (F32, BF16, F16)",
                                               path_, name, st_dtype_name(t->dtype)));
  const size_t numel = static_cast<size_t>(t->numel());
  if (first > numel || dst.size() > numel - first)
    return Status::InvalidArgument(fmt::format("{}: tensor '{}' of shape {} has {} elements, not [{}, {})", path_,
                                               name, shape_str(t->shape), numel, first, first + dst.size()));
  const size_t n = dst.size();
  if (n == 0) return Status::OK();
  const size_t elem = st_dtype_size(t->dtype);
  const std::byte* src = raw(*t).data() + elem * first;
  // In blocks, each block's pages given back once converted: a mapped
  // tensor is resident one block at a time, not whole.
  constexpr size_t kBlock = size_t{4} << 20;  // elements
  for (size_t i0 = 0; i0 < n; i0 += kBlock) {
    const size_t i1 = std::min(n, i0 + kBlock);
    if (t->dtype == StDType::kF32) {
      std::memcpy(dst.data() + i0, src + 4 * i0, (i1 - i0) * sizeof(float));
    } else {
      for (size_t i = i0; i < i1; ++i) {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);  // the data region need not be aligned
        dst[i] = t->dtype == StDType::kBF16 ? bf16_to_f32(h) : f16_to_f32(h);
      }
    }
    drop_range(src + elem * i0, elem * (i1 - i0));
  }
  return Status::OK();
}

// ---- SafetensorsWriter ----

namespace {

// numel of a writer's shape; duplicate names and negative dims are bugs.
int64_t checked_numel(const std::string& name, const std::vector<int64_t>& shape) {
  CHECK(name != "__metadata__");
  int64_t numel = 1;
  for (int64_t d : shape) {
    CHECK(d >= 0);
    const bool overflow = __builtin_mul_overflow(numel, d, &numel);
    CHECK(!overflow);
  }
  return numel;
}

}  // namespace

void SafetensorsWriter::add(std::string name, StDType dtype, std::vector<int64_t> shape, const void* data) {
  for (const Entry& e : entries_) CHECK(e.name != name);
  CHECK(data != nullptr || checked_numel(name, shape) == 0);
  entries_.push_back({std::move(name), dtype, std::move(shape), data, nullptr});
}

void SafetensorsWriter::add(std::string name, StDType dtype, std::vector<int64_t> shape, Fill fill) {
  for (const Entry& e : entries_) CHECK(e.name != name);
  checked_numel(name, shape);
  CHECK(fill != nullptr);
  entries_.push_back({std::move(name), dtype, std::move(shape), nullptr, std::move(fill)});
}

void SafetensorsWriter::set_metadata(std::string key, std::string value) {
  metadata_[std::move(key)] = std::move(value);
}

Status SafetensorsWriter::write(const std::string& path) const {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata_.empty()) header["__metadata__"] = metadata_;
  std::vector<uint64_t> sizes;
  uint64_t offset = 0, largest_fill = 0;
  for (const Entry& e : entries_) {
    const uint64_t nbytes = static_cast<uint64_t>(checked_numel(e.name, e.shape)) * st_dtype_size(e.dtype);
    header[e.name] = {{"dtype", std::string(st_dtype_name(e.dtype))},
                      {"shape", e.shape},
                      {"data_offsets", nlohmann::ordered_json::array({offset, offset + nbytes})}};
    sizes.push_back(nbytes);
    if (e.fill) largest_fill = std::max(largest_fill, nbytes);
    offset += nbytes;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception&) {
    return Status::InvalidArgument(fmt::format("{}: a tensor name or metadata string is not valid UTF-8", path));
  }
  text.append((8 - text.size() % 8) % 8, ' ');  // keeps the data 8-byte aligned, as the reference writer does
  const uint64_t header_len = text.size();
  std::vector<std::byte> buf;
  try {
    buf.resize(largest_fill);
  } catch (const std::bad_alloc&) {
    return Status::ResourceExhausted(fmt::format("{}: no memory for a {} byte tensor", path, largest_fill));
  }
  return write_file_atomic_stream(path, [&](const AppendFn& append) -> Status {
    RETURN_IF_ERROR(append(std::as_bytes(std::span(&header_len, 1))));
    RETURN_IF_ERROR(append(std::as_bytes(std::span(text))));
    for (size_t i = 0; i < entries_.size(); i++) {
      const Entry& e = entries_[i];
      if (!e.fill) {
        RETURN_IF_ERROR(append(std::span<const std::byte>(static_cast<const std::byte*>(e.data), sizes[i])));
        continue;
      }
      const std::span<std::byte> out(buf.data(), sizes[i]);
      RETURN_IF_ERROR(e.fill(out).With(fmt::format("{}: tensor '{}'", path, e.name)));
      RETURN_IF_ERROR(append(out));
    }
    return Status::OK();
  });
}

// ---- file helpers ----

Status write_file_atomic(const std::string& path, std::span<const std::span<const std::byte>> pieces) {
  return write_file_atomic_stream(path, [&](const AppendFn& append) -> Status {
    for (std::span<const std::byte> piece : pieces) RETURN_IF_ERROR(append(piece));
    return Status::OK();
  });
}

Status write_file_atomic_stream(const std::string& path, const std::function<Status(const AppendFn& append)>& body) {
  const std::string tmp = path + ".tmp";
  Status st;
  {
    UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    if (fd.get() < 0) return errno_status(tmp, "cannot create");
    st = body([&](std::span<const std::byte> piece) { return write_all(fd.get(), piece, tmp); });
    if (st.ok() && ::fsync(fd.get()) != 0) st = errno_status(tmp, "fsync failed");
    if (fd.close() != 0 && st.ok()) st = errno_status(tmp, "close failed");
  }
  if (st.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) st = errno_status(path, "cannot rename .tmp over it");
  if (!st.ok()) {
    ::unlink(tmp.c_str());
    return st;
  }
  return fsync_parent(path);
}

Result<std::vector<std::byte>> read_file(const std::string& path) {
  ASSIGN_OR_RETURN(UniqueFd fd, open_regular_file(path));
  struct stat info;
  if (::fstat(fd.get(), &info) != 0) return errno_status(path, "cannot stat");
  std::vector<std::byte> bytes(static_cast<size_t>(info.st_size));
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::read(fd.get(), bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno_status(path, "read failed");
    if (n == 0) return Status::IOError(fmt::format("{}: file shrank while being read", path));
    done += static_cast<size_t>(n);
  }
  return bytes;
}

}  // namespace tessera::io
