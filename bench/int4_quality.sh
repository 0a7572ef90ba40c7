#!/usr/bin/env bash
# The 4-bit tiers' quality against fp32 (docs/performance.md "The int4
# tiers"): cross-entropy on the held-out Brown shard for fp32, int8, int4
# (Q4_0) and int4k (Q4_K), and greedy agreement with fp32 over 50 prompts
# (the first four words of lines of the corpus's last ten files, 20 tokens).
#   bench/int4_quality.sh MODEL.safetensors [VAL_SHARD]
# MODEL: an fp32 model (the main job writes runs/brown/model.safetensors).
set -euo pipefail
cd "$(dirname "$0")/.."
tessera=build/release/tessera
model=$1
val=${2:-$(ls data/brown/val_*.bin | head -1)}
for d in fp32 int8 int4 int4k; do
  echo "$d: $("$tessera" eval --weights "$model" --dtype $d --tokens "$val" --batch 8 --seq 128 --max-batches 40 2>/dev/null | tail -1)"
done
python3 - "$tessera" "$model" <<'PY'
import subprocess, sys, glob
tessera, model = sys.argv[1:3]
files = sorted(glob.glob("data/raw/brown/**/c*", recursive=True))[-10:]
prompts = []
for f in files:
    for line in open(f, errors="replace"):
        words = [w.split("/")[0] for w in line.split()][:4]
        if len(words) == 4 and all(w.isalpha() for w in words):
            prompts.append(" ".join(words))
        if len(prompts) >= 50:
            break
    if len(prompts) >= 50:
        break
def run(dtype, p):
    out = subprocess.run([tessera, "sample", "--weights", model, "--dtype", dtype, "--prompt", p, "--tokens", "20",
                          "--temperature", "0"], capture_output=True, text=True, errors="replace").stdout
    return out[len(p):]
ref = {p: run("fp32", p) for p in prompts}
for dtype in ("int4", "int4k"):
    same, prefix = 0, 0.0
    for p in prompts:
        a, b = ref[p], run(dtype, p)
        same += a == b
        n = 0
        while n < min(len(a), len(b)) and a[n] == b[n]:
            n += 1
        prefix += n / max(1, len(a))
    print(f"{dtype} greedy: {same} of {len(prompts)} continuations identical to fp32's; "
          f"mean agreeing prefix {prefix / len(prompts):.0%} of the text")
PY
