#!/usr/bin/env bash
# Tessera against llama.cpp on the same weights (issue #31, "Measure";
# docs/performance.md "Against llama.cpp"): decode of 1 and 8 sequences
# after a prompt, and prefill, at fp32 / int8 / int4 against llama.cpp's
# F32 / Q8_0 / Q4_0, plus each process's peak and steady resident memory.
#   bench/llamacpp_vs.sh [MODEL=gpt2|tinyllama] [REPS=3] [PROMPT=128] [TOKENS=32]
#   TYPES="f32" bench/llamacpp_vs.sh ...   (a subset of f32 q8_0 q4_0, or
#       lq4_0 lq4_k_m lq4_k_s: llama.cpp's own Q4_0, Q4_K_M and Q4_K_S files,
#       made by llama-quantize from the F32 file, as users bring them;
#       Tessera runs them as the int4 tier, its Q6_K and Q5_K tensors
#       requantized to Q4_K)
#   KV=fp32 bench/llamacpp_vs.sh ...       (Tessera's KV cache type; default f16,
#                                           llama.cpp's default cache type)
#
# The model: random weights in a Hugging Face folder (tessera synth model:
# GPT-2 124M with GPT-2's vocabulary, or TinyLlama-1.1B's shape with Llama
# 2's vocabulary), converted by the project's own converter (tessera
# quantize --out FILE.gguf) to F32, Q8_0 and Q4_0 GGUF files that both
# engines load. Per file and repetition, interleaved:
#   tessera bench decode --model FILE.gguf --batch 1,8 --prompt P --tokens T --kv-dtype f16 --paired-roof
#     (fp32 for F32; the INT8 tier, per-channel int8 from the Q8_0 file's
#     values, for Q8_0; the file's own Q4_0 blocks for Q4_0)
#   llama-batched-bench -m FILE.gguf -npp P -ntg T -npl 1,8 -t 2
# both after a prompt of P tokens per sequence, with OMP/llama threads = 2.
# Prints one JSON line per run and a Markdown table of medians and ratios.
# llama.cpp is built by bench/llamacpp_build.sh (from the llama.cpp source
# that the npm package node-llama-cpp ships; nothing of it is linked).
#   TESSERA_LLAMACPP_ISA=avx2 bench/llamacpp_vs.sh ...
# compares the two as on a machine without AVX-512 or VNNI: llama.cpp built
# for AVX2 (llamacpp_build.sh) and Tessera run with DNNL_MAX_CPU_ISA=AVX2
# (oneDNN and Tessera's own kernels capped at AVX2); runs in
# MODEL-avx2-runs.jsonl.
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:-gpt2}
reps=${2:-3}
prompt=${3:-128}
tokens=${4:-32}
types=${TYPES:-f32 q8_0 q4_0}
kv=${KV:-f16}
ctx=$(( 8 * (prompt + tokens) > 2048 ? 8 * (prompt + tokens) : 2048 ))
tessera=$PWD/build/release/tessera
eval "$(bash bench/llamacpp_build.sh)"
work=${TESSERA_LLAMACPP_DIR:-/var/tmp/tessera-llamacpp}/models
mkdir -p "$work"
dir=$work/$model
if [ ! -f "$dir/config.json" ]; then
  case $model in
    gpt2) "$tessera" synth model --preset gpt2-124m --dtype fp32 --out "$dir" >&2 ;;
    tinyllama)
      "$tessera" synth model --preset tinyllama-1.1b --dtype fp32 --out "$dir" >&2
      cp data/raw/tokenizers/llama2/tokenizer.json data/raw/tokenizers/llama2/tokenizer_config.json "$dir/" ;;
    *) echo "llamacpp_vs: model '$model' (gpt2 or tinyllama)" >&2; exit 2 ;;
  esac
fi
# Converted again whenever tessera was rebuilt after the file was written
# (the converter's choices change: Q8_0 files got Q8_0 embeddings).
for t in $types; do
  case $t in lq4_*) continue ;; esac
  [ "$work/$model-$t.gguf" -nt "$tessera" ] ||
    "$tessera" quantize --weights "$dir" --out "$work/$model-$t.gguf" --dtype "$t" >&2
