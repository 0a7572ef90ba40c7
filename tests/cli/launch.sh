#!/usr/bin/env bash
# tessera launch: the mpirun command it builds for this machine, and its errors.
set -uo pipefail
tessera=$1; tests=$2
status=0
check() { # NAME PATTERN TEXT
  if echo "$3" | grep -qE -- "$2"; then echo "ok   $1"; else echo "FAIL $1: /$2/ not in: $3"; status=1; fi
}
cores=$(nproc)
out=$("$tessera" launch -n 2 --dry-run -- train --config x.toml 2>&1)
check "prints the mpirun command" "^tessera launch: mpirun .*-np 2 .*OMP_NUM_THREADS=$(( cores / 2 > 0 ? cores / 2 : 1 )) .*tessera train --config x.toml" "$out"
[ "$(id -u)" = 0 ] && check "root needs --allow-run-as-root" "--allow-run-as-root" "$out"
out=$("$tessera" launch -n $(( cores * 2 )) --dry-run -- train --config x.toml 2>&1)
check "more ranks than cores oversubscribe" "--oversubscribe --bind-to none .*OMP_NUM_THREADS=1" "$out"
out=$("$tessera" launch -n 2 --hosts h1:1,h2:1 --netns --tcp-if 10.99.0.0/24 --dry-run -- train 2>&1)
check "--netns runs mpirun in the first host with the agent" "ip netns exec h1 env TESSERA_HOST=h1 mpirun --mca plm_rsh_agent .*netns-agent.sh" "$out"
check "--tcp-if pins btl and oob" "btl_tcp_if_include 10.99.0.0/24 .*oob_tcp_if_include 10.99.0.0/24" "$out"
# Each namespace host's daemon binds from core 0: with --bind-to core every
# rank landed on CPU 0 (issue #18). Unbound, the kernel spreads them.
check "--netns does not bind ranks to cores" "--bind-to none" "$out"
if echo "$out" | grep -q -- "--bind-to core"; then echo "FAIL --netns passes --bind-to core: $out"; status=1; fi

# Errors: one line, non-zero.
err=$("$tessera" launch -n 2 --netns --dry-run -- train 2>&1); rc=$?
check "--netns without --hosts" "needs --hosts" "$err"; [ $rc -ne 0 ] && [ "$(echo "$err" | wc -l)" -eq 1 ] || { echo "FAIL: want one line and non-zero ($rc)"; status=1; }
err=$("$tessera" launch -n 2 2>&1); rc=$?
check "nothing to launch" "args|nothing to launch" "$err"; [ $rc -ne 0 ] && [ "$(echo "$err" | wc -l)" -eq 1 ] || { echo "FAIL: want one line and non-zero ($rc)"; status=1; }
exit $status
