#!/usr/bin/env bash
# Issue #18 item 5: a rank stopped (SIGSTOP) before MPI initialisation
# completes used to hang the job with no error. Start-up is now under
# parallel.timeout: the ranks that arrived print one line naming themselves,
# their host and the phase, the job ends within the timeout plus a bound, and
# no process is left (the stopped rank included).
set -uo pipefail
tessera=$1; tests=$2
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
source "$tests/cli/dp_common.inc"
status=0

start=$(date +%s)
timeout 120 mpirun --allow-run-as-root --oversubscribe --bind-to none -np 3 -x OMP_NUM_THREADS=1 \
  -x TESSERA_TEST_STOP_AT_START=1 \
  "$tessera" train --config "$tmp/cfg.toml" --set parallel.dp=3 --set parallel.timeout=3 \
  >"$tmp/stop.out" 2>"$tmp/stop.err"
rc=$?; took=$(( $(date +%s) - start ))
line="rank [02] of 3 on host .*: start-up did not finish within 3.0 s \(waiting in .*: a rank did not arrive\)"
if [ $rc -eq 0 ] || [ $rc -eq 124 ]; then echo "FAIL stop-at-start: exit $rc after ${took}s (want an error, no hang)"; status=1; fi
# The deadline (3 s) plus a bound for mpirun to end the job on a loaded machine.
if [ $took -gt 60 ]; then echo "FAIL stop-at-start: took ${took}s (want under 60 s)"; status=1; fi
if ! grep -qE "$line" "$tmp/stop.err"; then
  echo "FAIL stop-at-start: no start-up deadline line:"; cat "$tmp/stop.err"; status=1
else
  echo "ok   stop-at-start: exit $rc after ${took}s: $(grep -m1 -E "$line" "$tmp/stop.err")"
fi
sleep 1
if pgrep -f "$tmp/cfg.toml" >/dev/null; then
  echo "FAIL stop-at-start: processes left:"; pgrep -af "$tmp/cfg.toml"; status=1
  pgrep -f "$tmp/cfg.toml" | xargs -r kill -KILL
fi
exit $status
