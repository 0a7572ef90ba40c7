#include "plan/sbatch.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

namespace tessera::plan {

namespace {
// Slurm's D-HH:MM:SS.
std::string slurm_time(double seconds) {
  const int64_t s = static_cast<int64_t>(std::ceil(seconds));
  return fmt::format("{}-{:02}:{:02}:{:02}", s / 86400, s / 3600 % 24, s / 60 % 60, s % 60);
}
}  // namespace

Result<std::string> sbatch_script(const SbatchRequest& r, const ModelSpec& m, const Cluster& c, const Estimate& e) {
  const Layout& l = e.layout;
  if (!e.fits) return Status::InvalidArgument(fmt::format("no job script: the layout {} does not fit ({})", l.str(), e.refusal));
  const int ranks = l.dp * l.tp * l.pp;
  // Ranks of a shared host (the emulated cluster) are spread over its nodes
  // as the cluster file's ranks per node says; otherwise over the nodes used.
  const int nodes = std::max(1, l.nodes);
  if (ranks % nodes != 0)
    return Status::InvalidArgument(fmt::format("no job script: {} ranks do not split evenly over {} nodes", ranks, nodes));
  const int per_node = ranks / nodes;
  const bool gpu = c.node.kind == DeviceKind::kGpu;
  const int threads = c.threads_per_rank > 0 ? c.threads_per_rank
                      : c.node.cores > 0    ? std::max(1, c.node.cores / per_node)
                                            : 1;
  const DecoderConfig shape = m.shape();
  const int every = r.checkpoint_every > 0 ? r.checkpoint_every : 500;
  std::string s;
  s += "#!/bin/bash\n";
  s += fmt::format("# Written by: {}\n", r.plan_command);
  s += fmt::format("# The layout `tessera plan` recommends for {} on {}\n", m.str(), c.name);
  s += fmt::format("# ({}):\n", c.str());
  s += fmt::format("#   {}: {:.3g} s a step, {:.0f} tokens/s, MFU {:.1f}%, {:.2f} GB per device; held up by {}\n",
                   l.str(), e.step, e.tokens_per_s, 100 * e.mfu, e.mem_total / 1e9, e.bottleneck());
  s += "# Submit it unchanged: sbatch THIS_FILE [more `tessera train` arguments]. CONFIG (the TOML with the data\n";
  s += "# and the optimizer) and TESSERA (the binary) may be set in the environment. SIGUSR1 before the time\n";
  s += "# limit, or SIGTERM on preemption, makes `tessera train` save a verified checkpoint and exit 75; the\n";
  s += "# job is then requeued and resumes from `latest` (docs/cluster.md, \"Slurm\").\n";
  s += "#SBATCH --job-name=tessera-train\n";
  s += fmt::format("#SBATCH --nodes={}\n", nodes);
  s += fmt::format("#SBATCH --ntasks-per-node={}\n", per_node);
  if (gpu) s += fmt::format("#SBATCH --gpus-per-node={}\n", per_node);
  else s += fmt::format("#SBATCH --cpus-per-task={}\n", threads);
  if (e.train_seconds > 0) {
    // The planner's time plus a quarter and the checkpoint margin; a job
    // that outlives it is requeued and resumes, so the limit is not a wall.
    s += fmt::format("#SBATCH --time={}\n", slurm_time(e.train_seconds * 1.25 + 2.0 * r.signal_seconds + 600));
  }
  s += fmt::format("#SBATCH --signal=USR1@{}\n", r.signal_seconds);
  s += "#SBATCH --requeue\n";
  s += "#SBATCH --open-mode=append\n";
  s += "#SBATCH --output=tessera-train-%j.out\n";
  s += "set -uo pipefail\n";
  s += fmt::format("CONFIG=${{CONFIG:-{}}}\n", r.train_config);
  s += "TESSERA=${TESSERA:-tessera}\n";
  s += fmt::format("[ \"${{SLURM_NTASKS:-0}}\" = {} ] || {{ echo \"tessera-train: error: this layout needs {} tasks, the job "
                   "has ${{SLURM_NTASKS:-none}}\" >&2; exit 1; }}\n",
                   ranks, ranks);
  if (gpu) s += "export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}\n";
  else s += "export OMP_NUM_THREADS=${SLURM_CPUS_PER_TASK:-1}\n";
  s += "attempt=${SLURM_RESTART_COUNT:-0}\n";
  s += "echo \"attempt $attempt of job $SLURM_JOB_ID on $SLURM_JOB_NODELIST\"\n";
  s += "srun --mpi=pmix \"$TESSERA\" train --config \"$CONFIG\" --resume auto \\\n";
  s += fmt::format("  --set model.layers={} --set model.heads={} --set model.dim={} --set model.vocab={} \\\n", m.layers,
                   m.heads, m.dim, m.vocab);
  s += fmt::format("  --set model.context={} --set model.kv_heads={} --set model.mlp_hidden={} --set train.seq={} \\\n",
                   m.context > 0 ? m.context : m.seq, shape.kv(), shape.ffn(), m.seq);
  s += fmt::format("  --set parallel.dp={} --set parallel.tp={} --set parallel.pp={} --set parallel.zero={} \\\n", l.dp,
                   l.tp, l.pp, l.zero);
  s += fmt::format("  --set train.micro_batch={} --set train.grad_accum={} --set parallel.bucket_mb={:g} \\\n",
                   l.micro_batch, l.grad_accum, r.bucket_mb);
  s += fmt::format("  --set train.dtype={} \\\n", r.dtype);
  if (r.steps > 0) s += fmt::format("  --set train.steps={} \\\n", r.steps);
  s += fmt::format("  --set checkpoint.every={} --set log.metrics=metrics.$SLURM_JOB_ID.$attempt.jsonl \"$@\"\n", every);
  s += "rc=$?\n";
  s += "if [ $rc -eq 75 ]; then\n";
  s += "  echo \"attempt $attempt stopped with a verified checkpoint: requeueing job $SLURM_JOB_ID\"\n";
  s += "  scontrol requeue \"$SLURM_JOB_ID\"\n";
  s += "  exit 0\n";
  s += "fi\n";
  s += "if [ $rc -eq 138 ]; then  # 128 + SIGUSR1: the warning came while a task was still starting\n";
  s += "  echo \"attempt $attempt: SIGUSR1 ended a task before it could stop cleanly (during start-up): requeueing job "
       "$SLURM_JOB_ID\"\n";
  s += "  scontrol requeue \"$SLURM_JOB_ID\"\n";
  s += "  exit 0\n";
  s += "fi\n";
  s += "exit $rc\n";
  return s;
}

}  // namespace tessera::plan
