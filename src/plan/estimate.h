// The cost model of `tessera plan` (docs/planner.md states every formula):
// one training step of a ModelSpec on a Cluster under a Layout, in seconds,
// split into terms, with the memory each device needs; and the search over
// layouts. Pure functions of their inputs: no I/O, no clocks.
#pragma once

#include <string>
#include <vector>

#include "plan/cluster.h"
#include "plan/model.h"

namespace tessera::plan {

struct Job {
  ModelSpec model;
  std::string dtype = "bf16";  // matmul inputs: "fp32" or "bf16"
  double tokens = 0;           // tokens to train on (0: report per step only)
  int checkpoint_every = 0;    // steps between checkpoints (0: none)
  bool recompute = false;      // full activation recomputation (Tessera has none; for published runs that use it)
  double bucket_mb = 25;       // parallel.bucket_mb
  // Attention kernel: "flash" (fused, scores never stored: Tessera's CPU and
  // CUDA kernels, cuDNN/FlashAttention) or "materialized" (the (B,NH,T,T)
  // scores written, softmaxed, dropped out and read back: Megatron-LM 2021).
  std::string attention = "flash";
};

struct Layout {
  int nodes = 1;  // nodes used (at most the cluster's)
  int dp = 1, tp = 1, pp = 1, micro_batch = 1, grad_accum = 1, zero = 0;
  std::string str() const;  // "dp=2 tp=4 pp=1 mb=4 ga=8 zero=1"
};

// One term of the model, for --explain and --json.
struct Term {
  std::string name;     // "compute.matmul", "comm.dp.exposed", ...
  double seconds = 0;   // per step (memory terms: bytes)
  std::string formula;  // the formula with its numbers
};

struct Estimate {
  Layout layout;
  bool fits = true;
  std::string refusal;  // why it does not fit
  // Per step, seconds: the step is compute + bubble + tp + p2p + dp_exposed
  // + optimizer + checkpoint.
  double step = 0, compute = 0, bubble = 0, tp_comm = 0, p2p = 0, dp_comm = 0, dp_exposed = 0, optimizer = 0,
         checkpoint = 0;
  // Mean idle time of a rank per step in the pipeline (what the trainer's
  // bubble_ms measures): the fill and drain plus waiting on slower stages.
  double idle_mean = 0;
  double tokens_per_step = 0, tokens_per_s = 0, mfu = 0, train_seconds = 0, cost_usd = 0;
  // Per device (the largest stage), bytes.
  double mem_params = 0, mem_grads = 0, mem_optimizer = 0, mem_activations = 0, mem_total = 0, mem_capacity = 0;
  std::vector<Term> terms;
  // The largest term other than compute, with its share of the step.
  std::string bottleneck() const;
};

Estimate estimate(const Job& job, const Cluster& cluster, const Layout& layout);

// Every layout of the cluster (dp x tp x pp = ranks of the nodes used, tp
// dividing the heads, dp x micro_batch x grad_accum = the global batch,
// ZeRO 0/1), the fitting ones sorted by the objective ("time" or "cost"),
// at most `keep`. Empty when none fits; `closest` then gets the layout that
// came nearest to fitting. `fixed`, when given, keeps only the layouts that
// agree with its non-zero fields (zero: with its value when >= 0).
std::vector<Estimate> search(const Job& job, const Cluster& cluster, const std::string& objective, int keep,
                             Estimate* closest = nullptr, const Layout* fixed = nullptr);

}  // namespace tessera::plan
