#include "parallel/dlrm_plan.h"

#include <algorithm>
#include <numeric>

#include <fmt/format.h>

namespace tessera {

namespace {

std::string mib(int64_t bytes) {
  if (bytes < 1024) return fmt::format("{} bytes", bytes);
  if (bytes < (1 << 20)) return fmt::format("{:.2f} KiB", static_cast<double>(bytes) / 1024);
  return fmt::format("{:.2f} MiB", static_cast<double>(bytes) / (1 << 20));
}

struct Piece {
  int table;
  int64_t row_begin, row_end;
  int64_t bytes;
  double lookups;
};

// Rows [E*i/k, E*(i+1)/k) of a table of E rows, i = 0..k-1 (sizes differ by
// at most one; empty when E < k).
std::pair<int64_t, int64_t> row_range(int64_t E, int k, int i) { return {E * i / k, E * (i + 1) / k}; }

// Longest-processing-time packing over two loads: pieces by decreasing
// max(memory share, lookup share), each to the rank where that max after
// adding it is least, among the ranks within budget, preferring ranks that
// hold no piece of the same table. False when some piece fits no rank.
bool pack(const std::vector<Piece>& pieces, int ranks, int64_t budget, std::vector<int>* owner) {
  double total_bytes = 0, total_lookups = 0;
  for (const Piece& p : pieces) {
    total_bytes += static_cast<double>(p.bytes);
    total_lookups += p.lookups;
  }
  auto share = [](double x, double total) { return total > 0 ? x / total : 0.0; };
  std::vector<int> order(pieces.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    const double ka = std::max(share(pieces[a].bytes, total_bytes), share(pieces[a].lookups, total_lookups));
    const double kb = std::max(share(pieces[b].bytes, total_bytes), share(pieces[b].lookups, total_lookups));
    return ka > kb;
  });
  std::vector<double> bytes(ranks, 0.0), lookups(ranks, 0.0);
  std::vector<std::vector<int>> tables_on(ranks);
  owner->assign(pieces.size(), -1);
  for (int i : order) {
    const Piece& p = pieces[i];
    int best = -1;
    bool best_shares = true;
    double best_load = 0;
    for (int r = 0; r < ranks; r++) {
      if (budget > 0 && static_cast<int64_t>(bytes[r]) + p.bytes > budget) continue;
      const bool shares = std::find(tables_on[r].begin(), tables_on[r].end(), p.table) != tables_on[r].end();
      const double load =
          std::max(share(bytes[r] + p.bytes, total_bytes), share(lookups[r] + p.lookups, total_lookups));
      if (best < 0 || (best_shares && !shares) || (shares == best_shares && load < best_load)) {
        best = r;
        best_shares = shares;
        best_load = load;
      }
    }
    if (best < 0) return false;
    (*owner)[i] = best;
    bytes[best] += static_cast<double>(p.bytes);
    lookups[best] += p.lookups;
    tables_on[best].push_back(p.table);
  }
  return true;
}

}  // namespace

std::vector<int> DlrmPlan::shards_of_rank(int r) const {
  std::vector<int> out;
  for (size_t i = 0; i < shards.size(); i++)
    if (shards[i].rank == r) out.push_back(static_cast<int>(i));
  return out;
}

int DlrmPlan::pieces(int t) const {
  int n = 0;
  for (const DlrmShard& s : shards) n += s.table == t;
  return n;
}

