// A model registry on disk (docs/formats/registry.md), like Triton's model
// repository: ROOT/NAME/VERSION/ holds one published version of a model
// (weights, config.json, manifest.json with every file's size and XXH64),
// ROOT/NAME/promoted names the version served by default.
//
//   ROOT/tiny/1/            a version: complete, never changed once published
//   ROOT/tiny/2/
//   ROOT/tiny/promoted      "2\n", replaced atomically (temp file, rename)
//   ROOT/tiny/.tmp-PID-N/   an add in progress (or killed): never listed
//
// Publishing is atomic: files are written into a temporary folder, fsynced,
// the manifest written last, then the folder is renamed to the next free
// version number (renameat2 RENAME_NOREPLACE, so two adds never share one).
// A reader therefore sees a version whole or not at all; a numbered folder
// without manifest.json can only come from a hand edit and is "incomplete".
//
// Errors are Status values whose message is one line naming the registry
// path or file at fault (NotFound for an unknown name or version, Corruption
// for a checksum or size mismatch or an incomplete version, InvalidArgument
// for a bad name, IOError from the file system).
//
// Thread safety: a ModelRegistry is a path and holds no state; its methods
// may be called from any thread, and several processes may use one root (an
// add, a promote and a serve at once). Two promotes of one name at once
// race for the pointer; the last rename wins.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "nn/gpt.h"

namespace tessera::serve {

constexpr const char* kRegistryManifestFormat = "tessera-registry-version";
constexpr int kRegistryManifestVersion = 1;
constexpr const char* kRegistryManifestFile = "manifest.json";
constexpr const char* kRegistryPromotedFile = "promoted";
// The files of a version (docs/formats/registry.md).
constexpr const char* kRegistryFp32File = "model.safetensors";
constexpr const char* kRegistryInt8File = "model.int8.safetensors";
// The 4-bit tier: a GGUF file of Q4_0 or Q4_K blocks (docs/formats/gguf.md).
constexpr const char* kRegistryInt4File = "model.int4.gguf";
constexpr const char* kRegistryConfigFile = "config.json";

struct RegistryFile {
  std::string path;   // relative to the version folder, e.g. "model.safetensors"
  uint64_t bytes = 0;
  uint64_t xxh64 = 0;
  std::string dtype;  // "fp32", "int8", "int4", or "" for config.json
};

// manifest.json of one version.
struct VersionManifest {
  std::string name;
  int version = 0;
  std::string created;                  // UTC, ISO 8601 ("2026-11-30T21:48:35Z")
  std::string source;                   // what `add --from` named
  std::vector<std::string> dtypes;      // "fp32", "int8", "int4" (Q4_0) / "int4k" (Q4_K)
  nlohmann::json model = nlohmann::json::object();  // the config (n_layer, ...), informative
  std::vector<RegistryFile> files;      // every file of the folder but manifest.json
  const RegistryFile* file(std::string_view path) const;
};

nlohmann::json version_manifest_to_json(const VersionManifest& m);  // with "manifest_xxh64"
// Every check of docs/formats/registry.md; one-line Corruption messages
// without the file name (the caller prefixes it).
Result<VersionManifest> parse_version_manifest(std::string_view text);

// "tiny", "gpt2-small.v2": letters, digits, '.', '_', '-'; starts with a
// letter or digit; at most 64 characters (no '/', no ':').
Status check_model_name(std::string_view name);
// "tiny" -> {"tiny", nullopt}; "tiny:3" -> {"tiny", 3}. InvalidArgument for
// a bad name or version.
struct ModelRef {
  std::string name;
  std::optional<int> version;
};
Result<ModelRef> parse_model_ref(std::string_view ref);

// A version being added: a temporary folder the caller fills with the
// version's files, then hands to ModelRegistry::publish. Removes the folder
// when destroyed unless published.
class StagedVersion {
 public:
  StagedVersion(StagedVersion&& o) noexcept;
  StagedVersion& operator=(StagedVersion&&) = delete;
  ~StagedVersion();
  const std::string& dir() const { return dir_; }
  const std::string& name() const { return name_; }

