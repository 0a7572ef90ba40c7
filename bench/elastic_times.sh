#!/usr/bin/env bash
# Elastic training's recovery and steady-state figures on the emulated
# cluster (scripts/cluster.sh: 3 network-namespace hosts, links shaped by tc),
# for docs/performance.md "Elastic". Needs root (namespaces) and a built
# tessera. For each model and link rate:
#   - 3 agents train (--min 2 --max 3); after a few steps host 3's worker is
#     killed with kill -9 (its agent does not restart it): the time from the
#     kill to the first step the 2 survivors complete;
#   - a new agent is started on host 3: the time from its start to the first
#     step completed with it (rendezvous + state transfer + that step);
#   - the steps completed are 1..N with none missing or repeated (no step
#     lost other than the one in flight, which is redone);
#   - steady state: the median elastic step time on 3 workers against the
#     same layout under `tessera launch` (MPI, fixed size), and the per-step
#     store check (rank 0 asks the store whether a worker waits to join).
# Prints one Markdown row per model and rate.
#
#   bash bench/elastic_times.sh [build/rel/tessera] [models] [rates]
#     models: brown gpt2 (default both); rates: 1gbit 10gbit (default both)
#   STEPS=N  steps after the join (default 3)
#   AGENT_TIMEOUT=S  each agent (and the MPI run) is killed after S seconds
#     (default 3600), so a killed script leaves no worker training on
set -uo pipefail
tessera=$(realpath "${1:-build/rel/tessera}")
models=${2:-brown gpt2}
rates=${3:-1gbit 10gbit}
after=${STEPS:-3}
limit=${AGENT_TIMEOUT:-3600}
root=$(cd "$(dirname "$0")/.." && pwd)
cluster=$root/scripts/cluster.sh
data=$(realpath "$root/data/brown")
tmp=$(mktemp -d)
p=eb$$
pids=()
cleanup() { for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null; done; bash "$cluster" down --prefix $p >/dev/null 2>&1; [ -n "${KEEP:-}" ] || rm -rf "$tmp"; }
trap cleanup EXIT
export OMP_NUM_THREADS=1
die() { echo "elastic_times: $*" >&2; tail -n 8 "$tmp"/a*.log >&2; exit 1; }

model_sets() {  # the model's --set flags
  case $1 in
    # The main job's model (configs/brown.toml); 6 micro-batches of 2 x 128
    # tokens a step: 2 per worker on 3, 3 on 2.
    brown) echo "--set train.micro_batch=2 --set train.grad_accum=6 --set train.seq=128" ;;
    # GPT-2 124M shapes; 6 micro-batches of 1 x 64 tokens keep a CPU step short.
    gpt2) echo "--set model.layers=12 --set model.heads=12 --set model.dim=768 --set model.context=1024
                --set train.micro_batch=1 --set train.grad_accum=6 --set train.seq=64" ;;
  esac
}
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
field() { sed -n "s/.*\"$1\":\([-0-9.eE+]*\).*/\1/p"; }
steps_in() { grep -v '"event"' "$1" 2>/dev/null | grep -c '"loss"'; }
wait_for() {  # SECONDS CMD...
  local s=$1; shift
  for _ in $(seq 1 $((s * 20))); do "$@" && return 0; sleep 0.05; done
  return 1
}

