#!/usr/bin/env bash
# A rank that stalls: the others stop with the deadline error naming it,
# within the configured timeout. A rank that dies: the job ends, no hang.
set -uo pipefail
tessera=$1; tests=$2
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
source "$tests/cli/dp_common.inc"
status=0

start=$(date +%s)
timeout 120 mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2 -x OMP_NUM_THREADS=1 -x TESSERA_FAULT=stall@1:3 \
  "$tessera" train --config "$tmp/cfg.toml" --set train.micro_batch=2 --set parallel.dp=2 --set parallel.timeout=3 \
  >"$tmp/stall.out" 2>"$tmp/stall.err"
rc=$?; took=$(( $(date +%s) - start ))
if [ $rc -eq 0 ] || [ $rc -eq 124 ]; then echo "FAIL stall: exit $rc after ${took}s (want an error, no hang)"; status=1; fi
if ! grep -E "timed out after 3.0 s" "$tmp/stall.err" | grep -qE "peers \[1\]"; then
  echo "FAIL stall: no deadline error naming rank 1:"; cat "$tmp/stall.err"; status=1
else
  echo "ok   stall: exit $rc after ${took}s: $(grep -m1 'timed out' "$tmp/stall.err")"
fi

start=$(date +%s)
timeout 120 mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2 -x OMP_NUM_THREADS=1 -x TESSERA_FAULT=exit@1:3 \
  "$tessera" train --config "$tmp/cfg.toml" --set train.micro_batch=2 --set parallel.dp=2 --set parallel.timeout=3 \
  >"$tmp/exit.out" 2>"$tmp/exit.err"
rc=$?; took=$(( $(date +%s) - start ))
if [ $rc -eq 0 ] || [ $rc -eq 124 ]; then echo "FAIL exit: exit $rc after ${took}s (want an error, no hang)"; status=1
else echo "ok   exit: the job ended with status $rc after ${took}s"; fi
exit $status
