#include "ckpt/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>

#include "ckpt/reshard.h"
#include "io/checksum.h"
#include "io/json_guard.h"
#include "io/file.h"
#include "io/safetensors.h"

namespace tessera::ckpt {
namespace {

namespace fs = std::filesystem;

// A safetensors header longer than this is corruption (as in io/safetensors.cc).
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

Status io_error(const std::string& file, std::string_view what) {
  return Status::IOError(fmt::format("{}: {}: {}", file, what, std::strerror(errno)));
}

class ReadFd {
 public:
  // Regular files only: a FIFO in place of a piece is refused, not waited on.
  static Result<ReadFd> open(const std::string& path) {
    ASSIGN_OR_RETURN(io::UniqueFd fd, io::open_regular_file(path));
    return ReadFd(fd.release(), path);
  }
  ReadFd(ReadFd&& o) noexcept : fd_(std::exchange(o.fd_, -1)), path_(std::move(o.path_)) {}
  ~ReadFd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Result<uint64_t> size() const {
    struct stat info;
    if (::fstat(fd_, &info) != 0) return io_error(path_, "cannot stat");
    return static_cast<uint64_t>(info.st_size);
  }
  // Exactly n bytes at offset; Corruption if the file ends first.
  Status pread_all(void* dst, uint64_t n, uint64_t offset, std::string_view what) const {
    auto* p = static_cast<char*>(dst);
    uint64_t done = 0;
    while (done < n) {
      const ssize_t got = ::pread(fd_, p + done, n - done, static_cast<off_t>(offset + done));
      if (got < 0 && errno == EINTR) continue;
      if (got < 0) return io_error(path_, "read failed");
      if (got == 0)
        return Status::Corruption(fmt::format("{}: {} bytes [{}, {}) lie past the end of the file (truncated?)",
                                              path_, what, offset, offset + n));
      done += static_cast<uint64_t>(got);
    }
    return Status::OK();
  }

