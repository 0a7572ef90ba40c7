#!/usr/bin/env bash
# The official openai npm client (tests/clients, installed by
# scripts/setup.sh) against `tessera serve --api-key`: completions and chat
# completions, plain and streamed, models.list, and a wrong key as an
# AuthenticationError. The checks are in tests/clients/openai_client.mjs.
set -euo pipefail
tessera=$1; tests=$2
clients="$tests/clients"
export OMP_NUM_THREADS=1

# Not a skip: a machine set up by scripts/setup.sh has both.
command -v node >/dev/null 2>&1 || { echo "FAIL node is not installed: run scripts/setup.sh"; exit 1; }
[ -f "$clients/node_modules/openai/package.json" ] \
  || { echo "FAIL $clients/node_modules/openai is missing: run scripts/setup.sh (npm ci --prefix tests/clients)"; exit 1; }

tmp=$(mktemp -d)
source "$tests/cli/serve_common.inc"  # its EXIT trap kills the server and removes $tmp

serve_model "$tmp/m"
key="test-key-$RANDOM"
serve_start srv --model "$tmp/m/run/model.safetensors" --served-model-name tiny-byte --api-key "$key" --threads 1
port=${srv_url##*:}
echo "node $(node --version), openai $(node -p "require('$clients/node_modules/openai/package.json').version"), server on port $port"

node "$clients/openai_client.mjs" "$port" "$key" tiny-byte
serve_stop srv
