#include "serve/registry.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <stdio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <set>

#include <fmt/format.h>

#include "io/checksum.h"
#include "io/file.h"
#include "io/safetensors.h"
#include "nn/gguf_model.h"
#include "nn/gpt2_weights.h"

namespace tessera::serve {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr std::string_view kTmpPrefix = ".tmp-";
constexpr std::string_view kRemovingPrefix = ".rm-";
constexpr int kMaxVersion = 1'000'000'000;

// 12 for "12"; nullopt for "012", "-1", ".tmp-3-1", "".
std::optional<int> parse_version(std::string_view s) {
  if (s.empty() || s.size() > 10 || (s.size() > 1 && s[0] == '0')) return std::nullopt;
  int v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size() || v < 1 || v > kMaxVersion) return std::nullopt;
  return v;
}

Status io_error(const std::string& path, std::string_view what, int err) {
  return Status::IOError(fmt::format("{}: {}: {}", path, what, std::strerror(err)));
}

// rename(2) that refuses an existing target (EEXIST), where the file
// system can; elsewhere plain rename, which still refuses a non-empty
// folder (ENOTEMPTY), and a version folder is never empty.
int rename_no_replace(const std::string& from, const std::string& to) {
  if (::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_NOREPLACE) == 0) return 0;
  if (errno != EINVAL && errno != ENOSYS) return -1;
  if (fs::exists(to)) {
    errno = EEXIST;
    return -1;
  }
  return ::rename(from.c_str(), to.c_str());
}

// The pid in ".tmp-PID-N" / ".rm-PID-N"; 0 when it has none.
pid_t owner_pid(std::string_view folder, std::string_view prefix) {
  folder.remove_prefix(prefix.size());
  pid_t pid = 0;
  auto [end, ec] = std::from_chars(folder.data(), folder.data() + folder.size(), pid);
  if (ec != std::errc() || end == folder.data() || pid <= 0) return 0;
  return pid;
}

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

Status write_text_atomic(const std::string& path, const std::string& text) {
  const std::span<const std::byte> piece = std::as_bytes(std::span(text));
  return io::write_file_atomic(path, std::span<const std::span<const std::byte>>(&piece, 1));
}

}  // namespace

const RegistryFile* VersionManifest::file(std::string_view path) const {
  for (const RegistryFile& f : files)
    if (f.path == path) return &f;
  return nullptr;
}

// ---- manifest ----

json version_manifest_to_json(const VersionManifest& m) {
  json files = json::array();
  for (const RegistryFile& f : m.files)
    files.push_back({{"path", f.path}, {"bytes", f.bytes}, {"xxh64", io::hex64(f.xxh64)}, {"dtype", f.dtype}});
  json j = {{"format", kRegistryManifestFormat},
            {"format_version", kRegistryManifestVersion},
            {"name", m.name},
            {"version", m.version},
            {"created", m.created},
            {"source", m.source},
            {"dtypes", m.dtypes},
            {"model", m.model},
            {"files", std::move(files)}};
  j["manifest_xxh64"] = io::hex64(io::xxh64(j.dump()));
  return j;
}

