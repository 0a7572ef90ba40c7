#!/usr/bin/env bash
# Issue #34 item 3: the Redis and etcd rendezvous stores over TLS. A test CA
# (openssl) signs a certificate for 127.0.0.1; a real redis-server listens
# with TLS only and asks for a client certificate and a password, a real
# etcd serves https. With TESSERA_RDZV_TLS_CA (and, for Redis, the client
# certificate) a 2-worker job trains to the end over rediss:// and etcds://;
# without the CA, without the client certificate, or with plain redis:// to
# the TLS port, each agent ends in one line naming the store, before any
# worker trains.
set -euo pipefail
tessera=$1; tests=$2
command -v redis-server >/dev/null && command -v etcd >/dev/null || { echo "FAIL: redis-server or etcd missing (scripts/setup.sh)"; exit 1; }
tmp=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$tmp"; }
trap cleanup EXIT
source "$tests/cli/dp_common.inc"
export OMP_NUM_THREADS=1

cd "$tmp"
openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=test-ca -keyout ca.key -out ca.pem >/dev/null 2>&1
openssl req -newkey rsa:2048 -nodes -subj /CN=127.0.0.1 -keyout server.key -out server.csr >/dev/null 2>&1
printf 'subjectAltName=IP:127.0.0.1\n' >san.ext
openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 -extfile san.ext -out server.pem >/dev/null 2>&1
openssl req -newkey rsa:2048 -nodes -subj /CN=worker -keyout client.key -out client.csr >/dev/null 2>&1
openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 -out client.pem >/dev/null 2>&1
openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=other-ca -keyout other.key -out other.pem >/dev/null 2>&1
cd - >/dev/null

S=(--set train.micro_batch=2 --set train.grad_accum=2 --set train.steps=4)
source "$tests/cli/elastic_auth_common.inc"
trained() {  # NAME
  local i
  for i in 0 1; do
    [ "$(cat "$tmp/$1$i.rc")" = 0 ] || { echo "FAIL: $1: agent $i:"; cat "$tmp/$1$i.log"; exit 1; }
  done
  grep -q "^step *4/4" "$tmp/${1}0.log" "$tmp/${1}1.log" || { echo "FAIL: $1: no step 4"; cat "$tmp/${1}0.log"; exit 1; }
  echo "ok   $1: the job trained to step 4 over $url"
}

# ---- Redis: TLS only, client certificates required, a password ----
port=$(free_port)
mkdir -p "$tmp/redis"
redis-server --port 0 --tls-port "$port" --bind 127.0.0.1 --tls-cert-file "$tmp/server.pem" --tls-key-file "$tmp/server.key" \
  --tls-ca-cert-file "$tmp/ca.pem" --tls-auth-clients yes --requirepass tls-pw --save '' --appendonly no \
  --dir "$tmp/redis" --logfile "$tmp/redis/log" >/dev/null 2>&1 &
pids+=($!)
for _ in $(seq 100); do
  redis-cli --tls --cacert "$tmp/ca.pem" --cert "$tmp/client.pem" --key "$tmp/client.key" -p "$port" -a tls-pw ping 2>/dev/null | grep -q PONG && break
  sleep 0.1
done
TLS=(TESSERA_RDZV_TLS_CA="$tmp/ca.pem" TESSERA_RDZV_TLS_CERT="$tmp/client.pem" TESSERA_RDZV_TLS_KEY="$tmp/client.key"
     TESSERA_RDZV_PASSWORD=tls-pw)
url="rediss://127.0.0.1:$port"
job rok tlsjob1 "${TLS[@]}"
trained rok
job rnoca tlsjob2 TESSERA_RDZV_TLS_CA="$tmp/other.pem" TESSERA_RDZV_TLS_CERT="$tmp/client.pem" \
  TESSERA_RDZV_TLS_KEY="$tmp/client.key" TESSERA_RDZV_PASSWORD=tls-pw
one_line rnoca "rendezvous store $url: TLS handshake failed: .*certificate verify failed"
job rnocert tlsjob3 TESSERA_RDZV_TLS_CA="$tmp/ca.pem" TESSERA_RDZV_PASSWORD=tls-pw
one_line rnocert "rendezvous store $url: TLS: the server closed the connection: .*certificate"
url="redis://127.0.0.1:$port"
job rplain tlsjob4 TESSERA_RDZV_PASSWORD=tls-pw
one_line rplain "rendezvous store $url"

# ---- etcd over https ----
port=$(free_port); peer=$(free_port)
etcd --data-dir "$tmp/etcd" --listen-client-urls "https://127.0.0.1:$port" --advertise-client-urls "https://127.0.0.1:$port" \
  --cert-file "$tmp/server.pem" --key-file "$tmp/server.key" \
  --listen-peer-urls "http://127.0.0.1:$peer" --initial-advertise-peer-urls "http://127.0.0.1:$peer" \
  --initial-cluster "default=http://127.0.0.1:$peer" >"$tmp/etcd.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do
  curl -s --cacert "$tmp/ca.pem" -X POST -d '{}' "https://127.0.0.1:$port/v3/maintenance/status" | grep -q version && break
  sleep 0.1
done
url="etcds://127.0.0.1:$port"
job eok tlsjob5 TESSERA_RDZV_TLS_CA="$tmp/ca.pem"
trained eok
job enoca tlsjob6 TESSERA_RDZV_TLS_CA="$tmp/other.pem"
one_line enoca "rendezvous store $url: TLS: SSLServerVerification: unable to get local issuer certificate"
job ebadfile tlsjob7 TESSERA_RDZV_TLS_CA="$tmp/missing.pem"
one_line ebadfile "TESSERA_RDZV_TLS_CA=$tmp/missing.pem: No such file or directory"
