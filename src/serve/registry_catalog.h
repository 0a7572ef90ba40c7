// The models `tessera serve --registry ROOT --model NAME` answers for: the
// promoted version of NAME in a model registry (registry.h), under the ids
// "NAME" and "NAME:VERSION", swapped while serving when the promoted
// pointer changes ("hot promote").
//
// A watcher thread reads ROOT/NAME/promoted every poll_s. When it names
// another version, that version's manifest is read, the files to load are
// checked against their checksums, and the loader builds its engine in the
// watcher thread; only then do new requests go to it. Requests already
// holding the old version's ServedModel finish on it; the old engine is
// freed by the last of them (server.h), and the watcher logs when. A
// version that fails to load (corrupt, incomplete, removed) is logged in one
// line and the current one keeps serving; it is tried again when the
// pointer file is rewritten.
//
// Thread safety: find(), listed() and drain() from any thread.
#pragma once

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/status.h"
#include "serve/registry.h"
#include "serve/server.h"

namespace tessera::serve {

class RegistryCatalog : public ModelCatalog {
 public:
  // Builds a model from a weights file (config.json beside it), under `id`.
  using Loader =
      std::function<Result<std::shared_ptr<ServedModel>>(const std::string& weights_path, const std::string& id)>;
  using Log = std::function<void(const std::string& line)>;
  struct Options {
    std::string name;          // the model in the registry
    // Which weights to load when the version has them: "int8"
    // (model.int8.safetensors), "int4" (model.int4.gguf); else the fp32 ones.
    std::string prefer;
    double poll_s = 0.5;       // how often the promoted pointer is read
  };

  // Loads the promoted version (errors: no such model, none promoted, the
  // version's own errors naming the file), then starts the watcher.
  static Result<std::shared_ptr<RegistryCatalog>> open(ModelRegistry registry, Options opts, Loader loader, Log log);
  ~RegistryCatalog() override;  // stops the watcher

  Result<std::shared_ptr<ServedModel>> find(const std::string& requested) override;
  std::vector<std::pair<std::string, std::shared_ptr<ServedModel>>> listed() override;
  bool drain(double timeout_s) override;

  int current_version() const;

  // What load_version loads for a version: a weights file of the manifest.
  static std::string pick_weights(const VersionManifest& m, const std::string& prefer);

 private:
  RegistryCatalog(ModelRegistry registry, Options opts, Loader loader, Log log);
  Result<std::shared_ptr<ServedModel>> load_version(int version);
  void watch();
  void poll_once();

  const ModelRegistry registry_;
  const Options opts_;
  const Loader loader_;
  const Log log_;

  mutable std::mutex mu_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::shared_ptr<ServedModel> current_;
  int current_version_ = 0;
  struct Retiring {
    std::string id;
    std::weak_ptr<ServedModel> model;
  };
  std::vector<Retiring> retiring_;

  // The watcher's own: the pointer file last tried and failed (version,
  // inode, mtime), so a broken version is not reloaded every poll.
  std::string failed_key_;
  std::string last_error_;
  std::thread watcher_;
};

}  // namespace tessera::serve
