#!/usr/bin/env bash
# Elastic training through an external store (docs/elastic.md): a real
# redis-server on a free loopback port (no persistence, its own folder);
# 3 agents train a tiny GPT with --rdzv redis://; one worker is killed with
# kill -9 and not restarted, a second is killed and restarted (it rejoins,
# through the Redis rounds, and receives the state by broadcast). Every
# step's loss equals a fixed-size single-process run of the same global
# batch within 1e-5 relative, and the final parameters within 1e-4 (as
# cli.elastic_kill). Every key the job wrote is under its job id.
# A Redis address where nothing listens, and a server that is not Redis,
# each give one error line naming the address.
set -euo pipefail
tessera=$1; tests=$2
command -v redis-server >/dev/null || { echo "SKIP: redis-server is not installed (scripts/setup.sh)"; exit 0; }
tmp=${ELASTIC_TMP:-$(mktemp -d)}
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; [ -n "${ELASTIC_TMP:-}" ] || rm -rf "$tmp"; }
trap cleanup EXIT
source "$tests/cli/dp_common.inc"
export OMP_NUM_THREADS=1

port=$(free_port)
mkdir -p "$tmp/redis"
redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --dir "$tmp/redis" \
  --logfile "$tmp/redis/log" >/dev/null 2>&1 &
pids+=($!)
for _ in $(seq 100); do [ "$(redis-cli -p "$port" ping 2>/dev/null || true)" = PONG ] && break; sleep 0.1; done
[ "$(redis-cli -p "$port" ping)" = PONG ] || { echo "FAIL: redis-server did not start"; cat "$tmp/redis/log"; exit 1; }

S=(--set train.micro_batch=2 --set train.grad_accum=4 --set train.steps=30 --set train.warmup=2 --set parallel.timeout=60
   --set model.dim=64 --set model.layers=3 --set train.lr=1e-3 --set train.min_lr=1e-4)
timeout 300 "$tessera" train --config "$tmp/cfg.toml" "${S[@]}" --set "log.metrics=$tmp/ref.jsonl" \
  --set "checkpoint.dir=$tmp/ref" >"$tmp/ref.log" 2>&1 || { cat "$tmp/ref.log"; exit 1; }

for i in 0 1 2; do
  restarts=0; [ $i = 1 ] && restarts=1
  timeout 300 "$tessera" elastic --min 2 --max 3 --rdzv "redis://127.0.0.1:$port" --job redisjob --last-call 1 \
    --max-restarts $restarts -- train --config "$tmp/cfg.toml" "${S[@]}" --set "log.metrics=$tmp/el.jsonl" \
    --set "checkpoint.dir=$tmp/el$i" >"$tmp/a$i.log" 2>&1 &
  pids+=($!)
done
wait_step() {
  for _ in $(seq 1 6000); do
    [ -n "$(grep -h "^step *$1/" "$tmp"/a*.log 2>/dev/null || true)" ] && return 0
    sleep 0.02
  done
  echo "FAIL: step $1 never reached"; cat "$tmp"/a*.log; exit 1
}
worker_of() { grep -o "started worker pid [0-9]*" "$tmp/a$1.log" | head -1 | awk '{print $4}'; }
wait_step 8
kill -9 "$(worker_of 2)"
wait_step 16
kill -9 "$(worker_of 1)"
n=${#pids[@]}
status=0
for i in 0 1; do wait "${pids[$((n - 3 + i))]}" || { echo "FAIL: agent $i exited $?"; status=1; }; done
if wait "${pids[$((n - 1))]}"; then echo "FAIL: agent 2 should have failed (no restarts)"; status=1; fi
[ $status = 0 ] || { cat "$tmp"/a*.log; exit 1; }
[ -n "$(grep "uses the rendezvous store redis://127.0.0.1:$port (job 'redisjob'" "$tmp/a0.log")" ] || { echo "FAIL: agent line"; cat "$tmp/a0.log"; exit 1; }
[ -n "$(grep "restarting it to rejoin" "$tmp/a1.log")" ] || { echo "FAIL: agent 1 did not restart"; exit 1; }
events=$(grep '"event":"membership"' "$tmp/el.jsonl")
[ -n "$(echo "$events" | grep '"workers_before":3' | grep -v '"workers":3')" ] || { echo "FAIL: no round after 3"; echo "$events"; exit 1; }
[ -n "$(echo "$events" | grep -v '"joined":\[\]' | grep -v '"reason":"start"')" ] || { echo "FAIL: no join"; echo "$events"; exit 1; }
[ -n "$(grep '"event":"state_transfer"' "$tmp/el.jsonl")" ] || { echo "FAIL: no state transfer"; exit 1; }

# Same training as the fixed-size run: every step's loss, each step logged
# once (a step completed by a rank 0 killed before it logged it is logged by
# the next round's rank 0), and the final parameters.
python3 - "$tmp/ref.jsonl" "$tmp/el.jsonl" "$tmp/ref/model.safetensors" "$tmp"/el*/model.safetensors <<'PY'
import array, json, math, struct, sys
def losses(p):
    out, n = {}, 0
    for line in open(p):
        j = json.loads(line)
        if "loss" in j and "event" not in j: out[j["step"]] = j["loss"]; n += 1
    return out, n
(ref, _), (el, lines) = losses(sys.argv[1]), losses(sys.argv[2])
worst = max(abs(ref[s] - l) / abs(ref[s]) for s, l in el.items())
ok = len(ref) == 30 and sorted(el) == list(range(1, 31)) and lines == 30 and worst <= 1e-5
print(f"{'ok  ' if ok else 'FAIL'} losses through Redis: {len(el)} of 30 steps logged, worst relative difference {worst:.2e}")
def load(p):
    b = open(p, "rb").read(); n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n]); d = b[8 + n:]
    return {k: array.array("f", d[v["data_offsets"][0]:v["data_offsets"][1]]) for k, v in h.items() if k != "__metadata__"}
