#include "plan/estimate.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace tessera::plan {

namespace {

constexpr double kFloat = 4;  // Tessera's parameters, gradients, moments and saved activations are fp32

// Time of one GEMM C(M,N) = A(M,K) B(K,N), forward and backward (dinp: M x K
// from M x N by N x K; dW: K x N from K x M by M x N), on a device running at
// `rate` FLOP/s peak.
struct GemmTime {
  double fwd = 0, bwd = 0;
};
GemmTime gemm_time(const NodeType& node, const std::string& dtype, double rate, double m, double n, double k) {
  const double flops = 2 * m * n * k, bf = node.backward_factor.count(dtype) ? node.backward_factor.at(dtype) : 0.9;
  GemmTime t;
  t.fwd = flops / (rate * node.gemm_efficiency(dtype, m, n, k));
  t.bwd = flops / (rate * bf * node.gemm_efficiency(dtype, m, k, n)) +
          flops / (rate * bf * node.gemm_efficiency(dtype, k, n, m));
  return t;
}

// A collective over n ranks on a link: nccl-tests' bus-bandwidth factors
// (all-reduce 2(n-1)/n, reduce-scatter and all-gather (n-1)/n) and 2(n-1)
// resp. (n-1) latency steps of a ring.
double allreduce_s(double bytes, int n, double busbw, double alpha) {
  if (n <= 1) return 0;
  return 2.0 * (n - 1) * alpha + 2.0 * (n - 1) / n * bytes / busbw;
}
double half_collective_s(double bytes, int n, double busbw, double alpha) {
  if (n <= 1) return 0;
  return (n - 1) * alpha + 1.0 * (n - 1) / n * bytes / busbw;
}

// The link a group of ranks communicates over. Ranks are placed as Tessera
// places them (docs/parallel.md): world = pp_rank*(dp*tp) + dp_rank*tp +
// tp_rank, packed rpn to a node. A group of `size` ranks `stride` apart, all
// on one node, uses the node's link; otherwise the nodes' NICs, shared by the
// groups that cross them at once, bound it.
struct GroupLink {
  double busbw = 0, alpha = 0;
  bool crosses = false;
};
GroupLink group_link(const Cluster& c, int size, int stride) {
  GroupLink g;
  if (c.shared_host && c.nodes > 1) {  // one rank per namespace "node"
    // (they share one machine: its measured collective latency applies too)
    g.busbw = std::min(c.inter.busbw, c.intra.busbw), g.alpha = std::max(c.inter.alpha, c.intra.alpha), g.crosses = true;
    return g;
  }
  const int rpn = c.ranks_per_node;
  if (static_cast<int64_t>(size) * stride <= rpn || size <= 1 || c.nodes <= 1 || c.inter.busbw <= 0) {
    g.busbw = c.intra.busbw, g.alpha = c.intra.alpha;
    return g;
  }
  const int per_node = std::max(1, std::min(size, rpn / std::max(stride, 1)));  // members of one group per node
  const int groups_per_node = std::max(1, rpn / per_node);
  g.busbw = std::min(c.intra.busbw, c.inter.busbw / groups_per_node);
  g.alpha = std::max(c.intra.alpha, c.inter.alpha);
  g.crosses = true;
  return g;
}

double gb(double b) { return b / 1e9; }

}  // namespace

std::string Layout::str() const {
  return fmt::format("dp={} tp={} pp={} mb={} ga={}{}", dp, tp, pp, micro_batch, grad_accum, zero ? " zero1" : "");
}

