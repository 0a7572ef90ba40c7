#!/usr/bin/env bash
# Issue #34 item 2: TLS for `tessera serve`, `tessera route` and `tessera
# dashboard`, with a test
# CA made here by openssl. Over TLS the official openai npm client passes
# the same checks as over plain HTTP (tests/clients/openai_client.mjs), and
# curl gets the same greedy completion from the plain server, the TLS
# server and a TLS router in front of a TLS worker; a certificate from
# another CA is refused; with --tls-client-ca a client without a certificate
# from that CA is refused in the handshake and one with it is served; TLS
# files that cannot be used are one line at start-up, exit 1.
set -euo pipefail
tessera=$1; tests=$2
tmp=$(mktemp -d)
source "$tests/cli/serve_common.inc"
clients="$tests/clients"
command -v openssl >/dev/null || { echo "FAIL openssl is not installed: run scripts/setup.sh"; exit 1; }

# ---- A CA, a server certificate for 127.0.0.1, a client certificate, another CA ----
pki="$tmp/pki"
mkdir -p "$pki"
mkca() {  # NAME
  openssl req -x509 -newkey rsa:2048 -nodes -keyout "$pki/$1.key" -out "$pki/$1.pem" -days 2 \
    -subj "/CN=Tessera test $1" 2>/dev/null
}
mkcert() {  # NAME CA EXT
  openssl req -newkey rsa:2048 -nodes -keyout "$pki/$1.key" -out "$pki/$1.csr" -subj "/CN=$1" 2>/dev/null
  printf '%s\n' "$3" >"$pki/$1.ext"
  openssl x509 -req -in "$pki/$1.csr" -CA "$pki/$2.pem" -CAkey "$pki/$2.key" -CAcreateserial -days 2 \
    -extfile "$pki/$1.ext" -out "$pki/$1.pem" 2>/dev/null
}
mkca ca
mkca other
mkcert server ca "subjectAltName=IP:127.0.0.1
extendedKeyUsage=serverAuth"
mkcert client ca "extendedKeyUsage=clientAuth"
mkcert stranger other "extendedKeyUsage=clientAuth"

serve_model "$tmp/m"
model="$tmp/m/run/model.safetensors"
key=test-key-34
serve_start plain --model "$model" --served-model-name tiny-byte --api-key "$key" --threads 1
tls_curl=(--cacert "$pki/ca.pem")
serve_start secure --model "$model" --served-model-name tiny-byte --api-key "$key" --threads 1 \
  --tls-cert "$pki/server.pem" --tls-key "$pki/server.key"
case "$secure_url" in https://*) ;; *) echo "FAIL the TLS server's URL is $secure_url"; exit 1 ;; esac
grep -q "^serve: listening on https://127.0.0.1:" "$tmp/secure.log" || { cat "$tmp/secure.log"; exit 1; }

