#!/usr/bin/env bash
# tessera bench dlrm: a single-process DLRM trained on synthetic click shards
# learns (held-out AUC well above chance, not above the planted truth's);
# bad input gets one error line.
set -euo pipefail
tessera=$1
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

"$tessera" synth clicks --rows 30000 --tables 4 --cardinality 100 --crosses 0 --out "$tmp/c.tsv" >/dev/null
"$tessera" prepare --format criteo --tables 4 --hash-size 500 --input "$tmp/c.tsv" --out "$tmp/s" >/dev/null
"$tessera" bench dlrm --train "$tmp/s/train.bin" --val "$tmp/s/val.bin" --epochs 2 --batch 128 \
  --truth "$tmp/c.truth.json" >"$tmp/out"
cat "$tmp/out"
[ "$(grep -c '^epoch' "$tmp/out")" -eq 2 ]
tail -1 "$tmp/out" | python3 -c "
import json, sys
r = json.loads(sys.stdin.read())
assert r['train_rows'] == 27000 and r['val_rows'] == 3000, r
assert r['val_auc'] > 0.68, r          # chance is 0.5
assert r['auc_gap'] > -0.02, r         # not (much) above the truth: noise only
assert r['val_logloss'] < 0.62, r
"

set +e
"$tessera" bench dlrm --train "$tmp/c.tsv" --val "$tmp/s/val.bin" >/dev/null 2>"$tmp/e"; rc=$?
set -e
[ $rc -eq 1 ] && [ "$(wc -l <"$tmp/e")" -eq 1 ] && [ -n "$(grep 'bad magic' "$tmp/e")" ]
set +e
"$tessera" bench dlrm --train "$tmp/s/train.bin" --val "$tmp/s/val.bin" --dim 8 >/dev/null 2>"$tmp/e"; rc=$?
set -e
[ $rc -eq 1 ] && [ "$(wc -l <"$tmp/e")" -eq 1 ] && [ -n "$(grep 'must equal dim' "$tmp/e")" ]
echo PASS
