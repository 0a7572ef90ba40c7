#!/usr/bin/env bash
# `tessera bench p2p` on 3 MPI ranks: one JSON object per ordered pair (6),
# each with positive bandwidths and latency, and a summary; the table mode
# with a link speed; one rank refused with exit 1; bad flags exit 2 with one
# error line.
set -uo pipefail
tessera=$1
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
failures=0
fail() { echo "FAIL $*"; failures=$((failures+1)); }

mpirun_np3() {
  timeout 120 mpirun --allow-run-as-root --oversubscribe -np 3 -x OMP_NUM_THREADS=1 "$tessera" bench p2p "$@"
}

# A positive decimal: not 0, 0.0, 0.000...
positive='([1-9][0-9]*(\.[0-9]+)?|0\.[0-9]*[1-9][0-9]*)'

if mpirun_np3 -b 1M -n 3 -w 1 --lat-iters 20 --json >"$tmp/np3.json" 2>"$tmp/np3.err"; then
  pairs=$(grep -c '^{"src"' "$tmp/np3.json")
  good=$(grep '^{"src"' "$tmp/np3.json" | grep -E "\"bytes\": 1048576," | grep -E "\"gbps_1\": $positive," \
         | grep -E "\"gbps_n\": $positive," | grep '"streams": 4,' | grep -cE "\"latency_us\": $positive,")
  distinct=$(grep -o '"src": [0-9], "dst": [0-9]' "$tmp/np3.json" | sort -u | wc -l)
  if [ "$pairs" -ne 6 ] || [ "$good" -ne 6 ] || [ "$distinct" -ne 6 ] || grep -q '"src": \([0-9]\), "dst": \1,' "$tmp/np3.json"; then
    fail "p2p-json: want 6 distinct ordered pairs with positive gbps_1, gbps_n, latency_us; got $pairs, $good good:"
    cat "$tmp/np3.json"
  elif ! grep -q '^{"summary": "p2p", "ranks": 3, "pairs": 6,' "$tmp/np3.json"; then
    fail "p2p-json: no summary for 3 ranks, 6 pairs:"; cat "$tmp/np3.json"
  else
    echo "ok   p2p-json: $pairs pairs, all positive"
  fi
else
  fail "p2p-json: exit $?"; cat "$tmp/np3.err"
fi

# Table mode: three 3x3 matrices, the % of the link in each bandwidth cell,
# and the closing verdict line.
if mpirun_np3 -b 256K -n 2 -w 1 --streams 2 --lat-iters 10 --link-gbps 10 >"$tmp/np3.txt" 2>"$tmp/np3t.err"; then
  titles=$(grep -cE '^# (bandwidth, 1 stream \(Gbit/s\)|bandwidth, 2 streams \(Gbit/s\)|latency \(us\))' "$tmp/np3.txt")
  rows=$(grep -cE '^ +[0-2] ' "$tmp/np3.txt")
  pct_cells=$(grep -oE '[0-9.]+ \([0-9.]+%\)' "$tmp/np3.txt" | wc -l)
  if [ "$titles" -ne 3 ] || [ "$rows" -ne 9 ] || [ "$pct_cells" -ne 12 ] \
     || ! grep -qE '^# vs the 10 Gbit/s link: 1 stream min [0-9.]+% mean [0-9.]+%; 2 streams min' "$tmp/np3.txt"; then
    fail "p2p-table: want 3 matrices of 3 rows, 12 cells with a %, and the link line:"; cat "$tmp/np3.txt"
  else
    echo "ok   p2p-table"
  fi
else
  fail "p2p-table: exit $?"; cat "$tmp/np3t.err"
fi

# One rank (no mpirun): refused, exit 1, one line.
"$tessera" bench p2p -b 1K >"$tmp/out" 2>"$tmp/err"; rc=$?
if [ $rc -ne 1 ] || [ "$(wc -l <"$tmp/err")" -ne 1 ] || ! grep -q '^tessera: error: .*needs at least 2 ranks' "$tmp/err"; then
  fail "p2p-np1: want exit 1 and 'needs at least 2 ranks', got exit $rc:"; cat "$tmp/err"
else
  echo "ok   p2p-np1: $(cat "$tmp/err")"
fi

# Bad flags: exit 2, one line naming the problem.
expect_usage() {
  local name=$1 pattern=$2; shift 2
  "$tessera" bench p2p "$@" >"$tmp/out" 2>"$tmp/err"; local rc=$?
  if [ $rc -ne 2 ] || [ "$(wc -l <"$tmp/err")" -ne 1 ] || ! grep -qE "^tessera: error: .*$pattern" "$tmp/err"; then
    fail "$name: want exit 2 and one line matching /$pattern/, got exit $rc:"; cat "$tmp/err"
  else
    echo "ok   $name: $(cat "$tmp/err")"
  fi
}
expect_usage zero-size "-b 0: need at least one byte" -b 0
expect_usage zero-streams "--streams 0: need 1 to" --streams 0
expect_usage bad-suffix "bad size '4X'" -b 4X
expect_usage zero-lat-iters "--lat-iters 0" --lat-iters 0

[ $failures -eq 0 ] || { echo "$failures failure(s)"; exit 1; }
echo "bench p2p: all cases passed"
