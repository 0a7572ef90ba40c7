// Token loader: the concatenation of a set of shards, cut into windows of
// T+1 tokens (stride T), visited in a seeded random order, epoch after epoch.
//
// The loader is stateless between calls: global sequence g (counting from the
// start of training) is window perm_e[g mod W] of epoch e = g / W. A step's
// global batch is sequences [step*R, step*R + R) for R rows per step; each
// data-parallel rank and micro-step takes its slice of those rows. So the
// sequences of a step do not depend on the layout, and the exact position to
// save in a checkpoint is just the step number.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace tessera::data {

class TokenLoader {
 public:
  // pattern: a path or a glob; shards are taken in sorted path order. Errors:
  // nothing matches, a shard is invalid (or not a regular file), a token id
  // is >= vocab (when vocab > 0; the error names the shard and the token's
  // place in it: check_token_ids), or fewer than T+1 tokens in all.
  static Result<TokenLoader> open(const std::string& pattern, int T, uint64_t seed, int vocab = 0);

  // Fills inputs and targets (B,T) with rows [row0, row0+B) of the global
  // batch of `step`, which has rows_per_step rows.
  void fill(int64_t step, int64_t rows_per_step, int64_t row0, int B, int* inputs, int* targets);

  int64_t windows() const { return windows_; }
  int64_t tokens() const { return static_cast<int64_t>(tokens_.size()); }
  const std::vector<uint32_t>& all_tokens() const { return tokens_; }
  const std::vector<std::string>& files() const { return files_; }

 private:
  void ensure_epoch(int64_t epoch);

  std::vector<std::string> files_;
  std::vector<uint32_t> tokens_;
  int T_ = 0;
  uint64_t seed_ = 0;
  int64_t windows_ = 0;
  int64_t epoch_ = -1;
  std::vector<int64_t> perm_;  // window order of epoch_
};

// The sorted paths matching a glob (or the path itself if it exists).
Result<std::vector<std::string>> expand_glob(const std::string& pattern);

}  // namespace tessera::data
