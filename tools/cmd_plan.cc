// tessera plan: time, memory and cost of training a GPT-shaped model on one
// or more clusters (docs/planner.md). The model lives in src/plan; this file
// reads the flags, prints the table, the verdict, --explain and --json.
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "plan/cluster.h"
#include "plan/compare.h"
#include "plan/dlrm.h"
#include "plan/estimate.h"
#include "plan/model.h"
#include "plan/sbatch.h"
#include "plan/serve.h"
#include "nn/hf_decoder.h"
#include "tools/cmd_plan_dlrm.h"
#include "tools/commands.h"

namespace tessera::tools {

namespace {

struct PlanArgs {
  std::string attention = "flash";
  std::string model, dtype = "bf16", objective = "time", tokens, layout, hf_config;
  int kv_heads = 0, mlp_hidden = 0;
  int ranks_per_node = 0, threads_per_rank = 0;
  int layers = 0, heads = 0, dim = 0, vocab = 0, seq = 0, context = 0, top = 3, checkpoint_every = 0;
  int64_t global_batch = 0;
  double bucket_mb = 25;
  std::vector<std::string> clusters;
  bool json = false, explain = false, recompute = false;
  std::string emit_sbatch, train_config = "configs/brown.toml";  // --emit-sbatch (plan/sbatch.h)
  PlanDlrmArgs dlrm;  // DLRM jobs (cmd_plan_dlrm.cc)
  // Serving instead of training (plan/serve.h).
  bool serve = false;
  std::string serve_dtype;  // empty: int8 on a CPU, bf16 on a GPU
  int serve_batch = 1, serve_prompt = 128, serve_tokens = 128;
};

// --serve: each cluster's device serving the model (plan/serve.h), one
// replica a GPU or a CPU node.
int run_serve(const PlanArgs& a, const plan::ModelSpec& m) {
  plan::ServeJob job{a.serve_dtype, a.serve_batch, a.serve_prompt, a.serve_tokens};
  struct Row {
    plan::Cluster cluster;
    int replicas = 1;
    std::string dtype;
    plan::ServeEstimate e;
  };
  std::vector<Row> rows;
  for (const auto& f : a.clusters) {
    auto c = plan::load_cluster(f, a.ranks_per_node, a.threads_per_rank);
    if (!c.ok()) return fail(c.status());
    const bool gpu = c->node.kind == plan::DeviceKind::kGpu;
    const int per_node = gpu ? c->ranks_per_node : 1;
    plan::ServeJob here = job;
    if (here.dtype.empty()) here.dtype = gpu ? "bf16" : "int8";
    auto e = plan::estimate_serving(m, c->node, here, c->price_per_hour / per_node);
    if (!e.ok()) return fail(e.status().With(c->file));
    rows.push_back({*c, c->nodes * per_node, here.dtype, *e});
  }
  if (a.json) {
    nlohmann::json j = {{"schema", "tessera.plan.serve"}, {"version", 1},
                        {"model", {{"name", m.name}, {"shape", m.shape().str()}, {"parameters", m.parameters()}}},
                        {"job", {{"batch", job.batch}, {"prompt", job.prompt}, {"tokens", job.tokens}}}};
    j["clusters"] = nlohmann::json::array();
    for (const Row& r : rows) {
      const plan::ServeEstimate& e = r.e;
      nlohmann::json cj = {{"name", r.cluster.name}, {"file", r.cluster.file}, {"node", r.cluster.node.name},
                           {"source", r.cluster.node.source}, {"dtype", r.dtype}, {"replicas", r.replicas}, {"fits", e.fits},
                           {"memory_bytes", {{"weights", e.weight_bytes}, {"cache", e.cache_bytes},
                                             {"total", e.memory}, {"capacity", e.capacity}}},
                           {"decode", {{"step_s", e.decode_step}, {"tokens_per_s", e.decode_tokens_per_s},
                                       {"cluster_tokens_per_s", e.decode_tokens_per_s * r.replicas},
                                       {"read_bytes_per_step", e.stream_bytes}, {"cache_read_bytes_per_step", e.cache_read_bytes},
                                       {"roof_bytes_per_s", e.roof},
                                       {"roof_source", e.roof_source}, {"compute_bound", e.compute_bound}}},
                           {"prefill_tokens_per_s", e.prefill_tokens_per_s}, {"usd_per_million_tokens", e.usd_per_million}};
      if (!e.fits) cj["refusal"] = e.refusal;
      j["clusters"].push_back(cj);
    }
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("model %s; serving %d sequence(s) together, %d-token prompts, %d tokens each\n", m.str().c_str(),
                job.batch, job.prompt, job.tokens);
    for (const Row& r : rows) {
      const plan::ServeEstimate& e = r.e;
      const char* unit = r.cluster.node.kind == plan::DeviceKind::kGpu ? "GPU" : "node";
      std::printf("\n%s: %s\n  node: %s\n", r.cluster.name.c_str(), r.cluster.str().c_str(),
                  r.cluster.node.source.c_str());
      std::printf("  one replica a %s, %s weights: %.2f GB + cache %.2f GB of %.1f GB%s\n", unit, r.dtype.c_str(), e.weight_bytes / 1e9,
                  e.cache_bytes / 1e9, e.capacity / 1e9, e.fits ? "" : ": does not fit");
      if (!e.fits) {
        std::printf("  does not fit: %s\n", e.refusal.c_str());
        continue;
      }
      std::printf("  decode: at most %.0f tokens/s (a step of %s: %.1f MB of weights and %.1f MB of cache at %.1f GB/s, %s)%s\n",
                  e.decode_tokens_per_s, plan::duration_text(e.decode_step).c_str(), e.stream_bytes / 1e6,
                  e.cache_read_bytes / 1e6, e.roof / 1e9,
                  e.roof_source.c_str(), e.compute_bound ? "; bound by its arithmetic at the peak" : "");
      std::printf("  prefill: %.0f tokens/s (one %d-token prompt)\n", e.prefill_tokens_per_s, job.prompt);
      std::printf("  the cluster: %d replica(s), at most %.0f tokens/s decoding%s\n", r.replicas,
                  e.decode_tokens_per_s * r.replicas,
                  e.usd_per_million > 0 ? fmt::format("; ${:.3f} per million generated tokens", e.usd_per_million).c_str()
                                        : "");
    }
  }
  bool any = false;
  for (const Row& r : rows) any = any || r.e.fits;
  if (!any) return fail(Status::InvalidArgument(fmt::format("serving {}: fits on no cluster given ({})", m.name, rows.empty() ? "" : rows[0].e.refusal)));
  return kExitOk;
}

nlohmann::json to_json(const plan::Estimate& e) {
  nlohmann::json j = {
      {"layout", {{"nodes", e.layout.nodes}, {"dp", e.layout.dp}, {"tp", e.layout.tp}, {"pp", e.layout.pp},
                  {"micro_batch", e.layout.micro_batch}, {"grad_accum", e.layout.grad_accum}, {"zero", e.layout.zero}}},
      {"fits", e.fits},
      {"step_s", e.step}, {"tokens_per_s", e.tokens_per_s}, {"mfu", e.mfu}, {"train_s", e.train_seconds},
      {"cost_usd", e.cost_usd},
      {"breakdown_s", {{"compute", e.compute}, {"bubble", e.bubble}, {"tp_comm", e.tp_comm}, {"p2p", e.p2p},
                       {"dp_comm", e.dp_comm}, {"dp_exposed", e.dp_exposed}, {"optimizer", e.optimizer},
                       {"checkpoint", e.checkpoint}}},
      {"pipeline_idle_mean_s", e.idle_mean},
      {"memory_bytes", {{"params", e.mem_params}, {"grads", e.mem_grads}, {"optimizer", e.mem_optimizer},
                        {"activations", e.mem_activations}, {"total", e.mem_total}, {"capacity", e.mem_capacity}}},
      {"bottleneck", e.bottleneck()}};
  if (!e.fits) j["refusal"] = e.refusal;
  nlohmann::json terms = nlohmann::json::array();
  for (const auto& t : e.terms) terms.push_back({{"name", t.name}, {"value", t.seconds}, {"formula", t.formula}});
  j["terms"] = terms;
  return j;
}

void print_estimate_row(int i, const plan::Estimate& e) {
  std::printf("  %-3d %-30s %10s %12.0f %6.1f%% %9.1f GB %12s %12s\n", i, e.layout.str().c_str(), plan::duration_text(e.step).c_str(),
              e.tokens_per_s, 100 * e.mfu, e.mem_total / 1e9, plan::duration_text(e.train_seconds).c_str(),
              e.cost_usd > 0 ? fmt::format("${:.0f}", e.cost_usd).c_str() : "-");
}

void print_breakdown(const plan::Estimate& e) {
  auto pct = [&](double x) { return 100 * x / e.step; };
  std::printf("      step %s = compute %s (%.0f%%) + bubble %s (%.0f%%) + tp %s (%.0f%%) + p2p %s (%.0f%%) + dp exposed %s "
              "(%.0f%%, of %s) + optimizer %s (%.0f%%) + checkpoint %s\n",
              plan::duration_text(e.step).c_str(), plan::duration_text(e.compute).c_str(), pct(e.compute), plan::duration_text(e.bubble).c_str(), pct(e.bubble),
              plan::duration_text(e.tp_comm).c_str(), pct(e.tp_comm), plan::duration_text(e.p2p).c_str(), pct(e.p2p), plan::duration_text(e.dp_exposed).c_str(),
              pct(e.dp_exposed), plan::duration_text(e.dp_comm).c_str(), plan::duration_text(e.optimizer).c_str(), pct(e.optimizer),
              plan::duration_text(e.checkpoint).c_str());
  std::printf("      memory/device %.2f GB of %.1f: params %.2f, grads %.2f, optimizer %.2f, activations %.2f; bottleneck: %s\n",
              e.mem_total / 1e9, e.mem_capacity / 1e9, e.mem_params / 1e9, e.mem_grads / 1e9, e.mem_optimizer / 1e9,
              e.mem_activations / 1e9, e.bottleneck().c_str());
}

int run_plan(const PlanArgs& a) {
  plan::ModelSpec m;
  if (!a.hf_config.empty()) {
    if (!a.model.empty()) return fail(Status::InvalidArgument("--hf-config and --model name the model twice"));
    auto c = read_hf_model_config(a.hf_config);
    if (!c.ok()) return fail(c.status());
    m.name = "hf:" + a.hf_config;
    m.family = *c;
    m.layers = c->layers;
    m.heads = c->heads;
    m.dim = c->channels;
    m.vocab = c->vocab;
    m.context = c->context;
    m.seq = std::min(c->context, 4096);
    m.global_batch = 512;
  } else if (!a.model.empty()) {
    auto p = plan::model_preset(a.model);
    if (!p.ok()) return fail(p.status());
    m = *p;
  } else {
    m.name = "custom";
    m.global_batch = 512;
  }
  if (a.layers) m.layers = a.layers;
  if (a.heads) m.heads = a.heads;
  if (a.dim) m.dim = a.dim;
  if (a.vocab) m.vocab = a.vocab;
  if (a.seq) m.seq = a.seq;
  if (a.context) m.context = a.context;
  if (a.global_batch) m.global_batch = a.global_batch;
  if (a.kv_heads) m.family.kv_heads = a.kv_heads;
  if (a.mlp_hidden) m.family.mlp_hidden = a.mlp_hidden;
  if (Status st = m.validate(); !st.ok()) return fail(st);
  if (a.serve) return run_serve(a, m);
  auto tokens = plan::parse_count("--tokens", a.tokens, "10B, 300M, 2.5e9");
  if (!tokens.ok()) return fail(tokens.status());
  plan::Job job{m, a.dtype, *tokens, a.checkpoint_every, a.recompute, a.bucket_mb, a.attention};

  struct Result1 {
    plan::Cluster cluster;
    std::vector<plan::Estimate> best;
    plan::Estimate closest;
  };
  std::vector<Result1> results;
  for (const auto& f : a.clusters) {
    auto c = plan::load_cluster(f, a.ranks_per_node, a.threads_per_rank);
    if (!c.ok()) return fail(c.status());
    Result1 r{*c, {}, {}};
    plan::Layout fixed{0, 0, 0, 0, 0, 0, -1};
    if (!a.layout.empty()) {
      auto l = plan::parse_layout(a.layout);
      if (!l.ok()) return fail(l.status());
      fixed = *l;
    }
    if (fixed.nodes > c->nodes)
      return fail(Status::InvalidArgument(fmt::format("--layout: nodes={} but {} has {}", fixed.nodes, c->name, c->nodes)));
    if (fixed.dp && fixed.tp && fixed.pp && fixed.micro_batch) {
      // A whole layout: price exactly it (ga from the global batch unless given).
      auto e = plan::price_layout(job, *c, fixed);
      if (!e.ok()) return fail(e.status());
      r.best.push_back(*e);
    } else {
      r.best = plan::search(job, *c, a.objective, a.top, &r.closest, a.layout.empty() ? nullptr : &fixed);
      if (r.best.empty() && r.closest.refusal.empty())
        r.closest.refusal = "no layout agrees with --layout, the heads, the layers and the global batch";
    }
    results.push_back(std::move(r));
  }
  // Each cluster's best layout, or why none fits, for the verdict.
  std::vector<plan::ClusterOutcome> outcomes;
  for (const auto& r : results) {
    const bool fits = !r.best.empty() && r.best[0].fits;
    outcomes.push_back({r.cluster.name, fits, fits ? r.best[0].step : 0, fits ? r.best[0].cost_usd : 0,
                        r.best.empty() ? r.closest.refusal : r.best[0].refusal});
  }
  const bool any = plan::fastest_cluster(outcomes) >= 0;

  if (a.json) {
    nlohmann::json j = {{"schema", "tessera.plan"}, {"version", 1}, {"objective", a.objective}, {"dtype", a.dtype},
                        {"model", {{"name", job.model.name}, {"layers", m.layers}, {"heads", m.heads}, {"dim", m.dim},
                                   {"vocab", m.vocab}, {"seq", m.seq}, {"global_batch", job.model.global_batch},
                                   {"shape", m.shape().str()}, {"kv_heads", m.shape().kv()}, {"mlp_hidden", m.shape().ffn()},
                                   {"parameters", m.parameters()}, {"flops_per_token", m.flops_per_token()}}},
                        {"tokens", *tokens}};
    j["clusters"] = nlohmann::json::array();
    for (const auto& r : results) {
      nlohmann::json cj = {{"name", r.cluster.name}, {"file", r.cluster.file}, {"description", r.cluster.str()},
                           {"node", r.cluster.node.name}, {"source", r.cluster.node.source}, {"nodes", r.cluster.nodes},
                           {"ranks", r.cluster.ranks()}, {"price_per_hour", r.cluster.price_per_hour}};
      cj["layouts"] = nlohmann::json::array();
      for (const auto& e : r.best) cj["layouts"].push_back(to_json(e));
      if (r.best.empty()) cj["refusal"] = r.closest.refusal;
      j["clusters"].push_back(cj);
    }
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("model %s; %s; tokens %s; objective %s\n", job.model.str().c_str(), a.dtype.c_str(),
                *tokens > 0 ? fmt::format("{:.3g}", *tokens).c_str() : "- (per step only)", a.objective.c_str());
    for (const auto& r : results) {
      std::printf("\n%s: %s\n  node: %s\n", r.cluster.name.c_str(), r.cluster.str().c_str(), r.cluster.node.source.c_str());
      if (r.best.empty()) {
        std::printf("  no layout fits: %s%s\n", r.closest.layout.dp ? ("the nearest (" + r.closest.layout.str() + ") ").c_str() : "",
                    r.closest.refusal.c_str());
        continue;
      }
      std::printf("  %-3s %-30s %10s %12s %7s %12s %12s %12s\n", "#", "layout", "step", "tokens/s", "MFU", "mem/device",
                  "time", "cost");
      for (size_t i = 0; i < r.best.size(); ++i) print_estimate_row(static_cast<int>(i + 1), r.best[i]);
      print_breakdown(r.best[0]);
      if (!r.best[0].fits) std::printf("      does not fit: %s\n", r.best[0].refusal.c_str());
      if (a.explain) {
        std::printf("      every term of #1:\n");
        for (const auto& t : r.best[0].terms)
          std::printf("        %-16s %12.6g  %s\n", t.name.c_str(), t.seconds, t.formula.c_str());
      }
    }
    // The verdict: the best layout of each cluster against the fastest.
    if (results.size() > 1 && any) {
      const Result1* fast = &results[plan::fastest_cluster(outcomes)];
      std::printf("\nverdict:\n");
      for (size_t k = 0; k < results.size(); ++k) {
        const Result1& r = results[k];
        if (&r == fast) continue;
        if (!outcomes[k].fits) {
          std::printf("  %s: fits on %s, not on %s (%s)\n", fast->cluster.name.c_str(), fast->cluster.name.c_str(),
                      r.cluster.name.c_str(), outcomes[k].refusal.c_str());
          continue;
        }
        const auto& f = fast->best[0];
        const auto& s = r.best[0];
        const double speed = s.step / f.step * (f.tokens_per_step / s.tokens_per_step);
        const std::string cost = plan::cost_comparison(f.cost_usd, s.cost_usd);
        auto peak = [&](const Result1& x, const plan::Estimate& e) {
          const auto& n = x.cluster.node;
          const int devices = x.cluster.shared_host ? 1 : n.kind == plan::DeviceKind::kGpu ? e.layout.dp * e.layout.tp * e.layout.pp : e.layout.nodes;
          return std::pair{devices * n.peak_of(job.dtype), fmt::format("{} x {} ({:.0f} TFLOP/s {})", devices, n.name,
                                                                        devices * n.peak_of(job.dtype) / 1e12, job.dtype)};
        };
        const auto [pf, pf_s] = peak(*fast, f);
        const auto [ps, ps_s] = peak(r, s);
        std::vector<std::string> why;
        if (pf > 1.05 * ps) why.push_back(fmt::format("it has {} against {}", pf_s, ps_s));
        if (s.bottleneck().rfind("compute", 0) != 0) why.push_back(fmt::format("{} is held up by {}", r.cluster.name, s.bottleneck()));
        why.push_back(fmt::format("MFU {:.1f}% against {:.1f}%", 100 * f.mfu, 100 * s.mfu));
        std::string because;
        for (size_t i = 0; i < why.size(); ++i) because += (i == 0 ? "" : i + 1 == why.size() ? " and " : ", ") + why[i];
        std::printf("  %s: %.1fx faster than %s%s for this job, because %s; %s is bound by %s\n", fast->cluster.name.c_str(),
                    speed, r.cluster.name.c_str(), cost.c_str(), because.c_str(), fast->cluster.name.c_str(),
                    f.bottleneck().c_str());
      }
    }
  }
  if (!a.emit_sbatch.empty() && any) {
    if (results.size() != 1)
      return fail(Status::InvalidArgument(fmt::format("--emit-sbatch writes one cluster's job script; {} --cluster given",
                                                      results.size())));
    const Result1& r = results[0];
    if (r.best.empty() || !r.best[0].fits)
      return fail(Status::InvalidArgument(fmt::format("--emit-sbatch: no layout fits on {}", r.cluster.name)));
    plan::SbatchRequest q;
    q.plan_command = fmt::format("tessera plan (model {}, cluster {}, objective {}, dtype {})", job.model.name,
                                 r.cluster.file, a.objective, a.dtype);
    q.train_config = a.train_config;
    q.dtype = a.dtype;
    q.checkpoint_every = a.checkpoint_every;
    q.bucket_mb = a.bucket_mb;
    if (*tokens > 0) q.steps = static_cast<int64_t>(std::ceil(*tokens / r.best[0].tokens_per_step));
    Result<std::string> text = plan::sbatch_script(q, m, r.cluster, r.best[0]);
    if (!text.ok()) return fail(text.status());
    std::FILE* f = std::fopen(a.emit_sbatch.c_str(), "w");
    if (f == nullptr) return fail(Status::IOError(fmt::format("--emit-sbatch {}: cannot open for writing", a.emit_sbatch)));
    const bool wrote = std::fwrite(text->data(), 1, text->size(), f) == text->size();
    if (std::fclose(f) != 0 || !wrote)
      return fail(Status::IOError(fmt::format("--emit-sbatch {}: could not write the file", a.emit_sbatch)));
    if (!a.json)
      std::printf("\njob script: %s (%s on %d node(s); sbatch %s)\n", a.emit_sbatch.c_str(),
                  r.best[0].layout.str().c_str(), r.best[0].layout.nodes, a.emit_sbatch.c_str());
  }
  if (!any) return fail(plan::fits_nowhere(outcomes));
  return kExitOk;
}

}  // namespace

void add_plan_command(CLI::App& app) {
  auto a = std::make_shared<PlanArgs>();
  CLI::App* cmd = app.add_subcommand("plan", "Time, memory and cost of a training job on CPU/GPU clusters (docs/planner.md)");
  cmd->add_option("--model", a->model, "a preset: " + plan::model_preset_names() + "; DLRM: " + plan::dlrm_preset_names());
  cmd->add_option("--hf-config", a->hf_config,
                  "a Hugging Face config.json (GPT2LMHeadModel, LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM) "
                  "to price instead of a preset; --seq defaults to its context, at most 4096")
      ->check(CLI::ExistingFile);
  cmd->add_option("--layers", a->layers, "L (overrides the preset)")->check(CLI::PositiveNumber);
  cmd->add_option("--kv-heads", a->kv_heads, "key/value heads (a Llama-family preset's GQA)")->check(CLI::PositiveNumber);
  cmd->add_option("--mlp-hidden", a->mlp_hidden, "the MLP's hidden width (default 4C, or the preset's)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--heads", a->heads, "NH")->check(CLI::PositiveNumber);
  cmd->add_option("--dim", a->dim, "C")->check(CLI::PositiveNumber);
  cmd->add_option("--vocab", a->vocab, "V")->check(CLI::PositiveNumber);
  cmd->add_option("--seq", a->seq, "T, tokens per sequence")->check(CLI::PositiveNumber);
  cmd->add_option("--context", a->context, "positions (default --seq)")->check(CLI::PositiveNumber);
  cmd->add_option("--global-batch", a->global_batch, "sequences per optimizer step (default: the preset's, else 512)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--tokens", a->tokens, "tokens to train on: 10B, 300M, 2.5e9");
  cmd->add_option("--cluster", a->clusters, "cluster TOML file (repeatable; examples/clusters/)")->required();
  cmd->add_option("--objective", a->objective, "time or cost")->check(CLI::IsMember({"time", "cost"}));
  cmd->add_option("--dtype", a->dtype, "matmul inputs: bf16 (default) or fp32")->check(CLI::IsMember({"fp32", "bf16"}));
  cmd->add_option("--layout", a->layout, "constrain the search (dp=2,pp=2); with dp, tp, pp and mb all given, price exactly that layout: dp=2,tp=1,pp=2,mb=4[,ga=4][,zero=1][,nodes=N]");
  cmd->add_option("--top", a->top, "layouts shown per cluster")->check(CLI::Range(1, 100));
  cmd->add_option("--checkpoint-every", a->checkpoint_every, "steps between checkpoints (0: none)")->check(CLI::NonNegativeNumber);
  cmd->add_option("--bucket-mb", a->bucket_mb, "gradient bucket size, MB (parallel.bucket_mb)")->check(CLI::PositiveNumber);
  cmd->add_option("--ranks-per-node", a->ranks_per_node, "override the cluster's ranks (devices) per node")
      ->check(CLI::Range(1, 1024));
  cmd->add_option("--threads-per-rank", a->threads_per_rank, "override the cluster's CPU threads per rank")
      ->check(CLI::Range(1, 4096));
  cmd->add_option("--attention", a->attention, "flash (default; Tessera's kernels) or materialized (scores stored: Megatron-LM 2021)")
      ->check(CLI::IsMember({"flash", "materialized"}));
  cmd->add_flag("--recompute", a->recompute, "full activation recomputation (not in Tessera; for comparing published runs)");
  cmd->add_flag("--json", a->json, "one JSON document (schema tessera.plan, version 1)");
  cmd->add_option("--emit-sbatch", a->emit_sbatch,
                  "write the Slurm job script of the best layout to FILE (one --cluster; docs/cluster.md \"Slurm\")");
  cmd->add_option("--train-config", a->train_config, "--emit-sbatch: the training TOML the script runs (CONFIG's default)");
  cmd->add_flag("--explain", a->explain, "print every term of the model for the best layout");
  // Serving (docs/planner.md, "Serving").
  cmd->add_flag("--serve", a->serve, "price serving the model instead of training it: memory, decode and prefill a device");
  cmd->add_option("--serve-dtype", a->serve_dtype, "--serve: the weights, fp32, bf16, int8 or int4 (int8 and int4: CPU tiers; default int8 on a CPU, bf16 on a GPU)")
      ->check(CLI::IsMember({"fp32", "bf16", "int8", "int4"}));
  cmd->add_option("--serve-batch", a->serve_batch, "--serve: sequences decoded together (default 1)")->check(CLI::PositiveNumber);
  cmd->add_option("--serve-prompt", a->serve_prompt, "--serve: prompt tokens a sequence (default 128)")->check(CLI::PositiveNumber);
  cmd->add_option("--serve-tokens", a->serve_tokens, "--serve: tokens each sequence generates (default 128)")->check(CLI::PositiveNumber);
  // DLRM jobs (docs/planner.md, "DLRM"): a train config or these flags.
  PlanDlrmArgs& d = a->dlrm;
  cmd->add_option("--config", d.config, "DLRM: a tessera train config with model.kind = \"dlrm\" (configs/dlrm_500m.toml)");
  cmd->add_option("--set", d.overrides, "DLRM: override a config key, section.key=value (repeatable)");
  cmd->add_option("--tables", d.tables, "DLRM: embedding tables")->check(CLI::Range(1, 100000));
  cmd->add_option("--table-rows", d.table_rows, "DLRM: rows of every table (300000), or one per table (1000,2000,...)");
  cmd->add_option("--embedding-dim", d.dim, "DLRM: D")->check(CLI::PositiveNumber);
  cmd->add_option("--dense", d.dense, "DLRM: dense features (default 13)")->check(CLI::NonNegativeNumber);
  cmd->add_option("--bottom-mlp", d.bottom, "DLRM: bottom MLP sizes, the last = D (512,256,64)");
  cmd->add_option("--top-mlp", d.top, "DLRM: top MLP hidden sizes (512,256; a final layer to one logit is added)");
  cmd->add_option("--bag", d.bag, "DLRM: ids per sample and table (default 1)")->check(CLI::PositiveNumber);
  cmd->add_option("--samples", d.samples, "DLRM: samples to train on: 4.4B, 300M (default: train.steps x train.batch of --config)");
  cmd->add_option("--table-optimizer", d.table_optimizer, "DLRM: adagrad (row-wise) or sgd")->check(CLI::IsMember({"adagrad", "sgd"}));
  cmd->add_option("--placement", d.placement, "DLRM: table, row or auto (default: the config's, else auto: both searched)")
      ->check(CLI::IsMember({"table", "row", "auto"}));
  cmd->callback([a, cmd] {
    a->dlrm.model = a->model;
    if (!plan_is_dlrm(a->dlrm)) {
      // A flag of the other kind of plan would be ignored: say so instead.
      const std::vector<const char*> training = {"--tokens", "--layout", "--objective", "--top", "--checkpoint-every",
                                                 "--bucket-mb", "--recompute", "--attention", "--emit-sbatch",
                                                 "--train-config", "--explain", "--dtype", "--global-batch", "--seq"};
      const std::vector<const char*> serving = {"--serve-dtype", "--serve-batch", "--serve-prompt", "--serve-tokens"};
      for (const char* flag : a->serve ? training : serving)
        if (cmd->count(flag) > 0) {
          exit_code() = fail(Status::InvalidArgument(
              a->serve ? fmt::format("{} prices training; --serve prices serving (docs/planner.md, \"Serving\")", flag)
                       : fmt::format("{} is a --serve flag", flag)));
          return;
        }
      exit_code() = run_plan(*a);
      return;
    }
    for (const char* gpt : {"--layers", "--heads", "--dim", "--vocab", "--seq", "--context", "--tokens", "--layout",
                            "--hf-config", "--kv-heads", "--mlp-hidden",
                            "--recompute", "--attention", "--checkpoint-every", "--bucket-mb", "--serve-dtype",
                            "--serve-batch", "--serve-prompt", "--serve-tokens"})
      if (cmd->count(gpt) > 0) {
        exit_code() = fail(Status::InvalidArgument(fmt::format("{} is a GPT flag; this is a DLRM plan (docs/planner.md, \"DLRM\")", gpt)));
        return;
      }
    if (a->serve) {
      exit_code() = fail(Status::InvalidArgument("--serve prices a decoder; a DLRM is not served by Tessera"));
      return;
    }
    PlanDlrmArgs d = a->dlrm;
    d.global_batch = a->global_batch;
    if (cmd->count("--dtype") > 0) d.dtype = a->dtype;
    d.objective = a->objective;
    d.clusters = a->clusters;
    d.top_k = a->top;
    d.ranks_per_node = a->ranks_per_node;
    d.threads_per_rank = a->threads_per_rank;
    d.json = a->json;
    d.explain = a->explain;
    exit_code() = run_plan_dlrm(d);
  });
}

}  // namespace tessera::tools
