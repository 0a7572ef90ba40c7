#!/usr/bin/env bash
# A bounded, seeded fuzz of `tessera serve` (tests/cli/serve_fuzz.py: a few
# thousand malformed, mutated and valid requests in seconds): every request
# is answered (or a malformed connection closed), 4xx bodies are OpenAI-shaped,
# nothing is 5xx, and the server is alive, idle and still completing after.
#   SERVE_FUZZ_SEED=N    another seed (default 1); the seed is printed either way
#   SERVE_FUZZ_COUNT=N   cases (default 5000)
set -euo pipefail
tessera=$1; tests=$2
export OMP_NUM_THREADS=1
seed=${SERVE_FUZZ_SEED:-1}
count=${SERVE_FUZZ_COUNT:-5000}
max_body=65536

tmp=$(mktemp -d)
source "$tests/cli/serve_common.inc"  # its EXIT trap kills the server and removes $tmp

serve_model "$tmp/m"
key="fuzz-key-$RANDOM"
serve_start srv --model "$tmp/m/run/model.safetensors" --served-model-name tiny-byte --api-key "$key" \
  --max-body "$max_body" --threads 1
port=${srv_url##*:}
echo "serve_fuzz: seed $seed, $count cases against port $port (--max-body $max_body)"

rc=0
python3 "$tests/cli/serve_fuzz.py" --port "$port" --key "$key" --model tiny-byte --max-body "$max_body" \
  --seed "$seed" --count "$count" --budget 40 || rc=$?
if ! kill -0 "$srv_pid" 2>/dev/null; then
  echo "FAIL the server died during the fuzz (seed $seed); its log:"; tail -20 "$tmp/srv.log"; exit 1
fi
code=$(curl -s -o /dev/null -w '%{http_code}' "$srv_url/health")
[ "$code" = 200 ] || { echo "FAIL GET /health is $code after the fuzz (seed $seed)"; exit 1; }
out=$(curl -s -H "Authorization: Bearer $key" "$srv_url/v1/completions" \
  -d '{"prompt": "The ", "max_tokens": 4, "temperature": 0}')
echo "$out" | grep -q '"completion_tokens":4' || { echo "FAIL a completion after the fuzz: $out"; exit 1; }
[ $rc -eq 0 ] || exit $rc
serve_stop srv
echo "ok   serve_fuzz: seed $seed"
