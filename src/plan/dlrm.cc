#include "plan/dlrm.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>

namespace tessera::plan {

namespace {

constexpr double kFloat = 4;  // Tessera's DLRM keeps tables, MLPs, activations and messages fp32
// Calibrated once on the one-process, one-thread run of configs/dlrm_500m.toml
// on this machine (docs/planner.md, "DLRM"; the other runs validate them):
// the sparse backward's std::stable_sort of positions by id (an indirect
// comparison with unpredictable branches), per element and log2 step...
constexpr double kSortSeconds = 9e-9;
// ...and the dense step's memory traffic against the passes counted below.
constexpr double kCpuDenseTraffic = 2.5;

// A ring all-reduce of `bytes` over n ranks (as estimate.cc): 2(n-1) steps.
double allreduce_s(double bytes, int n, double busbw, double alpha) {
  if (n <= 1) return 0;
  return 2.0 * (n - 1) * alpha + 2.0 * (n - 1) / n * bytes / busbw;
}

// Time of one GEMM C(M,N) = A(M,K) B(K,N), forward and backward (dinp, dW).
double gemm_fwd_bwd(const NodeType& node, const std::string& dtype, double rate, double m, double n, double k) {
  const double flops = 2 * m * n * k, bf = node.backward_factor.count(dtype) ? node.backward_factor.at(dtype) : 0.9;
  return flops / (rate * node.gemm_efficiency(dtype, m, n, k)) +
         flops / (rate * bf * node.gemm_efficiency(dtype, m, k, n)) +
         flops / (rate * bf * node.gemm_efficiency(dtype, k, n, m));
}

// Rows [E*i/k, E*(i+1)/k): as src/parallel/dlrm_plan.cc splits a table.
int64_t row_piece(int64_t E, int k, int i) { return E * (i + 1) / k - E * i / k; }

// Whole tables onto n ranks, largest first, each onto the rank where the
// larger of its two shares (memory, lookups) after adding it is least: the
// rule of plan_dlrm_tables (src/parallel/dlrm_plan.cc; the planner may not
// include the parallel layer, so it is restated here). Every table has the
// same bag size, so its lookup share is 1/T.
std::vector<std::vector<int>> place_tables(const DlrmSpec& m, int n) {
  const int T = m.tables();
  std::vector<int> order(T);
  std::iota(order.begin(), order.end(), 0);
  const double total_rows = static_cast<double>(m.table_parameters()) / m.dim;
  const double total_lookups = T;
  auto key = [&](int t) { return std::max(m.table_rows[t] / total_rows, 1.0 / total_lookups); };
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return key(a) > key(b); });
  std::vector<double> rows(n, 0), lookups(n, 0);
  std::vector<std::vector<int>> of(n);
  for (int t : order) {
    int best = 0;
    double best_load = 1e300;
    for (int r = 0; r < n; r++) {
      const double load = std::max((rows[r] + m.table_rows[t]) / total_rows, (lookups[r] + 1) / total_lookups);
      if (load < best_load) best = r, best_load = load;
    }
    of[best].push_back(t);
    rows[best] += m.table_rows[t];
    lookups[best] += 1;
  }
  return of;
}

std::string gbs(double b) { return fmt::format("{:.2f} GB", b / 1e9); }

}  // namespace

int64_t DlrmSpec::table_parameters() const {
  int64_t s = 0;
  for (int64_t e : table_rows) s += e * dim;
  return s;
}

std::vector<std::pair<int, int>> DlrmSpec::mlp_layers() const {
  std::vector<std::pair<int, int>> l;
  int in = num_dense;
  for (int o : bottom) l.push_back({in, o}), in = o;
  const int F = 1 + tables();
  in = dim + F * (F - 1) / 2;
  for (int o : top) l.push_back({in, o}), in = o;
  l.push_back({in, 1});
  return l;
}

int64_t DlrmSpec::mlp_parameters() const {
  int64_t s = 0;
  for (auto [i, o] : mlp_layers()) s += int64_t{i} * o + o;
  return s;
}

