#!/usr/bin/env bash
# Elastic training: the state lost with every worker, the deadlines, and the
# metrics file's completeness (docs/elastic.md "Failure handling"), on
# loopback. Each case trains the same tiny GPT with validation every 10 steps
# and must log every step exactly once, with every step's loss (and every
# validation loss) equal to a fixed-size single-process run of the same
# global batch within 1e-5 relative:
#   lost:     every worker killed at once (SIGKILL, after step 12, with
#             checkpoints every 5 steps); the restarted workers hold no state
#             and load the newest checkpoint (not step 0 with fresh weights);
#   nockpt:   the same without checkpoints: the job fails with one line;
#   unlogged: rank 0 dies after it completed a step and before it logged it;
#             the next round's rank 0 logs it;
#   record:   a member dies between joining a round and writing its record;
#             the round is abandoned within seconds (not 30 s);
#   slow:     a worker stopped (SIGSTOP) for 8 s with --rdzv-timeout 4: the
#             collectives' deadline is parallel.timeout (30 s), not the
#             rendezvous timeout: no failure, one round;
#   silent:   a worker stopped with parallel.timeout 4: the survivors' error
#             names the stopped worker as the rank they waited on.
#   ELASTIC_CASES="lost slow"   run only these cases
set -euo pipefail
tessera=$1; tests=$2
tmp=${ELASTIC_TMP:-$(mktemp -d)}
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${stopped[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  [ -n "${ELASTIC_TMP:-}" ] || rm -rf "$tmp"
}
stopped=()
trap cleanup EXIT
source "$tests/cli/dp_common.inc"
export OMP_NUM_THREADS=1
steps=30
base=(--set train.micro_batch=2 --set train.grad_accum=4 --set "train.steps=$steps" --set train.warmup=2
      --set model.dim=64 --set model.layers=3 --set train.lr=1e-3 --set train.min_lr=1e-4
      --set train.eval_every=10 --set train.eval_batches=3)
timeout 120 "$tessera" train --config "$tmp/cfg.toml" "${base[@]}" --set "log.metrics=$tmp/ref.jsonl" \
  --set "checkpoint.dir=$tmp/ref" >"$tmp/ref.log" 2>&1 || { cat "$tmp/ref.log"; exit 1; }

# agent CASE I RESTARTS [ENV=VALUE...]: starts agent I of a case in the
# background, with the case's extra training flags X and --rdzv-timeout RT.
agent() {
  local c=$1 i=$2 r=$3; shift 3
  env "$@" timeout 100 "$tessera" elastic --min 2 --max 3 --rdzv "embedded:127.0.0.1:$port" --job "$c" \
    --last-call 1 --rdzv-timeout "$rt" --max-restarts "$r" -- train --config "$tmp/cfg.toml" "${base[@]}" "${X[@]}" \
    --set "log.metrics=$tmp/$c.jsonl" --set "checkpoint.dir=$tmp/$c$i" >"$tmp/$c.a$i.log" 2>&1 &
  apids[$i]=$!
  pids+=($!)
}
fail() { echo "FAIL $c: $*"; tail -n 15 "$tmp/$c".a*.log; exit 1; }
wait_for() {
  local what=$1; shift
  for _ in $(seq 1 3000); do "$@" && return 0; sleep 0.02; done
  fail "$what never happened"
}
at_step() { [ -n "$(grep -h "^step *$1/" "$tmp/$c".a*.log 2>/dev/null || true)" ]; }
has() { [ -n "$(grep -h -- "$1" "$tmp/$c".a*.log "$tmp/$c.jsonl" 2>/dev/null || true)" ]; }
worker_of() { grep -o "started worker pid [0-9]*" "$tmp/$c.a$1.log" | tail -1 | awk '{print $4}'; }
want() { has "$2" || fail "$1: no '$2'"; }
# finish OK_AGENTS FAILED_AGENTS: the agents' exits, then every step against the reference.
finish() {
  local i
  for i in $1; do wait "${apids[$i]}" || fail "agent $i exited $?"; done
  for i in $2; do if wait "${apids[$i]}"; then fail "agent $i should have failed"; fi; done
  elastic_losses "$tmp/ref.jsonl" "$tmp/$c.jsonl" "$steps" 1e-5 "$c" || fail "the metrics differ from the fixed-size run"
}
# membership_count: rounds formed (rank 0's events).
rounds() { grep -c '"event":"membership"' "$tmp/$c.jsonl"; }
cases=${ELASTIC_CASES:-lost nockpt unlogged record slow silent}

for c in $cases; do
  apids=(); port=$(free_port); t0=$(date +%s); rt=20; X=(--set parallel.timeout=8)
  case $c in
    lost|nockpt)
      # Every worker kills itself (SIGKILL) once it completed step 12;
      # their agents restart them.
      [ $c = lost ] && X+=(--set checkpoint.every=5)
      for i in 0 1 2; do agent $c $i 1 TESSERA_ELASTIC_FAULT=after-step@12; done
      if [ $c = lost ]; then
        finish "0 1 2" ""
        want "the reload" "no worker holds the job's state (it had completed at least step .*); rank . loaded the checkpoint of step"
        want "the reload's event" '"event":"state_from_disk"'
        echo "ok   lost: every worker killed at once; the restarted ones continued from the checkpoint [$(( $(date +%s) - t0 )) s]"
      else
        for i in 0 1 2; do if wait "${apids[$i]}"; then fail "agent $i should have failed"; fi; done
        line="tessera: error: elastic: no worker of round 1 holds the state of job 'nockpt' (it had completed at least step"
        [ -n "$(grep -h -- "$line" "$tmp/$c".a*.log)" ] || fail "no '$line'"
        [ -z "$(grep -h "^step *1/" "$tmp/$c".a*.log | sed -n 2p)" ] || fail "step 1 trained twice"
        echo "ok   nockpt: every worker killed at once, no checkpoint: the job failed in one line [$(( $(date +%s) - t0 )) s]"
      fi
      ;;
    unlogged)
      for i in 0 1 2; do agent $c $i 1 TESSERA_ELASTIC_FAULT=before-log@8; done
      finish "0 1 2" ""
      want "rank 0's death" "test fault: killing this worker at before-log in step 8"
      want "the late line" '"logged_late":true'
      echo "ok   unlogged: rank 0 died before it logged step 8; the next rank 0 logged it [$(( $(date +%s) - t0 )) s]"
      ;;
    record)
      for i in 0 1 2; do agent $c $i 1 TESSERA_ELASTIC_FAULT=rdzv-record@1; done
      wait_for "step 8" at_step 8
      kill -9 "$(worker_of 2)"
      finish "0 1 2" ""
      want "the member's death" "test fault: killing this worker at rdzv-record in round 1"
      want "the abandoned round" "round 1 abandoned: no record from slot(s) [12] of"
      # Every round formed well before the 30 s a missing record used to cost.
      worst=$(grep '"event":"membership"' "$tmp/$c.jsonl" | sed 's/.*"rendezvous_s":\([0-9.]*\).*/\1/' | sort -g | tail -1)
      awk -v w="$worst" 'BEGIN { exit !(w < 20) }' || fail "a round took $worst s to form"
      echo "ok   record: a member died before its record; the next round formed (slowest rendezvous ${worst} s) [$(( $(date +%s) - t0 )) s]"
      ;;
    slow)
      rt=4; X=(--set parallel.timeout=30)
      for i in 0 1 2; do agent $c $i 0; done
      wait_for "step 8" at_step 8
      w=$(worker_of 1); kill -STOP "$w"; stopped+=("$w"); sleep 8; kill -CONT "$w"
      finish "0 1 2" ""
      [ "$(rounds)" = 1 ] || fail "$(rounds) rounds: the stopped worker was taken for dead"
      if has "abandoned"; then fail "a step was abandoned"; fi
      echo "ok   slow: a worker stopped 8 s with --rdzv-timeout 4 and parallel.timeout 30: no failure [$(( $(date +%s) - t0 )) s]"
      ;;
    silent)
      X=(--set parallel.timeout=4)
      for i in 0 1 2; do agent $c $i 0; done
      wait_for "step 8" at_step 8
      # Rank 2 of round 0 (the start's "joined" list is in rank order).
      id=$(grep '"event":"membership"' "$tmp/$c.jsonl" | head -1 | python3 -c 'import json,sys; print(json.loads(sys.stdin.readline())["joined"][2])')
      w=${id##*:}
      kill -STOP "$w"; stopped+=("$w")
      wait_for "round 1" grep -q '"epoch":1,' "$tmp/$c.jsonl"
      kill -9 "$w"
      ok=""; bad=""
      for i in 0 1 2; do if [ "$(worker_of $i)" = "$w" ]; then bad=$i; else ok="$ok $i"; fi; done
      finish "$ok" "$bad"
      want "the silent peer named" "step .* abandoned: gloo dp: all_reduce .*Timed out.*waited on rank 2 ($id)"
      echo "ok   silent: a worker stopped; the survivors' deadline error named it ($id) [$(( $(date +%s) - t0 )) s]"
      ;;
    *) echo "unknown case '$c'"; exit 2 ;;
  esac
done
