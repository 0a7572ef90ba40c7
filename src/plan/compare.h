// What `tessera plan` does around the cost models (plan/estimate.h for GPT
// jobs, plan/dlrm.h for DLRM jobs), one implementation for both: the
// command's counts and --layout, a whole layout priced as given, durations
// as the table prints them, and the comparison of clusters (which is
// fastest, how much cheaper, why none fits). Pure functions: no I/O but the
// cluster file load_cluster reads.
#pragma once

#include <string>
#include <vector>

#include "core/status.h"
#include "plan/cluster.h"
#include "plan/estimate.h"

namespace tessera::plan {

// "10B", "2.5e9", "300M", "4k" (K, M, B or G, T): a count of tokens or
// samples, 0 for "". InvalidArgument naming `flag` and showing `examples`
// ("10B, 300M, 2.5e9") for anything else or a negative count.
Result<double> parse_count(const std::string& flag, const std::string& text, const std::string& examples);

// "dp=2,tp=1,pp=2,mb=4,ga=4,zero=1,nodes=1" (--layout): keys not given stay
// 0 (zero: -1), the form search() takes as `fixed`. InvalidArgument for an
// unknown key, a value that is not a number, zero other than 0 or 1, or
// another key below 1.
Result<Layout> parse_layout(const std::string& text);

// A layout with dp, tp, pp and micro_batch all given, priced exactly: nodes
// default to the cluster's, zero to 0, grad_accum to the global batch over
// dp x micro_batch. InvalidArgument when its ranks are not the nodes' ranks,
// tp does not divide the heads, pp exceeds the layers or dp x micro_batch
// does not divide the global batch.
Result<Estimate> price_layout(const Job& job, const Cluster& cluster, Layout layout);

// A cluster file with --ranks-per-node and --threads-per-rank applied (0:
// the file's).
Result<Cluster> load_cluster(const std::string& path, int ranks_per_node, int threads_per_rank);

// "12.3 ms", "4.56 s", "7.8 min", "3.1 h", "4.4 days"; "-" for <= 0.
std::string duration_text(double seconds);

// One cluster's best answer, as the comparison sees it.
struct ClusterOutcome {
  std::string name;
  bool fits = false;     // a layout (placement) fits
  double step = 0;       // its step time, seconds
  double cost_usd = 0;   // its cost of the whole job (0: unknown)
  std::string refusal;   // why nothing fits
};

// The index of the fastest cluster that fits; -1 when none does. Ties: the first.
int fastest_cluster(const std::vector<ClusterOutcome>& clusters);

// " and 1.3x cheaper", " but 2.0x dearer", " at about the same cost" (within
// 5%) for the fast cluster's cost against the slow one's; "" when either is
// unknown.
std::string cost_comparison(double fast_cost_usd, double slow_cost_usd);

// ResourceExhausted "the model fits on no cluster given (A: why; B: why)".
Status fits_nowhere(const std::vector<ClusterOutcome>& clusters);

}  // namespace tessera::plan