double DlrmSpec::flops_per_sample() const {
  double w = 0;
  for (auto [i, o] : mlp_layers()) w += static_cast<double>(i) * o;
  const double F = 1 + tables(), P = F * (F - 1) / 2;
  return 6 * w + 3 * 2 * P * dim;
}

Status DlrmSpec::validate() const {
  if (num_dense < 0 || dim <= 0 || tables() == 0)
    return Status::InvalidArgument(fmt::format(
        "the DLRM needs at least one table, a positive embedding dimension and no negative dense count (got {} tables, "
        "dim {}, {} dense)", tables(), dim, num_dense));
  if (bottom.empty() || bottom.back() != dim)
    return Status::InvalidArgument(fmt::format("the bottom MLP must end in the embedding dimension {} (got {})", dim,
                                               bottom.empty() ? std::string("none") : std::to_string(bottom.back())));
  for (int s : bottom)
    if (s <= 0) return Status::InvalidArgument(fmt::format("bottom MLP sizes must be positive (got {})", s));
  for (int s : top)
    if (s <= 0) return Status::InvalidArgument(fmt::format("top MLP sizes must be positive (got {})", s));
  for (size_t t = 0; t < table_rows.size(); t++)
    if (table_rows[t] <= 0)
      return Status::InvalidArgument(fmt::format("table {} has {} rows; every table needs at least one", t, table_rows[t]));
  if (global_batch <= 0) return Status::InvalidArgument(fmt::format("the batch must be positive, got {}", global_batch));
  if (!(bag > 0)) return Status::InvalidArgument(fmt::format("--bag must be positive, got {}", bag));
  if (table_optimizer != "adagrad" && table_optimizer != "sgd")
    return Status::InvalidArgument(fmt::format("table optimizer '{}' is not adagrad or sgd", table_optimizer));
  return Status::OK();
}

std::string DlrmSpec::str() const {
  auto join = [](const std::vector<int>& v) {
    std::string s;
    for (int x : v) {
      if (!s.empty()) s += '-';
      s += std::to_string(x);
    }
    return s;
  };
  const auto [lo, hi] = std::minmax_element(table_rows.begin(), table_rows.end());
  const std::string rows = *lo == *hi ? fmt::format("{}", *lo) : fmt::format("{}..{}", *lo, *hi);
  return fmt::format("{}: {} tables x {} rows x D={}, bag {:g}, {} dense, bottom {}, top {}-1, {:.1f}M parameters "
                     "({:.2f}M in the MLPs), batch {} samples, tables by {}",
                     name, tables(), rows, dim, bag, num_dense, join(bottom), join(top), parameters() / 1e6,
                     mlp_parameters() / 1e6, global_batch, table_optimizer == "adagrad" ? "row-wise Adagrad" : "SGD");
}

std::string dlrm_preset_names() { return "dlrm-500m"; }

Result<DlrmSpec> dlrm_preset(const std::string& name) {
  if (name == "dlrm-500m") {  // configs/dlrm_500m.toml
    DlrmSpec m;
    m.name = name;
    m.num_dense = 13;
    m.dim = 64;
    m.bottom = {512, 256, 64};
    m.top = {512, 256};
    m.table_rows.assign(26, 300000);
    m.global_batch = 2048;
    return m;
  }
  return Status::NotFound(fmt::format("unknown DLRM model '{}' (known: {})", name, dlrm_preset_names()));
}

const char* placement_name(DlrmPlacement p) { return p == DlrmPlacement::kTable ? "table-wise" : "row-wise"; }

std::string DlrmEstimate::bottleneck() const {
  std::pair<double, const char*> parts[] = {{mlp, "the MLPs"},
                                            {interaction, "the interaction and feature copies"},
                                            {lookup, "embedding lookups"},
                                            {update, "the sparse backward and table update"},
                                            {alltoall, "the all-to-all"},
                                            {allreduce, "the MLP gradient all-reduce"},
                                            {optimizer, "AdamW on the MLPs"},
                                            {launch, "kernel launches"}};
  auto* worst = std::max_element(std::begin(parts), std::end(parts),
                                 [](const auto& a, const auto& b) { return a.first < b.first; });
  return fmt::format("{} ({:.0f}% of the step)", worst->second, 100 * worst->first / step);
}

