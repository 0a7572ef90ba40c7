#include "data/criteo.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <random>
#include <span>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "io/safetensors.h"  // io::write_file_atomic

namespace tessera::data {

namespace {

constexpr char kMagic[8] = {'T', 'S', 'C', 'L', 'I', 'C', 'K', '1'};
constexpr uint32_t kVersion = 1;

std::vector<std::string_view> split_tabs(std::string_view line) {
  std::vector<std::string_view> out;
  size_t start = 0;
  while (true) {
    const size_t tab = line.find('\t', start);
    if (tab == std::string_view::npos) {
      out.push_back(line.substr(start));
      return out;
    }
    out.push_back(line.substr(start, tab - start));
    start = tab + 1;
  }
}

uint64_t splitmix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}
uint64_t mix(uint64_t a, uint64_t b, uint64_t c) { return splitmix(splitmix(splitmix(a) ^ b) ^ c); }
// A standard normal drawn deterministically from a key (Box-Muller).
double normal_of(uint64_t key) {
  const uint64_t h1 = splitmix(key), h2 = splitmix(h1);
  const double u1 = (static_cast<double>(h1 >> 11) + 0.5) / 9007199254740992.0;
  const double u2 = static_cast<double>(h2 >> 11) / 9007199254740992.0;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

}  // namespace

Status parse_click_line(std::string_view line, int num_dense, const std::vector<int64_t>& hash_sizes,
                        ClickRecord& rec) {
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  const int num_cat = static_cast<int>(hash_sizes.size());
  const std::vector<std::string_view> f = split_tabs(line);
  if (static_cast<int>(f.size()) != 1 + num_dense + num_cat)
    return Status::InvalidArgument(
        fmt::format("wrong field count (got {}, want {})", f.size(), 1 + num_dense + num_cat));
  if (f[0] == "0") {
    rec.label = 0.0f;
  } else if (f[0] == "1") {
    rec.label = 1.0f;
  } else {
    return Status::InvalidArgument(fmt::format("label '{}' is not 0 or 1", f[0]));
  }
  rec.dense.resize(num_dense);
  for (int j = 0; j < num_dense; j++) {
    const std::string_view s = f[1 + j];
    if (s.empty()) {
      rec.dense[j] = 0.0f;
      continue;
    }
    const std::string tmp(s);
    char* end = nullptr;
    errno = 0;
    const long long v = std::strtoll(tmp.c_str(), &end, 10);
    if (end != tmp.c_str() + tmp.size() || errno != 0)
      return Status::InvalidArgument(fmt::format("dense feature I{} '{}' is not an integer", j + 1, s));
    // The DLRM reference: negative values clamped to 0, then log(1 + x).
    rec.dense[j] = static_cast<float>(std::log1p(static_cast<double>(std::max(v, 0LL))));
  }
  rec.cats.resize(num_cat);
  for (int t = 0; t < num_cat; t++) {
    const std::string_view s = f[1 + num_dense + t];
    if (s.empty()) {
      rec.cats[t] = 0;
      continue;
    }
    if (s.size() > 16 || !std::all_of(s.begin(), s.end(), [](char c) { return std::isxdigit(static_cast<unsigned char>(c)); }))
      return Status::InvalidArgument(fmt::format("categorical feature C{} '{}' is not a hex string", t + 1, s));
    const uint64_t v = std::strtoull(std::string(s).c_str(), nullptr, 16);
    rec.cats[t] = static_cast<int>(v % static_cast<uint64_t>(hash_sizes[t]));
  }
  return Status::OK();
}

Status write_click_shard(const std::string& path, const ClickShard& s) {
  const uint32_t head[4] = {kVersion, static_cast<uint32_t>(s.num_dense), static_cast<uint32_t>(s.num_cat), 0};
  const uint64_t rows = static_cast<uint64_t>(s.rows());
  const std::span<const std::byte> pieces[] = {
      std::as_bytes(std::span(kMagic, 8)),       std::as_bytes(std::span(head)),
      std::as_bytes(std::span(&rows, 1)),        std::as_bytes(std::span(s.hash_sizes)),
      std::as_bytes(std::span(s.labels)),        std::as_bytes(std::span(s.dense)),
      std::as_bytes(std::span(s.cats))};
  return io::write_file_atomic(path, pieces);
}

Result<ClickShard> read_click_shard(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return Status::IOError(fmt::format("cannot open {}: {}", path, std::strerror(errno)));
  char magic[8];
  uint32_t head[4];
  uint64_t rows = 0;
  f.read(magic, 8);
  f.read(reinterpret_cast<char*>(head), sizeof(head));
  f.read(reinterpret_cast<char*>(&rows), 8);
  if (!f || std::memcmp(magic, kMagic, 8) != 0)
    return Status::Corruption(fmt::format("{}: not a click shard (bad magic)", path));
  if (head[0] != kVersion) return Status::Corruption(fmt::format("{}: unsupported version {}", path, head[0]));
  ClickShard s;
  s.num_dense = static_cast<int>(head[1]);
  s.num_cat = static_cast<int>(head[2]);
  std::error_code ec;
  const uint64_t size = std::filesystem::file_size(path, ec);
  if (ec || head[1] > 4096 || head[2] > 4096)
    return Status::Corruption(fmt::format("{}: {} dense and {} categorical features (at most 4096 each)", path,
                                          head[1], head[2]));
  // The row count bounded by the file's size before it is multiplied (a
  // crafted count must not wrap around to a matching size).
  const uint64_t fixed = 32 + 8 * static_cast<uint64_t>(s.num_cat);
  const uint64_t row_bytes = 4 * (1 + static_cast<uint64_t>(s.num_dense) + static_cast<uint64_t>(s.num_cat));
  if (size < fixed || rows > (size - fixed) / row_bytes || size != fixed + rows * row_bytes)
    return Status::Corruption(fmt::format("{}: size {} does not match its header ({} rows)", path, size, rows));
  s.hash_sizes.resize(s.num_cat);
  s.labels.resize(rows);
  s.dense.resize(rows * s.num_dense);
  s.cats.resize(rows * s.num_cat);
  f.read(reinterpret_cast<char*>(s.hash_sizes.data()), 8 * s.hash_sizes.size());
  f.read(reinterpret_cast<char*>(s.labels.data()), 4 * s.labels.size());
  f.read(reinterpret_cast<char*>(s.dense.data()), 4 * s.dense.size());
  f.read(reinterpret_cast<char*>(s.cats.data()), 4 * s.cats.size());
  if (!f) return Status::Corruption(fmt::format("{}: truncated", path));
  for (int t = 0; t < s.num_cat; t++) {
    if (s.hash_sizes[t] <= 0 || s.hash_sizes[t] > (int64_t{1} << 31))
      return Status::Corruption(fmt::format("{}: table {} has bad size {}", path, t, s.hash_sizes[t]));
  }
  for (size_t i = 0; i < s.cats.size(); i++)
    if (s.cats[i] < 0 || s.cats[i] >= s.hash_sizes[i % s.num_cat])
      return Status::Corruption(fmt::format("{}: row {} has an id out of its table", path, i / s.num_cat));
  return s;
}

Result<CriteoPrepareSummary> prepare_criteo(const CriteoPrepareOptions& o) {
  if (o.inputs.empty()) return Status::InvalidArgument("prepare --format criteo: no --input files");
  if (o.num_dense < 0 || o.num_cat < 0) return Status::InvalidArgument("--dense and --tables must be >= 0");
  if (o.hash_size <= 0 || o.hash_size > (int64_t{1} << 31))
    return Status::InvalidArgument(fmt::format("--hash-size {} must be in [1, 2^31]", o.hash_size));
  if (!(o.val_fraction >= 0.0 && o.val_fraction < 1.0))
    return Status::InvalidArgument(fmt::format("--val-fraction {} must be in [0, 1)", o.val_fraction));
  const int64_t every = o.val_fraction > 0 ? std::max<int64_t>(2, std::llround(1.0 / o.val_fraction)) : 0;
  const std::vector<int64_t> hash_sizes(o.num_cat, o.hash_size);
  ClickShard train, val;
  for (ClickShard* s : {&train, &val}) {
    s->num_dense = o.num_dense;
    s->num_cat = o.num_cat;
    s->hash_sizes = hash_sizes;
  }
  CriteoPrepareSummary sum;
  ClickRecord rec;
  std::string line;
  for (const std::string& path : o.inputs) {
    std::ifstream f(path);
    if (!f) return Status::IOError(fmt::format("cannot open {}: {}", path, std::strerror(errno)));
    int64_t lineno = 0;
    while (std::getline(f, line)) {
      lineno++;
      const int64_t i = sum.lines++;
      Status st = parse_click_line(line, o.num_dense, hash_sizes, rec);
      if (!st.ok()) {
        sum.bad_lines++;
        if (sum.bad_examples.size() < 10) {
          sum.bad_examples.push_back(fmt::format("{}:{}: {}", path, lineno, st.message()));
        }
        continue;
      }
      ClickShard& s = every > 0 && i % every == every - 1 ? val : train;
      s.labels.push_back(rec.label);
      s.dense.insert(s.dense.end(), rec.dense.begin(), rec.dense.end());
      s.cats.insert(s.cats.end(), rec.cats.begin(), rec.cats.end());
    }
    if (f.bad()) return Status::IOError(fmt::format("error reading {}", path));
  }
  if (train.rows() + val.rows() == 0)
    return Status::InvalidArgument(
        fmt::format("no valid Criteo line in the input ({} lines, {} bad{}{})", sum.lines, sum.bad_lines,
                    sum.bad_examples.empty() ? "" : "; first: ",
                    sum.bad_examples.empty() ? "" : sum.bad_examples[0]));
  if (o.warnings)
    for (const std::string& e : sum.bad_examples) std::fprintf(o.warnings, "tessera: warning: %s\n", e.c_str());
  if (o.warnings && sum.bad_lines > static_cast<int64_t>(sum.bad_examples.size()))
    std::fprintf(o.warnings, "tessera: warning: %lld more bad lines not shown\n",
                 static_cast<long long>(sum.bad_lines - static_cast<int64_t>(sum.bad_examples.size())));
  std::error_code ec;
  std::filesystem::create_directories(o.out_dir, ec);
  if (ec) return Status::IOError(fmt::format("cannot create {}: {}", o.out_dir, ec.message()));
  for (auto [name, s] : {std::pair{"train.bin", &train}, std::pair{"val.bin", &val}}) {
    const std::string p = (std::filesystem::path(o.out_dir) / name).string();
    if (Status st = write_click_shard(p, *s); !st.ok()) return st;
    sum.shards.push_back(p);
  }
  sum.train_rows = train.rows();
  sum.val_rows = val.rows();
  return sum;
}

double exact_auc(const std::vector<float>& scores, const std::vector<float>& labels) {
  const size_t n = scores.size();
  std::vector<size_t> idx(n);
  std::iota(idx.begin(), idx.end(), 0);
  std::sort(idx.begin(), idx.end(), [&](size_t a, size_t b) { return scores[a] < scores[b]; });
  // Sum of the positives' ranks (1-based, ties given their average rank).
  double rank_sum = 0.0;
  int64_t pos = 0;
  for (size_t i = 0; i < n;) {
    size_t j = i;
    while (j < n && scores[idx[j]] == scores[idx[i]]) j++;
    const double avg = (static_cast<double>(i + 1) + static_cast<double>(j)) / 2.0;
    for (size_t k = i; k < j; k++)
      if (labels[idx[k]] > 0.5f) {
        rank_sum += avg;
        pos++;
      }
    i = j;
  }
  const int64_t neg = static_cast<int64_t>(n) - pos;
  if (pos == 0 || neg == 0) return 0.5;
  return (rank_sum - static_cast<double>(pos) * (pos + 1) / 2.0) / (static_cast<double>(pos) * neg);
}

Result<SynthClicksSummary> synth_clicks(const SynthClicksOptions& o) {
  if (o.rows <= 0) return Status::InvalidArgument(fmt::format("--rows {} must be > 0", o.rows));
  if (o.tables < 0 || o.tables > 26) return Status::InvalidArgument(fmt::format("--tables {} must be in [0, 26]", o.tables));
  if (o.num_dense < 0 || o.num_dense > 13) return Status::InvalidArgument(fmt::format("--dense {} must be in [0, 13]", o.num_dense));
  if (o.cardinality <= 0 || o.cardinality > 100'000'000)
    return Status::InvalidArgument(fmt::format("--cardinality {} must be in [1, 1e8]", o.cardinality));
  if (!(o.zipf >= 0.0 && o.zipf <= 5.0)) return Status::InvalidArgument(fmt::format("--zipf {} must be in [0, 5]", o.zipf));
  if (o.crosses < 0) return Status::InvalidArgument("--crosses must be >= 0");
  if (!(o.val_fraction > 0.0 && o.val_fraction < 1.0))
    return Status::InvalidArgument(fmt::format("--val-fraction {} must be in (0, 1)", o.val_fraction));
  if (o.out.empty()) return Status::InvalidArgument("--out is required");
  const int64_t every = std::max<int64_t>(2, std::llround(1.0 / o.val_fraction));
  const int64_t K = o.cardinality;
  std::vector<double> cdf(K);
  double acc = 0.0;
  for (int64_t k = 0; k < K; k++) cdf[k] = acc += 1.0 / std::pow(static_cast<double>(k + 1), o.zipf);
  for (double& c : cdf) c /= acc;
  // The planted model (docs/dlrm.md): all of it derived from the seed.
  const uint64_t S = o.seed;
  std::vector<double> w_dense(o.num_dense), mu(o.num_dense);
  for (int j = 0; j < o.num_dense; j++) {
    w_dense[j] = 0.3 * normal_of(mix(S, 1, j));
    mu[j] = 1.0 + 0.2 * j;
  }
  std::vector<double> sigma_t(o.tables);
  for (int t = 0; t < o.tables; t++) sigma_t[t] = t % 3 == 2 ? 0.0 : 0.5;  // every third table is noise
  std::vector<std::pair<int, int>> crosses;
  for (int c = 0; c < o.crosses && 2 * c + 1 < o.tables; c++) crosses.push_back({2 * c, 2 * c + 1});
  const double bias = -1.2;

  std::FILE* f = std::fopen(o.out.c_str(), "w");
  if (f == nullptr) return Status::IOError(fmt::format("cannot write {}: {}", o.out, std::strerror(errno)));
  std::mt19937_64 rng(mix(S, 2, 0));
  std::uniform_real_distribution<double> uni(0.0, 1.0);
  std::normal_distribution<double> gauss(0.0, 1.0);
  std::vector<float> held_p, held_y;
  int64_t clicks = 0;
  double logloss = 0.0;
  std::vector<int64_t> cat(o.tables);
  std::string line;
  for (int64_t i = 0; i < o.rows; i++) {
    double logit = bias;
    std::string fields;
    for (int j = 0; j < o.num_dense; j++) {
      fields += '\t';
      // The planted model sees a feature as `prepare` does (the DLRM
      // reference's transform): log(1 + x), and 0 for a missing one. (It
      // used to count a missing feature as its mean, which prepare cannot
      // tell from x = 0: a gap between the truth and any trained model.)
      if (uni(rng) < 0.05) {  // missing
        logit += w_dense[j] * (0.0 - mu[j]);
        continue;
      }
      const double x = std::max(0.0, std::floor(std::exp(mu[j] + gauss(rng))) - 1.0);
      logit += w_dense[j] * (std::log1p(x) - mu[j]);
      fields += std::to_string(static_cast<int64_t>(x));
    }
    for (int t = 0; t < o.tables; t++) {
      const int64_t k = std::lower_bound(cdf.begin(), cdf.end(), uni(rng)) - cdf.begin();
      cat[t] = std::min(k, K - 1);
      logit += sigma_t[t] * normal_of(mix(S, 100 + t, cat[t]));
      fields += fmt::format("\t{:08x}", static_cast<uint32_t>(mix(S, 200 + t, cat[t])));
    }
    for (size_t c = 0; c < crosses.size(); c++)
      logit += 0.6 * normal_of(mix(S, 300 + c, cat[crosses[c].first] * K + cat[crosses[c].second]));
    const double p = 1.0 / (1.0 + std::exp(-logit));
    const int y = uni(rng) < p ? 1 : 0;
    clicks += y;
    line = std::to_string(y) + fields + "\n";
    std::fputs(line.c_str(), f);
    if (i % every == every - 1) {
      held_p.push_back(static_cast<float>(p));
      held_y.push_back(static_cast<float>(y));
      logloss -= y ? std::log(p) : std::log1p(-p);
    }
  }
  if (std::fclose(f) != 0) return Status::IOError(fmt::format("cannot write {}", o.out));

  SynthClicksSummary sum;
  sum.rows = o.rows;
  sum.heldout_rows = static_cast<int64_t>(held_y.size());
  sum.ctr = static_cast<double>(clicks) / o.rows;
  sum.heldout_auc = exact_auc(held_p, held_y);
  sum.heldout_logloss = held_y.empty() ? 0.0 : logloss / held_y.size();
  std::string base = o.out;
  if (base.size() > 4 && base.substr(base.size() - 4) == ".tsv") base.resize(base.size() - 4);
  sum.truth_path = base + ".truth.json";
  nlohmann::json j = {{"rows", sum.rows},
                      {"tables", o.tables},
                      {"dense", o.num_dense},
                      {"cardinality", o.cardinality},
                      {"zipf", o.zipf},
                      {"crosses", crosses.size()},
                      {"seed", o.seed},
                      {"ctr", sum.ctr},
                      {"heldout_rule", fmt::format("line i (0-based) with i % {} == {}", every, every - 1)},
                      {"val_fraction", o.val_fraction},
                      {"heldout_rows", sum.heldout_rows},
                      {"heldout_auc", sum.heldout_auc},
                      {"heldout_logloss", sum.heldout_logloss}};
  std::ofstream tf(sum.truth_path, std::ios::trunc);
  tf << j.dump(1) << "\n";
  tf.close();
  if (!tf) return Status::IOError(fmt::format("cannot write {}", sum.truth_path));
  return sum;
}

}  // namespace tessera::data
