#!/usr/bin/env bash
# The cost of `--trace`, or of the Prometheus exporter scraped once a
# second, on the README's main job (configs/brown.toml, data-parallel on 2
# local ranks, micro-batch 4 per rank): PAIRS alternating pairs of short
# runs without and with it, the median step time of each run (steps after
# the first WARMUP), and the ratio of each pair. docs/performance.md,
# "Timeline trace overhead" and "Metrics exporter overhead", has the figures.
#   bash bench/trace_overhead.sh [BUILD_DIR] [PAIRS] [STEPS] [trace|metrics]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build/release}; pairs=${2:-5}; steps=${3:-60}; mode=${4:-trace}; warmup=5
case $mode in trace|metrics) ;; *) echo "mode must be trace or metrics, not '$mode'" >&2; exit 2 ;; esac
tessera=$build/tessera
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
[ -f data/brown/train_000000.bin ] || { echo "data/brown is missing: run scripts/main-job.sh once" >&2; exit 1; }

# on NAME: the option that turns it on, and with metrics a scraper that
# reads both ranks' /metrics once a second for as long as the run lasts.
port=$((20000 + $$ % 20000))
scrape() {
  while sleep 1; do
    curl -s "http://127.0.0.1:$port/metrics" >/dev/null 2>&1 || true
    curl -s "http://127.0.0.1:$((port + 1))/metrics" >/dev/null 2>&1 || true
  done
}
# The scraper runs beside the "off" runs too (refused there): on this
# 2-core machine its own curl processes take CPU from the ranks, a cost a
# Prometheus server on another machine would not add.
scraped() {
  scrape >/dev/null 2>&1 & local scraper=$!
  run "$@"
  kill $scraper 2>/dev/null; wait $scraper 2>/dev/null || true
}
on() {
  if [ "$mode" = trace ]; then run "$1" --trace "$tmp/trace_$1"; return; fi
  scraped "$1" --set log.metrics_port=$port
}
off() {
  if [ "$mode" = trace ]; then run "$1"; return; fi
  scraped "$1"
}

run() {  # NAME [OPTION...]: the run's median step_ms after the warm-up steps
  local name=$1; shift
  "$tessera" launch -n 2 -- train --config configs/brown.toml --set parallel.dp=2 --set train.micro_batch=4 \
    --set train.steps="$steps" --set train.eval_every=0 --set train.eval_batches=1 \
    --set checkpoint.dir="$tmp/$name" --set log.metrics="$tmp/$name.jsonl" "$@" >"$tmp/$name.log" 2>&1 ||
    { cat "$tmp/$name.log" >&2; exit 1; }
  grep '"step_ms"' "$tmp/$name.jsonl" | tail -n +$((warmup + 1)) |
    sed 's/.*"step_ms":\([-0-9.eE+]*\).*/\1/' | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'
}

echo "pair  off_ms  on_ms  on/off"
ratios=()
for i in $(seq 1 "$pairs"); do
  # Alternate which goes first, so a drifting machine load favours neither.
  if [ $((i % 2)) = 1 ]; then off=$(off off$i); on=$(on on$i)
  else on=$(on on$i); off=$(off off$i); fi
  r=$(awk -v a="$on" -v b="$off" 'BEGIN { printf "%.4f", a / b }')
  ratios+=("$r")
  echo "$i  $off  $on  $r"
done
printf '%s\n' "${ratios[@]}" | sort -g | awk '{ v[NR] = $1 } END { printf "median on/off: %.4f (%d pairs)\n", v[int((NR + 1) / 2)], NR }'
[ "$mode" = metrics ] || ls -l "$tmp"/trace_on1/ | tail -n +2 | awk '{ print "trace file: " $NF ", " $5 " bytes" }'
