#!/usr/bin/env bash
# The seeded fuzz of tests/cli/serve_fuzz.py against `tessera route` in front
# of a real worker: the router answers bad input as the server does
# (OpenAI-shaped 4xx, no 5xx, no crash), and afterwards the router and its
# worker are idle and still complete.
#   SERVE_FUZZ_SEED=N, SERVE_FUZZ_COUNT=N as for serve_fuzz.sh
set -euo pipefail
tessera=$1; tests=$2
export OMP_NUM_THREADS=1
seed=${SERVE_FUZZ_SEED:-1}
count=${SERVE_FUZZ_COUNT:-5000}
max_body=65536

tmp=$(mktemp -d)
source "$tests/cli/serve_common.inc"

serve_model "$tmp/m"
key="fuzz-key-$RANDOM"
serve_start w --model "$tmp/m/run/model.safetensors" --served-model-name tiny-byte --threads 1 --max-body "$max_body"
route_start r --tier "main=$w_url" --api-key "$key" --max-body "$max_body" --served-model-name tiny-byte
port=${r_url##*:}
echo "route_fuzz: seed $seed, $count cases against the router on port $port"
rc=0
python3 "$tests/cli/serve_fuzz.py" --router --port "$port" --key "$key" --model tiny-byte --max-body "$max_body" \
  --seed "$seed" --count "$count" --budget 30 || rc=$?
for p in "$r_pid" "$w_pid"; do
  kill -0 "$p" 2>/dev/null || { echo "FAIL a process died during the fuzz (seed $seed)"; tail -20 "$tmp"/*.log; exit 1; }
done
h=$(curl -s "$w_url/health")
echo "$h" | grep -q '"running":0' && echo "$h" | grep -q '"kv_blocks_used":0' ||
  { echo "FAIL the worker is not idle after the fuzz: $h"; exit 1; }
[ $rc -eq 0 ] || exit $rc
echo "ok   route_fuzz: seed $seed"
