// tessera synth clicks: Criteo-layout click logs from a planted ground truth
// (data/criteo.h, docs/dlrm.md). tessera synth model: a random-weight
// Hugging Face folder of a Llama-family shape, written tensor by tensor.
#include <cstdio>
#include <filesystem>
#include <memory>

#include "data/criteo.h"
#include "io/file.h"
#include "nn/hf_decoder.h"
#include "plan/model.h"
#include "tools/commands.h"
#include "train/dlrm_train.h"

#include <fstream>

#include <nlohmann/json.hpp>

namespace tessera::tools {

namespace {

struct SynthModelArgs {
  std::string preset, hf_config, out, dtype;  // dtype "": bf16, fp32 for GPT-2
  int layers = 0, heads = 0, kv_heads = 0, dim = 0, mlp_hidden = 0, vocab = 0, context = 0;
  uint64_t seed = 1;
  double shard_gb = 5;
};

int run_synth_model(const SynthModelArgs& a) {
  if (a.preset.empty() == a.hf_config.empty()) return fail(Status::InvalidArgument("give --preset or --hf-config"));
  DecoderConfig c;
  if (!a.preset.empty()) {
    auto p = plan::model_preset(a.preset);
    if (!p.ok()) return fail(p.status());
    c = p->shape();
  } else {
    auto r = read_hf_model_config(a.hf_config);
    if (!r.ok()) return fail(r.status());
    c = *r;
  }
  if (a.layers) c.layers = a.layers;
  if (a.heads) c.heads = a.heads;
  if (a.kv_heads) c.kv_heads = a.kv_heads;
  if (a.dim) c.channels = a.dim;
  if (a.mlp_hidden) c.mlp_hidden = a.mlp_hidden;
  if (a.vocab) c.vocab = a.vocab;
  if (a.context) c.context = a.context;
  if (a.heads || a.dim) c.head_dim = 0;  // C / NH again
  if (Status st = io::check_writable_folder(a.out); !st.ok()) return fail(st.With("--out"));
  const std::string dtype = !a.dtype.empty() ? a.dtype : c.gpt2() ? "fp32" : "bf16";
  HfSaveOptions o;
  o.dtype = dtype == "bf16" ? io::StDType::kBF16 : io::StDType::kF32;
  o.max_shard_bytes = static_cast<int64_t>(a.shard_gb * 1e9);
  const std::string path = (std::filesystem::path(a.out) / "model.safetensors").string();
  if (c.gpt2()) {
    // GPT-2 presets: built in memory (1.5B at most) with GPT-2's own
    // initialisation, written as GPT2LMHeadModel in fp32.
    if (dtype != "fp32") return fail(Status::InvalidArgument("GPT-2 folders are written in fp32 (--dtype fp32)"));
    auto m = GPT::create(c, Backend::kCPU, ModelShard{}, nullptr, ModelUse::kInference);
    if (!m.ok()) return fail(m.status());
    if (Status st = (*m)->init_weights(a.seed); !st.ok()) return fail(st);
    if (Status st = save_hf(**m, path); !st.ok()) return fail(st);
  } else if (Status st = save_random_hf_decoder(c, path, o, a.seed); !st.ok()) {
    return fail(st);
  }
  std::printf("wrote a random-weight %s (%.1fM parameters, %s) to %s\n", c.str().c_str(), c.num_parameters() / 1e6,
              dtype.c_str(), a.out.c_str());
  return kExitOk;
}

}  // namespace

void add_synth_command(CLI::App& app) {
  CLI::App* synth = app.add_subcommand("synth", "Write synthetic data with a known ground truth");
  synth->require_subcommand(1);
  {
    auto a = std::make_shared<SynthModelArgs>();
    CLI::App* cmd = synth->add_subcommand(
        "model", "A random-weight Hugging Face folder (Llama family one tensor at a time; GPT-2)");
    cmd->add_option("--preset", a->preset, "a planner preset: llama2-7b, llama3-8b, tinyllama-1.1b, qwen2.5-0.5b, "
                                           "gpt2-124m, ...");
    cmd->add_option("--hf-config", a->hf_config, "a config.json to copy the shape from")->check(CLI::ExistingFile);
    cmd->add_option("--layers", a->layers, "override: layers")->check(CLI::PositiveNumber);
    cmd->add_option("--heads", a->heads, "override: query heads")->check(CLI::PositiveNumber);
    cmd->add_option("--kv-heads", a->kv_heads, "override: key/value heads")->check(CLI::PositiveNumber);
    cmd->add_option("--dim", a->dim, "override: channels")->check(CLI::PositiveNumber);
    cmd->add_option("--mlp-hidden", a->mlp_hidden, "override: SwiGLU width")->check(CLI::PositiveNumber);
    cmd->add_option("--vocab", a->vocab, "override: vocabulary")->check(CLI::PositiveNumber);
    cmd->add_option("--context", a->context, "override: context")->check(CLI::PositiveNumber);
    cmd->add_option("--dtype", a->dtype, "bf16 or fp32 (default bf16; GPT-2: fp32)")->check(CLI::IsMember({"bf16", "fp32"}));
    cmd->add_option("--shard-gb", a->shard_gb, "largest shard (model-0000k-of-0000n.safetensors past it)")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
    cmd->add_option("--seed", a->seed, "seed of the weights")->capture_default_str();
    cmd->add_option("--out", a->out, "the folder to write (config.json and the weights)")->required();
    cmd->callback([a] { exit_code() = run_synth_model(*a); });
  }
  auto o = std::make_shared<data::SynthClicksOptions>();
  CLI::App* cmd = synth->add_subcommand("clicks", "Criteo-layout click log (TSV) plus FILE.truth.json");
  cmd->add_option("--rows", o->rows, "lines to write")->required();
  cmd->add_option("--tables", o->tables, "categorical columns (at most 26)");
  cmd->add_option("--dense", o->num_dense, "integer columns (at most 13)");
  cmd->add_option("--cardinality", o->cardinality, "distinct categories per table");
  cmd->add_option("--zipf", o->zipf, "category frequency ~ 1/rank^zipf");
  cmd->add_option("--crosses", o->crosses, "planted crosses of table pairs (0,1), (2,3), ...");
  cmd->add_option("--val-fraction", o->val_fraction, "held-out share for the truth's AUC (prepare's rule)");
  cmd->add_option("--seed", o->seed, "seed of the planted model and the draws");
  cmd->add_option("--out", o->out, "output FILE.tsv")->required();
  cmd->callback([o] {
    auto s = data::synth_clicks(*o);
    if (!s.ok()) {
      exit_code() = fail(s.status());
      return;
    }
    std::printf("wrote %lld rows to %s (ctr %.4f); ground truth on %lld held-out rows: auc %.4f, log loss %.4f -> %s\n",
                static_cast<long long>(s->rows), o->out.c_str(), s->ctr, static_cast<long long>(s->heldout_rows),
                s->heldout_auc, s->heldout_logloss, s->truth_path.c_str());
    exit_code() = kExitOk;
  });
}

// tessera bench dlrm: a single-process DLRM trained on click shards, judged
// on the held-out rows (against the synthetic ground truth with --truth).
void add_bench_dlrm_command(CLI::App& bench) {
  auto o = std::make_shared<DlrmBenchOptions>();
  auto truth = std::make_shared<std::string>();
  CLI::App* cmd = bench.add_subcommand("dlrm", "Train a DLRM on click shards; held-out log loss and exact AUC");
  cmd->add_option("--train", o->train_shard, "train.bin of tessera prepare --format criteo")->required();
  cmd->add_option("--val", o->val_shard, "val.bin")->required();
  cmd->add_option("--dim", o->dim, "embedding dimension D");
  cmd->add_option("--bottom", o->bottom, "bottom MLP sizes (the last must equal --dim)")->delimiter(',');
  cmd->add_option("--top", o->top, "top MLP hidden sizes")->delimiter(',');
  cmd->add_option("--batch", o->batch, "samples per step");
  cmd->add_option("--epochs", o->epochs, "passes over train.bin");
  cmd->add_option("--lr", o->lr, "AdamW learning rate of the MLPs");
  cmd->add_option("--table-lr", o->table_lr, "learning rate of the tables");
  cmd->add_option("--table-optimizer", o->table_optimizer, "adagrad (row-wise) or sgd");
  cmd->add_option("--seed", o->seed, "initialisation seed");
  cmd->add_option("--truth", *truth, "FILE.truth.json of tessera synth clicks: print the gap to its AUC");
  cmd->callback([o, truth] {
    DlrmBenchOptions opts = *o;
    opts.log = stdout;
    double truth_auc = -1.0;
    if (!truth->empty()) {
      std::ifstream f(*truth);
      const auto j = nlohmann::json::parse(f, nullptr, false);
      if (!f || j.is_discarded() || !j.contains("heldout_auc")) {
        exit_code() = fail(Status::InvalidArgument(*truth + ": not a truth file (no heldout_auc)"));
        return;
      }
      truth_auc = j["heldout_auc"].get<double>();
    }
    auto r = train_dlrm(opts);
    if (!r.ok()) {
      exit_code() = fail(r.status());
      return;
    }
    const DlrmEpoch& e = r->epochs.back();
    nlohmann::json j = {{"params", r->params},         {"train_rows", r->train_rows}, {"val_rows", r->val_rows},
                        {"val_auc", e.val_auc},         {"val_logloss", e.val_logloss},
                        {"train_loss", e.train_loss},   {"samples_per_s", e.samples_per_s}};
    if (truth_auc >= 0) {
      j["truth_auc"] = truth_auc;
      j["auc_gap"] = truth_auc - e.val_auc;
    }
    std::printf("%s\n", j.dump().c_str());
    exit_code() = kExitOk;
  });
}

}  // namespace tessera::tools
