// tessera synth clicks: Criteo-layout click logs from a planted ground truth
// (data/criteo.h, docs/dlrm.md).
#include <cstdio>
#include <memory>

#include "data/criteo.h"
#include "tools/commands.h"

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

}  // namespace tessera::tools