Result<DlrmPlan> plan_dlrm_tables(const DlrmConfig& config, const DlrmPlanOptions& o) {
  if (Status st = config.validate(); !st.ok()) return st;
  const int T = static_cast<int>(config.table_rows.size());
  if (o.ranks < 1) return Status::InvalidArgument(fmt::format("dlrm placement: ranks must be >= 1 (got {})", o.ranks));
  if (o.placement != "table" && o.placement != "row" && o.placement != "auto")
    return Status::InvalidArgument(
        fmt::format("dlrm placement: '{}' is not table, row or auto", o.placement));
  if (o.budget_bytes < 0)
    return Status::InvalidArgument(fmt::format("dlrm placement: budget must be >= 0 bytes (got {})", o.budget_bytes));
  if (o.state_floats_per_row < 0)
    return Status::InvalidArgument("dlrm placement: state floats per row must be >= 0");
  if (!o.lookups.empty() && static_cast<int>(o.lookups.size()) != T)
    return Status::InvalidArgument(
        fmt::format("dlrm placement: {} lookups per sample given for {} tables", o.lookups.size(), T));
  for (size_t t = 0; t < o.lookups.size(); t++)
    if (!(o.lookups[t] >= 0))
      return Status::InvalidArgument(fmt::format("dlrm placement: table {}'s lookups per sample must be >= 0", t));

  const int64_t row_bytes = (static_cast<int64_t>(config.dim) + o.state_floats_per_row) * 4;
  const int64_t budget = o.budget_bytes;
  auto lookups_of = [&](int t) { return o.lookups.empty() ? 1.0 : o.lookups[t]; };
  int64_t total = 0;
  for (int t = 0; t < T; t++) total += config.table_rows[t] * row_bytes;
  if (budget > 0 && row_bytes > budget)
    return Status::InvalidArgument(
        fmt::format("dlrm placement: a budget of {} bytes is smaller than one row ({} bytes)", budget, row_bytes));
  if (budget > 0 && total > budget * o.ranks)
    return Status::InvalidArgument(fmt::format(
        "dlrm placement: the tables need {}, more than {} rank(s) x a budget of {} hold", mib(total), o.ranks,
        mib(budget)));

  DlrmPlan plan;
  plan.rank_bytes.assign(o.ranks, 0);
  plan.rank_lookups.assign(o.ranks, 0.0);
  auto finish = [&](std::vector<DlrmShard> shards, const std::string& placement) {
    std::sort(shards.begin(), shards.end(), [](const DlrmShard& a, const DlrmShard& b) {
      return a.table != b.table ? a.table < b.table : a.row_begin < b.row_begin;
    });
    for (const DlrmShard& s : shards) {
      const int64_t rows = s.row_end - s.row_begin;
      plan.rank_bytes[s.rank] += rows * row_bytes;
      plan.rank_lookups[s.rank] += lookups_of(s.table) * static_cast<double>(rows) / config.table_rows[s.table];
    }
    plan.shards = std::move(shards);
    plan.placement = placement;
  };

  // Row-wise over all ranks: table t's piece i on rank i.
  auto row_wise = [&]() -> Status {
    std::vector<DlrmShard> shards;
    std::vector<int64_t> bytes(o.ranks, 0);
    for (int t = 0; t < T; t++)
      for (int i = 0; i < o.ranks; i++) {
        auto [b, e] = row_range(config.table_rows[t], o.ranks, i);
        if (b == e) continue;
        shards.push_back({t, b, e, i});
        bytes[i] += (e - b) * row_bytes;
      }
    for (int r = 0; r < o.ranks; r++)
      if (budget > 0 && bytes[r] > budget)
        return Status::InvalidArgument(fmt::format(
            "dlrm placement: split by rows over {} ranks, rank {} would hold {}, over its budget of {}", o.ranks, r,
            mib(bytes[r]), mib(budget)));
    finish(std::move(shards), "row");
    return Status::OK();
  };

  if (o.placement == "row") {
    if (Status st = row_wise(); !st.ok()) return st;
    return plan;
  }

  // Whole tables; in auto mode a table over the budget in the fewest row
  // pieces that each fit it.
  std::vector<Piece> pieces;
  for (int t = 0; t < T; t++) {
    const int64_t E = config.table_rows[t];
    const int64_t bytes = E * row_bytes;
    int k = 1;
    if (budget > 0 && bytes > budget) {
      if (o.placement == "table")
        return Status::InvalidArgument(fmt::format(
            "dlrm placement: table {} ({}) does not fit one rank's budget of {}; placement row or auto splits it", t,
            mib(bytes), mib(budget)));
      const int64_t rows_fit = budget / row_bytes;  // >= 1 (checked above)
      const int64_t need = (E + rows_fit - 1) / rows_fit;
      if (need > o.ranks)
        return Status::InvalidArgument(fmt::format(
            "dlrm placement: table {} ({}) needs {} ranks at a budget of {}; there are {}", t, mib(bytes), need,
            mib(budget), o.ranks));
      k = static_cast<int>(need);
    }
    for (int i = 0; i < k; i++) {
      auto [b, e] = row_range(E, k, i);
      pieces.push_back({t, b, e, (e - b) * row_bytes, lookups_of(t) * static_cast<double>(e - b) / E});
    }
  }
  std::vector<int> owner;
  if (pack(pieces, o.ranks, budget, &owner)) {
    std::vector<DlrmShard> shards;
    for (size_t i = 0; i < pieces.size(); i++)
      shards.push_back({pieces[i].table, pieces[i].row_begin, pieces[i].row_end, owner[i]});
    finish(std::move(shards), o.placement);
    return plan;
  }
  if (o.placement == "table")
    return Status::InvalidArgument(fmt::format(
        "dlrm placement: whole tables ({} in all) do not pack into {} rank(s) x {}; placement row or auto splits them",
        mib(total), o.ranks, mib(budget)));
  if (Status st = row_wise(); !st.ok()) return st;
  return plan;
}

std::string describe_plan(const DlrmPlan& plan) {
  std::string out;
  for (size_t r = 0; r < plan.rank_bytes.size(); r++) {
    out += fmt::format("rank {}: {}, {:.2f} lookups/sample:", r, mib(plan.rank_bytes[r]), plan.rank_lookups[r]);
    for (int i : plan.shards_of_rank(static_cast<int>(r))) {
      const DlrmShard& s = plan.shards[i];
      out += fmt::format(" t{}[{},{})", s.table, s.row_begin, s.row_end);
    }
    out += "\n";
  }
  return out;
}

}  // namespace tessera
