#!/usr/bin/env bash
# Training under a real Slurm (issue #32): slurmctld and three slurmd on the
# emulated cluster (scripts/slurm.sh), jobs submitted with sbatch running
# examples/slurm/train.sbatch, ranks started by srun through PMIx.
#  1. A dp=3 x pp=2 job over 3 hosts: COMPLETED, its losses those of one
#     rank (1e-5, 20 steps).
#  2. scancel --signal=USR1 at a random step, five times in a row: each
#     attempt saves a verified checkpoint, exits 75 and requeues; the next
#     resumes from `latest`; every step's loss equals an uninterrupted job's.
#  3. A time limit: --time=1 with --signal=USR1@55; the job checkpoints
#     before the limit, is requeued and finishes with the same losses. A
#     warning that ends every task before its handler (exit 138) requeues.
#  4. Bad input, one line each before a model is built: more tasks than
#     the layout, a layout that does not divide the allocation, no PMI
#     (srun --mpi=none).
#  6. (run before 5) The script `tessera plan --emit-sbatch` writes for
#     examples/clusters/this-machine-netns-1g.toml runs unchanged.
#  8. (before 5) DLRM as an sbatch job on 2 hosts, stopped by USR1,
#     requeued, completed; each attempt checks the planner's prediction.
#  9. (before 5) dp=2 x tp=2 on 2 hosts: its losses those of one rank.
#  7. (after 5) Elastic training: an agent per node by srun; a node killed,
#     the other trains on and the job COMPLETES.
#  5. A node lost (kill -9 of its slurmd and ranks): the job fails within
#     the deadline with a line naming the host; resubmitted without that
#     node on 2 hosts (dp=2, the global batch kept by grad_accum), it
#     resumes from `latest` by resharding and trains as a run of that
#     layout from the same checkpoint.
# Slurm holds a requeued job for two minutes (EligibleTime = requeue + 121
# s); the test releases it with `scontrol update StartTime=now` a second
# after the requeue (in the same second the start fails: "Job credential
# revoked").
set -uo pipefail
tessera=$(readlink -f "$1"); tests=$2
source "$tests/cli/netns_common.inc"  # $root, $cluster; SKIP without namespaces
command -v slurmctld >/dev/null 2>&1 || { echo "SKIP: Slurm is not installed (bash scripts/setup.sh)"; exit 0; }

