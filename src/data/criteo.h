// Click logs in the Criteo layout, for the DLRM model (docs/dlrm.md):
//   - the synthetic generator with a planted ground truth (synth_clicks),
//   - the TSV parser and `tessera prepare --format criteo`, which writes the
//     binary click shards of docs/formats/click-shard.md,
//   - the shard reader, and the exact AUC used to judge a model.
//
// A line: label \t I1..I13 \t C1..C26 (tab-separated; num_dense integer
// features, num_cat categorical features as hex strings; any may be empty,
// meaning missing). Functions here are pure or do their own file I/O; errors
// are Status values, never aborts. Not thread-safe per call; no globals.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace tessera::data {

// ---- Parsing one line.
struct ClickRecord {
  float label = 0.0f;
  std::vector<float> dense;   // (num_dense): log(1 + max(x, 0)), missing = 0
  std::vector<int> cats;      // (num_cat): hex value mod hash_size[t], missing = 0
};
// Parses `line` (no trailing newline) into rec; an error names what is wrong
// (field count, label, which dense or categorical field) without the line
// number, which the caller adds. hash_sizes has num_cat entries.
Status parse_click_line(std::string_view line, int num_dense, const std::vector<int64_t>& hash_sizes,
                        ClickRecord& rec);

// ---- The binary shard (docs/formats/click-shard.md).
struct ClickShard {
  int num_dense = 0, num_cat = 0;
  std::vector<int64_t> hash_sizes;  // (num_cat): rows of each table
  std::vector<float> labels;        // (N)
  std::vector<float> dense;         // (N, num_dense)
  std::vector<int> cats;            // (N, num_cat)
  int64_t rows() const { return static_cast<int64_t>(labels.size()); }
};
Status write_click_shard(const std::string& path, const ClickShard& s);
Result<ClickShard> read_click_shard(const std::string& path);

// ---- tessera prepare --format criteo.
struct CriteoPrepareOptions {
  std::vector<std::string> inputs;  // TSV files, read in order
  std::string out_dir;              // gets train.bin and val.bin
  int num_dense = 13;
  int num_cat = 26;
  int64_t hash_size = 100000;       // rows of every table (categories hashed into it)
  double val_fraction = 0.1;        // line i (0-based, over all files) is val if i % k == k-1, k = round(1/f)
  std::FILE* warnings = nullptr;    // when it succeeds: the first 10 bad lines by number here, and a count
};
struct CriteoPrepareSummary {
  int64_t lines = 0, train_rows = 0, val_rows = 0, bad_lines = 0;
  std::vector<std::string> bad_examples;  // "FILE:LINE: reason", the first 10
  std::vector<std::string> shards;
};
// Bad lines are skipped and counted; an input with no good line, an unreadable
// file or an unwritable output folder is an error.
Result<CriteoPrepareSummary> prepare_criteo(const CriteoPrepareOptions& o);

// ---- The synthetic generator (docs/dlrm.md, "Synthetic data").
struct SynthClicksOptions {
  int64_t rows = 100000;
  int tables = 26;             // categorical columns written (num_cat)
  int num_dense = 13;
  int64_t cardinality = 1000;  // distinct categories per table
  double zipf = 1.1;           // category frequency ~ 1 / rank^zipf
  int crosses = 3;             // planted pairwise feature crosses
  double val_fraction = 0.1;   // held-out rows for the ground truth's AUC (prepare's rule)
  uint64_t seed = 1;
  std::string out;             // FILE.tsv; the truth goes to FILE.truth.json
};
struct SynthClicksSummary {
  int64_t rows = 0, heldout_rows = 0;
  double ctr = 0.0, heldout_auc = 0.0, heldout_logloss = 0.0;
  std::string truth_path;
};
Result<SynthClicksSummary> synth_clicks(const SynthClicksOptions& o);

// ---- Metrics.
// Exact ROC AUC (the Mann-Whitney statistic, ties counted half) of scores
// against 0/1 labels; 0.5 when either class is absent.
double exact_auc(const std::vector<float>& scores, const std::vector<float>& labels);

}  // namespace tessera::data
