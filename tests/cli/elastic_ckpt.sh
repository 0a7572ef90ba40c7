#!/usr/bin/env bash
# Disk checkpoints of an elastic job (docs/elastic.md, "Disk checkpoints"):
# two agents with --min 2 share one checkpoint.dir and save every 5 steps
# (rank 0 of the round); one worker is killed with kill -9 and not restarted,
# so the survivor waits below --min and fails with the documented line,
# leaving a checkpoint of its last completed step. `tessera checkpoint
# verify` accepts it, and a new elastic job started with --resume continues
# from it with every step's loss equal to an unbroken single-process run of
# the same global batch (1e-5 relative). A non-elastic `tessera train
# --resume` reads the same checkpoint.
set -euo pipefail
tessera=$1; tests=$2
tmp=${ELASTIC_TMP:-$(mktemp -d)}
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; [ -n "${ELASTIC_TMP:-}" ] || rm -rf "$tmp"; }
trap cleanup EXIT
source "$tests/cli/dp_common.inc"
export OMP_NUM_THREADS=1
# The store's port: free now, drawn from 20000..32767, below Linux's
# ephemeral range (32768..60999), where the ports of other tests (bound to
# port 0) and of outgoing connections come from.
pick_port() {
  python3 -c 'import random, socket
for _ in range(200):
    p = random.randint(20000, 32767); s = socket.socket()
    try: s.bind(("127.0.0.1", p)); print(p); break
    except OSError: pass
    finally: s.close()'
}
job=ck$$
# start_job LOG ARGS...: two agents (logs $tmp/LOG0.log, LOG1.log; pids in
# pids) on a fresh port. The port is free when drawn but released before the
# agents bind it: if another process takes it in between, none of our agents
# serves the store (they would use the stranger's): stop them and start
# again on another port.
start_job() {
  local log=$1; shift
  for attempt in 1 2 3 4 5; do
    local port; port=$(pick_port)
    pids=()
    for i in 0 1; do
      timeout 300 "$tessera" elastic --rdzv "embedded:127.0.0.1:$port" "$@" >"$tmp/$log$i.log" 2>&1 &
      pids+=($!)
    done
    for _ in $(seq 1 1500); do
      [ "$(grep -l "started worker pid" "$tmp/${log}0.log" "$tmp/${log}1.log" 2>/dev/null | wc -l)" = 2 ] && break
      kill -0 "${pids[0]}" 2>/dev/null && kill -0 "${pids[1]}" 2>/dev/null || break
      sleep 0.02
    done
    [ "$(grep -l "serves the rendezvous store" "$tmp/${log}0.log" "$tmp/${log}1.log" 2>/dev/null | wc -l)" = 1 ] && return 0
    echo "note: port $port was taken before our agents bound it (attempt $attempt); again on another port"
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  done
  echo "FAIL: no port of 5 could be served by our agents"; cat "$tmp/$log"*.log; exit 1
}
S=(--set train.micro_batch=2 --set train.grad_accum=4 --set train.steps=30 --set train.warmup=2 --set parallel.timeout=60
   --set model.dim=64 --set model.layers=3 --set train.lr=1e-3 --set train.min_lr=1e-4)

timeout 300 "$tessera" train --config "$tmp/cfg.toml" "${S[@]}" --set "log.metrics=$tmp/ref.jsonl" \
  --set "checkpoint.dir=$tmp/ref" >"$tmp/ref.log" 2>&1 || { cat "$tmp/ref.log"; exit 1; }

# The job that fails below --min.
C=(--set checkpoint.every=5 --set checkpoint.keep=2 --set "checkpoint.dir=$tmp/ck")
start_job a --min 2 --max 2 --job "$job" --last-call 0.5 --rdzv-timeout 3 --max-restarts 0 \
  -- train --config "$tmp/cfg.toml" "${S[@]}" "${C[@]}" --set "log.metrics=$tmp/el.jsonl"
wait_step() {
  for _ in $(seq 1 6000); do
    [ -n "$(grep -h "^step *$1/" "$tmp"/a*.log 2>/dev/null || true)" ] && return 0
    sleep 0.02
  done
  echo "FAIL: step $1 never reached"; cat "$tmp"/a*.log; exit 1
}
worker_of() { grep -o "started worker pid [0-9]*" "$tmp/a$1.log" | head -1 | awk '{print $4}'; }
wait_step 12
kill -9 "$(worker_of 1)"
for i in 0 1; do
  if wait "${pids[$i]}"; then echo "FAIL: agent $i should have failed"; cat "$tmp"/a*.log; exit 1; fi
