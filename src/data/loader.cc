#include "data/loader.h"

#include <glob.h>

#include <algorithm>
#include <numeric>
#include <random>

#include <fmt/format.h>

#include "data/shard.h"

namespace tessera::data {

Result<std::vector<std::string>> expand_glob(const std::string& pattern) {
  glob_t g{};
  int rc = ::glob(pattern.c_str(), 0, nullptr, &g);
  std::vector<std::string> out;
  if (rc == 0)
    for (size_t i = 0; i < g.gl_pathc; i++) out.emplace_back(g.gl_pathv[i]);
  globfree(&g);
  if (out.empty()) return Status::NotFound(fmt::format("no token shard matches '{}'", pattern));
  std::sort(out.begin(), out.end());
  return out;
}

Result<TokenLoader> TokenLoader::open(const std::string& pattern, int T, uint64_t seed, int vocab) {
  TokenLoader l;
  ASSIGN_OR_RETURN(l.files_, expand_glob(pattern));
  for (const std::string& f : l.files_) {
    ASSIGN_OR_RETURN(std::vector<uint32_t> tokens, read_shard(f));
    // Every id now, with the file's name, not when its batch is drawn.
    if (vocab > 0) {
      ASSIGN_OR_RETURN(int id_bytes, read_shard_id_bytes(f));
      RETURN_IF_ERROR(check_token_ids(tokens, vocab, f, id_bytes));
    }
    l.tokens_.insert(l.tokens_.end(), tokens.begin(), tokens.end());
  }
  l.T_ = T;
  l.seed_ = seed;
  int64_t n = static_cast<int64_t>(l.tokens_.size());
  l.windows_ = n > T ? (n - 1) / T : 0;
  if (l.windows_ == 0)
    return Status::InvalidArgument(
        fmt::format("'{}' holds {} tokens, fewer than one sequence of {} needs", pattern, n, T + 1));
  return l;
}

void TokenLoader::ensure_epoch(int64_t epoch) {
  if (epoch == epoch_) return;
  perm_.resize(windows_);
  std::iota(perm_.begin(), perm_.end(), 0);
  std::mt19937_64 rng(seed_ * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(epoch));
  // Fisher-Yates with our own index draw: std::shuffle's use of the engine is
  // implementation-defined, and the order must be the same everywhere.
  for (int64_t i = windows_ - 1; i > 0; i--) {
    int64_t j = static_cast<int64_t>(rng() % static_cast<uint64_t>(i + 1));
    std::swap(perm_[i], perm_[j]);
  }
  epoch_ = epoch;
}

void TokenLoader::fill(int64_t step, int64_t rows_per_step, int64_t row0, int B, int* inputs, int* targets) {
  for (int b = 0; b < B; b++) {
    int64_t g = step * rows_per_step + row0 + b;
    ensure_epoch(g / windows_);
    const uint32_t* w = tokens_.data() + perm_[g % windows_] * T_;
    for (int t = 0; t < T_; t++) {
      inputs[b * T_ + t] = static_cast<int>(w[t]);
      targets[b * T_ + t] = static_cast<int>(w[t + 1]);
    }
  }
}

}  // namespace tessera::data
