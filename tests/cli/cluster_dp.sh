#!/usr/bin/env bash
# Multi-host runs on the emulated cluster (scripts/cluster.sh: network
# namespaces behind a bridge, links shaped with tc):
#  - dp training on 2 and 4 namespace hosts gives the losses of one host;
#  - all-reduce on 1 Gbit/s links moves each byte over the link once, both
#    ways at a time (more than 60% of theoretical busbw at large sizes, which
#    no half-duplex or twice-sending algorithm reaches; the 90% goal is
#    measured in docs/performance.md, not asserted here, since two busy cores
#    shave 10-30%), and p2p bandwidth follows the shaping: at most
#    1.1 Gbit/s (unshaped loopback is over 10) and at least 0.75 (a busy
#    machine measured 0.85-0.9; the figure itself is in performance.md);
#  - cutting a link mid-step gives, on every surviving rank, the deadline
#    error naming the unreachable peer and its host; no hang.
set -uo pipefail
tessera=$1; tests=$2
source "$tests/cli/netns_common.inc"  # $root, $cluster; SKIP without namespaces

tmp=$(mktemp -d)
p=tc$$
trap 'bash "$cluster" down --prefix $p >/dev/null 2>&1; rm -rf "$tmp"' EXIT
source "$tests/cli/dp_common.inc"
status=0
bash "$cluster" up 4 --rate 1gbit --prefix $p >/dev/null || { echo "FAIL: cluster up"; exit 1; }
hosts4="${p}1:1,${p}2:1,${p}3:1,${p}4:1"
launch() { "$tessera" launch --netns --tcp-if 10.99.0.0/24 "$@"; }
run() { local out=$1; shift; "$@" --set "log.metrics=$tmp/$out.jsonl" --set "checkpoint.dir=$tmp/$out" >"$tmp/$out.log" 2>&1 || { echo "FAIL $out:"; tail -5 "$tmp/$out.log"; status=1; }; }

# 1. Same losses on one host and on 2 and 4 namespace hosts (same global batch).
run one "$tessera" train --config "$tmp/cfg.toml" --set train.micro_batch=2 --set train.grad_accum=4
run two launch -n 2 --hosts "${p}1:1,${p}2:1" -- train --config "$tmp/cfg.toml" --set train.micro_batch=2 --set train.grad_accum=2 --set parallel.dp=2
run four launch -n 4 --hosts "$hosts4" -- train --config "$tmp/cfg.toml" --set train.micro_batch=2 --set parallel.dp=4
same_losses "$tmp/one.jsonl" "$tmp/two.jsonl" 1e-5 "2 namespace hosts vs one host" || status=1
same_losses "$tmp/one.jsonl" "$tmp/four.jsonl" 1e-5 "4 namespace hosts vs one host" || status=1

# 2. All-reduce at 1 Gbit/s: > 60% of the link's busbw at large sizes. An
# algorithm that sends every byte twice, or that sends one way at a time
# (libnbc's default binomial reduce + broadcast), reaches at most 50%; the
# ring's full-duplex exchange measures 69-83% on two busy cores (90% and more
# on an idle machine, in docs/performance.md). A run under the bar is run once
# more (the best of the two counts), since a busy machine can slow one run.
allreduce_pct() {
  launch -n 2 --hosts "${p}1:1,${p}2:1" -- bench allreduce -b 16M -e 64M -f 4 -n 3 -w 1 -c 1 --link-gbps 1 --json \
    >"$tmp/ar.json" 2>"$tmp/ar.err" || { echo "FAIL allreduce bench:" >&2; tail -3 "$tmp/ar.err" >&2; return 1; }
  grep '"summary"' "$tmp/ar.json" | sed 's/.*"large_pct_of_link": *\([0-9.]*\).*/\1/'
}
above() { awk -v x="$1" -v t="$2" 'BEGIN { exit !(x + 0 > t) }'; }
pct=$(allreduce_pct) || status=1
if ! above "${pct:-0}" 60; then
  first=$pct; pct=$(allreduce_pct) || status=1
  above "${first:-0}" "${pct:-0}" && pct=$first
