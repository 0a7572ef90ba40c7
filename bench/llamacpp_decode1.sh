#!/usr/bin/env bash
# One-sequence decode, Tessera against llama.cpp, each run between two reads
# of the memory roof (issue #31, "Measure"; docs/performance.md "One
# sequence, run by run in the host's phases").
#   bench/llamacpp_decode1.sh [MODEL=tinyllama] [TYPE=f32] [REPS=8] [PROMPT=128] [TOKENS=32]
#   TESSERA_LLAMACPP_ISA=avx2 bench/llamacpp_decode1.sh ...   (both capped at AVX2)
#   SPLIT=42 bench/llamacpp_decode1.sh ...   (GB/s between the slow and fast phase)
#
# Why: a one-sequence decode streams every weight once a token, so its
# speed is the read bandwidth of its seconds, and this host's moves between
# about 30 and 55 GB/s within seconds; bench/llamacpp_vs.sh's medians over
# two or three runs can put one engine in each phase. Here every run is
# short (one sequence, TOKENS steps after a PROMPT-token prompt) and
# bracketed by BM_ReadRoof (2 threads streaming 512 MB, 0.4 s); the runs
# whose two roofs agree within 10% are binned by phase, and the engines are
# compared within a bin, as tokens/s and as their weights' bytes a second
# over the roof around them (both engines read the same file's matrices a
# token; Tessera's weight_mb is those bytes).
#   Tessera:   tessera bench decode --model FILE --dtype D --batch 1 --prompt P --tokens T --kv-dtype f16 --paired-roof
#   llama.cpp: llama-bench -m FILE -t 2 -p 0 -n T -d P -r 1   (tg T at depth P, after its warm-up)
# The files are bench/llamacpp_vs.sh's (run it once first: it makes them).
# The order of the two engines alternates from one repetition to the next.
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:-tinyllama}
type=${2:-f32}
reps=${3:-8}
prompt=${4:-128}
tokens=${5:-32}
split=${SPLIT:-42}
tessera=$PWD/build/release/tessera
roofbin=$PWD/build/release/bench/tessera_bench
eval "$(bash bench/llamacpp_build.sh)"
work=${TESSERA_LLAMACPP_DIR:-/var/tmp/tessera-llamacpp}/models
f=$work/$model-$type.gguf
[ -f "$f" ] || { echo "llamacpp_decode1: $f not found (bench/llamacpp_vs.sh $model makes it)" >&2; exit 2; }
[ -x "$roofbin" ] || { echo "llamacpp_decode1: $roofbin not built (cmake --build --preset release)" >&2; exit 2; }
case $type in f32) d=fp32 ;; q8_0) d=int8 ;; q4_0 | lq4_*) d=int4 ;; *) echo "llamacpp_decode1: type '$type'" >&2; exit 2 ;; esac
isa=${TESSERA_LLAMACPP_ISA:-native}
cap=()
[ "$isa" = avx2 ] && cap=(env DNNL_MAX_CPU_ISA=AVX2)
out=$work/$model-$type-$isa-decode1.jsonl
: > "$out"
export OMP_NUM_THREADS=2

