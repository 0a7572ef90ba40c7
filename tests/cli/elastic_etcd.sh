#!/usr/bin/env bash
# Elastic training through etcd (docs/elastic.md): a real etcd on free
# loopback ports (its own data folder); 3 agents train a tiny GPT with
# --rdzv etcd://, one worker is killed with kill -9 and restarted (it
# rejoins and receives the state); the logged losses and the final
# parameters equal a fixed-size single-process run. An etcd address where
# nothing listens gives one error line naming it. (cli.elastic_redis covers
# the same through Redis, with more failure cases.)
set -euo pipefail
tessera=$1; tests=$2
command -v etcd >/dev/null || { echo "SKIP: etcd is not installed (scripts/setup.sh: etcd-server)"; exit 0; }
tmp=${ELASTIC_TMP:-$(mktemp -d)}
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; [ -n "${ELASTIC_TMP:-}" ] || rm -rf "$tmp"; }
trap cleanup EXIT
source "$tests/cli/dp_common.inc"
export OMP_NUM_THREADS=1

port=$(free_port); peer=$(free_port)
etcd --data-dir "$tmp/etcd" --listen-client-urls "http://127.0.0.1:$port" --advertise-client-urls "http://127.0.0.1:$port" \
  --listen-peer-urls "http://127.0.0.1:$peer" --initial-advertise-peer-urls "http://127.0.0.1:$peer" \
  --initial-cluster "default=http://127.0.0.1:$peer" >"$tmp/etcd.log" 2>&1 &
pids+=($!)
etcd_up() { curl -sf -X POST "http://127.0.0.1:$port/v3/maintenance/status" -d '{}' >/dev/null 2>&1; }
for _ in $(seq 200); do etcd_up && break; sleep 0.1; done
etcd_up || { echo "FAIL: etcd did not answer on port $port within 20 s"; cat "$tmp/etcd.log"; exit 1; }

S=(--set train.micro_batch=2 --set train.grad_accum=4 --set train.steps=20 --set train.warmup=2 --set parallel.timeout=60
   --set model.dim=64 --set model.layers=3 --set train.lr=1e-3 --set train.min_lr=1e-4)
timeout 300 "$tessera" train --config "$tmp/cfg.toml" "${S[@]}" --set "log.metrics=$tmp/ref.jsonl" \
  --set "checkpoint.dir=$tmp/ref" >"$tmp/ref.log" 2>&1 || { cat "$tmp/ref.log"; exit 1; }
for i in 0 1 2; do
  timeout 300 "$tessera" elastic --min 2 --max 3 --rdzv "etcd://127.0.0.1:$port" --job etcdjob --last-call 1 \
    --max-restarts 1 -- train --config "$tmp/cfg.toml" "${S[@]}" --set "log.metrics=$tmp/el.jsonl" \
    --set "checkpoint.dir=$tmp/el$i" >"$tmp/a$i.log" 2>&1 &
  pids+=($!)
done
reached() { [ -n "$(grep -h "^step *$1/" "$tmp"/a*.log 2>/dev/null || true)" ]; }
for _ in $(seq 1 6000); do reached 8 && break; sleep 0.02; done
reached 8 || { echo "FAIL: step 8 never reached"; cat "$tmp"/a*.log; exit 1; }
# A worker that is not rank 0 (rank 0 prints the steps).
victim=$(grep -L "^step" "$tmp"/a*.log | head -1)
[ -n "$victim" ] || { echo "FAIL: no agent without steps (every worker rank 0?)"; cat "$tmp"/a*.log; exit 1; }
kill -9 "$(grep -o "started worker pid [0-9]*" "$victim" | head -1 | awk '{print $4}')"
n=${#pids[@]}
for i in 0 1 2; do wait "${pids[$((n - 3 + i))]}" || { echo "FAIL: agent $i exited $?"; cat "$tmp"/a*.log; exit 1; }; done
[ -n "$(grep '"event":"state_transfer"' "$tmp/el.jsonl")" ] || { echo "FAIL: no state transfer"; cat "$tmp"/a*.log; exit 1; }
elastic_losses "$tmp/ref.jsonl" "$tmp/el.jsonl" 20 1e-5 "losses through etcd"

closed_port dead
if timeout 60 "$tessera" elastic --min 1 --max 1 --rdzv "etcd://127.0.0.1:$dead" --job x \
    -- train --config "$tmp/cfg.toml" >"$tmp/dead.log" 2>&1; then echo "FAIL: a dead etcd should fail"; exit 1; fi
[ "$(grep -c "tessera: error: rendezvous store etcd://127.0.0.1:$dead unreachable" "$tmp/dead.log")" = 1 ] &&
  [ "$(grep -c . "$tmp/dead.log")" = 1 ] || { echo "FAIL: dead etcd line"; cat "$tmp/dead.log"; exit 1; }
echo "ok   elastic through etcd: kill -9 and rejoin, unreachable server"