a, b = load(sys.argv[3]), load(sys.argv[4])
num = sum((p - q) ** 2 for k in a for p, q in zip(a[k], b[k])); den = sum(p * p for k in a for p in a[k])
r = math.sqrt(num / den)
print(f"{'ok  ' if r <= 1e-4 else 'FAIL'} parameters: relative L2 difference {r:.2e}")
sys.exit(0 if ok and r <= 1e-4 and a.keys() == b.keys() else 1)
PY

# The job's keys are all under its id (two jobs can share the server), and
# the rounds' records are there.
keys=$(redis-cli -p "$port" --scan)
[ -n "$(echo "$keys" | grep '^redisjob/r0/closed$')" ] || { echo "FAIL: no round key"; echo "$keys"; exit 1; }
[ -z "$(echo "$keys" | grep -v '^redisjob/')" ] || { echo "FAIL: keys outside the job's prefix"; echo "$keys"; exit 1; }

# Nothing listens: one line naming the address, within the connect deadline.
closed_port dead
if timeout 60 "$tessera" elastic --min 1 --max 1 --rdzv "redis://127.0.0.1:$dead" --job x \
    -- train --config "$tmp/cfg.toml" >"$tmp/dead.log" 2>&1; then echo "FAIL: a dead Redis should fail"; exit 1; fi
[ "$(grep -c "tessera: error: rendezvous store redis://127.0.0.1:$dead unreachable" "$tmp/dead.log")" = 1 ] &&
  [ "$(grep -c . "$tmp/dead.log")" = 1 ] || { echo "FAIL: dead Redis line"; cat "$tmp/dead.log"; exit 1; }
# A server that is not Redis (an HTTP server): one line naming it.
http=$(free_port)
python3 -m http.server "$http" --bind 127.0.0.1 --directory "$tmp/redis" >/dev/null 2>&1 &
pids+=($!)
for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/$http) 2>/dev/null && break; sleep 0.1; done
if timeout 60 "$tessera" elastic --min 1 --max 1 --rdzv "redis://127.0.0.1:$http" --job x \
    -- train --config "$tmp/cfg.toml" >"$tmp/http.log" 2>&1; then echo "FAIL: a non-Redis server should fail"; exit 1; fi
[ "$(grep -c "tessera: error: rendezvous store redis://127.0.0.1:$http" "$tmp/http.log")" = 1 ] &&
  [ "$(grep -c . "$tmp/http.log")" = 1 ] || { echo "FAIL: non-Redis line"; cat "$tmp/http.log"; exit 1; }
# A Redis that asks for a password: refused, one line with Redis' words.
redis-cli -p "$port" config set requirepass secret >/dev/null
if timeout 60 "$tessera" elastic --min 1 --max 1 --rdzv "redis://127.0.0.1:$port" --job x \
    -- train --config "$tmp/cfg.toml" >"$tmp/auth.log" 2>&1; then echo "FAIL: NOAUTH should fail"; exit 1; fi
[ "$(grep -c "tessera: error: rendezvous store redis://127.0.0.1:$port refused PING: NOAUTH" "$tmp/auth.log")" = 1 ] ||
  { echo "FAIL: NOAUTH line"; cat "$tmp/auth.log"; exit 1; }
echo "ok   elastic through Redis: kill -9, rejoin, keys under the job id, unreachable and refusing servers"