echo "| model | link | kill -9 to the survivors' first step | of it after detection | joiner start to its first step | state MB | transfer s | steps lost | elastic step ms (3 workers) | MPI step ms (same layout) | store check ms |"
echo "|---|---|---|---|---|---|---|---|---|---|---|"
for model in $models; do
  for rate in $rates; do
    bash "$cluster" up 3 --rate "$rate" --prefix $p >/dev/null || die "cluster up"
    rm -f "$tmp"/*.jsonl "$tmp"/*.log
    S=(--config "$root/configs/brown.toml" --set "data.train=$data/train_*.bin" --set train.eval_every=0
       --set train.steps=100000 --set parallel.dp=1 --set parallel.timeout=120 $(model_sets "$model"))
    agent() {  # HOST LOG; `timeout` inside the namespace is the agent's parent: it passes the
      # script's kill on (SIGTERM: the agent stops its worker) and ends an agent the script left behind.
      bash "$cluster" exec "$p$1" timeout -k 30 "$limit" "$tessera" elastic --min 2 --max 3 --rdzv "embedded:10.99.0.1:29400" --job bench \
        --last-call 1 --max-restarts 0 -- train "${S[@]}" --set "log.metrics=$tmp/el.jsonl" \
        --set "checkpoint.dir=$tmp/el$1" >"$tmp/$2.log" 2>&1 &
      pids+=($!)
    }
    agent 1 a1; sleep 0.5; agent 2 a2; agent 3 a3
    # Steady state on 3: a few steps.
    wait_for 900 bash -c "[ \$(grep -v '\"event\"' $tmp/el.jsonl 2>/dev/null | grep -c '\"workers\":3') -ge 4 ]" || die "4 steps on 3"
    el_ms=$(grep -v '"event"' "$tmp/el.jsonl" | grep '"workers":3' | tail -n +2 | field step_ms | median)
    store_ms=$(grep -v '"event"' "$tmp/el.jsonl" | field store_ms | median)
    worker=$(grep -o "started worker pid [0-9]*" "$tmp/a3.log" | head -1 | awk '{print $4}')
    n0=$(steps_in "$tmp/el.jsonl")
    t_kill=$(date +%s.%N)
    kill -9 "$worker"
    wait_for 600 bash -c "grep -q '\"event\":\"resumed\"' $tmp/el.jsonl" || die "no resumed step"
    t_res=$(grep '"event":"resumed"' "$tmp/el.jsonl" | head -1 | field time)
    detect=$(grep '"event":"resumed"' "$tmp/el.jsonl" | head -1 | field resume_s)
    # A joiner on host 3.
    n1=$(steps_in "$tmp/el.jsonl")
    # Host 3 joined the first round too: wait for one more such record.
    joins0=$(grep '"event":"membership"' "$tmp/el.jsonl" | grep -c "\"joined\":\[\"${p}3")
    t_start=$(date +%s.%N)
    agent 3 j3
    wait_for 900 bash -c "[ \$(grep '\"event\":\"membership\"' $tmp/el.jsonl | grep -c '\"joined\":\[\"${p}3') -gt $joins0 ]" || die "no join"
    join_line=$(grep '"event":"membership"' "$tmp/el.jsonl" | grep "\"joined\":\[\"${p}3" | tail -1)
    wait_for 900 bash -c "[ \$(grep -v '\"event\"' $tmp/el.jsonl | grep -c '\"loss\"') -ge \$(( $(steps_in "$tmp/el.jsonl") + $after )) ]" ||
      die "no steps after the join"
    # The first step completed after the join.
    t_first=$(awk -v j="$(echo "$join_line" | field time)" '/"loss"/ && !/"event"/ { if (match($0, /"time":[0-9.eE+]+/)) { t = substr($0, RSTART + 7, RLENGTH - 7); if (t + 0 > j + 0) { print t; exit } } }' "$tmp/el.jsonl")
    xfer=$(grep '"event":"state_transfer"' "$tmp/el.jsonl" | tail -1)
    # No step lost: the step numbers are 1..N, each once.
    lost=$(grep -v '"event"' "$tmp/el.jsonl" | grep '"loss"' | field step |
           awk '{ if ($1 != NR) bad++ } END { print bad + 0 }')
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null; done
    wait 2>/dev/null; pids=()
    # The same layout, fixed size: 3 ranks under MPI.
    timeout -k 30 "$limit" "$tessera" launch --netns --tcp-if 10.99.0.0/24 -n 3 --hosts "${p}1:1,${p}2:1,${p}3:1" -- train "${S[@]}" \
      --set parallel.dp=3 --set train.grad_accum=2 \
      --set train.steps=4 --set train.warmup=2 --set "log.metrics=$tmp/mpi.jsonl" --set "checkpoint.dir=$tmp/mpi" >"$tmp/mpi.log" 2>&1 ||
      { grep -m3 "error" "$tmp/mpi.log" >&2; die "the MPI run failed"; }
    mpi_ms=$(grep '"loss"' "$tmp/mpi.jsonl" | tail -n +2 | field step_ms | median)
    bash "$cluster" down --prefix $p >/dev/null
    printf "| %s | %s | %.1f s | %.1f s | %.1f s | %.0f | %.1f | %s | %.0f | %.0f | %.2f |\n" "$model" "$rate" \
      "$(awk -v a="$t_kill" -v b="$t_res" 'BEGIN { print b - a }')" "$detect" \
      "$(awk -v a="$t_start" -v b="$t_first" 'BEGIN { print b - a }')" "$(echo "$xfer" | field mb)" \
      "$(echo "$xfer" | field seconds)" "$lost" "$el_ms" "$mpi_ms" "$store_ms"
  done
done