Result<VersionManifest> parse_version_manifest(std::string_view text) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Status::Corruption("not a JSON object");
  auto str = [&](const char* key) -> Result<std::string> {
    auto it = j.find(key);
    if (it == j.end() || !it->is_string()) return Status::Corruption(fmt::format("no \"{}\" string", key));
    return it->get<std::string>();
  };
  ASSIGN_OR_RETURN(std::string format, str("format"));
  if (format != kRegistryManifestFormat)
    return Status::Corruption(fmt::format("\"format\" is '{}', not '{}'", format, kRegistryManifestFormat));
  if (!j.contains("format_version") || !j["format_version"].is_number_integer())
    return Status::Corruption("no \"format_version\" integer");
  if (j["format_version"].get<int64_t>() != kRegistryManifestVersion)
    return Status::Corruption(fmt::format("\"format_version\" {} is not supported (this build reads {})",
                                          j["format_version"].dump(), kRegistryManifestVersion));
  // The self-check: every other field as written.
  ASSIGN_OR_RETURN(std::string sum_text, str("manifest_xxh64"));
  const std::optional<uint64_t> want = io::parse_hex64(sum_text);
  if (!want) return Status::Corruption("\"manifest_xxh64\" is not 16 hex digits");
  json rest = j;
  rest.erase("manifest_xxh64");
  const uint64_t got = io::xxh64(rest.dump());
  if (got != *want)
    return Status::Corruption(fmt::format(
        "its contents hash to {} but \"manifest_xxh64\" says {}: the manifest was edited or corrupted",
        io::hex64(got), sum_text));

  VersionManifest m;
  ASSIGN_OR_RETURN(m.name, str("name"));
  ASSIGN_OR_RETURN(m.created, str("created"));
  ASSIGN_OR_RETURN(m.source, str("source"));
  if (!j.contains("version") || !j["version"].is_number_integer() || j["version"].get<int64_t>() < 1 ||
      j["version"].get<int64_t>() > kMaxVersion)
    return Status::Corruption("no \"version\" integer >= 1");
  m.version = j["version"].get<int>();
  if (!j.contains("dtypes") || !j["dtypes"].is_array()) return Status::Corruption("no \"dtypes\" array");
  for (const json& d : j["dtypes"]) {
    if (!d.is_string()) return Status::Corruption("\"dtypes\" holds a non-string");
    m.dtypes.push_back(d.get<std::string>());
  }
  if (j.contains("model") && j["model"].is_object()) m.model = j["model"];
  if (!j.contains("files") || !j["files"].is_array()) return Status::Corruption("no \"files\" array");
  std::set<std::string> seen;
  for (const json& f : j["files"]) {
    if (!f.is_object() || !f.contains("path") || !f["path"].is_string() || !f.contains("bytes") ||
        !f["bytes"].is_number_unsigned() || !f.contains("xxh64") || !f["xxh64"].is_string())
      return Status::Corruption("a \"files\" entry lacks \"path\", \"bytes\" or \"xxh64\"");
    RegistryFile rf;
    rf.path = f["path"].get<std::string>();
    // Inside the version folder: no absolute path, no "..", no hidden file.
    if (rf.path.empty() || rf.path[0] == '/' || rf.path[0] == '.' || rf.path.find("/.") != std::string::npos ||
        rf.path == kRegistryManifestFile)
      return Status::Corruption(fmt::format("file path '{}' is not allowed", rf.path));
    if (!seen.insert(rf.path).second) return Status::Corruption(fmt::format("file '{}' is listed twice", rf.path));
    rf.bytes = f["bytes"].get<uint64_t>();
    const std::optional<uint64_t> h = io::parse_hex64(f["xxh64"].get<std::string>());
    if (!h) return Status::Corruption(fmt::format("file '{}': \"xxh64\" is not 16 hex digits", rf.path));
    rf.xxh64 = *h;
    if (f.contains("dtype") && f["dtype"].is_string()) rf.dtype = f["dtype"].get<std::string>();
    m.files.push_back(std::move(rf));
  }
  return m;
}

// ---- names ----

Status check_model_name(std::string_view name) {
  if (name.empty()) return Status::InvalidArgument("the model name is empty");
  if (name.size() > 64) return Status::InvalidArgument(fmt::format("model name '{}' is longer than 64 characters", name));
  auto ok = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-'; };
  if (!std::isalnum(static_cast<unsigned char>(name[0])) || !std::all_of(name.begin(), name.end(), ok))
    return Status::InvalidArgument(fmt::format(
        "model name '{}': use letters, digits, '.', '_' and '-', starting with a letter or digit", name));
  return Status::OK();
}

Result<ModelRef> parse_model_ref(std::string_view ref) {
  ModelRef r;
  const size_t colon = ref.rfind(':');
  r.name = std::string(ref.substr(0, colon));
  RETURN_IF_ERROR(check_model_name(r.name));
  if (colon != std::string_view::npos) {
    r.version = parse_version(ref.substr(colon + 1));
    if (!r.version)
      return Status::InvalidArgument(
          fmt::format("'{}': the version after ':' must be a number >= 1", ref));
  }
  return r;
}

// ---- StagedVersion ----

StagedVersion::StagedVersion(StagedVersion&& o) noexcept
    : name_(std::move(o.name_)), dir_(std::exchange(o.dir_, std::string())) {}

StagedVersion::~StagedVersion() {
  if (dir_.empty()) return;
  std::error_code ec;
  fs::remove_all(dir_, ec);
}

// ---- ModelRegistry ----

