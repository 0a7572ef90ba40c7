// tessera synth clicks: Criteo-layout click logs from a planted ground truth
// (data/criteo.h, docs/dlrm.md).
#include <cstdio>
#include <memory>

#include "data/criteo.h"
#include "tools/commands.h"
#include "train/dlrm_train.h"

#include <fstream>

#include <nlohmann/json.hpp>

namespace tessera::tools {

void add_synth_command(CLI::App& app) {
  CLI::App* synth = app.add_subcommand("synth", "Write synthetic data with a known ground truth");
  synth->require_subcommand(1);
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
