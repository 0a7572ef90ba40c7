#!/usr/bin/env bash
# `tessera bench serve` with and without 1,000 slow ("slowloris")
# connections held open against the same `tessera serve` (issue #34,
# "Measure"; docs/performance.md, "Slow clients"): the tiny byte-level
# model of the serving tests, closed loop at concurrency 4, 32 prompt and
# 8 output tokens, DURATION seconds per run, the two loads alternated
# ROUNDS times. Prints one JSON line per run and a summary table.
#   bench/serve_slow_clients.sh [DURATION=20] [ROUNDS=3] [SLOW=1000]
set -euo pipefail
cd "$(dirname "$0")/.."
tessera=$PWD/build/release/tessera
duration=${1:-20}; rounds=${2:-3}; slow=${3:-1000}
tmp=$(mktemp -d)
tests=$PWD/tests
source tests/cli/serve_common.inc
serve_model "$tmp/m"
serve_start s --model "$tmp/m/run/model.safetensors"
for r in $(seq 1 "$rounds"); do
  for n in 0 "$slow"; do
    "$tessera" bench serve --url "$s_url" --concurrency 4 --requests 100000000 --duration "$duration" \
      --prompt-tokens 32 --max-tokens 8 --slow-connections "$n" --json 2>/dev/null | tee -a "$tmp/runs.jsonl"
  done
done
python3 - "$tmp/runs.jsonl" <<'PY'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
print(f"{'slow connections':>16} {'req/s (median)':>15} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'failed':>7}")
for n in sorted({r["slow_connections"] for r in runs}):
    rs = [r for r in runs if r["slow_connections"] == n]
    med = lambda k: statistics.median(r[k] for r in rs)
    print(f"{n:>16} {med('request_throughput'):>15.0f} {med('p50_e2el_ms'):>8.2f} {med('p99_e2el_ms'):>8.2f} "
          f"{max(r['max_e2el_ms'] for r in rs):>8.1f} {sum(r['failed'] for r in rs):>7}")
PY
serve_stop s
