#!/usr/bin/env bash
# The INT8 tier's quality against fp32 (docs/performance.md "The INT8 tier"):
# cross-entropy on the held-out Brown shard, and greedy agreement over 50
# prompts (the first four words of lines of the corpus's last ten files, 20
# tokens each).
#   bench/int8_quality.sh MODEL.safetensors [VAL_SHARD]
# MODEL: an fp32 GPT-2 file (the main job writes runs/brown/model.safetensors).
set -euo pipefail
cd "$(dirname "$0")/.."
tessera=build/release/tessera
model=$1
val=${2:-$(ls data/brown/val_*.bin | head -1)}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$tessera" quantize --weights "$model" --out "$work/int8.safetensors" >/dev/null
for w in "$model" "$work/int8.safetensors"; do
  echo "$w: $("$tessera" eval --weights "$w" --tokens "$val" --batch 8 --seq 128 --max-batches 40 2>/dev/null | tail -1)"
done
python3 - "$tessera" "$model" "$work/int8.safetensors" <<'PY'
import subprocess, sys, glob
tessera, fp, q = sys.argv[1:4]
# Prompts: the first four words of lines of the corpus's last ten files.
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
def run(w, p):
    out = subprocess.run([tessera, "sample", "--weights", w, "--prompt", p, "--tokens", "20", "--temperature", "0"],
                         capture_output=True, text=True, errors="replace").stdout
    return out[len(p):]
same = 0
prefix = 0.0
for p in prompts:
    a, b = run(fp, p), run(q, p)
    same += a == b
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    prefix += n / max(1, len(a))
print(f"greedy: {same} of {len(prompts)} continuations identical; mean agreeing prefix {prefix / len(prompts):.0%} of the text")
PY
