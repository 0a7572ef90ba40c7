#include "train/plan_check.h"

#include <algorithm>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>

#include <fmt/format.h>

#include "comm/mpi/local_device.h"
#include "perf/profile.h"
#include "train/monitoring.h"
#include "plan/cluster.h"
#include "plan/estimate.h"
#include "plan/hardware.h"
#include "plan/model.h"

namespace tessera {

Result<PlanCheckMachine> describe_run_machine(comm::Communicator& world, const std::string& profile,
                                              double link_gbps) {
  PlanCheckMachine m;
  m.profile_path = perf::profile_path(profile);
  Result<comm::LocalRank> local = comm::local_rank();
  m.ranks_per_host = local.ok() && local->size > 0 ? local->size : 1;
  m.hosts = world.size() % m.ranks_per_host == 0 ? world.size() / m.ranks_per_host : 1;
  std::string boot;
  if (std::FILE* f = std::fopen("/proc/sys/kernel/random/boot_id", "r")) {
    char buf[64] = {};
    if (std::fgets(buf, sizeof buf, f)) boot = buf;
    std::fclose(f);
  }
  // max(h) == -max(-h) on every rank exactly when all ranks have the same h.
  const uint64_t h = std::hash<std::string>{}(boot);
  double ids[4] = {static_cast<double>(h >> 32), static_cast<double>(h & 0xffffffffu),
                   -static_cast<double>(h >> 32), -static_cast<double>(h & 0xffffffffu)};
  if (world.size() > 1)
    RETURN_IF_ERROR(world.all_reduce(ids, ids, 4, comm::ElemType::kF64, comm::ReduceOp::kMax));
  m.shared_host = m.hosts > 1 && ids[0] == -ids[2] && ids[1] == -ids[3];
  // OpenMP's threads as the launcher set them; unset: the planner's own
  // default, the host's cores over its ranks.
  if (const char* t = std::getenv("OMP_NUM_THREADS")) m.threads_per_rank = std::max(0, std::atoi(t));
  m.link_gbps = link_gbps;
  return m;
}

namespace {

Result<plan::Cluster> run_cluster(const PlanCheckMachine& j) {
  if (j.profile_path.empty())
    return Status::NotFound("no doctor profile (log.profile or TESSERA_PROFILE; `tessera doctor --save FILE` makes one)");
  ASSIGN_OR_RETURN(plan::NodeType node, plan::node_from_profile(j.profile_path));
  plan::Cluster c;
  c.name = "this job";
  c.node = node;
  c.nodes = j.hosts;
  c.ranks_per_node = j.ranks_per_host;
  c.shared_host = j.shared_host;
  c.threads_per_rank = j.threads_per_rank;
  c.intra = node.intra;
  c.inter.kind = "none";
  if (j.hosts > 1) {
    // As a cluster file's [network] with inter = "ethernet" (TCP sockets:
    // 80% of the line rate, 30 us a step).
    const double gbps = j.link_gbps > 0 ? j.link_gbps : 10.0;
    c.inter.kind = fmt::format("ethernet {:g} Gbit/s x1{}", gbps, j.link_gbps > 0 ? "" : " (link speed unknown: assumed)");
    c.inter.busbw = gbps / 8.0 * 1e9 * 0.8;
    c.inter.alpha = 30e-6;
  }
  return c;
}

}  // namespace

Result<PlanPrediction> predict_for_run(const PlanCheckJob& j) {
  ASSIGN_OR_RETURN(plan::Cluster c, run_cluster(j.machine));
  plan::ModelSpec m;
  m.name = "this job's model";
  m.family = j.model;
  m.layers = j.model.layers;
  m.heads = j.model.heads;
  m.dim = j.model.channels;
  m.vocab = j.model.vocab;
  m.context = j.model.context;
  m.seq = j.seq;
  m.global_batch = int64_t{j.dp} * j.micro_batch * j.grad_accum;
  plan::Job job{m, j.dtype, 0.0, j.checkpoint_every, false, j.bucket_mb, "flash"};
  plan::Layout l;
  l.nodes = j.machine.hosts;
  l.dp = j.dp, l.tp = j.tp, l.pp = j.pp, l.micro_batch = j.micro_batch, l.grad_accum = j.grad_accum, l.zero = j.zero;
  const plan::Estimate e = plan::estimate(job, c, l);
  if (!(e.step > 0)) return Status::Internal("the planner gave no step time for this layout");
  PlanPrediction p;
  p.step_s = e.step;
  p.mem_bytes = e.mem_total;
  p.comm_share = (e.tp_comm + e.p2p + e.dp_exposed) / e.step;
  p.bubble_share = e.bubble / e.step;
  p.cluster = c.str();
  p.bottleneck = e.bottleneck();
  return p;
}

Result<PlanPrediction> predict_dlrm_for_run(const PlanCheckMachine& machine, const plan::DlrmJob& job,
                                            plan::DlrmPlacement placement) {
  ASSIGN_OR_RETURN(plan::Cluster c, run_cluster(machine));
  RETURN_IF_ERROR(job.model.validate());
  const plan::DlrmEstimate e = plan::estimate_dlrm(job, c, placement, machine.hosts);
  if (!e.fits) return Status::ResourceExhausted("the planner says this job does not fit: " + e.refusal);
  if (!(e.step > 0)) return Status::Internal("the planner gave no step time for this job");
  PlanPrediction p;
  p.step_s = e.step;
  p.mem_bytes = e.mem_total;
  p.comm_share = e.alltoall / e.step;
  p.cluster = c.str();
  p.bottleneck = e.bottleneck();
  return p;
}

std::string plan_error(double measured, double predicted) {
  if (!(predicted > 0)) return "-";
  return fmt::format("{:+.1f}%", 100.0 * (measured - predicted) / predicted);
}

void report_plan_check(const PlanPrediction& plan, const PlanCheckMeasured& m, std::FILE* out, MetricsLog* metrics) {
  if (m.step_seconds.size() < 2) return;
  std::vector<double> steps(m.step_seconds.begin() + 1, m.step_seconds.end());
  std::nth_element(steps.begin(), steps.begin() + steps.size() / 2, steps.end());
  const double step = steps[steps.size() / 2];
  if (out) {
    std::fprintf(out,
                 "plan check: step %.2f ms measured vs %.2f ms predicted (%s), memory %.1f vs %.1f MB per rank (%s), "
                 "%s %.0f%% vs %.0f%% of the step\n",
                 step * 1e3, plan.step_s * 1e3, plan_error(step, plan.step_s).c_str(), m.mem_bytes / 1e6,
                 plan.mem_bytes / 1e6, plan_error(m.mem_bytes, plan.mem_bytes).c_str(), m.comm_name,
                 100 * m.comm_share, 100 * plan.comm_share);
    std::fflush(out);
  }
  if (metrics == nullptr) return;
  metrics->write({{"plan_check_steps", steps.size()},
                  {"measured_step_ms", step * 1e3},
                  {"plan_step_ms", plan.step_s * 1e3},
                  {"step_error", (step - plan.step_s) / plan.step_s},
                  {"measured_memory_mb", m.mem_bytes / 1e6},
                  {"plan_memory_mb", plan.mem_bytes / 1e6},
                  {"memory_error", plan.mem_bytes > 0 ? (m.mem_bytes - plan.mem_bytes) / plan.mem_bytes : 0.0},
                  {"measured_comm_share", m.comm_share},
                  {"plan_comm_share", plan.comm_share}});
}

}  // namespace tessera
