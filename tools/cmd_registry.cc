// tessera registry add|list|show|promote|rm: a model registry on disk
// (src/serve/registry.h, docs/formats/registry.md). `add` lives here, not in
// src/serve/, because it reads checkpoints (ckpt, train), which the serve
// layer may not use.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ckpt/checkpoint.h"
#include "io/file.h"
#include "nn/gpt2_weights.h"
#include "serve/registry.h"
#include "core/progress.h"
#include "tools/commands.h"
#include "train/checkpointing.h"

namespace tessera::tools {

namespace {

namespace fs = std::filesystem;

struct RegistryArgs {
  std::string root;     // --registry, or $TESSERA_REGISTRY
  std::string name;     // NAME or NAME:VERSION
  int version = 0;      // 0: not given
  std::string from;     // add
  std::string quantize; // add: "" or "int8"
  bool promote = false; // add: promote the new version
};

Result<serve::ModelRegistry> open_registry(const RegistryArgs& a, bool create) {
  std::string root = a.root;
  if (root.empty()) {
    const char* env = std::getenv("TESSERA_REGISTRY");
    if (env) root = env;
  }
  return serve::ModelRegistry::open(root, create);
}

// NAME[:VERSION] and an optional VERSION argument; both given must agree.
Result<serve::ModelRef> model_ref(const RegistryArgs& a) {
  ASSIGN_OR_RETURN(serve::ModelRef r, serve::parse_model_ref(a.name));
  if (a.version > 0) {
    if (r.version && *r.version != a.version)
      return Status::InvalidArgument(fmt::format("'{}' and version {} disagree", a.name, a.version));
    r.version = a.version;
  }
  return r;
}

// The Hugging Face folder, checkpoint folder or safetensors file `add --from`
// names, loaded for inference on the CPU (the loaders of serve and export).
Result<std::unique_ptr<GPT>> load_source(const std::string& from) {
  std::error_code ec;
  if (fs::is_directory(from, ec) && fs::exists(fs::path(from) / "config.json", ec))
    return load_gpt2(from, nullptr, Backend::kCPU, ModelUse::kInference);
  if (fs::is_directory(from, ec)) {
    ASSIGN_OR_RETURN(ckpt::Checkpoint ck, ckpt::Checkpoint::open(from));
    return load_whole_model(ck);
  }
  if (!fs::exists(from, ec))
    return Status::NotFound(fmt::format("--from {}: no such file or folder (a checkpoint folder or a safetensors "
                                        "file with config.json beside it)",
                                        from));
  if (Status st = io::check_regular_file(from); !st.ok()) return st.With("--from");
  return load_gpt2(from, nullptr, Backend::kCPU, ModelUse::kInference);
}

int run_add(const RegistryArgs& a) {
  auto ref = serve::parse_model_ref(a.name);
  if (!ref.ok()) return fail(ref.status());
  if (ref->version)
    return fail(Status::InvalidArgument(
        fmt::format("'{}': add assigns the version itself; give only the name", a.name)));
  auto reg = open_registry(a, /*create=*/true);
  if (!reg.ok()) return fail(reg.status());
  // Steps: read, fp32 and/or int8 (quantize, write), publish.
  ProgressBar bar(ProgressBar::tty(stderr), 5, "steps");
  int step = 0;
  bar.update(step, "reading " + a.from);
  auto model = load_source(a.from);
  if (!model.ok()) return bar.interrupt(), fail(model.status());
  GPT& m = **model;

  auto staged = reg->stage(ref->name);
  if (!staged.ok()) return bar.interrupt(), fail(staged.status());
  auto man = serve::write_version(m, *staged, serve::VersionSource{a.from, a.quantize}, [&](const std::string& what) {
    if (what.empty()) {
      ++step;  // nothing to quantize
    } else {
      bar.update(++step, what);
    }
  });
  if (!man.ok()) return bar.interrupt(), fail(man.status());
  const GPTConfig c = m.config();
  bar.update(++step, "publishing");
  auto version = reg->publish(*staged, *man);
  if (!version.ok()) return bar.interrupt(), fail(version.status());
  bar.finish("done");
  std::printf("added %s:%d (%s; %s) from %s -> %s\n", ref->name.c_str(), *version,
              fmt::format("{}", fmt::join(man->dtypes, ", ")).c_str(), c.str().c_str(), man->source.c_str(),
              reg->version_dir(ref->name, *version).c_str());
  // The first version of a model is promoted: there is nothing to serve otherwise.
  auto promoted = reg->promoted(ref->name);
  if (!promoted.ok()) return fail(promoted.status());
  if (a.promote || !*promoted) {
    if (Status st = reg->promote(ref->name, *version); !st.ok()) return fail(st);
    std::printf("promoted %s:%d\n", ref->name.c_str(), *version);
  }
  return kExitOk;
}

int run_list(const RegistryArgs& a) {
  auto reg = open_registry(a, false);
  if (!reg.ok()) return fail(reg.status());
  std::vector<std::string> names;
  if (!a.name.empty()) {
    if (Status st = serve::check_model_name(a.name); !st.ok()) return fail(st);
    names.push_back(a.name);
  } else {
    auto all = reg->names();
    if (!all.ok()) return fail(all.status());
    names = *all;
  }
  for (const std::string& name : names) {
    auto versions = reg->versions(name);
    if (!versions.ok()) return fail(versions.status());
    auto promoted = reg->promoted(name);
    if (!promoted.ok()) return fail(promoted.status());
    for (const serve::VersionInfo& v : *versions) {
      auto m = reg->manifest(name, v.version);
      if (!m.ok()) {
        // A broken version is not listed as one; say why on stderr.
        std::fprintf(stderr, "tessera: warning: %s\n", m.status().message().c_str());
        continue;
      }
      std::printf("%s:%d  %-10s  %s  %s%s\n", name.c_str(), v.version, fmt::format("{}", fmt::join(m->dtypes, ",")).c_str(),
                  m->created.c_str(), m->source.c_str(), *promoted == v.version ? "  (promoted)" : "");
    }
  }
  return kExitOk;
}

int run_show(const RegistryArgs& a) {
  auto reg = open_registry(a, false);
  if (!reg.ok()) return fail(reg.status());
  auto ref = model_ref(a);
  if (!ref.ok()) return fail(ref.status());
  int version = ref->version.value_or(0);
  if (!version) {
    auto promoted = reg->promoted(ref->name);
    if (!promoted.ok()) return fail(promoted.status());
    if (!*promoted)
      return fail(Status::NotFound(fmt::format("{}: no promoted version; name one (NAME:VERSION)", ref->name)));
    version = **promoted;
  }
  auto m = reg->manifest(ref->name, version);
  if (!m.ok()) return fail(m.status());
  std::printf("%s\n", serve::version_manifest_to_json(*m).dump(2).c_str());
  if (Status st = reg->verify(*m); !st.ok()) return fail(st);
  uint64_t bytes = 0;
  for (const serve::RegistryFile& f : m->files) bytes += f.bytes;
  std::printf("%s:%d: %zu files, %.1f MB, every checksum matches\n", ref->name.c_str(), version, m->files.size(),
              bytes / 1e6);
  return kExitOk;
}

int run_promote(const RegistryArgs& a) {
  auto reg = open_registry(a, false);
  if (!reg.ok()) return fail(reg.status());
  auto ref = model_ref(a);
  if (!ref.ok()) return fail(ref.status());
  if (!ref->version) return fail(Status::InvalidArgument("promote: give the version (NAME VERSION or NAME:VERSION)"));
  if (Status st = reg->promote(ref->name, *ref->version); !st.ok()) return fail(st);
  std::printf("promoted %s:%d\n", ref->name.c_str(), *ref->version);
  return kExitOk;
}

int run_rm(const RegistryArgs& a) {
  auto reg = open_registry(a, false);
  if (!reg.ok()) return fail(reg.status());
  auto ref = model_ref(a);
  if (!ref.ok()) return fail(ref.status());
  if (!ref->version) return fail(Status::InvalidArgument("rm: give the version (NAME VERSION or NAME:VERSION)"));
  if (Status st = reg->remove(ref->name, *ref->version); !st.ok()) return fail(st);
  std::printf("removed %s:%d\n", ref->name.c_str(), *ref->version);
  return kExitOk;
}

void add_root_option(CLI::App* cmd, RegistryArgs& a) {
  cmd->add_option("--registry", a.root, "the registry folder (default: $TESSERA_REGISTRY)");
}

}  // namespace

void add_registry_commands(CLI::App& app) {
  auto a = std::make_shared<RegistryArgs>();
  CLI::App* reg = app.add_subcommand("registry", "A model registry on disk: add, list, show, promote, rm versions");
  reg->require_subcommand(1);

  CLI::App* add = reg->add_subcommand("add", "Publish a new version of a model (atomically)");
  add->add_option("name", a->name, "the model's name")->required();
  add->add_option("--from", a->from, "a checkpoint folder, or a safetensors file with config.json beside it")
      ->required();
  add->add_option("--quantize", a->quantize,
                  "also store the INT8 weights (tessera quantize's form), or the 4-bit ones as a GGUF file (int4: "
                  "Q4_0, int4k: Q4_K)")
      ->check(CLI::IsMember({"int8", "int4", "int4k"}));
  add->add_flag("--promote", a->promote, "promote the new version (the first version always is)");
  add_root_option(add, *a);
  add->callback([a] { exit_code() = run_add(*a); });

  CLI::App* list = reg->add_subcommand("list", "List the complete versions of every model (or of one)");
  list->add_option("name", a->name, "only this model");
  add_root_option(list, *a);
  list->callback([a] { exit_code() = run_list(*a); });

  CLI::App* show = reg->add_subcommand("show", "Print a version's manifest and verify its checksums");
  show->add_option("name", a->name, "NAME (the promoted version) or NAME:VERSION")->required();
  show->add_option("version", a->version, "the version")->check(CLI::Range(1, 1000000000));
  add_root_option(show, *a);
  show->callback([a] { exit_code() = run_show(*a); });

  CLI::App* promote = reg->add_subcommand("promote", "Make a version the one served under the model's name");
  promote->add_option("name", a->name, "NAME or NAME:VERSION")->required();
  promote->add_option("version", a->version, "the version")->check(CLI::Range(1, 1000000000));
  add_root_option(promote, *a);
  promote->callback([a] { exit_code() = run_promote(*a); });

  CLI::App* rm = reg->add_subcommand("rm", "Remove a version (not the promoted one)");
  rm->add_option("name", a->name, "NAME or NAME:VERSION")->required();
  rm->add_option("version", a->version, "the version")->check(CLI::Range(1, 1000000000));
  add_root_option(rm, *a);
  rm->callback([a] { exit_code() = run_rm(*a); });
}

}  // namespace tessera::tools
