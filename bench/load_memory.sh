#!/usr/bin/env bash
# Peak resident memory while loading (issue #30 item 3; docs/performance.md,
# "Loading within the model's memory"): GPT-2 124M (random weights, fp32)
# through `tessera sample` in fp32 and int8, and a random-weight
# Llama-3-8B-shaped BF16 folder (tessera synth model, 16 GB on disk)
# through `tessera quantize` and `tessera serve --dtype int8` with one
# completion. Peaks are /usr/bin/time's maximum resident set, or VmHWM of
# the running server; the process baseline (`tessera --help`: the shared
# libraries' pages) is printed beside them.
#   bench/load_memory.sh [WORK_DIR]   (needs about 26 GB of free disk)
set -euo pipefail
cd "$(dirname "$0")/.."
tessera=$PWD/build/release/tessera
work=${1:-$(mktemp -d)}
mkdir -p "$work"
server=""
trap '[ -n "$server" ] && kill -9 $server 2>/dev/null; rm -rf "$work"' EXIT
peak() {  # MB of a command's maximum resident set
  /usr/bin/time -f %M -o "$work/rss" "$@" >"$work/cmd.log" 2>&1 || { cat "$work/cmd.log"; exit 1; }
  echo $(( $(tail -1 "$work/rss") / 1024 ))
}
echo "baseline (tessera --help): $(peak "$tessera" --help) MB"

"$tessera" synth model --preset gpt2-124m --out "$work/gpt2" >/dev/null
echo "gpt2-124m fp32 weights: $(du -m "$work/gpt2/model.safetensors" | cut -f1) MB on disk"
for dtype in fp32 int8; do
  echo "sample gpt2-124m --dtype $dtype: peak $(peak "$tessera" sample --weights "$work/gpt2" --dtype $dtype --tokens 8 \
    --tokenizer byte --prompt hi) MB"
done
rm -rf "$work/gpt2"

t0=$(date +%s)
"$tessera" synth model --preset llama3-8b --context 8192 --out "$work/l8" >/dev/null
echo "llama3-8b bf16 folder: $(du -sm "$work/l8" | cut -f1) MB on disk, written in $(( $(date +%s) - t0 )) s"
t0=$(date +%s)
echo "quantize llama3-8b -> int8: peak $(peak "$tessera" quantize --weights "$work/l8" --out "$work/l8i/model.safetensors") MB in $(( $(date +%s) - t0 )) s"
tail -1 "$work/cmd.log"
echo "int8 file: $(du -m "$work/l8i/model.safetensors" | cut -f1) MB"
rm -rf "$work/l8i"

t0=$(date +%s)
"$tessera" serve --model "$work/l8" --dtype int8 --port 0 --kv-memory 256 --max-seqs 2 2>"$work/serve.log" &
server=$!
port=""
for _ in $(seq 1 1200); do
  port=$(sed -n 's|^serve: listening on http://127.0.0.1:\([0-9]*\).*|\1|p' "$work/serve.log")
  [ -n "$port" ] && curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
  kill -0 $server 2>/dev/null || { cat "$work/serve.log"; exit 1; }
  sleep 0.5
done
echo "serve llama3-8b --dtype int8: ready in $(( $(date +%s) - t0 )) s"
grep -E "weights loaded|ready" "$work/serve.log"
curl -sf "http://127.0.0.1:$port/v1/completions" -H 'Content-Type: application/json' \
  -d '{"prompt": [128000, 9906, 11], "max_tokens": 4, "temperature": 0}' >"$work/out.json"
echo "completion: $(head -c 300 "$work/out.json")"
echo "serve VmHWM after the completion: $(( $(awk '/^VmHWM:/ {print $2}' /proc/$server/status) / 1024 )) MB," \
  "VmRSS $(( $(awk '/^VmRSS:/ {print $2}' /proc/$server/status) / 1024 )) MB"
grep MemTotal /proc/meminfo
