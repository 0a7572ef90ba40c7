#!/usr/bin/env bash
# The Llama family against GPT-2 in training (issue #28; docs/performance.md,
# "Decoder family"): `tessera bench train` for GPT-2 124M (L=12 C=768 NH=12,
# V=50257) and a Llama-shaped model of about the same size (L=12 C=768, 12
# query and 4 key/value heads, SwiGLU 2048, V=32000, untied head), fp32 and
# bf16, B=8 T=256, interleaved so the machine's drift hits both alike.
#   bench/decoder_family.sh [REPEATS=3] [STEPS=3]
# Prints each run's JSON line (step_ms, mfu, gemm_efficiency, per-op times),
# then the median MFU and step time of each and Llama's MFU over GPT-2's.
set -euo pipefail
cd "$(dirname "$0")/.."
tessera=${TESSERA:-build/release/tessera}
repeats=${1:-3}
steps=${2:-3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
common=(--batch 8 --seq 256 --steps "$steps" --warmup 1 --layers 12 --dim 768 --heads 12)
for r in $(seq 1 "$repeats"); do
  for dtype in fp32 bf16; do
    for arch in gpt2 llama; do
      extra=(--vocab 50257)
      [ "$arch" = llama ] && extra=(--arch llama --kv-heads 4 --mlp-hidden 2048 --vocab 32000)
      line=$("$tessera" bench train "${common[@]}" "${extra[@]}" --dtype "$dtype" 2>/dev/null | tail -1)
      echo "{\"run\": $r, \"arch\": \"$arch\", \"dtype\": \"$dtype\", \"result\": $line}" | tee -a "$tmp/runs"
    done
  done
done
python3 - "$tmp/runs" <<'PY'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
print("\n| model | dtype | params | step ms | MFU | GEMM efficiency | matmul ms | attention ms |")
print("|---|---|---|---|---|---|---|---|")
med = {}
for arch in ("gpt2", "llama"):
    for dtype in ("fp32", "bf16"):
        rs = [x["result"] for x in runs if x["arch"] == arch and x["dtype"] == dtype]
        m = lambda k: statistics.median(r[k] for r in rs if r.get(k) is not None) if any(r.get(k) is not None for r in rs) else float("nan")
        med[arch, dtype] = m("mfu")
        print(f"| {arch} | {dtype} | {rs[0]['params'] / 1e6:.1f}M | {m('step_ms'):.0f} | {m('mfu'):.3f} | "
              f"{m('gemm_efficiency'):.3f} | {m('matmul_ms'):.0f} | {m('attention_ms'):.0f} |")
for dtype in ("fp32", "bf16"):
    print(f"llama MFU / gpt2 MFU, {dtype}: {med['llama', dtype] / med['gpt2', dtype]:.3f}")
PY