slurm="$root/scripts/slurm.sh"
job_script="$root/examples/slurm/train.sbatch"
tmp=$(mktemp -d)
p=sl$$
trap 'bash "$cluster" down --prefix $p >/dev/null 2>&1; [ -n "${SLURM_TRAIN_KEEP:-}" ] || rm -rf "$tmp"' EXIT
source "$tests/cli/dp_common.inc"
status=0
fail() { echo "FAIL $*"; status=1; }
bash "$cluster" up 3 --rate 1gbit --prefix $p >/dev/null || { echo "FAIL: cluster up"; exit 1; }
bash "$slurm" up --prefix $p >"$tmp/slurm_up.log" 2>&1 || { echo "FAIL: slurm up"; cat "$tmp/slurm_up.log"; exit 1; }
echo "ok   $(cat "$tmp/slurm_up.log")"
S() { bash "$slurm" run --prefix $p "$@"; }
# submit NAME [sbatch args...] -- [train args...]: prints the job id.
submit() {
  local name=$1; shift
  local sb=() ; while [ $# -gt 0 ] && [ "$1" != -- ]; do sb+=("$1"); shift; done; [ $# -gt 0 ] && shift
  S env TESSERA="${TESSERA_BIN:-$tessera}" CONFIG="$tmp/cfg.toml" LOG_DIR="$tmp/$name" GLOBAL_BATCH=12 MICRO_BATCH=2 \
    ${PP:+PP=$PP} ${TP:+TP=$TP} sbatch --parsable -o "$tmp/$name.out" "${sb[@]}" "$job_script" \
    --set "checkpoint.dir=$tmp/$name/ck" --set checkpoint.every=100000 "$@"
}
field() { S scontrol show job "$1" 2>/dev/null | tr ' ' '\n' | sed -n "s/^$2=//p" | head -1; }
# wait_state JOB SECONDS STATE...: until the job is in one of the states.
declare -A released  # job -> the restart count whose hold was released
wait_state() {
  local job=$1 secs=$2 st want; shift 2
  for _ in $(seq $((secs * 5))); do
    st=$(field "$job" JobState)
    for want in "$@"; do [ "$st" = "$want" ] && return 0; done
    # A requeued job is held two minutes: release it, once per requeue and
    # a second after it (a start in the second of the requeue fails: "Job
    # credential revoked", as the old attempt's credentials are revoked by
    # time). StartTime=now, not now+N: the update itself runs the scheduler.
    if [ "$st" = PENDING ] && [ "$(field "$job" Reason)" = BeginTime ]; then
      local r; r=$(field "$job" Restarts)
      if [ "${released[$job]:-}" != "$r" ]; then
        sleep 1.1
        S scontrol update JobId="$job" StartTime=now >/dev/null 2>&1 && released[$job]=$r
      fi
    fi
    sleep 0.2
  done
  echo "(job $job is $st after ${secs}s, want $*)"; return 1
}
# all_losses NAME: every step's loss of every attempt, in attempt order.
all_losses() { local f; for f in $(ls "$tmp/$1"/metrics.*.jsonl 2>/dev/null | sort -t. -k3,3n); do losses "$f"; done; }
steps_of() { local n; n=$(grep -c '"loss"' "$1" 2>/dev/null); echo "${n:-0}"; }
# SLURM_TRAIN_ONLY=N (a section number below) runs section 1 and that one.
only() { [ -z "${SLURM_TRAIN_ONLY:-}" ] || [ "$SLURM_TRAIN_ONLY" = "$1" ]; }

# --- 1. dp=3 x pp=2 over 3 hosts, 20 steps, against one rank.
"$tessera" train --config "$tmp/cfg.toml" --set train.steps=20 --set train.micro_batch=2 --set train.grad_accum=6 \
  --set "log.metrics=$tmp/ref.jsonl" --set "checkpoint.dir=$tmp/ref" >"$tmp/ref.log" 2>&1 || { fail "one-rank run"; tail -3 "$tmp/ref.log"; }
t0=$(date +%s.%N)
job=$(PP=2 submit whole -N3 --ntasks-per-node=2 -- --set train.steps=20 --set "log.profile=$root/docs/profiles/tessera-dev-epyc-2core.json")
if wait_state "$job" 120 COMPLETED FAILED CANCELLED TIMEOUT NODE_FAIL && [ "$(field "$job" JobState)" = COMPLETED ]; then
  echo "ok   job $job (dp=3 x pp=2 on $(field "$job" NodeList)) COMPLETED in $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }') s, exit $(field "$job" ExitCode)"
else fail "job $job: $(field "$job" JobState)"; tail -5 "$tmp/whole.out"; fi
# Every run checks the planner (issue #32 item 7): predicted at start-up,
# measured beside it at the end.
if grep -q '^plan: predicted step' "$tmp/whole.out" && grep -q '^plan check: step' "$tmp/whole.out"; then
  echo "ok   $(grep -m1 '^plan check:' "$tmp/whole.out")"
else fail "job $job: no planner prediction and check"; grep '^plan' "$tmp/whole.out"; fi
grep -q "layout: dp=3 tp=1 pp=2" "$tmp/whole.out" || fail "job $job did not run as dp=3 x pp=2: $(grep -m1 layout "$tmp/whole.out")"
paste <(losses "$tmp/ref.jsonl") <(all_losses whole) | awk '
  { n++; d = $1 - $2; if (d < 0) d = -d; r = d / $1; if (r > w) w = r; if (r > 1e-5) bad = 1 }
  END { if (n != 20 || bad) { printf "FAIL sbatch dp=3 x pp=2 vs one rank: %d steps, worst %.2e\n", n, w; exit 1 }
        printf "ok   sbatch dp=3 x pp=2 over 3 hosts vs one rank: 20 steps, worst relative difference %.2e\n", w }' || status=1

if only 2 || only 3; then
# Steps for the runs that are stopped (dp=3, one rank per host): about 40 s
# of training here (the time limit's signal comes up to 30 s into a job),
# 2000 at least, from a 300-step job's step time.
job=$(submit cal -N3 --ntasks-per-node=1 -- --set train.steps=300)
wait_state "$job" 120 COMPLETED FAILED CANCELLED TIMEOUT >/dev/null || fail "calibration job"
step_ms=$(grep '"step_ms"' "$tmp"/cal/metrics.*.jsonl | tail -200 | sed 's/.*"step_ms":\([0-9.eE+-]*\).*/\1/' | sort -g | awk '{ v[NR] = $1 } END { print (NR ? v[int((NR + 1) / 2)] : 10) }')
steps=$(awk -v ms="$step_ms" 'BEGIN { n = int(40000 / ms); if (n < 2000) n = 2000; if (n > 40000) n = 40000; print n }')
echo "     stopped runs: $steps steps (${step_ms} ms a step, dp=3 under Slurm)"
long=(--set "train.steps=$steps" --set train.warmup=2)
# The uninterrupted job the stopped ones must equal, step for step.
job=$(submit full -N3 --ntasks-per-node=1 -- "${long[@]}")
wait_state "$job" 300 COMPLETED FAILED CANCELLED TIMEOUT || fail "uninterrupted job"
[ "$(steps_of "$(ls "$tmp"/full/metrics.*.jsonl | head -1)")" = "$steps" ] || fail "uninterrupted job: $(field "$job" JobState), not $steps steps"

fi

if only 2; then
# --- 2. scancel --signal=USR1 at random steps, five times in a row.
job=$(submit sig -N3 --ntasks-per-node=1 -- "${long[@]}")
for k in 0 1 2 3 4; do
  f="$tmp/sig/metrics.$job.$k.jsonl"
  want=$((RANDOM % 40 + 5))  # steps of this attempt before the signal
  for _ in $(seq 600); do [ "$(steps_of "$f")" -ge $want ] && break; sleep 0.1; done
  S scancel --signal=USR1 "$job"
  for _ in $(seq 300); do [ "$(field "$job" Restarts)" -gt $k ] 2>/dev/null && break; sleep 0.2; done
  [ "$(field "$job" Restarts)" -gt $k ] 2>/dev/null || { fail "signal $((k + 1)): job $job was not requeued ($(field "$job" JobState))"; tail -5 "$tmp/sig.out"; break; }
  wait_state "$job" 60 RUNNING COMPLETED >/dev/null || true
done
wait_state "$job" 300 COMPLETED FAILED CANCELLED TIMEOUT || true
stops=$(grep -c "published and verified" "$tmp/sig.out")
resumes=$(grep -c "^resumed from .*step-" "$tmp/sig.out")
if [ "$(field "$job" JobState)" = COMPLETED ] && [ "$stops" = 5 ] && [ "$resumes" = 5 ] && cmp -s <(all_losses full) <(all_losses sig); then
  echo "ok   5 x scancel --signal=USR1: 5 verified checkpoints ($(grep -o 'stopped by SIGUSR1 after step [0-9]*' "$tmp/sig.out" | awk '{print $NF}' | paste -sd,)), 5 requeues, $steps losses identical to the uninterrupted job"
  echo "     $(grep -m1 'published and verified' "$tmp/sig.out")"
else
  fail "5 x USR1: job $(field "$job" JobState), $stops verified stops, $resumes resumes, losses $(all_losses sig | wc -l) vs $(all_losses full | wc -l)"
  cmp <(all_losses full) <(all_losses sig) | head -2; grep -E "error|stopped|resumed" "$tmp/sig.out" | head -20
fi
fi

if only 3; then
# --- 3. A time limit, the signal asked for before it.
job=$(submit limit -N3 --ntasks-per-node=1 --time=1 --signal=USR1@55 -- "${long[@]}")
wait_state "$job" 400 COMPLETED FAILED CANCELLED TIMEOUT || true
if [ "$(field "$job" JobState)" = COMPLETED ] && [ "$(field "$job" Restarts)" -ge 1 ] && cmp -s <(all_losses full) <(all_losses limit); then
  echo "ok   --time=1 --signal=USR1@55: $(field "$job" Restarts) requeue(s) before the limit, $steps losses identical to the uninterrupted job"
else
  fail "time limit: job $(field "$job" JobState), $(field "$job" Restarts) restarts, losses $(all_losses limit | wc -l) of $steps"
  grep -E "error|stopped|resumed|CANCELLED|TIME" "$tmp/limit.out" | head -10
fi
# The warning before a task has its handler (Slurm may send it up to a
# minute early): every task of the first attempt ends by SIGUSR1 before
# `tessera train` starts; srun answers 138, the script requeues, the next
# attempt trains to the end.
printf '#!/bin/bash\n[ "${SLURM_RESTART_COUNT:-0}" = 0 ] && kill -USR1 $$\nexec %q "$@"\n' "$tessera" >"$tmp/early.sh"
chmod +x "$tmp/early.sh"
job=$(TESSERA_BIN="$tmp/early.sh" submit early -N3 --ntasks-per-node=1 -- --set train.steps=20)
wait_state "$job" 300 COMPLETED FAILED CANCELLED TIMEOUT || true
if [ "$(field "$job" JobState)" = COMPLETED ] && [ "$(field "$job" Restarts)" = 1 ] &&
   grep -q "SIGUSR1 ended a task before it could stop cleanly" "$tmp/early.out" && [ "$(all_losses early | wc -l)" = 20 ]; then
  echo "ok   SIGUSR1 before the handler: attempt 0 ended by it (srun 138), requeued, attempt 1 trained 20 steps, COMPLETED"
else
  fail "SIGUSR1 before the handler: job $(field "$job" JobState), $(field "$job" Restarts) restarts, $(all_losses early | wc -l) losses"
  tail -5 "$tmp/early.out"
fi
fi

if only 4; then
# --- 4. Bad input: one line each, before a model is built.
bad() {  # bad NAME WANT sbatch-args... -- train args...
  local name=$1 want=$2; shift 2
  local job; job=$(PP=2 submit "$name" "$@")
  wait_state "$job" 120 COMPLETED FAILED CANCELLED TIMEOUT >/dev/null || true
  local lines; lines=$(grep -cE '^(tessera|train.sbatch): error' "$tmp/$name.out")
  local st; st=$(field "$job" JobState)
  if [ "$st" = FAILED ] && grep -q -- "$want" "$tmp/$name.out" && [ "$lines" = 1 ] && ! grep -q '^model:' "$tmp/$name.out"; then
    echo "ok   $name: $(grep -m1 error "$tmp/$name.out" | cut -c1-220)"
  else fail "$name: job $st, $lines error line(s)"; cat "$tmp/$name.out" | head -10; fi
}
bad too_many "rank(s) are running" -N3 --ntasks-per-node=2 -- --set parallel.dp=2
bad no_fit "do not split into" -N3 --ntasks-per-node=1 --
# No PMI: a job script of its own, srun --mpi=none.
job=$(S sbatch --parsable -N2 --ntasks-per-node=1 -o "$tmp/no_pmi.out" --wrap "srun --mpi=none $tessera train --config $tmp/cfg.toml --set parallel.dp=2 --set checkpoint.dir=$tmp/no_pmi")
wait_state "$job" 120 COMPLETED FAILED CANCELLED TIMEOUT >/dev/null || true
lines=$(grep -cE '^tessera: error' "$tmp/no_pmi.out")
if [ "$(field "$job" JobState)" = FAILED ] && [ "$lines" = 1 ] && grep -q "without PMI" "$tmp/no_pmi.out"; then
  echo "ok   no_pmi: $(grep -m1 '^tessera: error' "$tmp/no_pmi.out" | cut -c1-220)"
else fail "no_pmi: job $(field "$job" JobState), $lines error line(s)"; head -10 "$tmp/no_pmi.out"; fi
fi

# --- 6. The planner's job script, submitted unchanged.
if only 6; then
"$tessera" plan --layers 2 --heads 2 --dim 32 --vocab 256 --seq 32 --global-batch 12 --tokens 40000 \
  --checkpoint-every 20 --cluster "$root/examples/clusters/this-machine-netns-1g.toml" --train-config "$tmp/cfg.toml" \
  --emit-sbatch "$tmp/plan.sbatch" >"$tmp/plan.out" 2>&1 || { fail "plan --emit-sbatch:"; tail -3 "$tmp/plan.out"; }
mkdir -p "$tmp/planned"
job=$(S env TESSERA="$tessera" sbatch --parsable --chdir="$tmp/planned" "$tmp/plan.sbatch" --set "checkpoint.dir=$tmp/planned/ck")
wait_state "$job" 120 COMPLETED FAILED CANCELLED TIMEOUT >/dev/null || true
out="$tmp/planned/tessera-train-$job.out"
layout=$(grep -m1 '^layout:' "$out" 2>/dev/null)
if [ "$(field "$job" JobState)" = COMPLETED ] && [ -n "$layout" ] && [ "$(steps_of "$tmp/planned/metrics.$job.0.jsonl")" -gt 0 ]; then
  echo "ok   plan --emit-sbatch (this-machine-netns-1g.toml): job $job COMPLETED unchanged on $(field "$job" NodeList): $(grep -m1 '^#   dp=' "$tmp/plan.sbatch" | cut -c5-60); $layout"
else fail "plan --emit-sbatch job $job: $(field "$job" JobState)"; tail -5 "$out" 2>/dev/null; fi
fi

# --- 8. DLRM as an sbatch job (examples/slurm/dlrm.sbatch) on 2 hosts, the
# tables split by rows; stopped once by USR1, requeued, completed.
if only 8; then
mkdir -p "$tmp/dlrm"
( cd "$tmp/dlrm" &&
  "$tessera" synth clicks --rows 6000 --tables 5 --cardinality 40 --crosses 0 --out c.tsv >/dev/null &&
  "$tessera" prepare --format criteo --tables 5 --hash-size 300 --input c.tsv --out s >/dev/null ) || fail "dlrm data"
cat >"$tmp/dlrm/cfg.toml" <<EOF
[model]
kind = "dlrm"
embedding_dim = 8
bottom = [16, 8]
top = [16]
[data]
train = "$tmp/dlrm/s/train.bin"
val = "$tmp/dlrm/s/val.bin"
[train]
batch = 64
steps = 3000
seed = 5
eval_every = 0
[checkpoint]
every = 1000
dir = "$tmp/dlrm/ck"
[log]
every = 1
profile = "$root/docs/profiles/tessera-dev-epyc-2core.json"
EOF
job=$(S env TESSERA="$tessera" CONFIG="$tmp/dlrm/cfg.toml" PLACEMENT=row LOG_DIR="$tmp/dlrm" sbatch --parsable -N2 \
  --exclude=${p}3 -o "$tmp/dlrm.out" "$root/examples/slurm/dlrm.sbatch")
for _ in $(seq 600); do [ "$(steps_of "$tmp/dlrm/metrics.$job.0.jsonl")" -ge 20 ] && break; sleep 0.1; done
S scancel --signal=USR1 "$job"
wait_state "$job" 180 COMPLETED FAILED CANCELLED TIMEOUT >/dev/null || true
done_steps=$(cat "$tmp"/dlrm/metrics.$job.*.jsonl 2>/dev/null | grep '"loss"' | grep -o '"step":[0-9]*' | sort -u | wc -l)
if [ "$(field "$job" JobState)" = COMPLETED ] && [ "$(field "$job" Restarts)" = 1 ] && [ "$done_steps" = 3000 ] &&
   grep -q "published and verified" "$tmp/dlrm.out"; then
  echo "ok   DLRM job $job on 2 hosts (row placement): $(grep -o 'stopped by SIGUSR1 after step [0-9]*' "$tmp/dlrm.out"), requeued, all 3000 steps, COMPLETED"
else fail "DLRM under Slurm: job $(field "$job" JobState), $(field "$job" Restarts) restarts, $done_steps of 3000 steps"; grep -vE '^step' "$tmp/dlrm.out" | tail -8; fi
# Both attempts checked the planner, the first at its signal stop.
if [ "$(grep -c '^plan: predicted step .* row-wise placement' "$tmp/dlrm.out")" = 2 ] &&
   [ "$(grep -c '^plan check: step' "$tmp/dlrm.out")" = 2 ]; then
  echo "ok   DLRM $(grep '^plan check:' "$tmp/dlrm.out" | tail -1)"
else fail "DLRM under Slurm: no planner prediction and check in each attempt"; grep '^plan' "$tmp/dlrm.out"; fi
fi

# --- 9. Tensor parallelism under Slurm: tp=2 inside each of 2 hosts (srun's
# block distribution puts consecutive ranks on a host, and tp is the
# innermost dimension of the mesh), dp=2 across them; against one rank.
if only 9; then
job=$(TP=2 submit tp -N2 --ntasks-per-node=2 --exclude=${p}3 -- --set train.steps=20)
if wait_state "$job" 180 COMPLETED FAILED CANCELLED TIMEOUT NODE_FAIL && [ "$(field "$job" JobState)" = COMPLETED ] &&
   grep -q "layout: dp=2 tp=2 pp=1" "$tmp/tp.out"; then
  paste <(losses "$tmp/ref.jsonl") <(all_losses tp) | awk '
    { n++; d = $1 - $2; if (d < 0) d = -d; r = d / $1; if (r > w) w = r; if (r > 1e-5) bad = 1 }
    END { if (n != 20 || bad) { printf "FAIL sbatch dp=2 x tp=2 vs one rank: %d steps, worst %.2e\n", n, w; exit 1 }
          printf "ok   sbatch dp=2 x tp=2 over 2 hosts vs one rank: 20 steps, worst relative difference %.2e\n", w }' || status=1
else fail "tp job $job: $(field "$job" JobState), $(grep -m1 layout "$tmp/tp.out")"; tail -5 "$tmp/tp.out"; fi
fi

if only 5; then
# --- 5. A node lost mid-job, then the job again without it.
lost=(--set train.steps=900 --set train.warmup=2 --set checkpoint.every=200)
job=$(PP=2 submit lost -N3 --ntasks-per-node=2 --no-requeue -- "${lost[@]}" --set parallel.timeout=5)
f="$tmp/lost/metrics.$job.0.jsonl"
for _ in $(seq 900); do [ "$(steps_of "$f")" -ge 450 ] && break; sleep 0.1; done
t0=$(date +%s)
bash "$slurm" kill-node ${p}3 >/dev/null
wait_state "$job" 90 FAILED NODE_FAIL CANCELLED COMPLETED >/dev/null || true
took=$(( $(date +%s) - t0 ))
st=$(field "$job" JobState)
# The lost host named: by a rank's timeout ("... waiting on peers [5] on
# host H"), or, when a rank's write to it failed first, by OpenMPI's TCP
# transport ("... to: H Error: ... writev failed: Broken pipe").
named="on host ${p}3|to: ${p}3 "
if [ "$st" != COMPLETED ] && [ $took -le 60 ] && grep -qE "$named" "$tmp/lost.out"; then
  echo "ok   node ${p}3 killed: job $st after ${took} s: $(grep -m1 -E "$named" "$tmp/lost.out" | cut -c1-200)"
else fail "node loss: job $st after ${took} s"; grep -i error "$tmp/lost.out" | head -5; fi
ck=$(cat "$tmp/lost/ck/latest" 2>/dev/null)
cp -r "$tmp/lost/ck" "$tmp/lost_ck_copy"
rm -f "$tmp/lost_ck_copy/LOCK"* 2>/dev/null
job=$(PP=2 submit lost -N2 --ntasks-per-node=2 --exclude=${p}3 -- "${lost[@]}")
wait_state "$job" 300 COMPLETED FAILED CANCELLED TIMEOUT || true
# The same layout from a copy of the same checkpoint, with mpirun on this host.
mpirun_np 4 "$tessera" train --config "$tmp/cfg.toml" "${lost[@]}" --set train.micro_batch=2 --set train.grad_accum=3 \
  --set parallel.dp=2 --set parallel.pp=2 --set "checkpoint.dir=$tmp/lost_ck_copy" \
  --set "log.metrics=$tmp/lost_ref.jsonl" --resume latest >"$tmp/lost_ref.log" 2>&1 || fail "node loss: the reference resume"
if [ "$(field "$job" JobState)" = COMPLETED ] && grep -q "resumed from .*$ck" "$tmp/lost.out" && grep -q "layout: dp=2 tp=1 pp=2" "$tmp/lost.out" &&
   cmp -s <(losses "$tmp/lost_ref.jsonl") <(losses "$tmp/lost/metrics.$job.0.jsonl"); then
  echo "ok   without ${p}3: job $job resumed from $ck as dp=2 x pp=2 (grad_accum 3, the global batch kept), $(steps_of "$tmp/lost_ref.jsonl") losses identical to that layout's resume"
else
  fail "resume without the lost node: job $(field "$job" JobState)"; grep -E "error|resumed|layout" "$tmp/lost.out" | tail -5
fi
fi
# --- 7. Elastic under Slurm: an agent per node (examples/slurm/elastic.sbatch),
# one node killed, the other trains on to the end.
if only 7; then
job=$(S env TESSERA="$tessera" CONFIG="$tmp/cfg.toml" sbatch --parsable -N2 --exclude=${p}3 -o "$tmp/elastic.out" \
  "$root/examples/slurm/elastic.sbatch" --set train.steps=1500 --set train.micro_batch=2 --set train.grad_accum=6 \
  --set checkpoint.every=500 --set "checkpoint.dir=$tmp/elastic" --set "log.metrics=$tmp/elastic.jsonl")
for _ in $(seq 600); do [ "$(steps_of "$tmp/elastic.jsonl")" -ge 200 ] && break; sleep 0.1; done
bash "$slurm" kill-node ${p}2 >/dev/null
wait_state "$job" 180 COMPLETED FAILED CANCELLED TIMEOUT NODE_FAIL >/dev/null || true
done_steps=$(grep '"loss"' "$tmp/elastic.jsonl" | grep -o '"step":[0-9]*' | sort -u | wc -l)
if [ "$(field "$job" JobState)" = COMPLETED ] && [ "$done_steps" = 1500 ] && [ -f "$tmp/elastic/model.safetensors" ] &&
   grep -q "1 worker(s) (was 2) at step .*left: ${p}2" "$tmp/elastic.out"; then
  echo "ok   elastic job $job: ${p}2 killed, $(grep -m1 'resumed: step' "$tmp/elastic.out" | sed 's/^elastic: //'); all 1500 steps, COMPLETED"
else fail "elastic under Slurm: job $(field "$job" JobState), $done_steps of 1500 steps"; grep -v '^step' "$tmp/elastic.out" | tail -8; fi
fi

exit $status