std::string Estimate::bottleneck() const {
  std::pair<double, const char*> parts[] = {{bubble, "the pipeline bubble"},
                                            {tp_comm, "tensor-parallel all-reduces"},
                                            {p2p, "pipeline point-to-point"},
                                            {dp_exposed, "the data-parallel gradient exchange"},
                                            {optimizer, "the optimizer's memory traffic"},
                                            {checkpoint, "checkpoint stalls"}};
  auto* worst = std::max_element(std::begin(parts), std::end(parts),
                                 [](const auto& a, const auto& b) { return a.first < b.first; });
  if (worst->first < 0.1 * step) return fmt::format("compute ({:.0f}% of the step)", 100 * compute / step);
  return fmt::format("{} ({:.0f}% of the step)", worst->second, 100 * worst->first / step);
}

Estimate estimate(const Job& job, const Cluster& c, const Layout& lay) {
  Estimate e;
  e.layout = lay;
  const ModelSpec& md = job.model;
  const DecoderConfig shape = md.shape();  // the widths below are the shape layer's
  const NodeType& node = c.node;
  const double C = md.dim, T = md.seq, tp = lay.tp, R = static_cast<double>(lay.micro_batch) * T;
  const double Vp = md.padded_vocab(lay.tp), hd = shape.hs();
  // Per layer: the fused qkv's rows (GQA: fewer key/value rows), the
  // attention output's width, the MLP's first projection's rows (SwiGLU:
  // gate and up) and its hidden width. GPT-2: 3C, C, 4C, 4C.
  const double QKV = shape.qkv_dim(), Q = shape.q_dim(), FC = shape.fc_rows(), F = shape.ffn();
  const int ranks = lay.dp * lay.tp * lay.pp;
  auto term = [&](std::string name, double s, std::string f) { e.terms.push_back({std::move(name), s, std::move(f)}); };

  // Each rank's share of the device: a GPU is one rank's; on a CPU node a
  // rank runs at threads / cores of the node's rate and memory bandwidth.
  // When the node's ranks want more threads than it has cores
  // (oversubscribed), each still runs at that rate while it has work (idle
  // pipeline stages free their cores), and the node's total work over the
  // `concurrent` ranks it can run at once bounds the step from below.
  double share = 1, concurrent = 1;
  int sharing = 1;
  if (node.kind == DeviceKind::kCpu) {
    sharing = c.shared_host ? ranks : std::min(ranks, c.ranks_per_node);
    const int cores = std::max(node.cores, 1);
    const int threads = c.threads_per_rank > 0 ? c.threads_per_rank : std::max(1, cores / sharing);
    share = std::min(1.0, static_cast<double>(threads) / cores);
    concurrent = std::max(1.0, static_cast<double>(cores) / threads);
  }
  const double rate = node.peak_of(job.dtype) * share;
  const double bw = node.mem_bw * node.mem_efficiency * share;
  const double ab = node.act_bytes;

  // Compute of one micro-batch on one stage: forward, backward.
  const GemmTime qkv = gemm_time(node, job.dtype, rate, R, QKV / tp, C);
  const GemmTime proj = gemm_time(node, job.dtype, rate, R, C, Q / tp);
  const GemmTime fc = gemm_time(node, job.dtype, rate, R, FC / tp, C);
  const GemmTime fcproj = gemm_time(node, job.dtype, rate, R, C, F / tp);
  const GemmTime head = gemm_time(node, job.dtype, rate, R, Vp / tp, C);
  // Causal attention, llm.c's count: 2*T*C FLOPs per token and layer forward,
  // twice that backward, at the efficiency of a (T, T, C/NH) GEMM times the
  // attention kernel's share (CPU 0.45: measured in docs/performance.md,
  // 159 ms for 29 GFLOP at B=8 T=256; GPU 0.6: FlashAttention-2's causal rate).
  const double attn_share = node.kind == DeviceKind::kGpu ? 0.6 : 0.45;
  double attn_fwd = 0;
  if (job.attention == "materialized") {
    // Full (unmasked) QK^T and AV as batched GEMMs, plus about 16 passes over
    // the scores (fwd: write, softmax read+write, dropout read+write+mask,
    // AV read; bwd: twice that) in the activation dtype.
    const double scores = R * md.heads / tp * T;
    attn_fwd = 4 * R * T * Q / tp / (rate * node.gemm_efficiency(job.dtype, T, T, hd)) + 16 * scores * ab / 3 / bw;
  } else {
    attn_fwd = 2 * R * T * Q / tp / (rate * attn_share * node.gemm_efficiency(job.dtype, T, T, hd));
  }
  const double attn_bwd = 2 * attn_fwd;
  // Elementwise kernels (norms, residuals, GELU or SwiGLU, bias, rotary):
  // about 16C replicated and 6 passes over the MLP's hidden width (24C for
  // GPT-2) split elements moved per token and layer, forward and backward;
  // softmax + cross-entropy 4 passes over the logits.
  const double elem_layer = (16 * C + 6 * F / tp) * R * ab / bw;
  const double elem_head = 4 * Vp / tp * R * kFloat / bw;
  const double layer_fwd = qkv.fwd + proj.fwd + fc.fwd + fcproj.fwd + attn_fwd + elem_layer / 3;
  const double layer_bwd = qkv.bwd + proj.bwd + fc.bwd + fcproj.bwd + attn_bwd + 2 * elem_layer / 3;
  const double head_t = head.fwd + head.bwd + elem_head;
  const double recompute = job.recompute ? layer_fwd : 0;  // the forward again before backward

  // Tensor parallelism: per layer 2 all-reduces of (B,T,C) forward and 2
  // backward, plus the embedding's and d(lnf) at the head; on the critical path.
  const GroupLink tpl = group_link(c, lay.tp, 1);
  const double tp_ar = allreduce_s(R * C * ab, lay.tp, tpl.busbw, tpl.alpha);

  // Stages: the first L % pp get one more layer; the first holds the
  // embeddings, the last the head.
  const int L = md.layers, pp = lay.pp;
  std::vector<double> stage_t(pp), stage_tp(pp);
  for (int s = 0; s < pp; ++s) {
    const int ls = L / pp + (s < L % pp ? 1 : 0);
    // (recomputation runs each layer's forward, and its 2 all-reduces, again)
    stage_tp[s] = ((job.recompute ? 6.0 : 4.0) * ls + (s == 0 ? 1 : 0) + (s == pp - 1 ? 1 : 0)) * tp_ar;
    stage_t[s] = ls * (layer_fwd + layer_bwd + recompute) + (s == pp - 1 ? head_t : 0) + stage_tp[s];
  }
  // Pipeline p2p: the (B,T,C) activation forward and its gradient backward
  // per micro-batch, on the critical path of every micro-step.
  // Stages are contiguous blocks of dp x tp ranks: once the pipeline spans
  // more than a node, some boundary crosses the nodes' NICs, shared by the
  // dp x tp pairs that cross it at once, and paces every micro-step.
  double p2p_mb = 0;
  if (pp > 1) {
    double bw_p2p = c.intra.busbw, alpha_p2p = c.intra.alpha;
    const int64_t stage_ranks = static_cast<int64_t>(lay.dp) * lay.tp;
    if ((c.shared_host && c.nodes > 1) || (c.nodes > 1 && c.inter.busbw > 0 && stage_ranks * pp > c.ranks_per_node)) {
      const double pairs = c.shared_host ? 1.0 : static_cast<double>(std::min<int64_t>(stage_ranks, c.ranks_per_node));
      bw_p2p = std::min(c.intra.busbw, c.inter.busbw / pairs);
      alpha_p2p = std::max(c.intra.alpha, c.inter.alpha);
    }
    p2p_mb = 2 * (alpha_p2p + R * C * kFloat / bw_p2p);
  }
  double sum = 0, mx = 0, mx_tp = 0;
  for (int s = 0; s < pp; ++s) {
    sum += stage_t[s] + p2p_mb;
    if (stage_t[s] + p2p_mb > mx) mx = stage_t[s] + p2p_mb, mx_tp = stage_tp[s];
  }
  // 1F1B: the slowest stage paces the steady state; filling and draining
  // the pipe add the other stages once: step = sum_s t_s + (m-1) max_s t_s.
  const int m = lay.grad_accum;
  const double pipe = sum + (m - 1) * mx;
  e.bubble = pp > 1 ? sum - mx : 0;
  e.idle_mean = pp > 1 ? pipe - m * (sum / pp - p2p_mb) : 0;
  e.tp_comm = m * mx_tp;
  e.p2p = m * p2p_mb;
  e.compute = pipe - e.bubble - e.tp_comm - e.p2p;

  // Parameters per rank (the largest stage: the first, with the embeddings,
  // or the last, with the head: its own, or a copy of the tied embedding).
  // Per layer, from the shape layer: matrices and the qkv and fc biases are
  // split, the norms and the row-parallel layers' biases replicated.
  const bool ln = shape.norm == Norm::kLayerNorm;
  const double split = QKV * C + C * Q + FC * C + C * F + (shape.qkv_bias ? QKV : 0) + (shape.bias ? FC : 0);
  const double replicated = (ln ? 4 : 2) * C + (shape.bias ? 2 * C : 0);
  const double per_layer = split / tp + replicated;
  const double pos_rows = shape.positions == Positions::kLearned ? shape.context : 0;
  double P_local = 0;
  for (int s = 0; s < pp; ++s) {
    const int ls = L / pp + (s < L % pp ? 1 : 0);
    const bool head_rows = !shape.tied_head || s > 0;  // the last stage's output layer, unless it is the first's wte
    double p = ls * per_layer + (s == 0 ? Vp / tp * C + pos_rows * C : 0) +
               (s == pp - 1 ? (ln ? 2 : 1) * C + (head_rows ? Vp / tp * C : 0) : 0);
    P_local = std::max(P_local, p);
  }
  const double grad_bytes = P_local * kFloat;

  // Data parallelism: gradients all-reduced (ZeRO-1: reduce-scattered, then
  // the parameters all-gathered after the update) in buckets during the last
  // micro-step's backward; exposed is what backward does not cover, at least
  // the last bucket.
  const GroupLink dpl = group_link(c, lay.dp, lay.tp);
  if (lay.dp > 1) {
    const double nb = std::max(1.0, std::ceil(grad_bytes / (job.bucket_mb * 1e6)));
    const double reduce = lay.zero ? half_collective_s(grad_bytes, lay.dp, dpl.busbw, dpl.alpha)
                                   : allreduce_s(grad_bytes, lay.dp, dpl.busbw, dpl.alpha);
    const double gather = lay.zero ? half_collective_s(grad_bytes, lay.dp, dpl.busbw, dpl.alpha) : 0;
    const int last = pp - 1;
    const int ls = L / pp + (last < L % pp ? 1 : 0);
    // On a CPU node the rank's threads are all computing: MPI progresses the
    // buckets only when backward yields, so nothing overlaps (measured here:
    // comm_gradient_ms equals the whole all-reduce); a GPU's NCCL kernels
    // run beside backward.
    const double window = node.kind == DeviceKind::kGpu ? (ls * layer_bwd + (pp == 1 ? head.bwd : 0)) * (1 - 1 / nb) : 0;
    e.dp_comm = reduce + gather;
    e.dp_exposed = std::max(reduce / nb, reduce - window) + gather;
    // With pp > 1 the first stage's embeddings and the last's head share wte:
    // their gradients are all-reduced between the two after backward.
  }
  if (pp > 1 && shape.tied_head) {
    const GroupLink tl = group_link(c, pp, lay.dp * lay.tp);  // the first and the last stage: the pipeline's span
    e.dp_exposed += allreduce_s(Vp / tp * C * kFloat, 2, tl.crosses ? tl.busbw : c.intra.busbw, tl.alpha);
  }

  // Optimizer: AdamW reads params, grads, m, v and writes params, m, v (28
  // bytes per parameter it owns); the global norm reads the gradients and
  // zeroing them writes them (8 bytes per local parameter).
  const double owned = lay.zero ? P_local / lay.dp : P_local;
  e.optimizer = (28 * owned + 8 * P_local) / bw;
  // Checkpoint: the rank copies its parameters and moments into the staging
  // buffer (the write itself is asynchronous); amortized over the interval.
  if (job.checkpoint_every > 0) e.checkpoint = (P_local + 2 * owned) * kFloat * 2 / bw / job.checkpoint_every;

  // Oversubscribed CPU node: the work of all its ranks over the ranks that
  // can run at once (its dp x tp ranks per stage each run the stage's m
  // micro-batches and the optimizer); waiting for a core counts as compute.
  if (sharing > concurrent) {
    double work = 0;
    for (int s = 0; s < pp; ++s) work += m * (stage_t[s] - stage_tp[s]);
    work = work * lay.dp * lay.tp * (static_cast<double>(sharing) / ranks) + sharing * e.optimizer;
    const double bound = work / concurrent;
    const double step_now = pipe + e.optimizer;
    if (bound > step_now) e.compute += bound - step_now;
    term("oversubscribed", std::max(0.0, bound - step_now),
         fmt::format("{} ranks on {:g} cores' worth: total work {:.3f} s / {:g}", sharing, concurrent, work, concurrent));
  }
  e.step = e.compute + e.bubble + e.tp_comm + e.p2p + e.dp_exposed + e.optimizer + e.checkpoint;
  e.tokens_per_step = static_cast<double>(md.global_batch) * T;
  e.tokens_per_s = e.tokens_per_step / e.step;
  const int devices_used = c.shared_host ? 1 : (node.kind == DeviceKind::kGpu ? ranks : lay.nodes);
  const double peak_total = node.mfu_peak_of(job.dtype) * devices_used;
  e.mfu = md.flops_per_token() * e.tokens_per_s / peak_total;
  if (job.tokens > 0) {
    e.train_seconds = job.tokens / e.tokens_per_s;
    e.cost_usd = e.train_seconds / 3600 * lay.nodes * c.price_per_hour;
  }

  // Memory per device: Tessera's plan_training_memory (src/train/memory_plan.cc)
  // plus the logits: fp32 parameters, gradients, 2 AdamW moments over 1/dp with
  // ZeRO-1, saved activations (4C + 13C/tp per token and layer, + C) for the
  // micro-batches in flight (1F1B: pp on the first stage), logits and their
  // gradient on the last stage.
  e.mem_params = P_local * kFloat;
  e.mem_grads = e.mem_params;
  e.mem_optimizer = 2 * owned * kFloat;
  const int ls0 = L / pp + (0 < L % pp ? 1 : 0);
  const double slots = std::min(pp, m);
  // Kept per token and layer: 4C replicated (norm outputs, residuals) and
  // qkv, attention output twice, fc and its activation split (GPT-2: 13C).
  const double act_split = (QKV + 2 * Q + FC + F) / tp;
  const double act_layer = job.recompute ? C : 4 * C + act_split;
  e.mem_activations = slots * R * (ls0 * act_layer + C) * kFloat + (job.recompute ? R * (4 * C + act_split) * kFloat : 0);
  e.mem_activations = std::max(e.mem_activations, R * (ls0 * act_layer + C) * kFloat + 2 * R * Vp / tp * kFloat);
  e.mem_total = e.mem_params + e.mem_grads + e.mem_optimizer + e.mem_activations;
  // Usable: a GPU's memory less 8% and 1 GB (CUDA context, allocator slack,
  // workspaces); a CPU node's 90%, split among its ranks.
  e.mem_capacity = node.kind == DeviceKind::kGpu ? node.memory * 0.92 - 1e9 : node.memory * 0.9 / sharing;
  if (e.mem_total > e.mem_capacity) {
    e.fits = false;
    e.refusal = fmt::format("needs {:.1f} GB per device, has {:.1f} GB", gb(e.mem_total), gb(e.mem_capacity));
  }

  // The terms, for --explain.
  const double flops_step = md.flops_per_token() * e.tokens_per_step;
  term("share", share, fmt::format("{} rank(s) on one {}: each {:.0f}% of it, {:.3g} TFLOP/s {} and {:.1f} GB/s",
                                   sharing, node.name, 100 * share, rate / 1e12, job.dtype, bw / 1e9));
  term("gemm.qkv", m * L / pp * (qkv.fwd + qkv.bwd),
       fmt::format("2*{:g}*{:g}*{:g} FLOP x3 (fwd+bwd) at e={:.2f} fwd", R, QKV / tp, C,
                   node.gemm_efficiency(job.dtype, R, QKV / tp, C)));
  term("gemm.attproj", m * L / pp * (proj.fwd + proj.bwd),
       fmt::format("(R={:g}, N={:g}, K={:g}) at e={:.2f}", R, C, Q / tp, node.gemm_efficiency(job.dtype, R, C, Q / tp)));
  term("gemm.fc", m * L / pp * (fc.fwd + fc.bwd),
       fmt::format("(R={:g}, N={:g}, K={:g}) at e={:.2f}", R, FC / tp, C, node.gemm_efficiency(job.dtype, R, FC / tp, C)));
  term("gemm.fcproj", m * L / pp * (fcproj.fwd + fcproj.bwd),
       fmt::format("(R={:g}, N={:g}, K={:g}) at e={:.2f}", R, C, F / tp, node.gemm_efficiency(job.dtype, R, C, F / tp)));
  term("gemm.head", m * (head.fwd + head.bwd),
       fmt::format("(R={:g}, N={:g}, K={:g}) at e={:.2f}, last stage", R, Vp / tp, C, node.gemm_efficiency(job.dtype, R, Vp / tp, C)));
  term("attention", m * L / pp * (attn_fwd + attn_bwd),
       job.attention == "materialized"
           ? fmt::format("materialized: 12*T*C/tp FLOP per token and layer at e({:g},{:g},{:g}) + 16 passes over NH/tp x T scores per token", T, T, hd)
           : fmt::format("flash: 6*T*C/tp FLOP per token and layer at {:.2f} x e({:g},{:g},{:g})", attn_share, T, T, hd));
  term("elementwise", m * (L / pp * elem_layer + elem_head),
       fmt::format("(16C + 24C/tp) x {:g} B per token and layer + 4 x Vp/tp x 4 B (softmax, CE), at {:.1f} GB/s", ab, bw / 1e9));
  if (job.recompute) term("recompute", m * L / pp * recompute, "one more forward of every layer");
  term("compute", e.compute, fmt::format("m={} micro-batches x the slowest stage's forward+backward", m));
  term("bubble", e.bubble, fmt::format("1F1B fill and drain: sum of the other stages once ((p-1)/m = {:.2f})",
                                       pp > 1 ? (pp - 1.0) / m : 0.0));
  term("comm.tp", e.tp_comm, fmt::format("(4 per layer, 6 with recomputation, + 2) all-reduces of {:.2f} MB over tp={} at {:.2f} GB/s busbw, "
                                         "2(n-1)/n factor: {:.3f} ms each",
                                         R * C * ab / 1e6, lay.tp, tpl.busbw / 1e9, tp_ar * 1e3));
  term("comm.p2p", e.p2p, fmt::format("2 x {:.2f} MB per micro-batch between stages", R * C * kFloat / 1e6));
  term("comm.dp", e.dp_comm, fmt::format("{} of {:.1f} MB over dp={} at {:.2f} GB/s busbw", lay.zero ? "reduce-scatter + all-gather" : "all-reduce",
                                         grad_bytes / 1e6, lay.dp, dpl.busbw / 1e9));
  term("comm.dp.exposed", e.dp_exposed,
       fmt::format("buckets of {:g} MB overlapped with the last backward (GPU; none on a CPU node); exposed = max(last bucket, total - backward)",
                   job.bucket_mb));
  term("optimizer", e.optimizer, fmt::format("(28 x {:.1f}M owned + 8 x {:.1f}M local) B at {:.1f} GB/s", owned / 1e6,
                                             P_local / 1e6, bw / 1e9));
  term("checkpoint", e.checkpoint, job.checkpoint_every > 0 ? fmt::format("staging copy every {} steps", job.checkpoint_every)
                                                             : std::string("no checkpoints"));
  term("step", e.step, "compute + bubble + comm.tp + comm.p2p + comm.dp.exposed + optimizer + checkpoint");
  term("mfu", e.mfu, fmt::format("{:.3g} FLOP per step / step / ({} x {:.1f} TFLOP/s)", flops_step, devices_used,
                                 node.mfu_peak_of(job.dtype) / 1e12));
  return e;
}

