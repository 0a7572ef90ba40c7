#include "serve/registry_catalog.h"

#include <sys/stat.h>

#include <chrono>

#include <fmt/format.h>

namespace tessera::serve {

RegistryCatalog::RegistryCatalog(ModelRegistry registry, Options opts, Loader loader, Log log)
    : registry_(std::move(registry)), opts_(std::move(opts)), loader_(std::move(loader)), log_(std::move(log)) {}

Result<std::shared_ptr<RegistryCatalog>> RegistryCatalog::open(ModelRegistry registry, Options opts, Loader loader,
                                                               Log log) {
  RETURN_IF_ERROR(check_model_name(opts.name));
  std::shared_ptr<RegistryCatalog> c(
      new RegistryCatalog(std::move(registry), std::move(opts), std::move(loader), std::move(log)));
  ASSIGN_OR_RETURN(std::optional<int> promoted, c->registry_.promoted(c->opts_.name));
  if (!promoted)
    return Status::NotFound(fmt::format("registry {}: model '{}' has no promoted version (tessera registry promote)",
                                        c->registry_.root(), c->opts_.name));
  ASSIGN_OR_RETURN(c->current_, c->load_version(*promoted));
  c->current_version_ = *promoted;
  c->watcher_ = std::thread([raw = c.get()] { raw->watch(); });
  return c;
}

RegistryCatalog::~RegistryCatalog() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  if (watcher_.joinable()) watcher_.join();
}

std::string RegistryCatalog::pick_weights(const VersionManifest& m, const std::string& prefer) {
  const bool fp32 = m.file(kRegistryFp32File) != nullptr;
  const bool int8 = m.file(kRegistryInt8File) != nullptr;
  const bool int4 = m.file(kRegistryInt4File) != nullptr;
  if (int4 && prefer == "int4") return kRegistryInt4File;
  if (int8 && (prefer == "int8" || !fp32)) return kRegistryInt8File;
  return kRegistryFp32File;  // verify() names it if the manifest lacks it
}

Result<std::shared_ptr<ServedModel>> RegistryCatalog::load_version(int version) {
  ASSIGN_OR_RETURN(VersionManifest m, registry_.manifest(opts_.name, version));
  const std::string weights = pick_weights(m, opts_.prefer);
  // Only what is loaded is read twice (checksum, then load): an int8 server
  // does not hash the fp32 file.
  RETURN_IF_ERROR(registry_.verify(m, {weights, kRegistryConfigFile}));
  return loader_(fmt::format("{}/{}", registry_.version_dir(opts_.name, version), weights),
                 fmt::format("{}:{}", opts_.name, version));
}

Result<std::shared_ptr<ServedModel>> RegistryCatalog::find(const std::string& requested) {
  std::lock_guard<std::mutex> lock(mu_);
  if (requested.empty() || requested == opts_.name) return current_;
  Result<ModelRef> ref = parse_model_ref(requested);
  if (!ref.ok() || ref->name != opts_.name)
    return Status::NotFound(fmt::format("the model '{}' does not exist; this server serves '{}' ({}:{})", requested,
                                        opts_.name, opts_.name, current_version_));
  if (ref->version && *ref->version == current_version_) return current_;
  return Status::NotFound(fmt::format("the model '{}' is not loaded; this server serves '{}' as {}:{}, the promoted "
                                      "version (promote another to serve it)",
                                      requested, opts_.name, opts_.name, current_version_));
}

std::vector<std::pair<std::string, std::shared_ptr<ServedModel>>> RegistryCatalog::listed() {
  std::lock_guard<std::mutex> lock(mu_);
  return {{opts_.name, current_}, {current_->id, current_}};
}

int RegistryCatalog::current_version() const {
  std::lock_guard<std::mutex> lock(mu_);
  return current_version_;
}

bool RegistryCatalog::drain(double timeout_s) {
  // No more swaps, then every engine still alive (the current one and the
  // old ones finishing their requests), all against one deadline.
  std::vector<std::shared_ptr<ServedModel>> live;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    live.push_back(current_);
    for (const Retiring& r : retiring_)
      if (auto m = r.model.lock()) live.push_back(std::move(m));
  }
  wake_.notify_all();
  if (watcher_.joinable() && watcher_.get_id() != std::this_thread::get_id()) watcher_.join();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  bool all = true;
  for (const auto& m : live) {
    const double left = std::chrono::duration<double>(deadline - std::chrono::steady_clock::now()).count();
    all = m->engine->drain(std::max(0.0, left)) && all;
  }
  return all;
}

void RegistryCatalog::watch() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    wake_.wait_for(lock, std::chrono::duration<double>(opts_.poll_s), [&] { return stop_; });
    if (stop_) break;
    lock.unlock();
    poll_once();
    lock.lock();
  }
}

void RegistryCatalog::poll_once() {
  // Old versions whose last request ended.
  {
    std::vector<std::string> gone;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto it = retiring_.begin(); it != retiring_.end();) {
        if (it->model.expired()) {
          gone.push_back(it->id);
          it = retiring_.erase(it);
        } else {
          ++it;
        }
      }
    }
    for (const std::string& id : gone) log_(fmt::format("{} unloaded", id));
  }

  Result<std::optional<int>> promoted = registry_.promoted(opts_.name);
  if (!promoted.ok() || !*promoted) {
    const std::string err = promoted.ok() ? "no promoted version" : promoted.status().message();
    if (err != last_error_) log_(fmt::format("registry: {}; still serving {}:{}", err, opts_.name, current_version()));
    last_error_ = err;
    return;
  }
  const int want = **promoted;
  if (want == current_version()) {
    failed_key_.clear();
    last_error_.clear();
    return;
  }
  struct stat st {};
  const std::string pointer = fmt::format("{}/{}", registry_.model_dir(opts_.name), kRegistryPromotedFile);
  ::stat(pointer.c_str(), &st);
  const std::string key =
      fmt::format("{}:{}:{}.{}", want, static_cast<uint64_t>(st.st_ino), st.st_mtim.tv_sec, st.st_mtim.tv_nsec);
  if (key == failed_key_) return;

  log_(fmt::format("{}:{} promoted; loading it", opts_.name, want));
  Result<std::shared_ptr<ServedModel>> loaded = load_version(want);
  if (!loaded.ok()) {
    failed_key_ = key;
    log_(fmt::format("cannot load {}:{}: {}; still serving {}:{}", opts_.name, want, loaded.status().message(),
                     opts_.name, current_version()));
    return;
  }
  std::shared_ptr<ServedModel> old;
  int running = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) return;  // shutting down: the new one is freed unused
    old = std::move(current_);
    current_ = std::move(*loaded);
    current_version_ = want;
    retiring_.push_back({old->id, old});
  }
  const EngineStats s = old->engine->stats();
  running = s.running + s.waiting;
  log_(fmt::format("{} now serves new requests; {} finishes its {} running and queued requests, then unloads",
                   current_->id, old->id, running));
  failed_key_.clear();
  last_error_.clear();
  // Dropped here, outside the lock: if no request holds it, the old engine
  // is freed now.
  old.reset();
}

}  // namespace tessera::serve