 private:
  ReadFd(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  int fd_;
  std::string path_;
};

// "(3, 5)": the view coordinate of element k of slice s's stored data.
std::string coordinate_of(const TensorSlice& s, int64_t k) {
  int64_t f = s.flat_begin + k;
  std::vector<int64_t> idx(s.view.rank);
  for (int d = s.view.rank - 1; d >= 0; d--) {
    idx[d] = s.begin[d] + (s.size[d] > 0 ? f % s.size[d] : 0);
    if (s.size[d] > 0) f /= s.size[d];
  }
  std::string out = "(";
  for (size_t d = 0; d < idx.size(); d++) out += (d ? ", " : "") + std::to_string(idx[d]);
  return out + ")";
}

}  // namespace

Result<std::string> resolve_checkpoint_dir(const std::string& path) {
  std::error_code ec;
  if (fs::exists(fs::path(path) / kManifestFile, ec)) return path;
  const std::string latest = (fs::path(path) / kLatestFile).string();
  if (!fs::exists(latest, ec))
    return Status::NotFound(fmt::format("{}: not a checkpoint (no {} and no {} pointer)", path, kManifestFile,
                                        kLatestFile));
  ASSIGN_OR_RETURN(std::vector<std::byte> bytes, io::read_file(latest));
  std::string name(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  while (!name.empty() && (name.back() == '\n' || name.back() == ' ' || name.back() == '\r')) name.pop_back();
  if (!parse_step_dir_name(name))
    return Status::Corruption(fmt::format("{}: does not name a step folder (step-NNNNNNNN)", latest));
  return (fs::path(path) / name).string();
}

Result<Checkpoint> Checkpoint::open(const std::string& path) {
  ASSIGN_OR_RETURN(std::string dir, resolve_checkpoint_dir(path));
  const std::string manifest_path = (fs::path(dir) / kManifestFile).string();
  ASSIGN_OR_RETURN(std::vector<std::byte> bytes, io::read_file(manifest_path));
  Result<Manifest> m = parse_manifest(std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
  if (!m.ok()) return m.status().With(manifest_path);
  fs::path normal = fs::path(dir).lexically_normal();
  if (!normal.has_filename()) normal = normal.parent_path();  // "DIR/step-00000050/"
  const std::string folder = normal.filename().string();
  std::optional<int64_t> folder_step = parse_step_dir_name(folder);
  if (folder_step && *folder_step != m->step)
    return Status::Corruption(fmt::format("{}: says step {} but lies in folder {}", manifest_path, m->step, folder));
  // Last: a manifest that reads well but was changed (a model dimension, a
  // piece's checksum, a piece dropped) fails its own checksum.
  if (Status st = check_manifest_checksum(std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
      !st.ok())
    return st.With(manifest_path);
  Checkpoint c;
  c.dir_ = normal.string();
  c.manifest_ = std::move(m).value();
  for (size_t s = 0; s < c.manifest_.shards.size(); s++)
    for (size_t p = 0; p < c.manifest_.shards[s].pieces.size(); p++)
      c.index_[c.manifest_.shards[s].pieces[p].name].push_back({s, p});
  return c;
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> out;
  for (const auto& [name, pieces] : index_) out.push_back(name);
  return out;
}

Result<const std::vector<Checkpoint::PieceRef>*> Checkpoint::find(std::string_view name) const {
  auto it = index_.find(name);
  if (it == index_.end()) return Status::NotFound(fmt::format("{}: no tensor named '{}'", dir_, name));
  return &it->second;
}

Result<Shape> Checkpoint::global_shape(std::string_view name) const {
  ASSIGN_OR_RETURN(const std::vector<PieceRef>* pieces, find(name));
  return piece_of(pieces->front()).slice.global;
}

Result<Shape> Checkpoint::view_shape(std::string_view name) const {
  ASSIGN_OR_RETURN(const std::vector<PieceRef>* pieces, find(name));
  return piece_of(pieces->front()).slice.view;
}

Result<std::string> Checkpoint::state(int rank) const {
  if (rank < 0 || rank >= world_size())
    return Status::InvalidArgument(
        fmt::format("{}: no rank {} (the checkpoint was saved by {} ranks)", dir_, rank, world_size()));
  const ShardRecord& s = manifest_.shards[rank];
  const std::string path = shard_path(s);
  ASSIGN_OR_RETURN(ReadFd fd, ReadFd::open(path));
  uint64_t header_len = 0;
  RETURN_IF_ERROR(fd.pread_all(&header_len, 8, 0, "header length"));
  if (header_len > kMaxHeaderBytes || header_len > s.bytes - std::min<uint64_t>(s.bytes, 8))
    return Status::Corruption(fmt::format("{}: header length {} is absurd for a {}-byte shard", path, header_len, s.bytes));
  std::string text(header_len, '\0');
  RETURN_IF_ERROR(fd.pread_all(text.data(), header_len, 8, "header"));
  if (Status st = io::check_json_nesting(text, io::JsonLimits{.max_depth = 3, .max_array = 64}); !st.ok())
    return st.With(path);
  const nlohmann::json header = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  auto meta = header.is_object() ? header.find("__metadata__") : header.end();
  if (meta == header.end() || !meta->is_object() || !meta->contains(kStateKey) || !(*meta)[kStateKey].is_string())
    return Status::Corruption(fmt::format("{}: header has no \"__metadata__\".\"{}\" string", path, kStateKey));
  std::string state = (*meta)[kStateKey].get<std::string>();
  const uint64_t got = XXH64(state.data(), state.size(), 0);
  if (got != s.state_xxh64)
    return Status::Corruption(fmt::format("{}: rank state xxh64 is {}, manifest says {} (corrupted)", path, hex64(got),
                                          hex64(s.state_xxh64)));
  return state;
}

Status Checkpoint::verify() const {
  for (const ShardRecord& s : manifest_.shards) {
    const std::string path = shard_path(s);
    ASSIGN_OR_RETURN(io::FileDigest d, io::file_xxh64(path));
    if (d.bytes != s.bytes)
      return Status::Corruption(
          fmt::format("{}: file is {} bytes, manifest says {} (truncated or replaced)", path, d.bytes, s.bytes));
    if (d.xxh64 != s.xxh64)
      return Status::Corruption(
          fmt::format("{}: xxh64 is {}, manifest says {} (corrupted)", path, hex64(d.xxh64), hex64(s.xxh64)));
    ASSIGN_OR_RETURN(ReadFd fd, ReadFd::open(path));
    // Every piece's own checksum too (what a resume reads).
    for (const PieceRecord& p : s.pieces) {
      std::vector<char> piece(p.bytes);
      RETURN_IF_ERROR(fd.pread_all(piece.data(), p.bytes, p.offset, "data"));
      const uint64_t h = XXH64(piece.data(), piece.size(), 0);
      if (h != p.xxh64)
        return Status::Corruption(fmt::format("{}: piece '{}' xxh64 is {}, manifest says {} (corrupted)", path,
                                              p.name, hex64(h), hex64(p.xxh64)));
    }
  }
  return Status::OK();
}

Status Checkpoint::read(std::string_view name, const TensorSlice& wanted, std::span<float> out) const {
  ASSIGN_OR_RETURN(const std::vector<PieceRef>* pieces, find(name));
  const std::string what = fmt::format("{}: tensor '{}'", dir_, name);
  if (Status st = check_slice(wanted); !st.ok()) return st.With(what + ": wanted slice");
  const Shape& stored_view = piece_of(pieces->front()).slice.view;
  if (wanted.view.rank != stored_view.rank)
    return Status::InvalidArgument(fmt::format("{}: wanted view {} has rank {} but the stored view {} has rank {}",
                                               what, wanted.view.str(), wanted.view.rank, stored_view.str(),
                                               stored_view.rank));
  if (static_cast<int64_t>(out.size()) != wanted.numel())
    return Status::InvalidArgument(
        fmt::format("{}: the wanted slice holds {} elements but out holds {}", what, wanted.numel(), out.size()));

  std::vector<uint8_t> covered(out.size(), 0);
  zero_outside(stored_view, wanted, out, covered);
  std::vector<float> buffer;
  for (const PieceRef& ref : *pieces) {
    const PieceRecord& p = piece_of(ref);
    if (intersection_size(p.slice, wanted) == 0) continue;  // read only the pieces that hold wanted elements
    const std::string path = shard_path(shard_of(ref));
    ASSIGN_OR_RETURN(ReadFd fd, ReadFd::open(path));
    // The manifest's range, against the file itself, before allocating.
    ASSIGN_OR_RETURN(uint64_t file_bytes, fd.size());
    if (p.offset > file_bytes || p.bytes > file_bytes - p.offset)
      return Status::Corruption(fmt::format("{}: piece '{}' bytes [{}, {}) lie past the end of the file ({} bytes; "
                                            "truncated?)", path, p.name, p.offset, p.offset + p.bytes, file_bytes));
    buffer.resize(static_cast<size_t>(p.slice.numel()));
    RETURN_IF_ERROR(fd.pread_all(buffer.data(), p.bytes, p.offset, fmt::format("piece '{}'", p.name)));
    const uint64_t got = XXH64(buffer.data(), p.bytes, 0);
    if (got != p.xxh64)
      return Status::Corruption(fmt::format("{}: piece '{}' xxh64 is {}, manifest says {} (corrupted)", path, p.name,
                                            hex64(got), hex64(p.xxh64)));
    copy_intersection(p.slice, buffer, wanted, out, covered);
  }
  auto hole = std::find(covered.begin(), covered.end(), uint8_t{0});
  if (hole != covered.end())
    return Status::Corruption(fmt::format("{}: element {} lies inside the stored extent {} but no stored piece holds it",
                                          what, coordinate_of(wanted, hole - covered.begin()), stored_view.str()));
  return Status::OK();
}

}  // namespace tessera::ckpt
