#!/usr/bin/env bash
# Issue #18 item 6: ten permanent cuts in a row on the emulated cluster. Each
# time a 3-host data-parallel job trains, host 3's link is cut for good, and
# the job must end (non-zero) within the deadline plus a stated bound, with
# nothing of the job left running in any host's namespace; which line named
# the lost host is reported (an orted used to live on in the cut
# host's, and mpirun used to hang until the link was healed). What ends
# them: the deadline, launch ending mpirun after the abort, and the rsh
# agent (scripts/netns-agent.sh) ending its daemon when mpirun is gone.
#   CLUSTER_CUTS=N   another number of cuts (default 10)
set -uo pipefail
tessera=$1; tests=$2
source "$tests/cli/netns_common.inc"  # $root, $cluster; SKIP without namespaces

tmp=$(mktemp -d)
p=tk$$
trap 'bash "$cluster" down --prefix $p >/dev/null 2>&1; rm -rf "$tmp"' EXIT
source "$tests/cli/dp_common.inc"
bash "$cluster" up 3 --rate 1gbit --prefix $p >/dev/null || { echo "FAIL: cluster up"; exit 1; }
deadline=3     # parallel.timeout: the survivors' collective deadline
dead_host=8    # tessera launch --dead-host-timeout (well above the deadline: the survivors speak first)
bound=25       # the job ends within deadline + bound seconds of the cut: the
               # survivors' verdict (a few s), launch's 10 s grace for mpirun after
               # the job failed, 2 s to end it, the agents' 0.5 s watch
cuts=${CLUSTER_CUTS:-10}
status=0
for i in $(seq 1 "$cuts"); do
  "$tessera" launch --netns --tcp-if 10.99.0.0/24 --dead-host-timeout $dead_host -n 3 --hosts "${p}1:1,${p}2:1,${p}3:1" \
    -- train --config "$tmp/cfg.toml" --set train.micro_batch=2 --set parallel.dp=3 --set train.steps=100000 \
    --set train.eval_every=0 --set parallel.timeout=$deadline --set checkpoint.dir="$tmp/run$i" \
    >"$tmp/out$i" 2>"$tmp/err$i" &
  job=$!
  for _ in $(seq 600); do grep -q "^step .*/100000" "$tmp/out$i" 2>/dev/null && break; kill -0 $job 2>/dev/null || break; sleep 0.2; done
  if ! grep -q "^step .*/100000" "$tmp/out$i" 2>/dev/null; then
    echo "FAIL cut $i: no training step (the job ended, or 120 s passed)"; tail -5 "$tmp/err$i"; kill -9 $job 2>/dev/null
    status=1; break
  fi
  start=$(date +%s.%N)
  bash "$cluster" cut "${p}3" --prefix $p >/dev/null
  for _ in $(seq $(( (deadline + bound) * 10 ))); do kill -0 $job 2>/dev/null || break; sleep 0.1; done
  took=$(python3 -c "import sys; print(f'{float(sys.argv[1]) - float(sys.argv[2]):.1f}')" "$(date +%s.%N)" "$start")
  if kill -0 $job 2>/dev/null; then
    echo "FAIL cut $i: the job still runs $((deadline + bound)) s after the cut"; status=1
    tail -8 "$tmp/err$i"
    kill -9 $job 2>/dev/null
  fi
  wait $job; rc=$?
  [ $rc -ne 0 ] || { echo "FAIL cut $i: the job exited 0"; status=1; }
  # Who named the lost host: a survivor's deadline line or, when the daemons
  # lose the host first (the survivors can be inside MPI's progress engine),
  # OpenMPI's line naming the lost daemon's node.
  # (No grep -q after a pipe: under pipefail its early exit fails the pipe.)
  if [ -n "$(grep "timed out" "$tmp/err$i" | grep "no answer from peers \[2\] on host ${p}3")" ]; then
    named="a survivor's deadline line (the peer found silent)"
  elif [ -n "$(grep "^tessera: error: .*timed out" "$tmp/err$i" | grep "${p}3")" ]; then
    named="a survivor's deadline line"
  elif [ -n "$(grep -A4 "lost communication with a remote daemon" "$tmp/err$i" | grep "on node ${p}3")" ]; then
    named="OpenMPI's lost-daemon line"
  else
    # Reported, not failed on: OpenMPI sometimes files the lost daemon under
    # "unable to reliably start one or more daemons", naming no host.
    named="no line"
  fi
  sleep 1
  left=""
  for h in 1 2 3; do left+=$(ip netns pids "${p}$h" 2>/dev/null | tr '\n' ' '); done
  if [ -n "${left// /}" ]; then
    echo "FAIL cut $i: processes left in the hosts' namespaces: $(for pid in $left; do ps -o comm= -p "$pid"; done | sort | uniq -c | tr '\n' ' ')"
    status=1
    for pid in $left; do kill -9 "$pid" 2>/dev/null; done
  fi
  echo "cut $i: the job ended (exit $rc) ${took} s after the cut, ${named} named ${p}3; nothing left on any host"
  bash "$cluster" heal "${p}3" --prefix $p >/dev/null
  [ $status -eq 0 ] || break
done
[ $status -eq 0 ] && echo "ok   $cuts permanent cuts: every job ended within ${deadline} + ${bound} s, nothing left running"
exit $status
