#include "plan/compare.h"

#include <cstdio>

#include <fmt/format.h>

namespace tessera::plan {

Result<double> parse_count(const std::string& flag, const std::string& text, const std::string& examples) {
  if (text.empty()) return 0.0;
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (...) {
    return Status::InvalidArgument(fmt::format("{} '{}' is not a number (e.g. {})", flag, text, examples));
  }
  const std::string suffix = text.substr(used);
  const double mult = suffix.empty() ? 1
                      : suffix == "K" || suffix == "k" ? 1e3
                      : suffix == "M" ? 1e6
                      : suffix == "B" || suffix == "G" ? 1e9
                      : suffix == "T" ? 1e12
                                      : -1;
  if (mult < 0 || v < 0)
    return Status::InvalidArgument(fmt::format("{} '{}' is not a count (e.g. {})", flag, text, examples));
  return v * mult;
}

Result<Layout> parse_layout(const std::string& s) {
  Layout l{0, 0, 0, 0, 0, 0, -1};
  size_t pos = 0;
  while (pos < s.size()) {
    size_t end = s.find(',', pos);
    if (end == std::string::npos) end = s.size();
    const std::string kv = s.substr(pos, end - pos);
    pos = end + 1;
    const size_t eq = kv.find('=');
    int v = 0;
    char extra = 0;
    if (eq == std::string::npos || std::sscanf(kv.c_str() + eq + 1, "%d%c", &v, &extra) != 1)
      return Status::InvalidArgument(
          fmt::format("--layout: '{}' is not KEY=N (keys dp, tp, pp, mb, ga, zero, nodes)", kv));
    const std::string k = kv.substr(0, eq);
    int* field = k == "dp" ? &l.dp : k == "tp" ? &l.tp : k == "pp" ? &l.pp : k == "mb" ? &l.micro_batch
               : k == "ga" ? &l.grad_accum : k == "zero" ? &l.zero : k == "nodes" ? &l.nodes : nullptr;
    if (field == nullptr)
      return Status::InvalidArgument(fmt::format("--layout: unknown key '{}' (dp, tp, pp, mb, ga, zero, nodes)", k));
    if (k == "zero" ? (v < 0 || v > 1) : v < 1)
      return Status::InvalidArgument(
          fmt::format("--layout: {} must be {}, got {}", k, k == "zero" ? "0 or 1" : "at least 1", v));
    *field = v;
  }
  return l;
}

Result<Estimate> price_layout(const Job& job, const Cluster& c, Layout l) {
  const ModelSpec& m = job.model;
  if (l.nodes == 0) l.nodes = c.nodes;
  if (l.zero < 0) l.zero = 0;
  const int ranks = l.dp * l.tp * l.pp;
  const int have = c.shared_host ? c.ranks() : l.nodes * c.ranks_per_node;
  if (ranks != have)
    return Status::InvalidArgument(fmt::format("--layout {} uses {} ranks, but {} nodes of {} have {}", l.str(), ranks,
                                               l.nodes, c.name, have));
  ModelShard shard;
  shard.tp = l.tp;
  if (Status st = shard.validate(m.shape()); !st.ok()) return Status::InvalidArgument("--layout: " + st.message());
  if (l.pp > m.layers)
    return Status::InvalidArgument(fmt::format("--layout: pp={} exceeds the {} layers", l.pp, m.layers));
  if (l.grad_accum == 0) {
    const int64_t per = static_cast<int64_t>(l.dp) * l.micro_batch;
    if (m.global_batch % per)
      return Status::InvalidArgument(
          fmt::format("--layout: dp x mb = {} does not divide the global batch {}", per, m.global_batch));
    l.grad_accum = static_cast<int>(m.global_batch / per);
  }
  Job j = job;
  j.model.global_batch = static_cast<int64_t>(l.dp) * l.micro_batch * l.grad_accum;
  return estimate(j, c, l);
}

Result<Cluster> load_cluster(const std::string& path, int ranks_per_node, int threads_per_rank) {
  ASSIGN_OR_RETURN(Cluster c, load_cluster(path));
  if (ranks_per_node > 0) c.ranks_per_node = ranks_per_node;
  if (threads_per_rank > 0) c.threads_per_rank = threads_per_rank;
  return c;
}

std::string duration_text(double s) {
  if (s <= 0) return "-";
  if (s < 1) return fmt::format("{:.1f} ms", s * 1e3);
  if (s < 120) return fmt::format("{:.2f} s", s);
  if (s < 7200) return fmt::format("{:.1f} min", s / 60);
  if (s < 3 * 86400) return fmt::format("{:.1f} h", s / 3600);
  return fmt::format("{:.1f} days", s / 86400);
}

int fastest_cluster(const std::vector<ClusterOutcome>& clusters) {
  int fast = -1;
  for (size_t i = 0; i < clusters.size(); ++i)
    if (clusters[i].fits && (fast < 0 || clusters[i].step < clusters[fast].step)) fast = static_cast<int>(i);
  return fast;
}

std::string cost_comparison(double fast_cost_usd, double slow_cost_usd) {
  if (fast_cost_usd <= 0 || slow_cost_usd <= 0) return "";
  const double ratio = slow_cost_usd / fast_cost_usd;
  return ratio > 1.05       ? fmt::format(" and {:.1f}x cheaper", ratio)
         : ratio < 1 / 1.05 ? fmt::format(" but {:.1f}x dearer", 1 / ratio)
                            : std::string(" at about the same cost");
}

Status fits_nowhere(const std::vector<ClusterOutcome>& clusters) {
  std::string why;
  for (const ClusterOutcome& c : clusters) why += fmt::format("{}{}: {}", why.empty() ? "" : "; ", c.name, c.refusal);
  return Status::ResourceExhausted(fmt::format("the model fits on no cluster given ({})", why));
}

}  // namespace tessera::plan
