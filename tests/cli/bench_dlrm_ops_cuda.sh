#!/usr/bin/env bash
# tessera bench dlrm-ops --backend cuda: with a GPU, one JSON object of the
# sparse ops' figures; without one (or without the CUDA backend), one error
# line and exit 1; bad flags exit 2 with one line, device or not.
set -euo pipefail
tessera=$1
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

small=(--tables 2 --rows 1000 --dim 8 --batch 64 --ids-per-bag 3 --iters 1)

# one_error_line WANT_RC PATTERN -- command...
one_error_line() {
  local want=$1 pattern=$2; shift 3
  local rc=0
  "$@" >"$tmp/out" 2>"$tmp/err" || rc=$?
  [ "$rc" -eq "$want" ] || { echo "FAIL: exit $rc, want $want: $*"; cat "$tmp/err"; exit 1; }
  [ "$(wc -l <"$tmp/err")" -eq 1 ] || { echo "FAIL: want one stderr line: $*"; cat "$tmp/err"; exit 1; }
  [ -n "$(grep -E "$pattern" "$tmp/err")" ] || { echo "FAIL: stderr does not match /$pattern/"; cat "$tmp/err"; exit 1; }
  echo "ok: $(cat "$tmp/err")"
}

one_error_line 2 "backend" -- "$tessera" bench dlrm-ops --backend tpu "${small[@]}"
one_error_line 2 "rows" -- "$tessera" bench dlrm-ops --backend cuda --rows 0

rc=0
"$tessera" bench dlrm-ops --backend cuda "${small[@]}" --json >"$tmp/out" 2>"$tmp/err" || rc=$?
if [ "$rc" -eq 0 ]; then
  python3 - "$tmp/out" <<'PY'
import json, sys
j = json.loads(open(sys.argv[1]).read())
assert j["backend"] == "cuda", j
assert j["lookups"] == 2 * 64 * 3, j
assert 0 < j["unique_rows"] <= j["lookups"], j
for k in ("lookup_gbps", "copy_gbps", "backward_ms", "adagrad_ms", "interaction_ms"):
    assert j[k] > 0, (k, j)
print("ok: on", j["device"], j)
PY
else
  [ "$rc" -eq 1 ] || { echo "FAIL: exit $rc without a device (want 1)"; cat "$tmp/err"; exit 1; }
  [ "$(wc -l <"$tmp/err")" -eq 1 ] || { echo "FAIL: want one stderr line"; cat "$tmp/err"; exit 1; }
  [ -n "$(grep -E '^tessera: error: .*(no CUDA device|not compiled)' "$tmp/err")" ] || { cat "$tmp/err"; exit 1; }
  echo "skip: no GPU here ($(cat "$tmp/err"))"
fi