done
for t in $types; do
  case $t in lq4_0) q=Q4_0 ;; lq4_k_m) q=Q4_K_M ;; lq4_k_s) q=Q4_K_S ;; *) continue ;; esac
  [ "$work/$model-f32.gguf" -nt "$tessera" ] ||
    "$tessera" quantize --weights "$dir" --out "$work/$model-f32.gguf" --dtype f32 >&2
  [ "$work/$model-$t.gguf" -nt "$work/$model-f32.gguf" ] ||
    "$LLAMA_QUANTIZE" "$work/$model-f32.gguf" "$work/$model-$t.gguf" "$q" 2 >"$work/quantize.log" 2>&1 ||
    { tail -5 "$work/quantize.log" >&2; echo "llamacpp_vs: llama-quantize to $q failed (log: $work/quantize.log)" >&2; exit 1; }
done
isa=${TESSERA_LLAMACPP_ISA:-native}
out=$work/$model-runs.jsonl
cap=()
if [ "$isa" = avx2 ]; then
  out=$work/$model-avx2-runs.jsonl
  cap=(env DNNL_MAX_CPU_ISA=AVX2)
fi
: > "$out"
export OMP_NUM_THREADS=2
# Steady resident memory: the process's VmRSS every 0.2 s while it runs
# (under /usr/bin/time: its child; read by the shell's builtins, no process
# started but sleep), the median of the second half of the samples (both
# engines have loaded by then and are prefilling or decoding: llama.cpp's
# 8 sequences and its last single one, Tessera's 8 sequences); the peak is
# /usr/bin/time's (VmHWM).
measure() {
  /usr/bin/time -f '{"peak_rss_mb": %M}' -o "$work/time.json" "$@" &
  local pid=$! child=""
  : > "$work/rss.txt"
  while kill -0 "$pid" 2>/dev/null; do
    [ -n "$child" ] || child=$(awk '{print $1}' "/proc/$pid/task/$pid/children" 2>/dev/null || true)
    if [ -n "$child" ]; then
      while read -r key kb _; do [ "$key" != VmRSS: ] || echo "$kb"; done < "/proc/$child/status" >> "$work/rss.txt" 2>/dev/null || true
    fi
    sleep 0.2
  done
  wait "$pid" || return $?
}
rss_mb() {
  python3 - "$work/time.json" "$work/rss.txt" <<'PY'
import json, statistics, sys
s = [int(x) / 1024 for x in open(sys.argv[2]).read().split()]
# /usr/bin/time's line is the last (a failed command's exit status comes first).
lines = [l for l in open(sys.argv[1]).read().splitlines() if l.startswith("{")]
peak = json.loads(lines[-1])["peak_rss_mb"] / 1024 if lines else 0.0
print(peak, statistics.median(s[len(s) // 2:]) if s else 0.0)
PY
}
for r in $(seq "$reps"); do
  for t in $types; do
    case $t in f32) d=fp32 ;; q8_0) d=int8 ;; q4_0 | lq4_*) d=int4 ;; esac
    f=$work/$model-$t.gguf
    measure "${cap[@]}" "$tessera" bench decode --model "$f" --dtype "$d" --batch 1,8 --prompt "$prompt" --tokens "$tokens" \
      --kv-dtype "$kv" --paired-roof 2>/dev/null > "$work/t.jsonl"
    read -r peak steady < <(rss_mb)
    python3 - "$work/t.jsonl" "$t" "$r" "$peak" "$steady" >> "$out" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    j = json.loads(line)
    print(json.dumps({"engine": "tessera", "type": sys.argv[2], "rep": int(sys.argv[3]), "batch": j["batch"],
                      "decode": j["decode_tokens_per_s"], "prefill": j["prefill_tokens_per_s"],
                      "read_gb_s": j["read_gb_s"], "weight_mb": j["weight_mb"], "kv_read_mb": j["kv_read_mb"],
                      "of_roof": j["of_roof"], "weights_read_gb_s": j.get("weights_read_gb_s", 0.0),
                      "of_roof_paired": j.get("of_roof_paired", 0.0),
                      "peak_rss_mb": float(sys.argv[4]), "steady_rss_mb": float(sys.argv[5])}))
PY
    # -npl 1,8,1: batched-bench's logger may drop its last line at exit.
    # Its context holds the 8 sequences' prompts and tokens at once.
    measure "$LLAMA_BATCHED_BENCH" -m "$f" -t 2 -tb 2 -c "$ctx" -npp "$prompt" -ntg "$tokens" -npl 1,8,1 \
      --output-format jsonl 2>"$work/llama.log" > "$work/l.jsonl" ||
      echo "llamacpp_vs: llama-batched-bench failed on $f (log: $work/llama.log)" >&2
    read -r peak steady < <(rss_mb)
    python3 - "$work/l.jsonl" "$t" "$r" "$peak" "$steady" >> "$out" <<'PY'
