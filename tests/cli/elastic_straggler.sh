#!/usr/bin/env bash
# A straggler after the job's end (docs/elastic.md, "The end of a job"):
# three agents on loopback, the embedded store. One worker is stopped
# (SIGSTOP) mid-training; the others' collective passes its deadline
# (parallel.timeout), they go on as a round of 2 and finish the job. Only
# then is the stopped worker continued: its step fails, it comes back to
# the store, which its agent's (or another agent's) store still serves
# because the worker holds its connection, reads JOB/done and ends, exit 0,
# saying the job finished without it. Every agent exits 0. (Before, the
# store ended with the last round and such a worker failed with "the
# rendezvous store ... is gone": cli.elastic_kill's rare failure, a worker
# 60 s in a send.)
set -euo pipefail
tessera=$1; tests=$2
tmp=${ELASTIC_TMP:-$(mktemp -d)}
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -CONT "$p" 2>/dev/null || true; kill "$p" 2>/dev/null || true; done
  [ -n "${ELASTIC_TMP:-}" ] || rm -rf "$tmp"
}
trap cleanup EXIT
source "$tests/cli/dp_common.inc"
export OMP_NUM_THREADS=1
port=$(free_port)
S=(--set train.micro_batch=2 --set train.grad_accum=3 --set train.steps=30 --set train.warmup=2
   --set parallel.timeout=4 --set model.dim=32 --set model.layers=2)
for i in 0 1 2; do
  timeout 240 "$tessera" elastic --min 2 --max 3 --rdzv "embedded:127.0.0.1:$port" --job straggle --last-call 1 \
    --rdzv-timeout 30 --max-restarts 0 -- train --config "$tmp/cfg.toml" "${S[@]}" \
    --set "checkpoint.dir=$tmp/el$i" >"$tmp/a$i.log" 2>&1 &
  pids+=($!)
done
wait_for() {  # wait_for WHAT SECONDS CMD...
  local what=$1 secs=$2; shift 2
  for _ in $(seq 1 $((secs * 20))); do "$@" && return 0; sleep 0.05; done
  echo "FAIL: $what"; cat "$tmp"/a*.log; exit 1
}
at_step() { [ -n "$(grep -h "^step *$1/" "$tmp"/a*.log 2>/dev/null || true)" ]; }
saved() { [ -n "$(grep -h "^saved " "$tmp"/a*.log 2>/dev/null || true)" ]; }
worker_of() { grep -o "started worker pid [0-9]*" "$tmp/a$1.log" | head -1 | awk '{print $4}'; }
wait_for "step 5" 120 at_step 5
w=$(worker_of 1)
kill -STOP "$w"
wait_for "the job's end without worker $w" 120 saved
sleep 1
kill -CONT "$w"
status=0
for i in 0 1 2; do wait "${pids[$i]}" || { echo "FAIL: agent $i exited $?"; status=1; }; done
[ $status = 0 ] || { cat "$tmp"/a*.log; exit 1; }
grep -q "the job finished in round [0-9]* without this worker" "$tmp/a1.log" ||
  { echo "FAIL: the straggler's line"; cat "$tmp"/a*.log; exit 1; }
echo "ok   the stopped worker ended after the job, exit 0: $(grep -o 'the job finished.*' "$tmp/a1.log")"