Result<ModelRegistry> ModelRegistry::open(const std::string& root, bool create_root) {
  if (root.empty()) return Status::InvalidArgument("no registry given (--registry ROOT or TESSERA_REGISTRY)");
  std::error_code ec;
  if (create_root) {
    fs::create_directories(root, ec);
    if (ec) return Status::IOError(fmt::format("registry {}: cannot create: {}", root, ec.message()));
  }
  if (!fs::exists(root, ec))
    return Status::NotFound(fmt::format("registry {}: no such folder (`tessera registry add` creates it)", root));
  if (!fs::is_directory(root, ec)) return Status::InvalidArgument(fmt::format("registry {}: not a folder", root));
  return ModelRegistry(root);
}

std::string ModelRegistry::model_dir(std::string_view name) const { return fmt::format("{}/{}", root_, name); }

std::string ModelRegistry::version_dir(std::string_view name, int version) const {
  return fmt::format("{}/{}/{}", root_, name, version);
}

Result<std::vector<std::string>> ModelRegistry::names() const {
  std::vector<std::string> out;
  std::error_code ec;
  for (fs::directory_iterator it(root_, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string n = it->path().filename().string();
    std::error_code e2;  // an entry removed meanwhile is skipped, not thrown
    if (!check_model_name(n).ok() || !it->is_directory(e2)) continue;
    out.push_back(n);
  }
  if (ec) return Status::IOError(fmt::format("registry {}: cannot list: {}", root_, ec.message()));
  std::sort(out.begin(), out.end());
  return out;
}

Result<std::vector<VersionInfo>> ModelRegistry::versions(std::string_view name) const {
  RETURN_IF_ERROR(check_model_name(name));
  const std::string dir = model_dir(name);
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    return Status::NotFound(fmt::format("registry {}: no model '{}'", root_, name));
  std::vector<VersionInfo> out;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::optional<int> v = parse_version(it->path().filename().string());
    std::error_code e2;
    if (!v || !it->is_directory(e2)) continue;  // temporary and removed folders, the pointer
    out.push_back({*v, fs::is_regular_file(it->path() / kRegistryManifestFile, e2)});
  }
  if (ec) return Status::IOError(fmt::format("{}: cannot list: {}", dir, ec.message()));
  std::sort(out.begin(), out.end(), [](const VersionInfo& a, const VersionInfo& b) { return a.version < b.version; });
  return out;
}

Result<std::optional<int>> ModelRegistry::promoted(std::string_view name) const {
  RETURN_IF_ERROR(check_model_name(name));
  const std::string path = fmt::format("{}/{}", model_dir(name), kRegistryPromotedFile);
  std::error_code ec;
  if (!fs::exists(path, ec)) {
    if (!fs::is_directory(model_dir(name), ec))
      return Status::NotFound(fmt::format("registry {}: no model '{}'", root_, name));
    return std::optional<int>();
  }
  ASSIGN_OR_RETURN(std::vector<std::byte> bytes, io::read_file(path));
  std::string text(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  const std::optional<int> v = parse_version(text);
  if (!v) return Status::Corruption(fmt::format("{}: holds '{}', not a version number", path, text));
  return std::optional<int>(*v);
}

Result<std::string> ModelRegistry::existing_version_dir(std::string_view name, int version) const {
  RETURN_IF_ERROR(check_model_name(name));
  std::string dir = version_dir(name, version);
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    if (!fs::is_directory(model_dir(name), ec))
      return Status::NotFound(fmt::format("registry {}: no model '{}'", root_, name));
    return Status::NotFound(fmt::format("registry {}: model '{}' has no version {}", root_, name, version));
  }
  return dir;
}

