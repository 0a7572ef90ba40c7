#!/usr/bin/env bash
# Tokenizer throughput on the Brown corpus (issue #29; docs/performance.md,
# "Tokenizers"): `tessera prepare` (both cores, the whole pipeline: read,
# tokenize, write shards) with the Llama 3 tokenizer.json, the Qwen3 and
# Llama 2 ones and GPT-2's own BPE, next to Hugging Face's JavaScript
# tokenizer (@huggingface/tokenizers, one thread: JavaScript has one) on the
# same text. The 500 Brown files are used as they are (tagged text, 9.6 MB).
#   bench/tokenizer.sh [REPEATS=3]
# Prints one line per run, then the median MB/s of each and the ratios.
# prepare's MB/s is its own figure: tokenizing and writing the shards once
# the tokenizer is loaded (what a large corpus sees); the command's wall
# time with the load is printed beside it. The JS figure is one encode()
# of the whole text after loading.
set -euo pipefail
cd "$(dirname "$0")/.."
tessera=build/release/tessera
repeats=${1:-3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
bytes=$(cat data/raw/brown/c[a-r][0-9][0-9] | wc -c)
cat data/raw/brown/c[a-r][0-9][0-9] >"$tmp/all.txt"
out="$tmp/runs"
for r in $(seq 1 "$repeats"); do
  for tok in gpt2 llama3 qwen3 llama2; do
    arg=$tok
    [ "$tok" = gpt2 ] || arg=data/raw/tokenizers/$tok
    # prepare's own figure (tokenize and write, after the tokenizer is
    # loaded) and the whole command's wall time (with the load).
    line=$( { /usr/bin/time -f "wall %e" "$tessera" prepare --input data/raw/brown --format text --tokenizer "$arg" \
            --out "$tmp/shards"; } 2>&1)
    s=$(echo "$line" | sed -n 's/.* tokens in \([0-9.]*\) s .*/\1/p')
    w=$(echo "$line" | sed -n 's/^wall //p')
    echo "{\"run\": $r, \"what\": \"prepare $tok\", \"seconds\": $s, \"wall\": $w}" | tee -a "$out"
  done
  for tok in llama3 qwen3; do
    j=$(cd tests/clients && node tokenizer_oracle.mjs "../../data/raw/tokenizers/$tok" --time 1 <"$tmp/all.txt")
    s=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["seconds"])' "$j")
    echo "{\"run\": $r, \"what\": \"js $tok\", \"seconds\": $s}" | tee -a "$out"
  done
done
python3 - "$out" "$bytes" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
mb = int(sys.argv[2]) / 1e6
med = {}
for w in dict.fromkeys(r["what"] for r in rows):
    med[w] = statistics.median(r["seconds"] for r in rows if r["what"] == w)
    walls = [r["wall"] for r in rows if r["what"] == w and "wall" in r]
    wall = f"  (command {statistics.median(walls):.2f} s with the load)" if walls else ""
    print(f"{w:16s} {med[w]:7.2f} s  {mb / med[w]:6.2f} MB/s{wall}")
for t in ("llama3", "qwen3"):
    print(f"prepare {t} / js {t}: {med['js ' + t] / med['prepare ' + t]:.2f}x the JS oracle's MB/s")
for t in ("llama3", "qwen3", "llama2"):
    print(f"prepare {t} / prepare gpt2: {med['prepare gpt2'] / med['prepare ' + t]:.2f}x the GPT-2 path's speed")
PY