DlrmEstimate estimate_dlrm(const DlrmJob& job, const Cluster& c, DlrmPlacement placement, int nodes) {
  DlrmEstimate e;
  const DlrmSpec& md = job.model;
  const NodeType& node = c.node;
  const bool gpu = node.kind == DeviceKind::kGpu;
  e.nodes = nodes;
  e.placement = placement;
  const int n = c.shared_host ? c.ranks() : nodes * c.ranks_per_node;
  const int rpn = c.shared_host ? 1 : c.ranks_per_node;  // ranks sharing a node's links
  e.ranks = n;
  const int T = md.tables();
  const double B = static_cast<double>(md.global_batch), D = md.dim, bag = md.bag;
  const double Br = std::ceil(B / n);  // the largest slice (the first B % n ranks get one more)
  const double F = 1 + T, P = F * (F - 1) / 2;
  const double state = md.table_optimizer == "adagrad" ? 1 : 0;  // floats per row
  auto term = [&](std::string name, double v, std::string f) { e.terms.push_back({std::move(name), v, std::move(f)}); };

  // A rank's share of its device, as estimate.cc: a GPU is one rank's; on a
  // CPU node each of its ranks runs at threads / cores of it.
  double share = 1;
  int sharing = 1;
  if (!gpu) {
    sharing = c.shared_host ? n : std::min(n, c.ranks_per_node);
    const int cores = std::max(node.cores, 1);
    const int threads = c.threads_per_rank > 0 ? c.threads_per_rank : std::max(1, cores / sharing);
    share = std::min(1.0, static_cast<double>(threads) / cores);
  }
  const double rate = node.peak_of(job.dtype) * share;
  const double bw = node.mem_bw * node.mem_efficiency * share;
  const double bw_lookup = bw * node.lookup_efficiency;

  // The tables each rank holds: (shards, rows).
  std::vector<int> shards(n, 0);
  std::vector<double> rows(n, 0);
  if (placement == DlrmPlacement::kTable) {
    const auto of = place_tables(md, n);
    for (int r = 0; r < n; r++) {
      shards[r] = static_cast<int>(of[r].size());
      for (int t : of[r]) rows[r] += static_cast<double>(md.table_rows[t]);
    }
  } else {
    for (int r = 0; r < n; r++) {
      for (int t = 0; t < T; t++) {
        const int64_t piece = row_piece(md.table_rows[t], n, r);
        if (piece > 0) shards[r] += 1, rows[r] += static_cast<double>(piece);
      }
    }
  }
  // The busiest rank: the most shards (lookups and all-to-all bytes), the
  // most rows (memory). Row-wise: ids are taken as uniform over a table's
  // rows, so a rank answers 1/n of each table's lookups.
  const int rmax = static_cast<int>(std::max_element(shards.begin(), shards.end()) - shards.begin());
  const int S_r = shards[rmax];
  e.max_tables_per_rank = S_r;
  const double rows_max = *std::max_element(rows.begin(), rows.end());
  const double lookups = placement == DlrmPlacement::kTable ? B * bag * S_r : B * bag * T / n;

  // 1. The MLPs on the rank's B_r samples: every layer's GEMM forward and
  // backward at its own shape's efficiency; bias and ReLU 4 passes over the
  // outputs (forward and backward) at memory bandwidth.
  double mlp = 0, mlp_elem = 0;
  for (auto [in, out] : md.mlp_layers()) {
    mlp += gemm_fwd_bwd(node, job.dtype, rate, Br, out, in);
    mlp_elem += 4 * Br * out * kFloat / bw;
  }
  e.mlp = mlp + mlp_elem;
  // 2. The interaction: (F x D)(D x F) per sample forward, twice that
  // backward: a CPU node at its measured interaction efficiency (Tessera's
  // kernel), a GPU at the GEMM curve of that shape; and the rest of the
  // dense step's memory traffic: the features assembled from the received
  // vectors (zeroed, added, read), z and dz, the gradients copied into the
  // send buffer (6 F D + 4 (D + P) floats per sample) and bias, ReLU and
  // BCE (4 passes over every MLP output, counted in 1.). On a CPU these
  // counted passes are scaled by kCpuDenseTraffic, calibrated on the
  // one-process run (docs/planner.md, "DLRM"): what Tessera's dense step
  // moves beyond them (allocation, per-layer copies) is not itemised.
  const double inter_flops = 3 * 2 * P * D * Br;
  const double inter_e = !gpu && node.interaction_efficiency > 0 ? node.interaction_efficiency
                                                                 : node.gemm_efficiency(job.dtype, F, F, D);
  const double traffic = gpu ? 1.0 : kCpuDenseTraffic;
  const double inter_bytes = (6 * F * D + 4 * (D + P)) * Br * kFloat * traffic;
  e.interaction = inter_flops / (rate * inter_e) + inter_bytes / bw;
  e.mlp += mlp_elem * (traffic - 1);

  // 3. Lookups (forward): for all B samples, every owned shard's rows read
  // (D x 4 bytes each, a random row: cache and TLB misses), its ids and
  // offsets (8 bytes a lookup) and the pooled output (B x D x 4 per shard),
  // at the node's lookup efficiency of its memory bandwidth (a measured
  // figure: docs/planner.md). Row-wise shards first restrict the batch's
  // bags to their rows: a pass over all B x T ids.
  const double lookup_bytes = lookups * (D * kFloat + 8) + S_r * B * D * kFloat;
  const double restrict_bytes = placement == DlrmPlacement::kRow ? S_r * B * bag * 4 * 3 : 0;
  e.lookup = lookup_bytes / bw_lookup + restrict_bytes / bw;
  // 4. The sparse backward and update: each shard's received gradients
  // copied into place (B x D, read and written), gathered per row in id
  // order (random rows) into the gradient rows (written, read again), the
  // touched rows read and written (random) and their Adagrad accumulator
  // read and written (a cache line each); the sort of the L positions by id
  // at kSortSeconds x log2(L) each. Every lookup is
  // taken as touching its own row (U = L, the bound: repeated ids in a
  // batch only make it cheaper).
  const double L_shard = lookups / std::max(S_r, 1);
  const double U = lookups;
  const double update_random = lookups * D * kFloat + 2 * U * D * kFloat + (state > 0 ? 2 * U * 64 : 0);
  const double update_seq = 2 * S_r * B * D * kFloat + 2 * U * D * kFloat;
  const double sort_s = gpu ? 0 : lookups * std::log2(std::max(2.0, L_shard)) * kSortSeconds;  // a GPU's TBE sorts by radix
  e.update = update_random / bw_lookup + update_seq / bw + sort_s;

  // 5. The all-to-all, forward (pooled vectors to the samples' ranks) and
  // backward (their gradients back): rank p sends S_p x B_q x D x 4 bytes to
  // rank q. Ranks are packed rpn to a node; bytes between ranks of a node
  // use the node's link (a profile's measured all-to-all, else its
  // all-reduce link), bytes between nodes the node's NICs (all its ranks'
  // traffic through them); (n-1) alpha for the pairwise exchange. The time
  // is that of the busiest rank or NIC, sending or receiving.
  double a2a_one = 0, a2a_bytes_rank = 0;
  if (n > 1) {
    const LinkModel& in_link = node.a2a.busbw > 0 ? node.a2a : c.intra;
    auto slice = [&](int q) { return std::floor(B / n) + (q < static_cast<int64_t>(md.global_batch) % n ? 1 : 0); };
    double s_sum = 0;
    for (int r = 0; r < n; r++) s_sum += shards[r];
    const int nn = (n + rpn - 1) / rpn;
    std::vector<double> node_out(nn, 0), node_in(nn, 0);
    double worst_intra = 0;
    for (int r = 0; r < n; r++) {
      const int nr = r / rpn;
      double b_node = 0;  // samples of r's node
      for (int q = nr * rpn; q < std::min(n, (nr + 1) * rpn); q++) b_node += slice(q);
      const double send_on = shards[r] * (b_node - slice(r)) * D * kFloat;
      const double send_off = shards[r] * (B - b_node) * D * kFloat;
      double s_node = 0;  // shards held on r's node
      for (int q = nr * rpn; q < std::min(n, (nr + 1) * rpn); q++) s_node += shards[q];
      const double recv_on = (s_node - shards[r]) * slice(r) * D * kFloat;
      const double recv_off = (s_sum - s_node) * slice(r) * D * kFloat;
      worst_intra = std::max({worst_intra, send_on, recv_on});
      node_out[nr] += send_off;
      node_in[nr] += recv_off;
      a2a_bytes_rank = std::max(a2a_bytes_rank, 2 * (send_on + send_off));
    }
    const bool cross = c.shared_host ? c.nodes > 1 : nn > 1;
    double inter_bw = c.inter.busbw > 0 ? c.inter.busbw : in_link.busbw;
    if (c.shared_host) inter_bw = std::min(inter_bw, in_link.busbw);
    double worst_nic = 0;
    for (int k = 0; k < nn; k++) worst_nic = std::max({worst_nic, node_out[k], node_in[k]});
    // (a profile's all-to-all sizes are a rank's whole buffer, (n-1)/n of it sent)
    const double intra_bw = c.shared_host && cross ? inter_bw
                          : node.a2a.busbw > 0 ? node.a2a_busbw_at(worst_intra * n / (n - 1.0)) : in_link.busbw;
    const double alpha = cross ? std::max(c.inter.alpha, in_link.alpha) : in_link.alpha;
    a2a_one = (n - 1) * alpha + std::max(worst_intra / intra_bw, cross ? worst_nic / inter_bw : 0.0);
    e.alltoall = 2 * a2a_one;
    e.alltoall_bytes = a2a_bytes_rank;
  }

  // 6. The MLP gradients all-reduced over all ranks (not overlapped: the
  // trainer reduces after backward), then AdamW on every rank (replicated):
  // 28 bytes per parameter moved, 8 more to zero and read the gradients.
  // Inside a node: the node's link; where a profile measured an all-to-all
  // too, its figures (busbw at this size, alpha), taken in the same session
  // as the DLRM runs: dev-vm.json's all-reduce figures carry a loaded
  // session's 4 ms small-message time, which its GPT terms rely on.
  const double P_mlp = static_cast<double>(md.mlp_parameters());
  double ar_bw = node.a2a.busbw > 0 ? node.a2a_busbw_at(P_mlp * kFloat) : c.intra.busbw;
  double ar_alpha = node.a2a.busbw > 0 ? node.a2a.alpha : c.intra.alpha;
  if ((c.shared_host && c.nodes > 1) || (!c.shared_host && n > rpn)) {
    ar_bw = std::min(ar_bw, c.inter.busbw > 0 ? c.inter.busbw : ar_bw);
    ar_alpha = std::max(ar_alpha, c.inter.alpha);
  }
  e.allreduce = allreduce_s(P_mlp * kFloat, n, ar_bw, ar_alpha);
  e.optimizer = 36 * P_mlp / bw;
  // 7. GPU kernel launches: 5 per MLP layer (GEMM forward, bias + ReLU, two
  // GEMMs and a reduction backward), a fused lookup and a fused backward +
  // update over all tables (FBGEMM's TBE), 8 more (interaction, loss,
  // copies, AdamW); 5 us each (assumed: a launch plus a small kernel's tail).
  const double kernels = 5.0 * md.mlp_layers().size() + 2 + 8;
  e.launch = gpu ? kernels * 5e-6 : 0;

  e.step = e.mlp + e.interaction + e.lookup + e.update + e.alltoall + e.allreduce + e.optimizer + e.launch;
  e.samples_per_s = B / e.step;
  const int devices = c.shared_host ? 1 : gpu ? n : nodes;
  e.mfu = md.flops_per_sample() * e.samples_per_s / (devices * node.mfu_peak_of(job.dtype));
  if (job.samples > 0) {
    e.train_seconds = job.samples / e.samples_per_s;
    e.cost_usd = e.train_seconds / 3600 * nodes * c.price_per_hour;
  }

  // Memory of the rank holding the most rows: its tables and their Adagrad
  // state; the MLPs' parameters, gradients and AdamW moments (replicated);
  // activations of its B_r samples (every MLP output twice, F x D features
  // and their gradients, z and dz); the lookup and all-to-all buffers
  // (forward: S_r x B x D out, S x B_r x D in; backward: the same and one
  // B x D gradient per shard, and the L gradient rows); on a CPU node the
  // checkpoint's staging copy of the tables (Tessera stages before it
  // writes; a GPU stages in host memory).
  double act = 0;
  for (auto [in, out] : md.mlp_layers()) act += 2.0 * out;
  act += 2 * F * D + 2 * (D + P);
  e.mem_tables = rows_max * D * kFloat;
  e.mem_table_state = rows_max * state * kFloat;
  e.mem_mlp = 4 * P_mlp * kFloat;
  e.mem_activations = Br * act * kFloat;
  const double S_all = placement == DlrmPlacement::kTable ? T : static_cast<double>(T) * n;
  e.mem_buffers = 2 * (S_r * B * D + S_all * Br * D) * kFloat + S_r * B * D * kFloat + lookups * (D + 2) * kFloat;
  e.mem_staging = !gpu && job.checkpoint_staging ? e.mem_tables + e.mem_table_state : 0;
  e.mem_total = e.mem_tables + e.mem_table_state + e.mem_mlp + e.mem_activations + e.mem_buffers + e.mem_staging;
  e.mem_capacity = gpu ? node.memory * 0.92 - 1e9 : node.memory * 0.9 / sharing;
  if (e.mem_total > e.mem_capacity) {
    e.fits = false;
    e.refusal = fmt::format("{} on {} ranks needs {} per rank (tables {}), has {}", placement_name(placement), n,
                            gbs(e.mem_total), gbs(e.mem_tables + e.mem_table_state), gbs(e.mem_capacity));
  }

  // The terms, for --explain.
  const LinkModel& a2a_link = node.a2a.busbw > 0 ? node.a2a : c.intra;
  term("share", share, fmt::format("{} rank(s) on one {}: each {:.0f}% of it, {:.3g} TFLOP/s {}, {:.1f} GB/s streaming, "
                                   "{:.1f} GB/s random rows (lookup efficiency {:.2f})",
                                   sharing, node.name, 100 * share, rate / 1e12, job.dtype, bw / 1e9, bw_lookup / 1e9,
                                   node.lookup_efficiency));
  term("placement", S_r, fmt::format("{}: the busiest rank holds {} shard(s), {:.0f} rows", placement_name(placement), S_r, rows_max));
  term("mlp", e.mlp, fmt::format("{} layers on B_r={:g} samples, fwd+bwd GEMMs {:.3f} ms (6 x {:.2f}M weights x B_r FLOP) + "
                                 "bias/ReLU {:.3f} ms", md.mlp_layers().size(), Br, mlp * 1e3, P_mlp / 1e6, mlp_elem * 1e3));
  term("interaction", e.interaction, fmt::format("3 x 2 x P={:g} x D={:g} FLOP x B_r at e={:.2f} + {:.1f} MB of "
                                                 "feature copies ({:g} x the counted passes)", P, D, inter_e, inter_bytes / 1e6, traffic));
  term("lookup", e.lookup, fmt::format("{:g} lookups x ({:g} B row + 8 B ids) + {} x B x D x 4 B out = {:.1f} MB at {:.1f} GB/s{}",
                                       lookups, D * kFloat, S_r, lookup_bytes / 1e6, bw_lookup / 1e9,
                                       restrict_bytes > 0 ? fmt::format(" + {:.1f} MB of ids restricted to the shards", restrict_bytes / 1e6)
                                                          : std::string()));
  term("update", e.update, fmt::format("{:.1f} MB random (gradient gather, rows read+written{}) at {:.1f} GB/s + {:.1f} MB "
                                       "streamed + sort {:.3f} ms", update_random / 1e6, state > 0 ? ", Adagrad state" : "",
                                       bw_lookup / 1e9, update_seq / 1e6, sort_s * 1e3));
  term("alltoall", e.alltoall, n > 1 ? fmt::format("2 x (forward, backward) {:.3f} ms: the busiest rank sends {:.2f} MB a step; "
                                                   "(n-1) x alpha, node link {} ({:.2f} GB/s){}",
                                                   a2a_one * 1e3, a2a_bytes_rank / 1e6, a2a_link.kind.empty() ? "intra" : a2a_link.kind,
                                                   a2a_link.busbw / 1e9,
                                                   (c.shared_host ? c.nodes > 1 : n > rpn)
                                                       ? fmt::format(", NICs {:.2f} GB/s per node", c.inter.busbw / 1e9)
                                                       : std::string())
                                       : std::string("one rank: none"));
  term("allreduce", e.allreduce, fmt::format("{:.2f} MB of MLP gradients over {} ranks at {:.2f} GB/s busbw, alpha {:.0f} us",
                                             P_mlp * kFloat / 1e6, n, ar_bw / 1e9, ar_alpha * 1e6));
  term("optimizer", e.optimizer, fmt::format("AdamW: 36 x {:.2f}M B at {:.1f} GB/s", P_mlp / 1e6, bw / 1e9));
  term("launch", e.launch, gpu ? fmt::format("{:g} kernels x 5 us (assumed)", kernels) : std::string("CPU: none"));
  term("step", e.step, "mlp + interaction + lookup + update + alltoall + allreduce + optimizer + launch");
  term("mem.tables", e.mem_tables + e.mem_table_state, fmt::format("{:.0f} rows x (D + {:g}) x 4 B", rows_max, state));
  term("mem.mlp", e.mem_mlp, "4 x MLP parameters x 4 B (weights, gradients, AdamW m, v)");
  term("mem.activations", e.mem_activations, fmt::format("B_r x {:g} floats", act));
  term("mem.buffers", e.mem_buffers, "lookup and all-to-all buffers, forward and backward; gradient rows");
  term("mem.staging", e.mem_staging, gpu ? "GPU: the staging copy is in host memory" : "checkpoint staging copy of the tables");
  return e;
}

