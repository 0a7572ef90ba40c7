#!/usr/bin/env bash
# tessera synth clicks and tessera prepare --format criteo: a synthetic click
# log with its ground truth, prepared into click shards; malformed lines are
# skipped, counted and reported with their line numbers; bad flags get one
# error line.
set -euo pipefail
tessera=$1
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

out=$("$tessera" synth clicks --rows 5000 --tables 6 --cardinality 200 --out "$tmp/c.tsv")
echo "$out"
[ -f "$tmp/c.truth.json" ]
[ "$(wc -l <"$tmp/c.tsv")" -eq 5000 ]
# 1 label + 13 dense + 6 categorical fields on every line.
[ -z "$(awk -F'\t' 'NF != 20' "$tmp/c.tsv")" ]
auc=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['heldout_auc'])" "$tmp/c.truth.json")
python3 -c "import sys; a=float(sys.argv[1]); assert 0.6 < a < 1.0, a" "$auc"

# Three malformed lines after the 5000 good ones.
printf '1\t2\t3\n0\tabc%s\n1%s\tzz\n' "$(printf '\t1%.0s' {1..12})$(printf '\t0a%.0s' {1..6})" \
  "$(printf '\t1%.0s' {1..13})$(printf '\t0a%.0s' {1..5})" >>"$tmp/c.tsv"
"$tessera" prepare --format criteo --tables 6 --hash-size 1000 --input "$tmp/c.tsv" --out "$tmp/shards" \
  >"$tmp/out" 2>"$tmp/err"
cat "$tmp/out" "$tmp/err"
[ -n "$(grep 'prepared 5003 lines: 4500 train + 500 val rows, 3 bad lines skipped' "$tmp/out")" ]
[ -n "$(grep 'c.tsv:5001: wrong field count (got 3, want 20)' "$tmp/err")" ]
[ -n "$(grep "c.tsv:5002: dense feature I1 'abc' is not an integer" "$tmp/err")" ]
[ -n "$(grep "c.tsv:5003: categorical feature C6 'zz' is not a hex string" "$tmp/err")" ]
# Header 32 bytes + 6 table sizes (8 bytes each) + rows * 4 * (1 + 13 + 6).
[ "$(stat -c %s "$tmp/shards/train.bin")" -eq $((32 + 48 + 4500 * 80)) ]

# Bad input: one error line, exit 1 or 2.
expect_error() {
  local pattern=$1; shift
  set +e; "$@" >/dev/null 2>"$tmp/e"; local rc=$?; set -e
  [ $rc -eq 1 ] || [ $rc -eq 2 ] || { echo "exit $rc for $*"; exit 1; }
  [ "$(wc -l <"$tmp/e")" -eq 1 ] || { cat "$tmp/e"; exit 1; }
  [ -n "$(grep -E "$pattern" "$tmp/e")" ] || { cat "$tmp/e"; exit 1; }
}
printf 'nothing\there\n' >"$tmp/bad.tsv"
expect_error "no valid Criteo line" "$tessera" prepare --format criteo --input "$tmp/bad.tsv" --out "$tmp/x"
expect_error "tables 30 must be in" "$tessera" synth clicks --rows 10 --tables 30 --out "$tmp/y.tsv"
expect_error "rows 0 must be" "$tessera" synth clicks --rows 0 --out "$tmp/y.tsv"
expect_error "hash-size" "$tessera" prepare --format criteo --hash-size 0 --input "$tmp/c.tsv" --out "$tmp/x"
echo PASS
