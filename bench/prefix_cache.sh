#!/usr/bin/env bash
# Prefix caching's time to first token (issue #30; docs/performance.md,
# "Prefix caching"): requests sharing a 1,000-token system prompt (then 24
# tokens of their own, 16 generated, streamed) through `tessera serve` with
# the cache (the default) and with --no-prefix-cache, on an 8-layer,
# 512-channel byte-level model with 1,100 positions (weights from one
# training step: speed does not depend on their values).
#   bench/prefix_cache.sh [REQUESTS=24] [CONCURRENCY=4]
# Prints each run's JSON (bench serve --json), then TTFT and throughput of both
# and the ratio.
set -euo pipefail
cd "$(dirname "$0")/.."
tessera=build/release/tessera
requests=${1:-24}
concurrency=${2:-4}
work=$(mktemp -d)
server=""
trap '[ -n "$server" ] && kill -9 $server 2>/dev/null; rm -rf "$work"' EXIT
"$tessera" prepare --input /usr/share/common-licenses/GPL-3 --tokenizer byte --out "$work/data" --val-fraction 0 >/dev/null
cat >"$work/cfg.toml" <<TOML
[model]
layers = 8
heads = 8
dim = 512
vocab = 256
context = 1100
[data]
train = "$work/data/train_*.bin"
[train]
micro_batch = 1
seq = 64
steps = 1
eval_every = 0
[checkpoint]
dir = "$work/run"
TOML
"$tessera" train --config "$work/cfg.toml" >/dev/null
for mode in cache nocache; do
  flags=()
  [ "$mode" = nocache ] && flags=(--no-prefix-cache)
  "$tessera" serve --model "$work/run/model.safetensors" --port 0 --max-seqs 8 --max-batch-tokens 512 "${flags[@]}" \
    2>"$work/$mode.log" &
  server=$!
  port=""
  for _ in $(seq 1 300); do
    port=$(sed -n 's|^serve: listening on http://127.0.0.1:\([0-9]*\).*|\1|p' "$work/$mode.log")
    [ -n "$port" ] && curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
    sleep 0.1
  done
  "$tessera" bench serve --url "http://127.0.0.1:$port" --stream --json --concurrency "$concurrency" \
    --requests "$requests" --warmup 2 --prompt-tokens 1024 --shared-prefix 1000 --max-tokens 16 |
    tee "$work/$mode.json"
  curl -s "http://127.0.0.1:$port/metrics" | grep -E '^tessera_prefix_cache_(hits|queries)_total ' || true
  kill -TERM $server; wait $server 2>/dev/null || true
  server=""
done
python3 - "$work/cache.json" "$work/nocache.json" <<'PY'
import json, sys
c, n = (json.load(open(f)) for f in sys.argv[1:3])
print("\n| prefix cache | TTFT p50 (ms) | TTFT p99 (ms) | output tokens/s | requests/s | failed |")
print("|---|---|---|---|---|---|")
for name, d in (("on", c), ("off", n)):
    print(f"| {name} | {d['p50_ttft_ms']:.0f} | {d['p99_ttft_ms']:.0f} | {d['output_throughput']:.1f} | "
          f"{d['request_throughput']:.2f} | {d['failed']} |")
print(f"TTFT p50 without / with the cache: {n['p50_ttft_ms'] / c['p50_ttft_ms']:.1f}x")
PY