std::vector<DlrmEstimate> search_dlrm(const DlrmJob& job, const Cluster& c, const std::string& objective, int keep,
                                      DlrmEstimate* closest, const DlrmPlacement* only) {
  std::vector<int> node_counts;
  if (objective == "cost" && !c.shared_host)
    for (int k = 1; k < c.nodes; k *= 2) node_counts.push_back(k);
  node_counts.push_back(c.nodes);
  std::vector<DlrmEstimate> fits;
  double nearest = 1e300;
  for (int k : node_counts)
    for (DlrmPlacement p : {DlrmPlacement::kTable, DlrmPlacement::kRow}) {
      if (only != nullptr && *only != p) continue;
      DlrmEstimate e = estimate_dlrm(job, c, p, k);
      if (e.fits) {
        fits.push_back(std::move(e));
      } else if (closest != nullptr && e.mem_total / e.mem_capacity < nearest) {
        nearest = e.mem_total / e.mem_capacity;
        *closest = std::move(e);
      }
    }
  auto key = [&](const DlrmEstimate& e) {
    return objective == "cost" ? (e.cost_usd > 0 ? e.cost_usd : e.step * e.nodes * std::max(c.price_per_hour, 1e-9)) : e.step;
  };
  std::stable_sort(fits.begin(), fits.end(), [&](const DlrmEstimate& a, const DlrmEstimate& b) { return key(a) < key(b); });
  if (static_cast<int>(fits.size()) > keep) fits.resize(keep);
  return fits;
}

}  // namespace tessera::plan