fi
if above "${pct:-0}" 60; then echo "ok   allreduce at 1 Gbit/s: large busbw ${pct}% of theoretical"
else echo "FAIL allreduce at 1 Gbit/s: large busbw ${pct:-?}% of theoretical (want > 60)"; cat "$tmp/ar.json"; status=1; fi

# 3. p2p bandwidth follows the shaping.
launch -n 2 --hosts "${p}1:1,${p}2:1" -- bench p2p -b 32M -n 3 -w 1 --lat-iters 20 --link-gbps 1 --json \
  >"$tmp/p2p.json" 2>"$tmp/p2p.err" || { echo "FAIL p2p bench:"; tail -3 "$tmp/p2p.err"; status=1; }
bad=$(grep '"src"' "$tmp/p2p.json" | sed 's/.*"gbps_n": *\([0-9.]*\).*/\1/' | awk '$1 < 0.75 || $1 > 1.1' | wc -l)
pairs=$(grep -c '"src"' "$tmp/p2p.json")
if [ "$pairs" -ge 1 ] && [ "$bad" -eq 0 ]; then echo "ok   p2p at 1 Gbit/s: $(grep '"src"' "$tmp/p2p.json" | sed 's/.*"gbps_n": *\([0-9.]*\).*/\1/' | tr '\n' ' ')Gbit/s"
else echo "FAIL p2p at 1 Gbit/s: $pairs pair(s), $bad outside [0.75, 1.1] Gbit/s"; cat "$tmp/p2p.json"; status=1; fi

# 4. Cut a link mid-training: the surviving ranks name the peer and its host.
launch -n 3 --hosts "${p}1:1,${p}2:1,${p}3:1" -- train --config "$tmp/cfg.toml" --set train.micro_batch=2 \
  --set parallel.dp=3 --set train.steps=100000 --set train.eval_every=0 --set parallel.timeout=4 \
  >"$tmp/cut.out" 2>"$tmp/cut.err" &
job=$!
# Cut only once training runs (a slow start-up is no reason to cut while MPI
# is still connecting, which is another failure than the one checked here).
for _ in $(seq 600); do grep -q "^step .*/100000" "$tmp/cut.out" 2>/dev/null && break; kill -0 $job 2>/dev/null || break; sleep 0.2; done
if ! grep -q "^step .*/100000" "$tmp/cut.out" 2>/dev/null; then
  echo "FAIL cut: no training step (the job ended, or 120 s passed)"; cat "$tmp/cut.err"; kill -9 $job 2>/dev/null; exit 1
fi
start=$(date +%s)
bash "$cluster" cut "${p}3" --prefix $p >/dev/null
for _ in $(seq 300); do kill -0 $job 2>/dev/null || break; sleep 0.2; done
if kill -0 $job 2>/dev/null; then echo "FAIL cut: the job still runs 60 s after the cut (hang)"; kill -9 $job; status=1; fi
wait $job; rc=$?; took=$(( $(date +%s) - start ))
for r in 0 1; do
  if grep "timed out" "$tmp/cut.err" | grep "no answer from peers \[2\] on host ${p}3" | grep -q "(rank $r on ${p}$((r + 1)))"; then
    echo "ok   cut: rank $r reported: $(grep "(rank $r on" "$tmp/cut.err" | head -1)"
  else
    echo "FAIL cut: no deadline error naming peer 2 on ${p}3 from rank $r"; status=1
  fi
done
[ $rc -ne 0 ] || { echo "FAIL cut: the job exited 0"; status=1; }
echo "cut: the job ended with status $rc ${took}s after the cut"
[ $status -ne 0 ] && { echo "--- cut stderr"; cat "$tmp/cut.err"; }
exit $status
