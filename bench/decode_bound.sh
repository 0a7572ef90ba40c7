#!/usr/bin/env bash
# How close one-sequence decode could come to the read roof (issue #31,
# "Measure": 0.9 of the roof), cell by cell: docs/performance.md, "Where
# issue #31 stands".
#   bench/decode_bound.sh [REPS=2] [PROMPT=128] [TOKENS=64]
#   CELLS="gpt2:q8_0:int8 tinyllama:q4_0:int4" bench/decode_bound.sh ...
#
# Each run is
#   tessera bench decode --model MODEL-TYPE.gguf --dtype D --batch 1 --prompt P --tokens T --kv-dtype f16 --ops --paired-roof
# on bench/llamacpp_vs.sh's files (run it once first: it makes them). With
# p = of_roof_paired (the step's weights and cache read at the roof of the
# same second, over the step's time), R = p x step is what the step's bytes
# take at that roof, R_w the weights' part of it. The step is the products
# (matmul_ms), attention (attention_ms) and the rest (norms, elementwise,
# embedding, untimed). Two ceilings for p follow:
#   products at the roof:          R / (R_w + step - products)
#   and attention at its bytes':   R / (R + rest)
# the first with attention as it is, the second as if attention's
# arithmetic cost nothing (the cache's bytes at the roof). A cell whose
# first ceiling is under 0.9 cannot reach 0.9 by faster products alone.
set -euo pipefail
cd "$(dirname "$0")/.."
reps=${1:-2}
prompt=${2:-128}
tokens=${3:-64}
cells=${CELLS:-gpt2:f32:fp32 gpt2:q8_0:int8 gpt2:q4_0:int4 tinyllama:f32:fp32 tinyllama:q8_0:int8 tinyllama:q4_0:int4}
tessera=$PWD/build/release/tessera
work=${TESSERA_LLAMACPP_DIR:-/var/tmp/tessera-llamacpp}/models
for cell in $cells; do
  IFS=: read -r model type dtype <<< "$cell"
  file=$work/$model-$type.gguf
  if [ ! -f "$file" ]; then
    echo "decode_bound: $file is missing (bench/llamacpp_vs.sh $model makes it)" >&2
    exit 2
  fi
done
echo "| cell | tokens/s | of_roof_paired | step ms | products ms (of the roof) | attention ms | rest ms | ceiling: products at the roof | and attention at its bytes |"
echo "|---|---|---|---|---|---|---|---|---|"
for r in $(seq "$reps"); do
  for cell in $cells; do
    IFS=: read -r model type dtype <<< "$cell"
    "$tessera" bench decode --model "$work/$model-$type.gguf" --dtype "$dtype" --batch 1 --prompt "$prompt" \
        --tokens "$tokens" --kv-dtype f16 --ops --paired-roof 2>/dev/null | grep '^{' |
      python3 -c '
import json, sys
lines = [json.loads(l) for l in sys.stdin]
run = next(j for j in lines if "of_roof_paired" in j)
ops = next(j for j in lines if "matmul_ms" in j)
p, step, mm, att = run["of_roof_paired"], ops["step_ms"], ops["matmul_ms"], ops["attention_ms"]
w, kv = run["weight_mb"], run["kv_read_mb"]
R = p * step
Rw = R * w / (w + kv)
rest = step - mm - att
tps = run["decode_tokens_per_s"]
print(f"| {sys.argv[1]} | {tps:.1f} | {p:.3f} | {step:.2f} | {mm:.2f} ({Rw / mm:.2f}) | "
      f"{att:.2f} | {rest:.2f} | {R / (Rw + step - mm):.2f} | {R / (R + rest):.2f} |")
' "$model $dtype"
  done
done
