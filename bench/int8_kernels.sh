#!/usr/bin/env bash
# INT8 against fp32 decode on this CPU and with oneDNN and Tessera capped at
# AVX2 (DNNL_MAX_CPU_ISA=AVX2: no AVX-512, no VNNI, the kernels a Zen 3 or a
# Haswell runs), GPT-2 124M with random weights, `tessera bench decode`,
# fp32 and int8 runs alternating so that drift hits both (docs/performance.md,
# "The INT8 tier").
#   bench/int8_kernels.sh [REPEATS=3] [BATCHES=1,32]
# Prints one line per run and then, per ISA and batch, the median decode and
# prefill tokens/s of each dtype and the median of the int8/fp32 ratios of
# runs taken side by side.
set -euo pipefail
cd "$(dirname "$0")/.."
tessera=build/release/tessera
repeats=${1:-3}
batches=${2:-1,32}
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for r in $(seq 1 "$repeats"); do
  for isa in native AVX2; do
    for dtype in fp32 int8; do
      env_args=()
      [ "$isa" = AVX2 ] && env_args=(DNNL_MAX_CPU_ISA=AVX2)
      env "${env_args[@]}" "$tessera" bench decode --batch "$batches" --prompt 128 --tokens 24 --dtype "$dtype" \
        2>/dev/null | sed "s/^{/{\"isa\": \"$isa\", \"run\": $r, /" | tee -a "$out"
    done
  done
done
python3 - "$out" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
print("\n| isa | batch | fp32 decode tok/s | int8 decode tok/s | int8/fp32 | fp32 prefill tok/s | int8 prefill tok/s | int8/fp32 | int8 of limit | int8 kernel |")
print("|---|---|---|---|---|---|---|---|---|---|")
for isa in ("native", "AVX2"):
    for b in sorted({r["batch"] for r in rows}):
        f = {r["run"]: r for r in rows if r["isa"] == isa and r["batch"] == b and r["dtype"] == "fp32"}
        q = {r["run"]: r for r in rows if r["isa"] == isa and r["batch"] == b and r["dtype"] == "int8"}
        runs = sorted(set(f) & set(q))
        if not runs:
            continue
        med = lambda d, k: statistics.median(d[x][k] for x in runs)
        ratio = lambda k: statistics.median(q[x][k] / f[x][k] for x in runs)
        print(f"| {isa} | {b} | {med(f, 'decode_tokens_per_s'):.1f} | {med(q, 'decode_tokens_per_s'):.1f} | "
              f"{ratio('decode_tokens_per_s'):.2f}x | {med(f, 'prefill_tokens_per_s'):.0f} | "
              f"{med(q, 'prefill_tokens_per_s'):.0f} | {ratio('prefill_tokens_per_s'):.2f}x | "
              f"{med(q, 'of_limit'):.2f} | {q[runs[0]]['int8_kernel']} |")
PY
