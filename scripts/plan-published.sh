#!/usr/bin/env bash
# Predicts published GPU training throughputs from the planner's catalogue
# alone and prints predicted vs published (docs/planner.md, "Published runs").
# Usage: scripts/plan-published.sh TESSERA
set -euo pipefail
tessera=$1
root=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
# Megatron-LM (Narayanan et al. 2021, arXiv 2104.04473, table 1): model,
# tp, pp, nodes of 8 A100 80GB on Selene, global batch, published teraFLOP/s
# per GPU (their count: 96 B s l h^2 (1 + s/6h + V/16lh), with recomputation).
echo "| run | layout (planner's choice within the published tp, pp) | predicted | published | error |"
echo "|---|---|---|---|---|"
while read -r model tp pp nodes batch pub; do
  "$tessera" plan --model "$model" --cluster "$root/examples/clusters/selene-a100.toml" --layout "tp=$tp,pp=$pp,nodes=$nodes" \
    --global-batch "$batch" --recompute --attention materialized --json --top 1 >"$tmp/p.json"
  python3 - "$tmp/p.json" "$model" "$pub" <<'PY'
import json, sys
j = json.load(open(sys.argv[1])); m = j["model"]; L = j["clusters"][0]["layouts"][0]; lay = L["layout"]
B, s, l, h, V = m["global_batch"], m["seq"], m["layers"], m["dim"], m["vocab"]
F = 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))
gpus = lay["dp"] * lay["tp"] * lay["pp"]
tf = F / L["step_s"] / gpus / 1e12; pub = float(sys.argv[3])
print(f"| Megatron-LM {sys.argv[2][9:]} on {gpus} A100 | dp={lay['dp']} tp={lay['tp']} pp={lay['pp']} mb={lay['micro_batch']} | "
      f"{tf:.0f} TFLOP/s/GPU | {pub:.0f} | {100 * (tf - pub) / pub:+.1f}% |")
PY
done <<'EOF2'
megatron-1.7b 1 1 4 512 137
megatron-3.6b 2 1 8 512 138
megatron-7.5b 4 1 16 512 142
megatron-18b 8 1 32 1024 135
megatron-39b 8 2 64 1536 138
megatron-76b 8 4 128 1792 140
megatron-145b 8 8 192 2304 148
EOF2
# llm.c (github.com/karpathy/llm.c discussions 481 and 677): GPT-2 124M on
# 8 A100 80GB SXM, 10B tokens in about 90 minutes (batch 512 x 1024, mb 64);
# GPT-2 1.5B on 8 H100 SXM, 24 hours for 32B tokens (batch 1024 x 1024, mb 16).
while read -r model cluster batch mb tokens hours; do
  "$tessera" plan --model "$model" --cluster "$root/examples/clusters/$cluster" --layout "tp=1,pp=1,dp=8,zero=1" \
    --global-batch "$batch" --tokens "$tokens" --json >"$tmp/p.json"
  python3 - "$tmp/p.json" "$model" "$tokens" "$hours" "$cluster" <<'PY'
import json, sys
j = json.load(open(sys.argv[1])); L = j["clusters"][0]["layouts"][0]
tok = float(sys.argv[3].rstrip("B")) * 1e9; pub = tok / (float(sys.argv[4]) * 3600)
pred = L["tokens_per_s"]
print(f"| llm.c {sys.argv[2]} on {sys.argv[5].split('.')[0]} | dp=8 mb={L['layout']['micro_batch']} zero1 | "
      f"{pred / 1e3:.0f}k tokens/s | {pub / 1e3:.0f}k | {100 * (pred - pub) / pub:+.1f}% |")
PY
done <<'EOF2'
gpt2-124m a100x8-nvlink.toml 512 64 10B 1.5
gpt2-1.5b h100x8.toml 1024 16 32B 24
EOF2