Result<VersionManifest> ModelRegistry::manifest(std::string_view name, int version) const {
  ASSIGN_OR_RETURN(const std::string dir, existing_version_dir(name, version));
  std::error_code ec;
  const std::string path = fmt::format("{}/{}", dir, kRegistryManifestFile);
  if (!fs::exists(path, ec))
    return Status::Corruption(fmt::format("{}: incomplete version (no {})", dir, kRegistryManifestFile));
  ASSIGN_OR_RETURN(std::vector<std::byte> bytes, io::read_file(path));
  auto m = parse_version_manifest(std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
  if (!m.ok()) return m.status().With(path);
  if (m->name != name || m->version != version)
    return Status::Corruption(fmt::format("{}: describes {}:{}, not {}:{} (a folder moved by hand?)", path, m->name,
                                          m->version, name, version));
  return m;
}

Status ModelRegistry::verify(const VersionManifest& m, const std::vector<std::string>& only) const {
  const std::string dir = version_dir(m.name, m.version);
  for (const RegistryFile& f : m.files) {
    if (!only.empty() && std::find(only.begin(), only.end(), f.path) == only.end()) continue;
    const std::string path = fmt::format("{}/{}", dir, f.path);
    auto d = io::file_xxh64(path);
    if (!d.ok()) {
      if (d.status().code() == StatusCode::kNotFound)
        return Status::Corruption(fmt::format("{}: missing (listed in {})", path, kRegistryManifestFile));
      return d.status();
    }
    if (d->bytes != f.bytes)
      return Status::Corruption(
          fmt::format("{}: file is {} bytes, manifest says {} (truncated or replaced)", path, d->bytes, f.bytes));
    if (d->xxh64 != f.xxh64)
      return Status::Corruption(fmt::format("{}: xxh64 is {}, manifest says {} (corrupted)", path,
                                            io::hex64(d->xxh64), io::hex64(f.xxh64)));
  }
  for (const std::string& want : only)
    if (!m.file(want))
      return Status::Corruption(fmt::format("{}: {} does not list {}", dir, kRegistryManifestFile, want));
  return Status::OK();
}

Result<StagedVersion> ModelRegistry::stage(std::string_view name) const {
  RETURN_IF_ERROR(check_model_name(name));
  const std::string dir = model_dir(name);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return Status::IOError(fmt::format("{}: cannot create: {}", dir, ec.message()));
  // Leftovers of adds and removes that were killed: their process is gone.
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string n = it->path().filename().string();
    for (std::string_view prefix : {kTmpPrefix, kRemovingPrefix}) {
      if (n.rfind(prefix, 0) != 0) continue;
      const pid_t pid = owner_pid(n, prefix);
      if (pid == ::getpid()) continue;  // this process's own (another thread's add)
      if (pid != 0 && (::kill(pid, 0) == 0 || errno == EPERM)) continue;  // still running
      std::error_code e2;
      fs::remove_all(it->path(), e2);
    }
  }
  static std::atomic<int> counter{0};
  for (int attempt = 0; attempt < 100; attempt++) {
    const std::string tmp = fmt::format("{}/{}{}-{}", dir, kTmpPrefix, ::getpid(), counter++);
    if (::mkdir(tmp.c_str(), 0755) == 0) return StagedVersion(std::string(name), tmp);
    if (errno != EEXIST) return io_error(tmp, "cannot create", errno);
  }
  return Status::IOError(fmt::format("{}: cannot create a temporary folder", dir));
}

