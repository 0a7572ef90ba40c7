#!/usr/bin/env bash
# Issue #32, "Measure" (docs/performance.md, "Under Slurm"): on a 2-host
# emulated cluster with a real Slurm (scripts/slurm.sh), GPT-2 124M (byte
# data, T=64, one sequence per rank, dp=2):
#  - submit (or launch) to the first finished step, ROUNDS times each,
#    alternated: `sbatch` of examples/slurm/train.sbatch (srun, PMIx) against
#    `tessera launch --netns` (mpirun over the namespace agent);
#  - the time from `scancel --signal=USR1` to a published and verified
#    checkpoint, ROUNDS times.
# The first step is the first line of the metrics file (flushed per step;
# the console is buffered when it is a file). Needs root.
#   bench/slurm_start.sh [ROUNDS=3]
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
tessera=$root/build/release/tessera
rounds=${1:-3}
tmp=$(mktemp -d)
tests=$root/tests
p=bs$$
trap 'bash scripts/cluster.sh down --prefix $p >/dev/null 2>&1; rm -rf "$tmp"' EXIT
source tests/cli/dp_common.inc   # $tmp/cfg.toml and byte-level data
bash scripts/cluster.sh up 2 --rate 10gbit --prefix $p >/dev/null
bash scripts/slurm.sh up --prefix $p >/dev/null
S() { bash scripts/slurm.sh run --prefix $p "$@"; }
gpt2=(--set model.layers=12 --set model.heads=12 --set model.dim=768 --set model.vocab=50257 --set model.context=64
      --set train.seq=64 --set train.micro_batch=1 --set train.grad_accum=1 --set train.eval_every=0)
now() { date +%s.%N; }
first_step() {  # first_step FILE START: seconds from START to FILE's first step
  for _ in $(seq 6000); do grep -q '"loss"' "$1" 2>/dev/null && break; sleep 0.05; done
  awk -v a="$2" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }'
}
field() { S scontrol show job "$1" | tr ' ' '\n' | sed -n "s/^$2=//p" | head -1; }
wait_done() { for _ in $(seq 1200); do case $(field "$1" JobState) in COMPLETED|FAILED|CANCELLED|TIMEOUT) return;; esac; sleep 0.2; done; }
: >"$tmp/times.tsv"
for r in $(seq 1 "$rounds"); do
  t0=$(now)
  job=$(S env TESSERA="$tessera" CONFIG="$tmp/cfg.toml" LOG_DIR="$tmp/s$r" sbatch --parsable -N2 -o "$tmp/s$r.out" \
    examples/slurm/train.sbatch "${gpt2[@]}" --set train.steps=2 --set "checkpoint.dir=$tmp/s$r/ck")
  echo -e "sbatch\t$(first_step "$tmp/s$r/metrics.$job.0.jsonl" "$t0")" | tee -a "$tmp/times.tsv"
  wait_done "$job"
  t0=$(now)
  "$tessera" launch --netns --tcp-if 10.99.0.0/24 -n 2 --hosts "${p}1:1,${p}2:1" -- train --config "$tmp/cfg.toml" \
    "${gpt2[@]}" --set parallel.dp=2 --set train.steps=2 --set "log.metrics=$tmp/l$r.jsonl" \
    --set "checkpoint.dir=$tmp/l$r" >"$tmp/l$r.out" 2>&1 &
  pid=$!
  echo -e "launch\t$(first_step "$tmp/l$r.jsonl" "$t0")" | tee -a "$tmp/times.tsv"
  wait $pid
done
for r in $(seq 1 "$rounds"); do
  job=$(S env TESSERA="$tessera" CONFIG="$tmp/cfg.toml" LOG_DIR="$tmp/g$r" sbatch --parsable -N2 --no-requeue \
    -o "$tmp/g$r.out" examples/slurm/train.sbatch "${gpt2[@]}" --set train.steps=1000 --set checkpoint.every=1000 \
    --set "checkpoint.dir=$tmp/g$r/ck")
  first_step "$tmp/g$r/metrics.$job.0.jsonl" "$(now)" >/dev/null
  sleep 1
  S scancel --signal=USR1 "$job"
  wait_done "$job"
  line=$(grep -m1 'published and verified' "$tmp/g$r.out" || echo "no verified checkpoint")
  echo -e "signal\t$(echo "$line" | sed -n 's/.*(\([0-9.]*\) s after the signal).*/\1/p')\t$(echo "$line" | sed -n 's/.*verified in \([0-9.]*\) s.*/\1/p')" | tee -a "$tmp/times.tsv"
  grep -m1 'checkpoint step .* published' "$tmp/g$r.out" || true
done
python3 - "$tmp/times.tsv" <<'PY'
import statistics, sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
for kind, what in (("sbatch", "sbatch to first step (s)"), ("launch", "tessera launch to first step (s)"),
                   ("signal", "USR1 to verified checkpoint (s)")):
    xs = [float(r[1]) for r in rows if r[0] == kind and r[1]]
    if xs: print(f"{what:36} median {statistics.median(xs):6.2f}  runs {', '.join(f'{x:.2f}' for x in xs)}")
    if kind == "signal":
        ys = [float(r[2]) for r in rows if r[0] == kind and len(r) > 2 and r[2]]
        if ys: print(f"{'  of which the save and its check (s)':36} median {statistics.median(ys):6.2f}")
PY
