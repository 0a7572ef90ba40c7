#!/usr/bin/env bash
# `tessera bench alltoall` at 2 and 4 MPI ranks: JSON rows for every size,
# each checked (-c 1) with no wrong element, and busbw = algbw * (n-1)/n;
# the text table through `tessera launch`; one rank without mpirun; one
# clear error line for bad flags.
set -uo pipefail
tessera=$1
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
failures=0
fail() { echo "FAIL $*"; failures=$((failures+1)); }

# check_rows NAME FILE WANT_ROWS RANKS: WANT_ROWS JSON rows with "wrong": 0
# each and busbw = algbw * (RANKS-1)/RANKS.
check_rows() {
  local name=$1 file=$2 want=$3 n=$4
  if python3 - "$file" "$want" "$n" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"size"' in l]
want, n = int(sys.argv[2]), int(sys.argv[3])
assert len(rows) == want, f"{len(rows)} rows, want {want}"
for r in rows:
    assert r["wrong"] == 0, r
    assert r["type"] == "float", r
    assert abs(r["busbw"] - r["algbw"] * (n - 1) / n) <= 1e-3 + 1e-3 * r["algbw"], r
PY
  then echo "ok   $name: $want rows, none wrong, busbw = algbw * ($n-1)/$n"
  else fail "$name:"; cat "$file"
  fi
}

export OMP_NUM_THREADS=1
# 1K, 4K, 16K, 64K, 256K, 1M: 6 rows.
for np in 2 4; do
  if timeout 90 mpirun --allow-run-as-root --oversubscribe -np $np "$tessera" bench alltoall \
       -b 1K -e 1M -f 4 -n 3 -w 1 -c 1 --json >"$tmp/np$np.json" 2>"$tmp/np$np.err"; then
    check_rows "alltoall-np$np" "$tmp/np$np.json" 6 $np
    grep -q "\"summary\": \"alltoall\", \"ranks\": $np, .*\"total_wrong\": 0" "$tmp/np$np.json" \
      || fail "alltoall-np$np: no summary for $np ranks with total_wrong 0"
  else
    fail "alltoall-np$np: exit $?"; cat "$tmp/np$np.err"
  fi
done

# Under tessera launch (its own mpirun), the text table with a verdict line.
if timeout 90 "$tessera" launch -n 3 -- bench alltoall -b 96 -e 96K -f 32 -n 2 -w 1 -c 1 --link-gbps 100 \
     >"$tmp/launch.txt" 2>"$tmp/launch.err"; then
  if [ "$(grep -vc '^#' "$tmp/launch.txt")" -ne 3 ] || ! grep -q '^# Out of bounds values : 0 OK' "$tmp/launch.txt" \
     || ! grep -q '^# tessera bench alltoall: 3 rank(s)' "$tmp/launch.txt" \
     || ! grep -q '^# Verdict: .*of theoretical' "$tmp/launch.txt"; then
    fail "alltoall-launch-np3: want 3 rows, 0 wrong and a verdict:"; cat "$tmp/launch.txt"
  else
    echo "ok   alltoall-launch-np3"
  fi
else
  fail "alltoall-launch-np3: exit $?"; cat "$tmp/launch.err" "$tmp/launch.txt"
fi

# Without mpirun: one rank, the self communicator (busbw 0: nothing crosses a link).
if "$tessera" bench alltoall -b 1K -e 64K -f 2 -n 2 -w 1 -c 1 --json >"$tmp/np1.json" 2>"$tmp/np1.err"; then
  check_rows "alltoall-np1" "$tmp/np1.json" 7 1
else
  fail "alltoall-np1: exit $?"; cat "$tmp/np1.err"
fi

# Bad flags: exit 2, one line naming the problem.
expect_usage() {
  local name=$1 pattern=$2; shift 2
  "$tessera" bench "$@" >"$tmp/out" 2>"$tmp/err"; local rc=$?
  if [ $rc -ne 2 ] || [ "$(wc -l <"$tmp/err")" -ne 1 ] || ! grep -qE "^tessera: error: .*$pattern" "$tmp/err"; then
    fail "$name: want exit 2 and one line matching /$pattern/, got exit $rc:"; cat "$tmp/err"
  else
    echo "ok   $name: $(cat "$tmp/err")"
  fi
}
expect_usage min-over-max "larger than -e" alltoall -b 1M -e 1K
expect_usage small-factor "at least 2" alltoall -f 1
expect_usage bad-dtype "unknown type 'half'" alltoall --dtype half

[ $failures -eq 0 ] || { echo "$failures failure(s)"; exit 1; }
echo "bench alltoall: all cases passed"