complete() {  # URL [CURL ARGS...]: the greedy text of one completion
  local url=$1; shift
  curl -sS --fail-with-body "$@" -H "Authorization: Bearer $key" -H 'Content-Type: application/json' \
    -d '{"model": "tiny-byte", "prompt": "The licen", "max_tokens": 24, "temperature": 0}' "$url/v1/completions" |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["choices"][0]["text"])'
}
want=$(complete "$plain_url")
[ ${#want} -gt 10 ] || { echo "FAIL no text from the plain server: '$want'"; exit 1; }
got=$(complete "$secure_url" --cacert "$pki/ca.pem")
[ "$got" = "$want" ] || { printf 'FAIL TLS answer differs:\n%q\n%q\n' "$got" "$want"; exit 1; }
echo "ok   curl over TLS: the same greedy completion as over plain HTTP"

# The official client, every check of serve_openai_client.sh, over TLS.
port=${secure_url##*:}
NODE_EXTRA_CA_CERTS="$pki/ca.pem" TESSERA_SCHEME=https node "$clients/openai_client.mjs" "$port" "$key" tiny-byte \
  >"$tmp/node.out" 2>&1 || { cat "$tmp/node.out"; exit 1; }
grep -q "^FAIL" "$tmp/node.out" && { cat "$tmp/node.out"; exit 1; }
echo "ok   the openai npm client over TLS: $(grep -c '^ok' "$tmp/node.out") checks passed"

# A client trusting another CA refuses the server (curl's 60: peer certificate).
rc=0; curl -s --cacert "$pki/other.pem" "$secure_url/health" >/dev/null 2>&1 || rc=$?
[ "$rc" = 60 ] || { echo "FAIL a client with another CA got curl exit $rc, not 60"; exit 1; }
rc=0; curl -s "http://127.0.0.1:$port/health" >/dev/null 2>&1 || rc=$?
[ "$rc" != 0 ] || { echo "FAIL plain HTTP to the TLS port was answered"; exit 1; }
echo "ok   a certificate from another CA is refused (curl exit 60); plain HTTP to the TLS port gets no answer"

# Client certificates: --tls-client-ca.
# Started by hand: serve_start's readiness probe has no client certificate.
: >"$tmp/mutual.log"
"$tessera" serve --port 0 --model "$model" --served-model-name tiny-byte --api-key "$key" --threads 1 \
  --tls-cert "$pki/server.pem" --tls-key "$pki/server.key" --tls-client-ca "$pki/ca.pem" 2>"$tmp/mutual.log" &
serve_pids+=($!)
mport=""
for _ in $(seq 200); do
  mport=$(sed -n 's|^serve: listening on https://127.0.0.1:\([0-9]*\).*|\1|p' "$tmp/mutual.log")
  [ -n "$mport" ] && curl -sf --cacert "$pki/ca.pem" --cert "$pki/client.pem" --key "$pki/client.key" \
    "https://127.0.0.1:$mport/health" >/dev/null 2>&1 && break
  sleep 0.1
done
murl="https://127.0.0.1:$mport"
got=$(complete "$murl" --cacert "$pki/ca.pem" --cert "$pki/client.pem" --key "$pki/client.key")
[ "$got" = "$want" ] || { echo "FAIL with a client certificate: '$got'"; exit 1; }
for who in none stranger; do
  args=(--cacert "$pki/ca.pem")
  [ $who = stranger ] && args+=(--cert "$pki/stranger.pem" --key "$pki/stranger.key")
  rc=0; curl -s "${args[@]}" "$murl/health" >/dev/null 2>&1 || rc=$?
  [ "$rc" != 0 ] || { echo "FAIL a client with certificate '$who' was served"; exit 1; }
done
echo "ok   --tls-client-ca: served with a certificate from the CA; refused without one and with another CA's"

# ---- The router: TLS to clients and to a TLS worker ----------------------------
route_start rt --tier "cpu=$secure_url" --worker-api-key "$key" --api-key "$key" \
  --tls-cert "$pki/server.pem" --tls-key "$pki/server.key" --tls-worker-ca "$pki/ca.pem"
case "$rt_url" in https://*) ;; *) echo "FAIL the router's URL is $rt_url"; exit 1 ;; esac
got=$(complete "$rt_url" --cacert "$pki/ca.pem")
[ "$got" = "$want" ] || { printf 'FAIL through the TLS router:\n%q\n%q\n' "$got" "$want"; exit 1; }
# A router that does not trust the worker's CA finds no healthy worker.
route_start distrust --tier "cpu=$secure_url" --worker-api-key "$key" --tls-worker-ca "$pki/other.pem" \
  --served-model-name tiny-byte --wait-for-worker 1
code=$(curl -s -o "$tmp/distrust.json" -w '%{http_code}' -H 'Content-Type: application/json' \
  -d '{"model": "tiny-byte", "prompt": "x", "max_tokens": 2}' "$distrust_url/v1/completions" || true)
[ "$code" = 503 ] || { echo "FAIL a router distrusting its worker answered $code"; cat "$tmp/distrust.json"; exit 1; }
echo "ok   route: over TLS to the client and to its TLS worker, the same completion; a worker it cannot verify is not used (503)"

# ---- The dashboard over TLS ---------------------------------------------------------
: >"$tmp/dash.log"
"$tessera" dashboard --scrape "$plain_url/metrics" --port 0 --tls-cert "$pki/server.pem" --tls-key "$pki/server.key" \
  2>"$tmp/dash.log" &
serve_pids+=($!)
dport=""
for _ in $(seq 200); do
  dport=$(sed -n 's|^dashboard: listening on https://127.0.0.1:\([0-9]*\).*|\1|p' "$tmp/dash.log")
  [ -n "$dport" ] && curl -sf --cacert "$pki/ca.pem" "https://127.0.0.1:$dport/health" >/dev/null 2>&1 && break
  sleep 0.1
done
page=$(curl -sf --cacert "$pki/ca.pem" "https://127.0.0.1:$dport/") || { echo "FAIL the dashboard over TLS"; cat "$tmp/dash.log"; exit 1; }
echo "$page" | grep -qi "<html" || { echo "FAIL the dashboard page: ${page:0:200}"; exit 1; }
echo "ok   dashboard: its page over TLS"

# ---- TLS files that cannot be used: one line, exit 1 ---------------------------
bad() {  # PATTERN ARGS...
  local pattern=$1; shift
  local rc=0
  timeout 60 "$tessera" serve --model "$model" --port 0 "$@" >"$tmp/bad.out" 2>"$tmp/bad.err" || rc=$?
  [ "$rc" = 1 ] && [ "$(grep -c . "$tmp/bad.err")" = 1 ] && grep -q -- "$pattern" "$tmp/bad.err" ||
    { echo "FAIL want one line /$pattern/ and exit 1, got $rc:"; cat "$tmp/bad.err"; exit 1; }
}
bad "--tls-cert needs --tls-key" --tls-cert "$pki/server.pem"
bad "--tls-cert $tmp/none.pem" --tls-cert "$tmp/none.pem" --tls-key "$pki/server.key"
bad "OpenSSL cannot use them" --tls-cert "$pki/server.pem" --tls-key "$pki/client.key"
printf 'not a certificate\n' >"$pki/junk.pem"
bad "OpenSSL cannot use them" --tls-cert "$pki/junk.pem" --tls-key "$pki/server.key"
echo "ok   unusable TLS files: one line each, exit 1"
