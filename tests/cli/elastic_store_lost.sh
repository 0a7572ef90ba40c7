#!/usr/bin/env bash
# Issue #34: --rdzv-timeout bounds what it says. Three agents train with the
# embedded store (served by the first agent) and --rdzv-timeout 5; the
# store's agent and its worker are killed with kill -9. The survivors end
# within the flag plus a small margin (detecting the dead peer, one 0.5 s
# retry: docs/elastic.md), each with one line that names the store, says it
# is gone and what to do; no process is left.
set -euo pipefail
tessera=$1; tests=$2
tmp=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done; rm -rf "$tmp"; }
trap cleanup EXIT
source "$tests/cli/dp_common.inc"
export OMP_NUM_THREADS=1
port=$(free_port)
rt=5
S=(--set train.micro_batch=2 --set train.grad_accum=3 --set train.steps=100000 --set parallel.timeout=30)
for i in 0 1 2; do
  timeout 120 "$tessera" elastic --min 1 --max 3 --rdzv "embedded:127.0.0.1:$port" --job lost --last-call 1 \
    --rdzv-timeout $rt --max-restarts 0 -- train --config "$tmp/cfg.toml" "${S[@]}" \
    --set "checkpoint.dir=$tmp/c$i" >"$tmp/a$i.log" 2>&1 &
  pids+=($!)
  [ $i = 0 ] && for _ in $(seq 100); do grep -q "serves the rendezvous store" "$tmp/a0.log" && break; sleep 0.1; done
done
grep -q "agent .* serves the rendezvous store on 127.0.0.1:$port" "$tmp/a0.log" || { cat "$tmp/a0.log"; exit 1; }
# Until the three train together: rank 0 (on any of the hosts) logs the
# round of 3 and then steps.
steps() { cat "$tmp"/a*.log 2>/dev/null | grep -c "^step .* 3 worker(s)" || true; }
for _ in $(seq 1200); do
  [ "$(steps)" -ge 5 ] && break
  sleep 0.1
done
[ "$(steps)" -ge 5 ] || { echo "FAIL: the job never trained on 3"; tail -n 5 "$tmp"/a*.log; exit 1; }
read -r agent worker < <(sed -n 's/^elastic: agent \([0-9]*\) started worker pid \([0-9]*\).*/\1 \2/p' "$tmp/a0.log" | head -1)
pids+=($agent $worker)
kill -9 "$agent" "$worker"
t0=$(date +%s.%N)
# The survivors' agents exit (bounded by the flag plus a margin, checked below).
for p in "${pids[1]}" "${pids[2]}"; do
  for _ in $(seq 600); do kill -0 "$p" 2>/dev/null || break; sleep 0.05; done
done
t1=$(date +%s.%N)
took=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
margin=6  # detecting the dead peer's closed connections, a 0.5 s retry, exiting
awk -v t="$took" -v m="$((rt + margin))" 'BEGIN { exit !(t <= m) }' || {
  echo "FAIL: the survivors took $took s to end (--rdzv-timeout $rt + $margin s margin)"; tail -n 5 "$tmp"/a1.log "$tmp"/a2.log; exit 1; }
for i in 1 2; do
  line=$(grep "tessera: error: elastic: the rendezvous store at 127.0.0.1:$port is gone: no answer for [0-9]* s (--rdzv-timeout $rt" "$tmp/a$i.log" || true)
  [ "$(echo "$line" | grep -c .)" = 1 ] || { echo "FAIL: agent $i's line:"; cat "$tmp/a$i.log"; exit 1; }
  echo "$line" | grep -q -- "--resume latest" || { echo "FAIL: no advice: $line"; exit 1; }
done
for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && { echo "FAIL: pid $p still runs"; exit 1; }; done
echo "ok   store lost: the survivors ended $took s after the store's host was killed (--rdzv-timeout $rt), one line each:"
echo "     $line"