Result<int> ModelRegistry::publish(StagedVersion& staged, VersionManifest m) const {
  const std::string& tmp = staged.dir();
  m.name = staged.name();
  if (m.created.empty()) m.created = utc_now();
  m.files.clear();
  std::error_code ec;
  for (fs::directory_iterator it(tmp, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string n = it->path().filename().string();
    if (n == kRegistryManifestFile) continue;
    std::error_code e2;
    if (!it->is_regular_file(e2) || n[0] == '.')
      return Status::InvalidArgument(fmt::format("{}: only plain files go into a version", it->path().string()));
    // The writers (save_hf, write_file_atomic) fsync each file; hash what is on disk.
    ASSIGN_OR_RETURN(io::FileDigest d, io::file_xxh64(it->path().string()));
    std::string dtype = n == kRegistryFp32File   ? "fp32"
                        : n == kRegistryInt8File ? "int8"
                        : n == kRegistryInt4File ? "int4"
                                                 : "";
    m.files.push_back({n, d.bytes, d.xxh64, dtype});
  }
  if (ec) return Status::IOError(fmt::format("{}: cannot list: {}", tmp, ec.message()));
  std::sort(m.files.begin(), m.files.end(), [](const RegistryFile& a, const RegistryFile& b) { return a.path < b.path; });
  // The version is known only at the rename; the manifest names it, so it is
  // rewritten (still inside the temporary folder) if the number was taken.
  for (int attempt = 0; attempt < 1000; attempt++) {
    ASSIGN_OR_RETURN(std::vector<VersionInfo> have, versions(m.name));
    m.version = have.empty() ? 1 : have.back().version + 1;
    RETURN_IF_ERROR(write_text_atomic(fmt::format("{}/{}", tmp, kRegistryManifestFile),
                                      version_manifest_to_json(m).dump(2) + "\n"));
    RETURN_IF_ERROR(io::sync_dir(tmp));
    const std::string target = version_dir(m.name, m.version);
    if (rename_no_replace(tmp, target) == 0) {
      staged.dir_.clear();  // published: nothing to remove
      RETURN_IF_ERROR(io::sync_dir(model_dir(m.name)));
      return m.version;
    }
    if (errno != EEXIST && errno != ENOTEMPTY) return io_error(tmp, fmt::format("cannot rename to {}", target), errno);
  }
  return Status::IOError(fmt::format("{}: no free version number after 1000 tries", model_dir(m.name)));
}

Status ModelRegistry::promote(std::string_view name, int version) const {
  ASSIGN_OR_RETURN(VersionManifest m, manifest(name, version));
  RETURN_IF_ERROR(verify(m));
  RETURN_IF_ERROR(write_text_atomic(fmt::format("{}/{}", model_dir(name), kRegistryPromotedFile),
                                    fmt::format("{}\n", version)));
  return Status::OK();
}

Status ModelRegistry::remove(std::string_view name, int version) const {
  ASSIGN_OR_RETURN(const std::string dir, existing_version_dir(name, version));
  std::error_code ec;
  ASSIGN_OR_RETURN(std::optional<int> p, promoted(name));
  if (p && *p == version)
    return Status::InvalidArgument(
        fmt::format("{}:{} is the promoted version; promote another one before removing it", name, version));
  static std::atomic<int> counter{0};
  const std::string gone = fmt::format("{}/{}{}-{}", model_dir(name), kRemovingPrefix, ::getpid(), counter++);
  if (::rename(dir.c_str(), gone.c_str()) != 0) return io_error(dir, "cannot rename away", errno);
  RETURN_IF_ERROR(io::sync_dir(model_dir(name)));
  fs::remove_all(gone, ec);
  if (ec) return Status::IOError(fmt::format("{}: cannot remove: {}", gone, ec.message()));
  return Status::OK();
}

json manifest_model_fields(const GPTConfig& c) {
  json j = {{"n_layer", c.layers}, {"n_head", c.heads}, {"n_embd", c.channels}, {"vocab_size", c.vocab},
            {"n_positions", c.context}};
  if (!c.gpt2()) j["shape"] = c.str();  // the Llama family: the rest of the shape
  return j;
}

Result<VersionManifest> write_version(GPT& model, const StagedVersion& staged, const VersionSource& source,
                                      const std::function<void(const std::string& step)>& on_step) {
  auto step = [&](const std::string& what) {
    if (on_step) on_step(what);
  };
  VersionManifest man;
  std::error_code ec;
  man.source = fs::absolute(source.from, ec).lexically_normal().string();
  man.model = manifest_model_fields(model.config());
  // An fp32 model is stored as fp32; an INT8 file (tessera quantize) as it is.
  step("writing the fp32 weights");
  if (!model.int8()) {
    RETURN_IF_ERROR(save_hf(model, staged.dir() + "/" + kRegistryFp32File));
    man.dtypes.push_back("fp32");
  }
  // The model's own tokenizer, chat template and end ids travel with its
  // weights (checksummed with them by publish).
  const fs::path src = fs::is_directory(source.from, ec) ? fs::path(source.from) : fs::path(source.from).parent_path();
  for (const char* f : {"tokenizer.json", "tokenizer_config.json", "generation_config.json"}) {
    if (!fs::exists(src / f, ec)) continue;
    RETURN_IF_ERROR(io::check_regular_file((src / f).string()));
    fs::copy_file(src / f, fs::path(staged.dir()) / f, fs::copy_options::overwrite_existing, ec);
    if (ec)
      return Status::IOError(fmt::format("copying {} into the registry: {}", (src / f).string(), ec.message()));
  }
  step("quantizing");
  if (source.quantize == "int8" || model.int8()) {
    if (!model.int8()) RETURN_IF_ERROR(model.quantize_int8());
    step("writing the int8 weights");
    RETURN_IF_ERROR(save_int8(model, staged.dir() + "/" + kRegistryInt8File));
    man.dtypes.push_back("int8");
  } else if (source.quantize == "int4" || source.quantize == "int4k") {
    step("writing the int4 weights");
    const GgufWeights w = source.quantize == "int4" ? GgufWeights::kQ4_0 : GgufWeights::kQ4_K;
    RETURN_IF_ERROR(save_gguf(model, staged.dir() + "/" + kRegistryInt4File, w));
    man.dtypes.push_back(source.quantize);
  } else {
    step("");
  }
  return man;
}

}  // namespace tessera::serve
