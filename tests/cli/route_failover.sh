#!/usr/bin/env bash
# The failover drill (tests/cli/route_drill.py) with real processes: a router
# in front of a primary worker ("gpu" tier, fp32) and an INT8 CPU worker,
# under a steady load of streamed and non-streamed requests; the primary is
# killed (SIGKILL, then restarted), stopped (SIGSTOP, then SIGCONT), made to
# answer 500s, and made to report a device error. No request may fail, every
# stream must be whole, the switch must show in /health and the metrics, and
# traffic must come back to the primary once it has healed. Then with
# Llama-family workers, and over TLS between clients, router and workers.
set -euo pipefail
tessera=$1; tests=$2
tmp=$(mktemp -d)
source "$tests/cli/serve_common.inc"

serve_model "$tmp/m"
OMP_NUM_THREADS=1 python3 "$tests/cli/route_drill.py" --tessera "$tessera" --model "$tmp/m/run/model.safetensors" \
  --gpu-args "--threads 1" --cpu-args "--dtype int8 --threads 1" --threads 3 --phase 1.0 --logdir "$tmp/logs"

# The same drill with Llama-family workers (issue #30): a random-weight
# Llama folder (RMSNorm, rotary positions, SwiGLU, 4 query heads over 2
# key/value heads, untied head; tessera synth model), served in fp32 by the
# primary and quantized tensor by tensor by the INT8 fallback.
"$tessera" synth model --preset tinyllama-1.1b --layers 2 --dim 64 --heads 4 --kv-heads 2 --mlp-hidden 96 \
  --vocab 256 --context 256 --out "$tmp/llama" >/dev/null
OMP_NUM_THREADS=1 python3 "$tests/cli/route_drill.py" --tessera "$tessera" --model "$tmp/llama" \
  --gpu-args "--threads 1" --cpu-args "--dtype int8 --threads 1" --threads 3 --phase 1.0 --logdir "$tmp/logs_llama"

# The same drill over TLS (issue #34): a test CA (openssl) signs a
# certificate for 127.0.0.1; the workers and the router serve HTTPS, the
# router checks the workers against the CA, the drill's clients too.
pki="$tmp/pki"; mkdir -p "$pki"
openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=drill-ca -keyout "$pki/ca.key" -out "$pki/ca.pem" 2>/dev/null
openssl req -newkey rsa:2048 -nodes -subj /CN=127.0.0.1 -keyout "$pki/server.key" -out "$pki/server.csr" 2>/dev/null
printf 'subjectAltName=IP:127.0.0.1\n' >"$pki/san.ext"
openssl x509 -req -in "$pki/server.csr" -CA "$pki/ca.pem" -CAkey "$pki/ca.key" -CAcreateserial -days 2 \
  -extfile "$pki/san.ext" -out "$pki/server.pem" 2>/dev/null
OMP_NUM_THREADS=1 python3 "$tests/cli/route_drill.py" --tessera "$tessera" --model "$tmp/m/run/model.safetensors" \
  --gpu-args "--threads 1" --cpu-args "--dtype int8 --threads 1" --threads 3 --phase 1.0 --logdir "$tmp/logs_tls" \
  --tls-dir "$pki"
