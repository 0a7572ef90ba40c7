#!/usr/bin/env bash
# `tessera bench decode` on a tiny model: one JSON row per --batch with a
# positive decode rate and the bandwidth limit, the inference model's
# resident memory reported; bad sizes give one error line and exit 1.
set -uo pipefail
tessera=$1
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
failures=0
fail() { echo "FAIL $*"; failures=$((failures+1)); }
export OMP_NUM_THREADS=1

tiny=(--layers 2 --heads 4 --dim 64 --vocab 256 --context 96)
if "$tessera" bench decode "${tiny[@]}" --batch 1,3 --prompt 40 --tokens 5 >"$tmp/out" 2>"$tmp/err"; then
  rows=$(grep -c '"decode_tokens_per_s"' "$tmp/out")
  good=$(grep '"decode_tokens_per_s"' "$tmp/out" | grep -c '"bandwidth_limit_tokens_per_s": [1-9]')
  if [ "$rows" -eq 2 ] && [ "$good" -eq 2 ] && grep -q '"batch": 3' "$tmp/out" && grep -q "resident" "$tmp/err"; then
    echo "ok   bench decode: 2 rows, $(grep -o '"decode_tokens_per_s": [0-9.]*' "$tmp/out" | tr '\n' ' ')"
  else fail "bench decode rows:"; cat "$tmp/out" "$tmp/err"; fi
else fail "bench decode exited $?"; cat "$tmp/err"; fi

# --ops: a second line per batch with the step's time by kind of op; the
# kinds' sum (and the untimed rest) is the step, and int4 (a 4-bit model on
# the CPU) is profiled as well.
for d in fp32 int4; do
  if "$tessera" bench decode "${tiny[@]}" --dtype $d --batch 1 --prompt 40 --tokens 5 --ops >"$tmp/out" 2>"$tmp/err"; then
    line=$(grep '"matmul_ms"' "$tmp/out")
    if [ -n "$line" ] && python3 - "$line" <<'PY'
import json, sys
j = json.loads(sys.argv[1])
parts = sum(j[k] for k in ("matmul_ms", "attention_ms", "norm_ms", "elementwise_ms", "embedding_ms", "untimed_ms"))
ok = j["matmul_ms"] > 0 and j["attention_ms"] > 0 and j["matmul_gb_s"] > 0 and abs(parts - j["step_ms"]) <= 0.01 * j["step_ms"] + 0.002
sys.exit(0 if ok else 1)
PY
    then echo "ok   bench decode --ops ($d): $line"
    else fail "bench decode --ops ($d):"; cat "$tmp/out" "$tmp/err"; fi
  else fail "bench decode --ops ($d) exited $?"; cat "$tmp/err"; fi
done

# --paired-roof: of_roof_paired, each step against a read of the weights
# right after it; 0 (not measured) where the weights are under 4x the
# last-level cache, as for the roof after the decode. A 234 MB model (tied
# head of 32768 x 1024) clears that on this machine's 32 MiB L3.
llc=0
for f in /sys/devices/system/cpu/cpu0/cache/index*/size; do
  [ -r "$f" ] || continue
  sz=$(cat "$f"); n=${sz%[KM]}
  case $sz in *K) v=$((n * 1024)) ;; *M) v=$((n * 1048576)) ;; *) v=$n ;; esac
  [ "$v" -gt "$llc" ] && llc=$v
done
for m in tiny big; do
  if [ $m = tiny ]; then args=("${tiny[@]}")
  else args=(--layers 2 --heads 8 --dim 1024 --vocab 32768 --context 96); fi
  if "$tessera" bench decode "${args[@]}" --batch 1 --prompt 40 --tokens 6 --paired-roof >"$tmp/out" 2>"$tmp/err"; then
    line=$(grep '"of_roof_paired"' "$tmp/out")
    if [ -n "$line" ] && python3 - "$line" "$llc" <<'PY'
import json, sys
j = json.loads(sys.argv[1]); llc = int(sys.argv[2]); weights = j["weight_mb"] * 1e6
p = j["of_roof_paired"]
measured = 0.2 < p < 2.0
if llc == 0:  # no sysfs cache sizes: either
    sys.exit(0 if measured or p == 0 else 1)
sys.exit(0 if (measured if weights >= 4 * llc else p == 0) else 1)
PY
    then echo "ok   bench decode --paired-roof ($m, LLC $llc B): $(echo "$line" | grep -o '"of_roof_paired": [0-9.]*')"
    else fail "bench decode --paired-roof ($m):"; cat "$tmp/out" "$tmp/err"; fi
  else fail "bench decode --paired-roof ($m) exited $?"; cat "$tmp/err"; fi
done

"$tessera" bench decode "${tiny[@]}" --prompt 90 --tokens 10 >"$tmp/out" 2>"$tmp/err"; rc=$?
if [ $rc -eq 1 ] && [ "$(wc -l <"$tmp/err")" -eq 1 ] && grep -q "must fit in --context 96" "$tmp/err"; then
  echo "ok   prompt past the context: $(cat "$tmp/err")"
else fail "prompt past the context: exit $rc"; cat "$tmp/err"; fi

[ $failures -eq 0 ]
