#!/usr/bin/env bash
# Throughput and step breakdown of GPT-2 124M shapes (L=12, NH=12, C=768,
# V=50257) trained under different dp x tp x pp layouts on this machine, one
# thread per rank, and the pipeline bubble against theory for m = 4, 8, 16
# micro-batches. Prints a Markdown table (docs/performance.md).
#
#   bash bench/mesh_layouts.sh [build/release/tessera] [steps]
#
# Each row is the median over steps 2..N of the metrics (the first step warms
# up the caches). Uses data/brown (bash scripts/main-job.sh prepares it) or
# any token shard given as DATA=glob.
set -euo pipefail
tessera=${1:-build/release/tessera}
steps=${2:-4}
data=${DATA:-data/brown/train_*.bin}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
cat >"$tmp/cfg.toml" <<TOML
[model]
layers = 12
heads = 12
dim = 768
vocab = 50257
context = 1024
[data]
train = "$data"
[train]
micro_batch = 1
seq = 128
steps = $steps
eval_every = 0
[parallel]
timeout = 600
TOML

# median FILE FIELD: median over steps 2..N.
median() { grep '"loss"' "$1" | tail -n +2 | sed "s/.*\"$2\":\([-0-9.eE+]*\).*/\1/" | sort -g |
           awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

echo "| layout | m | tokens/s | step ms | compute ms | comm ms | bubble ms | p2p ms | bubble / (step - bubble) | (p-1)/m |"
echo "|---|---|---|---|---|---|---|---|---|---|"
row() {  # DP TP PP M [extra --set ...]
  local dp=$1 tp=$2 pp=$3 m=$4; shift 4
  local n=$((dp * tp * pp)) extra=()
  for s in "$@"; do extra+=(--set "$s"); done
  mpirun --allow-run-as-root --oversubscribe --bind-to none -np $n -x OMP_NUM_THREADS=1 \
    "$tessera" train --config "$tmp/cfg.toml" --set parallel.dp=$dp --set parallel.tp=$tp --set parallel.pp=$pp \
    --set train.grad_accum=$m --set "log.metrics=$tmp/m.jsonl" --set "checkpoint.dir=$tmp/ckpt" "${extra[@]}" \
    >"$tmp/log" 2>&1 || { cat "$tmp/log" >&2; exit 1; }
  local step bubble
  step=$(median "$tmp/m.jsonl" step_ms); bubble=$(median "$tmp/m.jsonl" bubble_ms)
  printf "| dp=%d tp=%d pp=%d%s | %d | %.0f | %.0f | %.0f | %.0f | %.0f | %.0f | %s | %s |\n" $dp $tp $pp \
    "${*:+ ($*)}" $m "$(median "$tmp/m.jsonl" tokens_per_s)" "$step" "$(median "$tmp/m.jsonl" compute_ms)" \
    "$(median "$tmp/m.jsonl" comm_ms)" "$bubble" "$(median "$tmp/m.jsonl" p2p_ms)" \
    "$(awk -v b="$bubble" -v s="$step" -v p=$pp 'BEGIN { if (p > 1) printf "%.3f", b / (s - b); else print "-" }')" \
    "$(awk -v p=$pp -v m=$m 'BEGIN { if (p > 1) printf "%.3f", (p - 1) / m; else print "-" }')"
}
row 1 1 1 4
row 2 1 1 2
row 1 2 1 4
for m in 4 8 16; do row 1 1 2 $m; done
row 1 1 2 8 parallel.schedule=gpipe
# The last stage also runs the output layer (V=50257 x C=768, about five
# layers' work at T=128): move layers to the first stage to balance.
for m in 4 8 16; do row 1 1 2 $m parallel.stages=9,3; done
