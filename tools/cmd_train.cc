// tessera train and tessera prepare.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "data/criteo.h"
#include "data/prepare.h"
#include "comm/mpi/mpi_communicator.h"
#include "elastic/elastic_trainer.h"
#include "tools/commands.h"
#include "tools/fault_env.h"
#include "train/config.h"
#include "train/dlrm_trainer.h"
#include "train/stop.h"
#include "train/trainer.h"

namespace tessera::tools {

namespace {
struct TrainArgs {
  bool print_keys = false;
  std::string config;
  std::vector<std::string> overrides;
  std::string resume;
  int metrics_port = -1;  // -1: log.metrics_port decides
  std::string trace;      // empty: log.trace decides
};

// model.kind = "dlrm" (train/dlrm_trainer.h); ends the world as run_train does.
int run_dlrm(const TrainConfig& c, std::unique_ptr<comm::Communicator>& world, const StopFlag* stop,
             const FaultPlan* faults) {
  comm::Communicator& w = *world;
  auto r = run_dlrm_training(c, w, stdout, nullptr, stop, faults);
  if (!r.ok()) {
    if (w.size() > 1 && r.status().code() != StatusCode::kInvalidArgument) comm::abort_job(r.status());
    int code = w.rank() == 0 ? fail(r.status()) : kExitError;
    world.reset();
    comm::mpi_finalize();
    return code;
  }
  if (w.rank() == 0 && r->has_val)
    std::printf("validation auc: %.4f -> %.4f (log loss %.4f)\n", r->first_auc, r->last_auc, r->last_logloss);
  if (w.rank() == 0 && !r->checkpoint.empty()) std::printf("checkpoint: %s\n", r->checkpoint.c_str());
  world.reset();
  comm::mpi_finalize();
  return r->stopped_by != 0 ? kExitRequeue : kExitOk;
}

int run_train(const TrainArgs& a) {
  // Started by `tessera elastic` (its environment says so): the agent's
  // death ends the worker by SIGTERM (PR_SET_PDEATHSIG), so no stop handler.
  elastic::ElasticOptions eo;
  const bool elastic = elastic_options_from_env(&eo);
  // Otherwise SIGUSR1 (a batch system's warning before the time limit) and
  // SIGTERM (preemption, scancel) stop at the next step with a verified
  // checkpoint. Installed first: Slurm may send --signal's warning up to a
  // minute early, and before the handler its default action ends the rank
  // (what is left of that window, the process's own start, the job scripts
  // requeue: exit status 138).
  const StopFlag* stop = elastic ? nullptr : &install_stop_signals();
  if (a.print_keys) {  // the table in docs/config.md
    std::printf("| key | type | default | meaning |\n|---|---|---|---|\n");
    for (const ConfigKeyDoc& d : config_key_docs())
      std::printf("| `%s` | %s | `%s` | %s |\n", d.key.c_str(), d.type.c_str(), d.default_value.c_str(),
                  d.help.c_str());
    return kExitOk;
  }
  if (a.config.empty()) return fail(Status::InvalidArgument("--config is required"));
  auto c = load_train_config(a.config, a.overrides);
  if (!c.ok()) return fail(c.status());
  c->resume = resolve_resume(a.resume, c->checkpoint_dir);
  if (a.metrics_port >= 0) c->metrics_port = a.metrics_port;
  if (!a.trace.empty()) c->trace = a.trace;
  Result<const FaultPlan*> plan = process_fault_plan();
  if (!plan.ok()) return fail(plan.status());
  const FaultPlan* faults = *plan;
  eo.faults = faults;
  if (elastic && c->model_kind == "dlrm")
    return fail(Status::InvalidArgument("model.kind = \"dlrm\" does not train under `tessera elastic` yet"));
  if (elastic) {  // started by `tessera elastic`
    auto r = elastic::run_elastic_training(c.value(), eo, stdout);
    if (!r.ok()) return fail(r.status());
    return kExitOk;
  }
  comm::CommOptions opts;
  opts.timeout = std::chrono::milliseconds(static_cast<int64_t>(c->timeout_s * 1000.0));
  stop_at_start_if_asked(*faults);
  auto world = comm::world_communicator(opts);
  if (!world.ok()) {
    // No ranks yet: under srun every task has the same error; task 0 says it.
    const char* task = std::getenv("SLURM_PROCID");
    if (task != nullptr && std::strcmp(task, "0") != 0) return kExitError;
    return fail(world.status());
  }
  comm::Communicator& w = *world.value();
  if (c->model_kind == "dlrm") return run_dlrm(c.value(), world.value(), stop, faults);
  auto r = run_training(c.value(), w, stdout, nullptr, stop, faults);
  if (!r.ok()) {
    // A user error is the same on every rank: rank 0 reports it, all exit
    // cleanly. Anything else (a peer timed out, I/O) may be this rank's
    // alone: report it here and end the whole job so no peer hangs.
    if (w.size() > 1 && r.status().code() != StatusCode::kInvalidArgument) comm::abort_job(r.status());
    int code = w.rank() == 0 ? fail(r.status()) : kExitError;
    world.value().reset();
    comm::mpi_finalize();
    return code;
  }
  if (w.rank() == 0 && r->has_val && r->stopped_by == 0)
    std::printf("validation loss: %.4f -> %.4f\n", r->first_val_loss, r->last_val_loss);
  world.value().reset();
  comm::mpi_finalize();
  return r->stopped_by != 0 ? kExitRequeue : kExitOk;
}

// --format criteo: click logs to click shards (data/criteo.h).
int run_prepare_criteo(const data::PrepareOptions& p, const data::CriteoPrepareOptions& c) {
  data::CriteoPrepareOptions o = c;
  o.inputs = p.inputs;
  o.out_dir = p.out_dir;
  o.val_fraction = p.val_fraction;
  o.warnings = stderr;
  auto s = data::prepare_criteo(o);
  if (!s.ok()) return fail(s.status());
  std::printf("prepared %lld lines: %lld train + %lld val rows, %lld bad lines skipped\n",
              static_cast<long long>(s->lines), static_cast<long long>(s->train_rows),
              static_cast<long long>(s->val_rows), static_cast<long long>(s->bad_lines));
  for (const std::string& path : s->shards) std::printf("  %s\n", path.c_str());
  return kExitOk;
}

int run_prepare(const data::PrepareOptions& o) {
  data::PrepareOptions opts = o;
  if (isatty(fileno(stderr))) opts.progress = stderr;
  auto s = data::prepare_shards(opts);
  if (!s.ok()) return fail(s.status());
  int64_t total = s->train_tokens + s->val_tokens;
  std::printf("prepared %lld documents: %lld train + %lld val tokens in %.2f s (%.0f tokens/s)\n",
              static_cast<long long>(s->documents), static_cast<long long>(s->train_tokens),
              static_cast<long long>(s->val_tokens), s->seconds, total / std::max(s->seconds, 1e-9));
  for (const std::string& p : s->shards) std::printf("  %s\n", p.c_str());
  return kExitOk;
}
}  // namespace

void add_train_command(CLI::App& app) {
  auto a = std::make_shared<TrainArgs>();
  CLI::App* cmd = app.add_subcommand("train", "Train a GPT or a DLRM (model.kind) from a TOML config (docs/config.md)");
  cmd->add_option("--config", a->config, "TOML file")->check(CLI::ExistingFile);
  cmd->add_flag("--print-keys", a->print_keys, "print every config key with its type, default and meaning");
  cmd->add_option("--set", a->overrides, "override a key: section.key=value (repeatable)");
  cmd->add_option("--resume", a->resume,
                  "continue from a checkpoint: 'latest' (in checkpoint.dir), 'auto' (latest if there is one, else start: "
                  "for job scripts that requeue) or a checkpoint folder; any dp x tp x pp layout of the same model");
  cmd->add_option("--metrics-port", a->metrics_port,
                  "serve Prometheus GET /metrics on this port (each rank on it + its local rank; 0: off); sets "
                  "log.metrics_port")
      ->check(CLI::Range(0, 65535));
  cmd->add_option("--trace", a->trace,
                  "write a timeline (Chrome trace events) per rank to DIR/trace-rank-N.json; merge with `tessera trace "
                  "merge DIR`; sets log.trace");
  cmd->callback([a] { exit_code() = run_train(*a); });
}

void add_prepare_command(CLI::App& app) {
  auto o = std::make_shared<data::PrepareOptions>();
  CLI::App* cmd = app.add_subcommand("prepare", "Tokenize text files into token shards");
  cmd->add_option("--input", o->inputs, "text files or folders")->required();
  cmd->add_option("--tokenizer", o->tokenizer,
                  "gpt2 (GPT-2 BPE, vocab 50257), byte (vocab 256), or a Hugging Face tokenizer.json or its folder "
                  "(32-bit shards past 65,536 ids)");
  cmd->add_option("--vocab", o->vocab_dir, "folder with encoder.json and vocab.bpe (gpt2)");
  cmd->add_option("--format", o->format,
                  "text, brown (the Brown corpus's word/tag files) or criteo (click logs: docs/dlrm.md)")
      ->check(CLI::IsMember({"text", "brown", "criteo"}));
  auto c = std::make_shared<data::CriteoPrepareOptions>();
  cmd->add_option("--hash-size", c->hash_size, "criteo: rows of each table (categories hashed into it)");
  cmd->add_option("--tables", c->num_cat, "criteo: categorical columns per line");
  cmd->add_option("--dense", c->num_dense, "criteo: integer columns per line");
  cmd->add_option("--shard-tokens", o->shard_tokens, "tokens per shard at most");
  cmd->add_option("--out", o->out_dir, "output folder")->required();
  cmd->add_option("--val-fraction", o->val_fraction, "share of documents for validation");
  cmd->callback([o, c] { exit_code() = o->format == "criteo" ? run_prepare_criteo(*o, *c) : run_prepare(*o); });
}

}  // namespace tessera::tools