roof() {
  "${cap[@]}" "$roofbin" --benchmark_filter='^BM_ReadRoof' --benchmark_format=json 2>/dev/null |
    python3 -c "import json, sys; print(json.load(sys.stdin)['benchmarks'][0]['read_B/s'] / 1e9)"
}
run_tessera() {
  local r=$1 before after
  before=$(roof)
  "${cap[@]}" "$tessera" bench decode --model "$f" --dtype "$d" --batch 1 --prompt "$prompt" --tokens "$tokens" \
    --kv-dtype f16 --paired-roof 2>/dev/null > "$work/t1.jsonl"
  after=$(roof)
  python3 - "$work/t1.jsonl" "$r" "$before" "$after" >> "$out" <<'PY'
import json, sys
j = json.loads(open(sys.argv[1]).readline())
print(json.dumps({"engine": "tessera", "rep": int(sys.argv[2]), "decode": j["decode_tokens_per_s"],
                  "weight_mb": j["weight_mb"], "of_roof_paired": j["of_roof_paired"],
                  "roof_before": float(sys.argv[3]), "roof_after": float(sys.argv[4])}))
PY
}
run_llamacpp() {
  local r=$1 before after
  before=$(roof)
  "$LLAMA_BENCH" -m "$f" -t 2 -p 0 -n "$tokens" -d "$prompt" -r 1 -o jsonl 2>/dev/null > "$work/l1.jsonl"
  after=$(roof)
  python3 - "$work/l1.jsonl" "$r" "$before" "$after" >> "$out" <<'PY'
import json, sys
j = json.loads([l for l in open(sys.argv[1]) if l.startswith("{")][-1])
print(json.dumps({"engine": "llama.cpp", "rep": int(sys.argv[2]), "decode": j["avg_ts"],
                  "roof_before": float(sys.argv[3]), "roof_after": float(sys.argv[4])}))
PY
}

for r in $(seq "$reps"); do
  if [ $((r % 2)) = 1 ]; then run_tessera "$r"; run_llamacpp "$r"; else run_llamacpp "$r"; run_tessera "$r"; fi
done
cat "$out"
python3 - "$out" "$model" "$type" "$isa" "$split" <<'PY'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
split = float(sys.argv[5])
mb = statistics.median(r["weight_mb"] for r in runs if r["engine"] == "tessera")
for r in runs:
    lo, hi = sorted((r["roof_before"], r["roof_after"]))
    r["roof"] = (lo + hi) / 2
    r["steady"] = hi <= 1.1 * lo
    r["of_roof"] = r["decode"] * mb / (r["roof"] * 1e3)
    r["phase"] = "fast" if r["roof"] >= split else "slow"
print(f"\n{sys.argv[2]} {sys.argv[3]} ({sys.argv[4]}), one sequence: {len(runs) // 2} interleaved runs each, "
      f"{mb:.1f} MB of weights a token; phases split at {split:g} GB/s; runs whose roofs before and after "
      f"differ by more than 10% left out")
print("| phase | runs (Tessera, llama.cpp) | Tessera tokens/s (of the roof) | llama.cpp tokens/s (of the roof) | Tessera / llama.cpp |")
print("|---|---|---|---|---|")
for phase in ("slow", "fast"):
    t = [r for r in runs if r["engine"] == "tessera" and r["steady"] and r["phase"] == phase]
    l = [r for r in runs if r["engine"] == "llama.cpp" and r["steady"] and r["phase"] == phase]
    if not t or not l:
        print(f"| {phase} | {len(t)}, {len(l)} | | | |")
        continue
    tm, lm = statistics.median(r["decode"] for r in t), statistics.median(r["decode"] for r in l)
    to, lo = statistics.median(r["of_roof"] for r in t), statistics.median(r["of_roof"] for r in l)
    print(f"| {phase} | {len(t)}, {len(l)} | {tm:.1f} ({to:.2f}) | {lm:.1f} ({lo:.2f}) | **{tm / lm:.2f}x** |")
t = [r["decode"] for r in runs if r["engine"] == "tessera"]
l = [r["decode"] for r in runs if r["engine"] == "llama.cpp"]
print(f"| all, either phase | {len(t)}, {len(l)} | {statistics.median(t):.1f} | {statistics.median(l):.1f} | "
      f"**{statistics.median(t) / statistics.median(l):.2f}x** |")
left = sum(not r["steady"] for r in runs)
paired = [r["of_roof_paired"] for r in runs if r["engine"] == "tessera"]
print(f"left out (roof moved during the run): {left}; Tessera's of_roof_paired (each step against a read of its "
      f"weights right after it), median {statistics.median(paired):.2f} (runs: {', '.join(f'{x:.2f}' for x in paired)})")
PY