done
[ "$(grep -c "tessera: error: elastic: only 1 of the minimum 2 workers joined round 1 of job '$job' within 3 s" "$tmp/a0.log")" = 1 ] ||
  { echo "FAIL: the below-min line"; cat "$tmp/a0.log"; exit 1; }
# A periodic save (rank 0, whichever worker that was): step 10, or 15 when
# the kill landed a few steps late on a busy machine (checkpoint.keep = 2
# then prunes 10), and the survivor's last completed step: at least the
# last step logged, at most one more (the step in flight, when the killed
# worker completed it too).
[ -f "$tmp/ck/step-00000010/manifest.json" ] || [ -f "$tmp/ck/step-00000015/manifest.json" ] ||
  { echo "FAIL: no periodic checkpoint of step 10 or 15"; ls "$tmp/ck"; cat "$tmp/a0.log"; exit 1; }
logged=$(grep -v '"event"' "$tmp/el.jsonl" | grep -c '"loss"')
"$tessera" checkpoint verify "$tmp/ck" >"$tmp/verify.log" 2>&1 || { cat "$tmp/verify.log"; exit 1; }
saved=$(sed -n 's/.*: step \([0-9]*\), .*/\1/p' "$tmp/verify.log")
[ -n "$saved" ] && [ "$saved" -ge "$logged" ] && [ "$saved" -le $((logged + 1)) ] && [ "$saved" -gt 10 ] ||
  { echo "FAIL: checkpoint step '$saved' after $logged logged steps"; cat "$tmp/verify.log" "$tmp/a0.log"; exit 1; }
echo "ok   below min: the job failed with the documented line and left step $saved ($logged logged)"

# A new elastic job resumes from it (2 workers, both read the shared folder).
start_job r --min 2 --max 2 --job "$job" --last-call 0.5 \
  -- train --config "$tmp/cfg.toml" "${S[@]}" "${C[@]}" --resume latest --set "log.metrics=$tmp/resumed.jsonl"
for i in 0 1; do wait "${pids[$i]}" || { echo "FAIL: resumed agent $i exited $?"; cat "$tmp"/r*.log; exit 1; }; done
[ "$(grep -c "resumed at step $saved" "$tmp"/r*.log | awk -F: '{s += $2} END {print s}')" = 2 ] ||
  { echo "FAIL: both workers resume at step $saved"; cat "$tmp"/r*.log; exit 1; }
[ -f "$tmp/ck/step-00000030/manifest.json" ] || { echo "FAIL: no checkpoint of the last step"; ls "$tmp/ck"; exit 1; }
paste <(losses "$tmp/ref.jsonl" | tail -n +$((saved + 1))) \
      <(grep -v '"event"' "$tmp/resumed.jsonl" | grep '"loss"' | sed 's/.*"loss":\([-0-9.eE+]*\).*/\1/') |
  awk -v want=$((30 - saved)) '{ n++; d = $1 - $2; if (d < 0) d = -d; r = d / ($1 < 0 ? -$1 : $1); if (r > w) w = r }
       END { if (n != want || w > 1e-5) { printf "FAIL: %d steps (want %d), worst loss difference %.2e\n", n, want, w; exit 1 }
             printf "ok   resumed: %d steps equal the unbroken run, worst relative difference %.2e\n", n, w }'

# tessera train (not elastic) resumes from the elastic job's step too.
timeout 300 "$tessera" train --config "$tmp/cfg.toml" "${S[@]}" --set train.steps=32 --resume "$tmp/ck" \
  --set "checkpoint.dir=$tmp/plain" --set "log.metrics=$tmp/plain.jsonl" >"$tmp/plain.log" 2>&1 ||
  { cat "$tmp/plain.log"; exit 1; }
[ -n "$(grep "resumed from .*step-00000030 at step 30" "$tmp/plain.log")" ] || { cat "$tmp/plain.log"; exit 1; }
echo "ok   elastic checkpoints: periodic, the fallback below min, --resume"
