#!/usr/bin/env bash
# The serving benchmark of docs/performance.md: GPT-2 124M shapes (weights
# from one training step: the speed does not depend on their values),
# 128-token prompts, 128 output tokens (ignore_eos), streamed, through
# `tessera serve` and, at the same loads, in-process on the engine alone
# (`bench serve --engine`). Prints one JSON line per run, then a markdown
# table.
#   bench/serve_sweep.sh [fp32|bf16 ...]     (default: fp32 bf16)
# Needs the release build and data/raw/gpt2 (scripts/setup.sh). About 6
# minutes per dtype on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
tessera=build/release/tessera
dtypes=("$@")
[ ${#dtypes[@]} -gt 0 ] || dtypes=(fp32 bf16)
work=$(mktemp -d)
server=""
trap '[ -n "$server" ] && kill -9 $server 2>/dev/null; rm -rf "$work"' EXIT

# GPT-2 124M weights: one step on a little GPT-2-tokenized text.
"$tessera" prepare --input /usr/share/common-licenses/GPL-3 --tokenizer gpt2 --out "$work/data" --val-fraction 0 >/dev/null
cat >"$work/cfg.toml" <<TOML
[model]
layers = 12
heads = 12
dim = 768
vocab = 50257
context = 1024
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
model="$work/run/model.safetensors"

common=(--prompt-tokens 128 --max-tokens 128 --stream --json)
requests_for() { case $1 in 1) echo 6 ;; 8) echo 16 ;; *) echo 64 ;; esac; }

for dtype in "${dtypes[@]}"; do
  "$tessera" serve --model "$model" --dtype "$dtype" --max-seqs 32 --port 0 2>"$work/serve.log" &
  server=$!
  for _ in $(seq 1 300); do
    port=$(sed -n 's|^serve: listening on http://127.0.0.1:\([0-9]*\).*|\1|p' "$work/serve.log")
    [ -n "$port" ] && curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
    sleep 0.1
  done
  url="http://127.0.0.1:$port"
  "$tessera" bench serve --url "$url" --requests 2 --max-tokens 8 >/dev/null 2>&1  # warm the primitives
  for c in 1 8 32; do
    n=$(requests_for $c)
    echo "{\"dtype\":\"$dtype\",\"via\":\"http\",\"run\":$("$tessera" bench serve --url "$url" --concurrency $c --requests $n --warmup $c "${common[@]}" 2>/dev/null)}"
  done
  for rate in 0.5 1 2; do
    echo "{\"dtype\":\"$dtype\",\"via\":\"http\",\"run\":$("$tessera" bench serve --url "$url" --rate $rate --requests 16 "${common[@]}" 2>/dev/null)}"
  done
  kill -TERM $server; wait $server || true; server=""
  for c in 1 8 32; do
    n=$(requests_for $c)
    echo "{\"dtype\":\"$dtype\",\"via\":\"engine\",\"run\":$("$tessera" bench serve --engine "$model" --dtype "$dtype" --max-seqs 32 --concurrency $c --requests $n --warmup $c "${common[@]}" 2>/dev/null)}"
  done
done | tee "$work/runs.jsonl"

python3 - "$work/runs.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print()
print("| dtype | via | load | output tok/s | p50 TTFT ms | p99 TTFT ms | p50 TPOT ms | p99 TPOT ms | p99 ITL ms |")
print("|---|---|---|---|---|---|---|---|---|")
for r in rows:
    x = r["run"]
    load = f"concurrency {x['concurrency']}" if x["mode"] == "concurrency" else f"Poisson {x['request_rate']}/s"
    print(f"| {r['dtype']} | {r['via']} | {load} | {x['output_throughput']:.1f} | {x['p50_ttft_ms']:.0f} | "
          f"{x['p99_ttft_ms']:.0f} | {x['p50_tpot_ms']:.1f} | {x['p99_tpot_ms']:.1f} | {x['p99_itl_ms']:.1f} |")
PY
