#!/usr/bin/env bash
# Issue #34 item 3: the etcd rendezvous store with users. A real etcd on a
# free loopback port with authentication on (set up through its JSON
# gateway: a root user, and a user "tessera" whose role may read and write
# only the keys under authjob/). With the user's password from
# TESSERA_RDZV_PASSWORD_FILE a 2-worker job trains to the end; a wrong
# password and no credentials each end the job with one line naming the
# store, exit 1, before any worker trains.
set -euo pipefail
tessera=$1; tests=$2
command -v etcd >/dev/null || { echo "FAIL: etcd is not installed (scripts/setup.sh: etcd-server)"; exit 1; }
tmp=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$tmp"; }
trap cleanup EXIT
source "$tests/cli/dp_common.inc"
export OMP_NUM_THREADS=1
port=$(free_port); peer=$(free_port)
etcd --data-dir "$tmp/etcd" --listen-client-urls "http://127.0.0.1:$port" --advertise-client-urls "http://127.0.0.1:$port" \
  --listen-peer-urls "http://127.0.0.1:$peer" --initial-advertise-peer-urls "http://127.0.0.1:$peer" \
  --initial-cluster "default=http://127.0.0.1:$peer" >"$tmp/etcd.log" 2>&1 &
pids+=($!)
api() { curl -sf -X POST "http://127.0.0.1:$port/v3/$1" -d "$2"; }
for _ in $(seq 200); do api maintenance/status '{}' >/dev/null 2>&1 && break; sleep 0.1; done
api maintenance/status '{}' >/dev/null || { echo "FAIL: etcd did not answer"; cat "$tmp/etcd.log"; exit 1; }
b64() { printf '%s' "$1" | base64 -w0; }
api auth/user/add '{"name": "root", "password": "root-pw"}' >/dev/null
api auth/role/add '{"name": "root"}' >/dev/null
api auth/user/grant '{"user": "root", "role": "root"}' >/dev/null
api auth/role/add '{"name": "tessera"}' >/dev/null
api auth/role/grant "{\"name\": \"tessera\", \"perm\": {\"permType\": \"READWRITE\", \"key\": \"$(b64 authjob/)\", \"range_end\": \"$(b64 authjob0)\"}}" >/dev/null
api auth/user/add '{"name": "tessera", "password": "tessera-pw"}' >/dev/null
api auth/user/grant '{"user": "tessera", "role": "tessera"}' >/dev/null
api auth/enable '{}' >/dev/null || { echo "FAIL: etcd auth enable"; cat "$tmp/etcd.log" | tail -5; exit 1; }
url="etcd://127.0.0.1:$port"
S=(--set train.micro_batch=2 --set train.grad_accum=2 --set train.steps=6)
source "$tests/cli/elastic_auth_common.inc"

printf 'tessera-pw\n' >"$tmp/pw"
job ok authjob TESSERA_RDZV_USER=tessera TESSERA_RDZV_PASSWORD_FILE="$tmp/pw"
for i in 0 1; do
  [ "$(cat "$tmp/ok$i.rc")" = 0 ] || { echo "FAIL: with the password, agent $i:"; cat "$tmp/ok$i.log"; exit 1; }
done
grep -q "^step *6/6" "$tmp/ok0.log" "$tmp/ok1.log" || { echo "FAIL: no step 6"; cat "$tmp/ok0.log"; exit 1; }
echo "ok   user tessera (keys under authjob/ only), password from TESSERA_RDZV_PASSWORD_FILE: the job trained to step 6"
job wrong authjob TESSERA_RDZV_USER=tessera TESSERA_RDZV_PASSWORD=nope
one_line wrong "rendezvous store $url refused the credentials of TESSERA_RDZV_USER ('tessera') and TESSERA_RDZV_PASSWORD(_FILE): .*authentication failed"
job none authjob
one_line none "rendezvous store $url requires a user"