 private:
  friend class ModelRegistry;
  StagedVersion(std::string name, std::string dir) : name_(std::move(name)), dir_(std::move(dir)) {}
  std::string name_, dir_;
};

struct VersionInfo {
  int version = 0;
  bool complete = false;  // false: a numbered folder without manifest.json
};

class ModelRegistry {
 public:
  // `root` must exist and be a folder (NotFound / InvalidArgument otherwise);
  // create_root makes it (and its parents) first.
  static Result<ModelRegistry> open(const std::string& root, bool create_root = false);

  const std::string& root() const { return root_; }
  std::string model_dir(std::string_view name) const;
  std::string version_dir(std::string_view name, int version) const;
  // version_dir when the folder exists; NotFound naming the model or the
  // version otherwise (after checking the name).
  Result<std::string> existing_version_dir(std::string_view name, int version) const;

  // Model names (folders that hold at least one version or a promoted
  // pointer), sorted.
  Result<std::vector<std::string>> names() const;
  // Numbered folders of a model, ascending; temporary folders never appear.
  // NotFound for an unknown name.
  Result<std::vector<VersionInfo>> versions(std::string_view name) const;
  // The promoted version; nullopt when none is. Corruption when the pointer
  // does not hold a number.
  Result<std::optional<int>> promoted(std::string_view name) const;
  // Reads and parses a version's manifest.json: NotFound for an unknown
  // version, Corruption "incomplete version" when manifest.json is missing.
  Result<VersionManifest> manifest(std::string_view name, int version) const;
  // Checks the size and XXH64 of the version's files (all of them, or only
  // those named in `only`) against its manifest; Corruption naming the file
  // and both checksums at the first mismatch.
  Status verify(const VersionManifest& m, const std::vector<std::string>& only = {}) const;

  // Creates ROOT/NAME/.tmp-PID-N/ for a new version, after removing the
  // temporary folders of adds whose process is gone.
  Result<StagedVersion> stage(std::string_view name) const;
  // Hashes every file in the staged folder, writes its manifest (the
  // fields of `m` but name, version and files, which are filled in here),
  // fsyncs, and renames the folder to the next free version. Returns it.
  Result<int> publish(StagedVersion& staged, VersionManifest m) const;
  // Verifies the version (every checksum), then points `promoted` at it.
  Status promote(std::string_view name, int version) const;
  // Removes a version; refuses the promoted one (InvalidArgument). The
  // folder is renamed away first, so a half-removed version is never seen.
  Status remove(std::string_view name, int version) const;

 private:
  explicit ModelRegistry(std::string root) : root_(std::move(root)) {}
  std::string root_;
};

// The informative "model" object of a version's manifest: n_layer, n_head,
// n_embd, vocab_size, n_positions, and for a shape other than GPT-2's (the
// Llama family) "shape", the rest of it (DecoderConfig::str()).
nlohmann::json manifest_model_fields(const GPTConfig& c);

// What `tessera registry add` writes of a loaded model.
struct VersionSource {
  std::string from;      // what --from named: a model folder, or a weights file (its folder is read)
  std::string quantize;  // "", "int8", "int4" (Q4_0) or "int4k" (Q4_K)
};

// Writes `model` into the staged folder for ModelRegistry::publish: the
// fp32 weights (kRegistryFp32File) unless the model is INT8 already; the
// source folder's tokenizer.json, tokenizer_config.json and
// generation_config.json (where present), so a served version reads them as
// `tessera serve --model DIR` does; then the INT8 weights (kRegistryInt8File)
// for quantize "int8" or an INT8 model (an fp32 model is quantized in place),
// or the 4-bit GGUF file (kRegistryInt4File) for "int4"/"int4k". Returns the
// manifest to publish (source: `from` made absolute; model; dtypes in the
// order written). `on_step`, when given, is called before each of the four
// steps (fp32 weights, quantizing, the quantized weights, which is "" when
// there are none) with what it does, for a progress bar. Errors: the
// writers' IOError, InvalidArgument for a tokenizer file that is no regular
// file, IOError naming a file that could not be copied.
Result<VersionManifest> write_version(GPT& model, const StagedVersion& staged, const VersionSource& source,
                                      const std::function<void(const std::string& step)>& on_step = {});

}  // namespace tessera::serve