std::vector<Estimate> search(const Job& job, const Cluster& c, const std::string& objective, int keep, Estimate* closest,
                             const Layout* fixed) {
  std::vector<Estimate> fits;
  double nearest = 1e300;
  const int64_t G = job.model.global_batch;
  std::vector<int> node_counts;
  for (int n = 1; n < c.nodes; n *= 2) node_counts.push_back(n);
  node_counts.push_back(c.nodes);
  if (objective == "time") node_counts = {c.nodes};  // more nodes are never slower for the same layout
  if (fixed != nullptr && fixed->nodes) node_counts = {fixed->nodes};
  for (int nodes : node_counts) {
    const int ranks = c.shared_host ? c.ranks() : nodes * c.ranks_per_node;
    for (int tp = 1; tp <= ranks; ++tp) {
      ModelShard shard;
      shard.tp = tp;
      if (ranks % tp || !shard.validate(job.model.shape()).ok()) continue;  // whole heads, key/value heads, MLP columns
      for (int pp = 1; pp * tp <= ranks; ++pp) {
        if ((ranks / tp) % pp || pp > job.model.layers) continue;
        const int dp = ranks / tp / pp;
        if (G % dp) continue;
        const int64_t per_dp = G / dp;
        for (int64_t mb = 1; mb <= per_dp && mb <= 1024; ++mb) {
          if (per_dp % mb) continue;
          for (int zero = 0; zero <= (dp > 1 ? 1 : 0); ++zero) {
            Layout l{nodes, dp, tp, pp, static_cast<int>(mb), static_cast<int>(per_dp / mb), zero};
            if (fixed != nullptr && ((fixed->dp && fixed->dp != dp) || (fixed->tp && fixed->tp != tp) ||
                                     (fixed->pp && fixed->pp != pp) || (fixed->micro_batch && fixed->micro_batch != mb) ||
                                     (fixed->zero >= 0 && fixed->zero != zero) || (fixed->nodes && fixed->nodes != nodes)))
              continue;
            Estimate e = estimate(job, c, l);
            if (e.fits) {
              fits.push_back(std::move(e));
            } else if (closest != nullptr && e.mem_total / e.mem_capacity < nearest) {
              nearest = e.mem_total / e.mem_capacity;
              *closest = std::move(e);
            }
          }
        }
      }
    }
    if (c.shared_host) break;
  }
  auto key = [&](const Estimate& e) { return objective == "cost" && e.cost_usd > 0 ? e.cost_usd : e.step * (objective == "cost" ? e.layout.nodes : 1); };
  std::sort(fits.begin(), fits.end(), [&](const Estimate& a, const Estimate& b) { return key(a) < key(b); });
  if (static_cast<int>(fits.size()) > keep) fits.resize(keep);
  return fits;
}

}  // namespace tessera::plan
