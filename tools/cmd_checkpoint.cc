// tessera export (a checkpoint to the Hugging Face GPT-2 layout) and
// tessera checkpoint verify.
#include <cstdio>

#include <fmt/format.h>

#include "ckpt/checkpoint.h"
#include "core/progress.h"
#include "io/file.h"
#include "nn/gpt2_weights.h"
#include "tools/commands.h"
#include "train/checkpointing.h"

namespace tessera::tools {

namespace {

struct ExportArgs {
  std::string checkpoint, out;
};

int run_export(const ExportArgs& a) {
  // The target first: its folder created and writable, the file itself not
  // a folder or a FIFO; before the model is read, not after.
  if (Status st = io::check_writable_file(a.out); !st.ok()) return fail(st.With("--out"));
  ProgressBar bar(ProgressBar::tty(stderr), 3, "steps");
  bar.update(0, "opening the checkpoint");
  auto ck = ckpt::Checkpoint::open(a.checkpoint);
  if (!ck.ok()) return bar.interrupt(), fail(ck.status());
  bar.update(1, fmt::format("reading {} shard(s)", ck->world_size()));
  auto model = load_whole_model(*ck);
  if (!model.ok()) return bar.interrupt(), fail(model.status());
  bar.update(2, "writing " + a.out);
  Status st = save_hf(**model, a.out);
  if (!st.ok()) return bar.interrupt(), fail(st);
  bar.finish("done");
  std::printf("exported %s (step %lld, %s) to %s (+ config.json)\n", ck->dir().c_str(),
              static_cast<long long>(ck->step()), (*model)->config().str().c_str(), a.out.c_str());
  return kExitOk;
}

int run_verify(const std::string& path) {
  auto ck = ckpt::Checkpoint::open(path);
  if (!ck.ok()) return fail(ck.status());
  Status st = ck->verify();
  if (!st.ok()) return fail(st);
  uint64_t bytes = 0;
  for (const auto& s : ck->manifest().shards) bytes += s.bytes;
  std::printf("%s: step %lld, %d shard(s), %.1f MB, every checksum matches; layout %s\n", ck->dir().c_str(),
              static_cast<long long>(ck->step()), ck->world_size(), bytes / 1e6, ck->layout().dump().c_str());
  return kExitOk;
}

}  // namespace

void add_checkpoint_commands(CLI::App& app) {
  auto e = std::make_shared<ExportArgs>();
  CLI::App* exp = app.add_subcommand("export", "Write a checkpoint's model as Hugging Face GPT-2 safetensors");
  exp->add_option("checkpoint", e->checkpoint, "a checkpoint folder (step-N) or checkpoint.dir (follows latest)")
      ->required();
  exp->add_option("--out", e->out, "output .safetensors (config.json goes beside it)")->required();
  exp->callback([e] { exit_code() = run_export(*e); });

  CLI::App* ck = app.add_subcommand("checkpoint", "Inspect checkpoints");
  ck->require_subcommand(1);
  auto path = std::make_shared<std::string>();
  CLI::App* verify = ck->add_subcommand("verify", "Check every shard's size and xxhash64 against the manifest");
  verify->add_option("checkpoint", *path, "a checkpoint folder (step-N) or checkpoint.dir (follows latest)")
      ->required();
  verify->callback([path] { exit_code() = run_verify(*path); });
}

}  // namespace tessera::tools
