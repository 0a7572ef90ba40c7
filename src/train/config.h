// Training configuration: a TOML file (toml++) plus --set overrides. Every
// key is listed once in config.cc's key table, which drives parsing, type
// checks, "did you mean" for unknown keys, and docs/config.md.
#pragma once

#include <string>
#include <vector>

#include "core/status.h"
#include "nn/gpt.h"
#include "optim/optimizer.h"

namespace tessera {

// The keys of `[model] kind = "dlrm"` (docs/dlrm.md, "Training"): the
// model's shape beyond what the click shards say (num_dense, the tables'
// hash sizes), the batch, the tables' optimizer, evaluation and logging.
// Shared keys (train.lr, beta1, beta2, weight_decay, steps, seed, eval_every,
// stop_at, checkpoint.*, log.metrics*) keep their meaning; train.lr is the
// MLPs' AdamW rate.
struct DlrmSettings {
  int embedding_dim = 16;              // D
  std::vector<int> bottom = {64, 16};  // bottom MLP sizes; the last must equal embedding_dim
  std::vector<int> top = {64, 32};     // top MLP hidden sizes (a final layer to 1 logit is added)
  // Rows of each table: empty takes each table's hash size from data.train,
  // one value is every table's, else one per table; each at least the hash size.
  std::vector<int> table_rows;
  std::string pooling = "sum";         // "sum" or "mean"
  int batch = 256;                     // samples per step (the global batch)
  float table_lr = 0.05f;
  std::string table_optimizer = "adagrad";  // "adagrad" (row-wise) or "sgd"
  float adagrad_eps = 1e-8f;
  std::string placement = "auto";      // tables over ranks: "table", "row" or "auto"
  int val_rows = 0;                    // held-out rows evaluated (0: all of data.val)
  int log_every = 1;                   // steps between progress lines and metrics records
};

struct TrainConfig {
  std::string model_kind = "gpt";  // "gpt" or "dlrm" (dlrm: the keys of DlrmSettings)
  DlrmSettings dlrm;
  GPTConfig model{.layers = 4, .heads = 4, .channels = 128, .vocab = 256, .context = 128};
  // The decoder's family keys as written (docs/config.md): model.arch picks
  // the defaults ("gpt2", "llama", "qwen2"), the others override them; turned
  // into `model` by load_train_config.
  struct ModelKeys {
    std::string arch = "gpt2";
    std::string norm, positions, mlp, rope_scaling;  // empty: the arch's
    float norm_eps = 0.0f, rope_theta = 0.0f;        // 0: the arch's
    float rope_factor = 1.0f, rope_low_freq_factor = 1.0f, rope_high_freq_factor = 4.0f;
    int rope_original_context = 8192;
    bool bias = true, qkv_bias = true, tied_head = true;  // used when given
  } model_keys;
  std::string init_from;  // safetensors to start from (overrides the shape)
  std::string train_data, val_data;  // paths or globs of token shards
  int micro_batch = 8;
  int seq = 128;
  int grad_accum = 1;
  int steps = 100;
  int stop_at = 0;  // stop after this step (0: run all steps); the schedule still spans `steps`
  OptimizerConfig opt;  // lr, min_lr, warmup, weight_decay, grad_clip, ...
  int seed = 1337;
  std::string dtype = "fp32";
  std::string device = "cpu";  // "cpu" or "cuda" (one GPU per rank; tp = pp = 1 for now)
  int eval_every = 50;   // 0: only at the start and the end
  int eval_batches = 8;
  int dp = 1, tp = 1, pp = 1, zero = 0;
  std::string schedule = "1f1b";  // pipeline schedule: "1f1b" or "gpipe"
  std::string stages;             // layers per pipeline stage, "3,1"; empty: balanced
  float timeout_s = 300.0f;  // deadline of every collective wait
  float bucket_mb = 25.0f;   // gradient bucket size for data parallelism
  std::string checkpoint_dir = "runs/default";
  int checkpoint_every = 0;  // 0: only the final weights
  int checkpoint_keep = 1;
  std::string checkpoint_on_busy = "wait";  // a save due while the last is still writing: "wait" or "skip"
  std::string resume;  // `tessera train --resume`: "latest" (checkpoint.dir) or a checkpoint folder (after resolve_resume)
  std::string metrics;  // JSON-lines path; empty: none
  // Prometheus /metrics of each rank on metrics_host, port metrics_port +
  // the rank's local rank (its index among the job's ranks on its host); 0: off.
  int metrics_port = 0;
  std::string metrics_host = "127.0.0.1";
  std::string trace;  // timeline trace folder (trace-rank-N.json per rank); empty: off
  float link_gbps = 0;  // the inter-host link's speed in Gbit/s; 0: read it from sysfs, or unknown
  // A `tessera doctor --save` profile: MFU against its theoretical peak and
  // GEMM efficiency against its measured GEMM peak. Empty: $TESSERA_PROFILE,
  // else MFU against this machine's theoretical peak (perf/profile.h).
  std::string profile;
  std::string job;  // the `job` label of every series; load_train_config: the config file's stem when empty
};

// Parses a TOML file and then "section.key=value" overrides. Errors name the
// file, the key and what is wrong (unknown key with the closest valid one,
// wrong type, out of range), one line each.
Result<TrainConfig> load_train_config(const std::string& path, const std::vector<std::string>& overrides);

// `--resume auto`, what a requeued batch job passes: "latest" when
// checkpoint_dir has published a checkpoint (its `latest` file exists),
// else "" (a fresh start). Any other value is returned as it is.
std::string resolve_resume(const std::string& resume, const std::string& checkpoint_dir);

// "3,1" -> {3, 1}; empty -> {}. Error names the bad item.
Result<std::vector<int>> parse_stage_counts(const std::string& s);

// Every key as "section.key", with its type, default and meaning (for docs
// and --help).
struct ConfigKeyDoc {
  std::string key, type, default_value, help;
};
std::vector<ConfigKeyDoc> config_key_docs();

}  // namespace tessera
