// tessera plan for DLRM jobs: reads the job (a train config or flags),
// prices it on each cluster (src/plan/dlrm.h), prints the table, the
// verdict, --explain and --json.
#include "tools/cmd_plan_dlrm.h"

#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "plan/cluster.h"
#include "plan/compare.h"
#include "plan/dlrm.h"
#include "tools/commands.h"
#include "train/config.h"

namespace tessera::tools {

namespace {

// "512,256,64" -> {512, 256, 64}; every item a positive integer.
Result<std::vector<int64_t>> parse_list(const std::string& flag, const std::string& s) {
  std::vector<int64_t> out;
  size_t pos = 0;
  while (pos <= s.size()) {
    size_t end = s.find(',', pos);
    if (end == std::string::npos) end = s.size();
    const std::string item = s.substr(pos, end - pos);
    long long v = 0;
    char extra = 0;
    if (std::sscanf(item.c_str(), "%lld%c", &v, &extra) != 1 || v <= 0)
      return Status::InvalidArgument(fmt::format("{}: '{}' is not a positive integer (a list: 512,256,64)", flag, item));
    out.push_back(v);
    pos = end + 1;
  }
  return out;
}

// The header of a click shard (docs/formats/click-shard.md): dense count and
// each table's hash size; nullopt-like false when the file is not readable.
struct ShardHeader {
  int num_dense = 0;
  std::vector<int64_t> hash_sizes;
};
Result<ShardHeader> read_shard_header(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::NotFound(fmt::format("cannot read {}", path));
  char head[32];
  if (!in.read(head, sizeof head) || std::memcmp(head, "TSCLICK1", 8) != 0)
    return Status::Corruption(fmt::format("{} is not a click shard (bad magic)", path));
  uint32_t dense = 0, cat = 0;
  std::memcpy(&dense, head + 12, 4);
  std::memcpy(&cat, head + 16, 4);
  if (cat == 0 || cat > 100000) return Status::Corruption(fmt::format("{}: bad table count {}", path, cat));
  ShardHeader h;
  h.num_dense = static_cast<int>(dense);
  h.hash_sizes.resize(cat);
  if (!in.read(reinterpret_cast<char*>(h.hash_sizes.data()), 8 * static_cast<std::streamsize>(cat)))
    return Status::Corruption(fmt::format("{}: truncated header", path));
  return h;
}

struct DlrmJobSpec {
  plan::DlrmJob job;
  std::string placement;  // "table", "row", "auto"
  std::string note;       // where the tables came from
};

Result<DlrmJobSpec> build_job(const PlanDlrmArgs& a) {
  DlrmJobSpec out;
  plan::DlrmSpec& m = out.job.model;
  out.placement = "auto";
  double steps_samples = 0;
  if (!a.config.empty()) {
    if (!a.model.empty()) return Status::InvalidArgument("give --config or --model, not both");
    auto c = load_train_config(a.config, a.overrides);
    if (!c.ok()) return c.status();
    if (c->model_kind != "dlrm")
      return Status::InvalidArgument(fmt::format(
          "{}: model.kind is \"{}\"; tessera plan --config reads DLRM configs (GPT jobs: --model or --layers/--heads/--dim/...)",
          a.config, c->model_kind));
    const DlrmSettings& d = c->dlrm;
    m.name = a.config;
    m.dim = d.embedding_dim;
    m.bottom = d.bottom;
    m.top = d.top;
    m.global_batch = d.batch;
    m.table_optimizer = d.table_optimizer;
    out.placement = d.placement;
    steps_samples = static_cast<double>(c->steps) * d.batch;
    // The tables: one size per table, or one for every table, or the
    // shard's hash sizes; the table count from the shard when it is there.
    auto header = read_shard_header(c->train_data);
    if (header.ok()) m.num_dense = header->num_dense;
    if (d.table_rows.size() > 1) {
      m.table_rows.assign(d.table_rows.begin(), d.table_rows.end());
      out.note = "model.table_rows";
    } else if (header.ok()) {
      m.table_rows = header->hash_sizes;
      if (d.table_rows.size() == 1) m.table_rows.assign(header->hash_sizes.size(), d.table_rows[0]);
      out.note = fmt::format("tables from {}", c->train_data);
    } else if (d.table_rows.size() == 1) {
      m.table_rows.assign(a.tables > 0 ? a.tables : 26, d.table_rows[0]);
      out.note = a.tables > 0 ? "--tables" : fmt::format("26 tables (the Criteo layout: {} is not readable; --tables sets it)", c->train_data);
    } else if (a.table_rows.empty()) {
      return Status::InvalidArgument(fmt::format(
          "{}: model.table_rows is empty and data.train ({}) cannot be read for its hash sizes: give --table-rows", a.config,
          c->train_data));
    }
  } else {
    auto p = plan::dlrm_preset(a.model.empty() ? "dlrm-500m" : a.model);
    if (!p.ok()) return p.status();
    m = *p;
    if (a.model.empty()) m.name = "custom";
  }
  // Flags over the config or preset.
  if (a.dim > 0) m.dim = a.dim;
  if (a.dense >= 0) m.num_dense = a.dense;
  if (!a.bottom.empty()) {
    auto v = parse_list("--bottom", a.bottom);
    if (!v.ok()) return v.status();
    m.bottom.assign(v->begin(), v->end());
  }
  if (!a.top.empty()) {
    auto v = parse_list("--top", a.top);
    if (!v.ok()) return v.status();
    m.top.assign(v->begin(), v->end());
  }
  if (!a.table_rows.empty()) {
    auto v = parse_list("--table-rows", a.table_rows);
    if (!v.ok()) return v.status();
    const int T = a.tables > 0 ? a.tables : v->size() > 1 ? static_cast<int>(v->size()) : m.tables() > 0 ? m.tables() : 26;
    if (v->size() > 1 && static_cast<int>(v->size()) != T)
      return Status::InvalidArgument(fmt::format("--table-rows gives {} sizes but --tables is {}", v->size(), T));
    m.table_rows = v->size() > 1 ? *v : std::vector<int64_t>(T, (*v)[0]);
  } else if (a.tables > 0 && a.tables != m.tables()) {
    const int64_t rows = m.table_rows.empty() ? 0 : m.table_rows[0];
    m.table_rows.assign(a.tables, rows);
  }
  if (a.bag > 0) m.bag = a.bag;
  if (a.global_batch > 0) m.global_batch = a.global_batch;
  if (!a.table_optimizer.empty()) m.table_optimizer = a.table_optimizer;
  if (!a.placement.empty()) out.placement = a.placement;
  if (out.placement != "table" && out.placement != "row" && out.placement != "auto")
    return Status::InvalidArgument(fmt::format("placement '{}' is not table, row or auto", out.placement));
  if (Status st = m.validate(); !st.ok()) return st;
  auto samples = plan::parse_count("--samples", a.samples, "4.4B, 300M, 2.5e9");
  if (!samples.ok()) return samples.status();
  out.job.samples = *samples > 0 ? *samples : steps_samples;
  out.job.dtype = a.dtype;
  return out;
}

nlohmann::json to_json(const plan::DlrmEstimate& e) {
  nlohmann::json j = {
      {"placement", e.placement == plan::DlrmPlacement::kTable ? "table" : "row"},
      {"nodes", e.nodes}, {"ranks", e.ranks}, {"fits", e.fits},
      {"step_s", e.step}, {"samples_per_s", e.samples_per_s}, {"mfu", e.mfu}, {"train_s", e.train_seconds},
      {"cost_usd", e.cost_usd}, {"alltoall_bytes", e.alltoall_bytes}, {"max_shards_per_rank", e.max_tables_per_rank},
      {"breakdown_s", {{"mlp", e.mlp}, {"interaction", e.interaction}, {"lookup", e.lookup}, {"update", e.update},
                       {"alltoall", e.alltoall}, {"allreduce", e.allreduce}, {"optimizer", e.optimizer}, {"launch", e.launch}}},
      {"memory_bytes", {{"tables", e.mem_tables}, {"table_state", e.mem_table_state}, {"mlp", e.mem_mlp},
                        {"activations", e.mem_activations}, {"buffers", e.mem_buffers}, {"staging", e.mem_staging},
                        {"total", e.mem_total}, {"capacity", e.mem_capacity}}},
      {"bottleneck", e.bottleneck()}};
  if (!e.fits) j["refusal"] = e.refusal;
  nlohmann::json terms = nlohmann::json::array();
  for (const auto& t : e.terms) terms.push_back({{"name", t.name}, {"value", t.value}, {"formula", t.formula}});
  j["terms"] = terms;
  return j;
}

void print_breakdown(const plan::DlrmEstimate& e) {
  auto part = [&](const char* name, double x) { return fmt::format("{} {} ({:.0f}%)", name, plan::duration_text(x), 100 * x / e.step); };
  std::printf("      step %s = %s + %s + %s + %s + %s + %s + %s + %s\n", plan::duration_text(e.step).c_str(), part("mlp", e.mlp).c_str(),
              part("interaction", e.interaction).c_str(), part("lookup", e.lookup).c_str(), part("update", e.update).c_str(),
              part("all-to-all", e.alltoall).c_str(), part("all-reduce", e.allreduce).c_str(),
              part("adamw", e.optimizer).c_str(), part("launch", e.launch).c_str());
  std::printf("      memory/rank %.2f GB of %.1f: tables %.2f + state %.2f, MLPs %.3f, activations %.3f, buffers %.3f, "
              "staging %.2f; all-to-all %.2f MB a step; bottleneck: %s\n",
              e.mem_total / 1e9, e.mem_capacity / 1e9, e.mem_tables / 1e9, e.mem_table_state / 1e9, e.mem_mlp / 1e9,
              e.mem_activations / 1e9, e.mem_buffers / 1e9, e.mem_staging / 1e9, e.alltoall_bytes / 1e6,
              e.bottleneck().c_str());
}

}  // namespace

bool plan_is_dlrm(const PlanDlrmArgs& a) {
  return !a.config.empty() || a.model.rfind("dlrm", 0) == 0 || a.tables > 0 || a.dense >= 0 || !a.table_rows.empty() ||
         !a.bottom.empty() || !a.top.empty() || a.bag > 0 || !a.samples.empty() || !a.table_optimizer.empty() ||
         !a.placement.empty();
}

int run_plan_dlrm(const PlanDlrmArgs& a) {
  auto spec = build_job(a);
  if (!spec.ok()) return fail(spec.status());
  const plan::DlrmJob& job = spec->job;
  const plan::DlrmSpec& m = job.model;
  plan::DlrmPlacement only{};
  const bool fixed = spec->placement != "auto";
  if (fixed) only = spec->placement == "table" ? plan::DlrmPlacement::kTable : plan::DlrmPlacement::kRow;

  struct Result1 {
    plan::Cluster cluster;
    std::vector<plan::DlrmEstimate> best;
    plan::DlrmEstimate closest;
  };
  std::vector<Result1> results;
  for (const auto& f : a.clusters) {
    auto c = plan::load_cluster(f, a.ranks_per_node, a.threads_per_rank);
    if (!c.ok()) return fail(c.status());
    Result1 r{*c, {}, {}};
    r.best = plan::search_dlrm(job, *c, a.objective, a.top_k, &r.closest, fixed ? &only : nullptr);
    results.push_back(std::move(r));
  }
  // Each cluster's best placement, or why none fits, for the verdict.
  std::vector<plan::ClusterOutcome> outcomes;
  for (const auto& r : results) {
    const bool fits = !r.best.empty();
    outcomes.push_back({r.cluster.name, fits, fits ? r.best[0].step : 0, fits ? r.best[0].cost_usd : 0,
                        r.closest.refusal});
  }
  const bool any = plan::fastest_cluster(outcomes) >= 0;

  if (a.json) {
    nlohmann::json j = {{"schema", "tessera.plan"}, {"version", 1}, {"objective", a.objective}, {"dtype", job.dtype},
                        {"model", {{"kind", "dlrm"}, {"name", m.name}, {"tables", m.tables()}, {"table_rows", m.table_rows},
                                   {"dim", m.dim}, {"dense", m.num_dense}, {"bottom", m.bottom}, {"top", m.top},
                                   {"bag", m.bag}, {"global_batch", m.global_batch}, {"table_optimizer", m.table_optimizer},
                                   {"parameters", m.parameters()}, {"mlp_parameters", m.mlp_parameters()},
                                   {"flops_per_sample", m.flops_per_sample()}}},
                        {"samples", job.samples}, {"placement", spec->placement}};
    j["clusters"] = nlohmann::json::array();
    for (const auto& r : results) {
      nlohmann::json cj = {{"name", r.cluster.name}, {"file", r.cluster.file}, {"description", r.cluster.str()},
                           {"node", r.cluster.node.name}, {"source", r.cluster.node.source}, {"nodes", r.cluster.nodes},
                           {"ranks", r.cluster.ranks()}, {"price_per_hour", r.cluster.price_per_hour},
                           {"lookup_efficiency", r.cluster.node.lookup_efficiency}};
      cj["layouts"] = nlohmann::json::array();
      for (const auto& e : r.best) cj["layouts"].push_back(to_json(e));
      if (r.best.empty()) cj["refusal"] = r.closest.refusal;
      j["clusters"].push_back(cj);
    }
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("model %s%s; MLPs %s; samples %s; placement %s; objective %s\n", m.str().c_str(),
                spec->note.empty() ? "" : (" (" + spec->note + ")").c_str(), job.dtype.c_str(),
                job.samples > 0 ? fmt::format("{:.3g}", job.samples).c_str() : "- (per step only)",
                spec->placement.c_str(), a.objective.c_str());
    for (const auto& r : results) {
      std::printf("\n%s: %s\n  node: %s\n", r.cluster.name.c_str(), r.cluster.str().c_str(), r.cluster.node.source.c_str());
      if (r.best.empty()) {
        std::printf("  no placement fits: %s\n", r.closest.refusal.c_str());
        continue;
      }
      std::printf("  %-3s %-11s %5s %5s %10s %12s %12s %12s %12s\n", "#", "placement", "nodes", "ranks", "step",
                  "samples/s", "mem/rank", "time", "cost");
      for (size_t i = 0; i < r.best.size(); ++i) {
        const auto& e = r.best[i];
        std::printf("  %-3zu %-11s %5d %5d %10s %12.0f %9.2f GB %12s %12s\n", i + 1, plan::placement_name(e.placement),
                    e.nodes, e.ranks, plan::duration_text(e.step).c_str(), e.samples_per_s, e.mem_total / 1e9, plan::duration_text(e.train_seconds).c_str(),
                    e.cost_usd > 0 ? fmt::format("${:.0f}", e.cost_usd).c_str() : "-");
      }
      print_breakdown(r.best[0]);
      if (a.explain) {
        std::printf("      every term of #1:\n");
        for (const auto& t : r.best[0].terms) std::printf("        %-16s %12.6g  %s\n", t.name.c_str(), t.value, t.formula.c_str());
      }
    }
    if (results.size() > 1 && any) {
      const Result1* fast = &results[plan::fastest_cluster(outcomes)];
      std::printf("\nverdict:\n");
      for (const auto& r : results) {
        if (&r == fast) continue;
        if (r.best.empty()) {
          std::printf("  %s: fits on %s, not on %s (%s)\n", fast->cluster.name.c_str(), fast->cluster.name.c_str(),
                      r.cluster.name.c_str(), r.closest.refusal.c_str());
          continue;
        }
        const auto& f = fast->best[0];
        const auto& s = r.best[0];
        const std::string cost = plan::cost_comparison(f.cost_usd, s.cost_usd);
        std::printf("  %s: %.1fx faster than %s%s for this job; %s is held up by %s, %s by %s\n", fast->cluster.name.c_str(),
                    s.step / f.step, r.cluster.name.c_str(), cost.c_str(), r.cluster.name.c_str(), s.bottleneck().c_str(),
                    fast->cluster.name.c_str(), f.bottleneck().c_str());
      }
    }
  }
  if (!any) return fail(plan::fits_nowhere(outcomes));
  return kExitOk;
}

}  // namespace tessera::tools