import json, sys
seen = set()
for line in open(sys.argv[1]):
    line = line.strip()
    if not line.startswith("{"):
        continue
    j = json.loads(line)
    if j["pl"] in seen:
        continue
    seen.add(j["pl"])
    print(json.dumps({"engine": "llama.cpp", "type": sys.argv[2], "rep": int(sys.argv[3]), "batch": j["pl"],
                      "decode": j["speed_tg"], "prefill": j["speed_pp"], "peak_rss_mb": float(sys.argv[4]),
                      "steady_rss_mb": float(sys.argv[5])}))
PY
  done
done
cat "$out"
python3 - "$out" "$model" <<'PY'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
def med(engine, t, b, key):
    v = [r[key] for r in runs if r["engine"] == engine and r["type"] == t and r["batch"] == b]
    return statistics.median(v) if v else float("nan")
names = {"f32": ("fp32", "F32"), "q8_0": ("int8", "Q8_0"), "q4_0": ("int4", "Q4_0"),
         "lq4_0": ("int4 (llama.cpp's Q4_0 file)", "Q4_0"),
         "lq4_k_m": ("int4 (llama.cpp's Q4_K_M file)", "Q4_K_M"),
         "lq4_k_s": ("int4 (llama.cpp's Q4_K_S file)", "Q4_K_S")}
print(f"\n{sys.argv[2]}: medians of {max(r['rep'] for r in runs)} interleaved runs, tokens/s")
print("| Tessera / llama.cpp | decode, 1 seq | decode, 8 seqs | prefill, 1 x prompt | prefill, 8 x prompt | peak RSS MiB | steady RSS MiB |")
print("|---|---|---|---|---|---|---|")
for t, (ours, theirs) in names.items():
    if not any(r["type"] == t for r in runs):
        continue
    cells = []
    for key, b in (("decode", 1), ("decode", 8), ("prefill", 1), ("prefill", 8)):
        a, l = med("tessera", t, b, key), med("llama.cpp", t, b, key)
        cells.append(f"{a:.1f} / {l:.1f} = **{a / l:.2f}x**")
    rss = f"{med('tessera', t, 1, 'peak_rss_mb'):.0f} / {med('llama.cpp', t, 1, 'peak_rss_mb'):.0f}"
    steady = f"{med('tessera', t, 1, 'steady_rss_mb'):.0f} / {med('llama.cpp', t, 1, 'steady_rss_mb'):.0f}"
    print(f"| {ours} / {theirs} | " + " | ".join(cells) + f" | {rss} | {steady} |")
reads = [r["read_gb_s"] for r in runs if r["engine"] == "tessera"]
for t, (ours, _) in names.items():
    w = [r["weight_mb"] for r in runs if r["engine"] == "tessera" and r["type"] == t]
    if w and reads:
        roof = statistics.median(reads) * 1e3 / w[0]
        kv = statistics.median(
            [r["kv_read_mb"] for r in runs if r["engine"] == "tessera" and r["type"] == t and r["batch"] == 1])
        roof_kv = statistics.median(reads) * 1e3 / (w[0] + kv)
        print(f"{ours}: one-sequence decode at {med('tessera', t, 1, 'decode') / roof:.2f} of the read roof "
              f"({statistics.median(reads):.1f} GB/s over {w[0]:.1f} MB of weights a token = {roof:.1f} tokens/s); "
              f"{med('tessera', t, 1, 'decode') / roof_kv:.2f} counting the {kv:.1f} MB of keys and values "
              f"it reads too")
        # bench decode measures the roof again over the weights right after
        # each batch when they are 4 x the last-level cache: each run against
        # the roof of its own minute.
        own = [r["decode"] * r["weight_mb"] / (r["weights_read_gb_s"] * 1e3) for r in runs
               if r["engine"] == "tessera" and r["type"] == t and r["batch"] == 1 and r.get("weights_read_gb_s", 0) > 0]
        if own:
            print(f"{ours}: one-sequence decode against the roof each run measured over its weights right after: "
                  f"median {statistics.median(own):.2f} (runs: {', '.join(f'{x:.2f}' for x in own)})")
        # --paired-roof: each timed step against a read of the weights right
        # after it (the median step), robust to a roof that moves within seconds.
        paired = [r["of_roof_paired"] for r in runs if r["engine"] == "tessera" and r["type"] == t and r["batch"] == 1
                  and r.get("of_roof_paired", 0) > 0]
        if paired:
            print(f"{ours}: one-sequence decode, each step against a read of its weights right after it "
                  f"(of_roof_paired): median {statistics.median(paired):.2f} "
                  f"(runs: {', '.join(f'{x:.2f}' for x in paired)})")
PY
