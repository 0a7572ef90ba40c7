#!/usr/bin/env bash
# Measures the step times of the training runs that docs/planner.md uses to
# validate `tessera plan` on this machine. One line per run on stdout:
#   NAME<TAB>median step_ms<TAB>min<TAB>max<TAB>load average before<TAB>1-thread GEMM GFLOP/s (512^3)
#   before<TAB>CPU-time step ms (see below)
# (median of the steps after the first two, from the run's metrics file).
# Every rank runs one thread: on a machine shared with other jobs, OpenMP
# barriers over 2 threads turn its load into 5-20x slower steps.
# Usage: scripts/plan-measure.sh TESSERA [NAME...]   (no names: every run)
# The emulated-cluster runs need root (scripts/cluster.sh, prefix "plan").
set -uo pipefail
tessera=$(readlink -f "$1"); shift
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
tmp=$(mktemp -d)
trap 'bash scripts/cluster.sh down --prefix plan >/dev/null 2>&1; rm -rf "$tmp"' EXIT
steps=${PLAN_STEPS:-8}
S="--set model.layers=4 --set model.heads=4 --set model.dim=256"
M="--set model.layers=6 --set model.heads=8 --set model.dim=512"
G="--set model.layers=12 --set model.heads=12 --set model.dim=768 --set train.seq=64"
runs=(
  "s1      1 - $S --set train.micro_batch=8"
  "s1b16   1 - $S --set train.micro_batch=16"
  "m1      1 - $M --set train.micro_batch=8"
  "g1      1 - $G --set train.micro_batch=4"
  "s_dp2   2 - $S --set train.micro_batch=8 --set parallel.dp=2"
  "s_dp4   4 - $S --set train.micro_batch=4 --set parallel.dp=4"
  "s_tp2   2 - $S --set train.micro_batch=8 --set parallel.tp=2"
  "s_pp2   2 - $S --set train.micro_batch=4 --set train.grad_accum=4 --set parallel.pp=2"
  "s_pp2m8 2 - $S --set train.micro_batch=2 --set train.grad_accum=8 --set parallel.pp=2"
  "s_dp2pp2 4 - $S --set train.micro_batch=4 --set train.grad_accum=4 --set parallel.dp=2 --set parallel.pp=2"
  "m_tp2   2 - $M --set train.micro_batch=8 --set parallel.tp=2"
  "g_dp2   2 - $G --set train.micro_batch=4 --set parallel.dp=2"
  "s_dp2_1g  2 1gbit $S --set train.micro_batch=8 --set parallel.dp=2"
  "s_dp2_10g 2 10gbit $S --set train.micro_batch=8 --set parallel.dp=2"
  "m_dp2_1g  2 1gbit $M --set train.micro_batch=8 --set parallel.dp=2"
)
want=" $* "
cur_rate=""
for r in "${runs[@]}"; do
  read -r name ranks rate rest <<<"$r"
  [ $# -gt 0 ] && [[ "$want" != *" $name "* ]] && continue
  common="--config configs/brown.toml --set train.eval_every=0 --set train.eval_batches=1 --set train.warmup=0"
  load=$(cut -d' ' -f1 /proc/loadavg)
  # The one-thread GEMM rate just before the run: how much of a core the
  # machine's load leaves, recorded beside the result.
  ref=$(OMP_NUM_THREADS=1 "$tessera" bench gemm --dtype fp32 --sizes 512 --iters 5 2>/dev/null | sed -n 's/.*"peak_gflops": *\([0-9.]*\).*/\1/p')
  if [ "$rate" != - ] && [ "$cur_rate" != "$rate" ]; then
    bash scripts/cluster.sh down --prefix plan >/dev/null 2>&1
    bash scripts/cluster.sh up "$ranks" --rate "$rate" --prefix plan >/dev/null || { echo "cluster up failed" >&2; continue; }
    cur_rate=$rate
  fi
  # run STEPS: the job under /usr/bin/time (user + system seconds of every
  # rank, which are mpirun's descendants) into $tmp/$name.$STEPS.*
  run() {
    local n=$1 c="$common --set train.steps=$1 --set log.metrics=$tmp/$name.$1.jsonl --set checkpoint.dir=$tmp/$name.$1"
    if [ "$rate" != - ]; then
      hosts=$(seq -s, -f "plan%g:1" 1 "$ranks")
      /usr/bin/time -f "%U %S" -o "$tmp/$name.$n.cpu" "$tessera" launch -n "$ranks" --threads 1 --netns --hosts "$hosts" --tcp-if 10.99.0.0/24 -- train $c $rest
    elif [ "$ranks" = 1 ]; then
      OMP_NUM_THREADS=1 /usr/bin/time -f "%U %S" -o "$tmp/$name.$n.cpu" "$tessera" train $c $rest
    else
      /usr/bin/time -f "%U %S" -o "$tmp/$name.$n.cpu" "$tessera" launch -n "$ranks" --threads 1 -- train $c $rest
    fi >"$tmp/$name.$n.log" 2>&1
  }
  run 2 || { echo "$name failed: $(tail -2 "$tmp/$name.2.log")" >&2; continue; }
  run "$steps" || { echo "$name failed: $(tail -2 "$tmp/$name.$steps.log")" >&2; continue; }
  # CPU seconds per rank and step, from the difference of the two runs (the
  # start-up and the evaluations cancel), times ranks per core when ranks
  # outnumber the 2 cores: the step a quiet machine would take.
  cpu=$(awk -v a="$(cat "$tmp/$name.2.cpu" | tail -1)" -v b="$(cat "$tmp/$name.$steps.cpu" | tail -1)" -v n="$steps" -v r="$ranks" -v cores="$(nproc)" \
    'BEGIN { split(a, x, " "); split(b, y, " "); c = (y[1] + y[2] - x[1] - x[2]) / (n - 2) / r * 1e3; print c * (r > cores ? r / cores : 1) }')
  grep '"step_ms"' "$tmp/$name.$steps.jsonl" | sed 's/.*"step_ms": *\([0-9.e+-]*\).*/\1/' | tail -n +3 | sort -g |
    awk -v n="$name" -v l="$load" -v r="$ref" -v c="$cpu" '{a[NR]=$1} END {m = (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2; printf "%s\t%.1f\t%.1f\t%.1f\t%s\t%s\t%.1f\n", n, m, a[1], a[NR], l, r, c}'
done
