#!/usr/bin/env bash
# `tessera bench allreduce` on 2 MPI ranks: JSON rows for every size, each
# checked (-c 1) with no wrong element; then the same on one rank without
# mpirun, and one clear error line for bad flags; --backend nccl runs where
# there is a GPU and NCCL, and otherwise fails with one line saying why.
set -uo pipefail
tessera=$1
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
failures=0
fail() { echo "FAIL $*"; failures=$((failures+1)); }

# check_rows NAME FILE WANT_ROWS: WANT_ROWS JSON rows with "wrong": 0 each.
check_rows() {
  local name=$1 file=$2 want=$3
  local rows good
  rows=$(grep -c '"size"' "$file")
  good=$(grep '"size"' "$file" | grep -c '"wrong": 0[,}]')
  if [ "$rows" -ne "$want" ] || [ "$good" -ne "$rows" ]; then
    fail "$name: want $want rows, all with \"wrong\": 0; got $rows rows, $good good:"; cat "$file"
  else
    echo "ok   $name: $rows rows, none wrong"
  fi
}

export OMP_NUM_THREADS=1
# 1K, 4K, 16K, 64K, 256K, 1M: 6 rows.
if timeout 60 mpirun --allow-run-as-root --oversubscribe -np 2 "$tessera" bench allreduce \
     -b 1K -e 1M -f 4 -n 5 -w 2 -c 1 --json >"$tmp/np2.json" 2>"$tmp/np2.err"; then
  check_rows "allreduce-np2" "$tmp/np2.json" 6
  grep -q '"summary": "allreduce", "ranks": 2' "$tmp/np2.json" || fail "allreduce-np2: no summary for 2 ranks"
else
  fail "allreduce-np2: exit $?"; cat "$tmp/np2.err"
fi

# The other collectives, briefly, with a link speed for the verdict line.
for op in reduce_scatter all_gather broadcast sendrecv; do
  if timeout 60 mpirun --allow-run-as-root --oversubscribe -np 2 "$tessera" bench $op \
       -b 64 -e 64K -f 32 -n 2 -w 1 -c 1 --link-gbps 100 >"$tmp/$op.txt" 2>"$tmp/$op.err"; then
    if [ "$(grep -vc '^#' "$tmp/$op.txt")" -ne 3 ] || ! grep -q '^# Out of bounds values : 0 OK' "$tmp/$op.txt" \
       || ! grep -q '^# Verdict: .*of theoretical' "$tmp/$op.txt"; then
      fail "$op-np2: want 3 rows, 0 wrong and a verdict:"; cat "$tmp/$op.txt"
    else
      echo "ok   $op-np2"
    fi
  else
    fail "$op-np2: exit $?"; cat "$tmp/$op.err"
  fi
done

# Without mpirun: one rank, the self communicator.
if "$tessera" bench allreduce -b 1K -e 64K -f 2 -n 2 -w 1 -c 1 --json >"$tmp/np1.json" 2>"$tmp/np1.err"; then
  check_rows "allreduce-np1" "$tmp/np1.json" 7
else
  fail "allreduce-np1: exit $?"; cat "$tmp/np1.err"
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
expect_usage min-over-max "larger than -e" allreduce -b 1M -e 1K
expect_usage small-factor "at least 2" allreduce -f 1
expect_usage bad-suffix "bad size '4X'" allreduce -e 4X
expect_usage bad-dtype "unknown type 'half'" allreduce --dtype half
expect_usage bad-backend "--backend: gloo not in" allreduce --backend gloo

# --backend nccl on one rank: rows like MPI's with a GPU and NCCL; else exit 1
# and one line with the reason.
if "$tessera" info | grep -q '^  cuda:0:' && "$tessera" info | grep -q '^nccl: [0-9]'; then
  if "$tessera" bench allreduce --backend nccl -b 1K -e 1M -f 4 -n 3 -w 1 -c 1 --json >"$tmp/nccl.json" 2>"$tmp/nccl.err"; then
    check_rows "allreduce-nccl-np1" "$tmp/nccl.json" 6
  else
    fail "allreduce-nccl-np1: exit $?"; cat "$tmp/nccl.err"
  fi
else
  "$tessera" bench allreduce --backend nccl -b 1K -e 4K >"$tmp/out" 2>"$tmp/err"; rc=$?
  if [ $rc -ne 1 ] || [ "$(wc -l <"$tmp/err")" -ne 1 ] ||
     ! grep -qE '^tessera: error: bench allreduce --backend nccl: .*(no CUDA device|built without NCCL)' "$tmp/err"; then
    fail "nccl-unavailable: want exit 1 and one line saying why, got exit $rc:"; cat "$tmp/err"
  else
    echo "ok   nccl-unavailable: $(cat "$tmp/err")"
  fi
fi

[ $failures -eq 0 ] || { echo "$failures failure(s)"; exit 1; }
echo "bench allreduce: all cases passed"
