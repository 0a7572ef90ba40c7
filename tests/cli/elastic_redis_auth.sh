#!/usr/bin/env bash
# Issue #34 item 3: the Redis rendezvous store with a password. A real
# redis-server on a free loopback port requires one (requirepass) and has an
# ACL user limited to the job's keys. With the password from
# TESSERA_RDZV_PASSWORD_FILE (never the command line), and with the ACL
# user's, a 2-worker job trains to the end; a wrong password, a missing one
# and an unreadable password file each end the job with one line naming the
# store (or the variable), exit 1, before any worker trains.
set -euo pipefail
tessera=$1; tests=$2
command -v redis-server >/dev/null || { echo "FAIL: redis-server is not installed (scripts/setup.sh)"; exit 1; }
tmp=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$tmp"; }
trap cleanup EXIT
source "$tests/cli/dp_common.inc"
export OMP_NUM_THREADS=1

port=$(free_port)
mkdir -p "$tmp/redis"
printf 'requirepass  s3cret-default\nuser alice on >alice-pw ~authjob2/* +@all\n' >"$tmp/redis/redis.conf"
redis-server "$tmp/redis/redis.conf" --port "$port" --bind 127.0.0.1 --save '' --appendonly no --dir "$tmp/redis" \
  --logfile "$tmp/redis/log" >/dev/null 2>&1 &
pids+=($!)
for _ in $(seq 100); do redis-cli -p "$port" ping 2>&1 | grep -q NOAUTH && break; sleep 0.1; done
redis-cli -p "$port" ping 2>&1 | grep -q NOAUTH || { echo "FAIL: redis-server did not start with a password"; cat "$tmp/redis/log"; exit 1; }
url="redis://127.0.0.1:$port"
S=(--set train.micro_batch=2 --set train.grad_accum=2 --set train.steps=6)
source "$tests/cli/elastic_auth_common.inc"

printf 's3cret-default\n' >"$tmp/pw"
job ok authjob TESSERA_RDZV_PASSWORD_FILE="$tmp/pw"
for i in 0 1; do
  [ "$(cat "$tmp/ok$i.rc")" = 0 ] || { echo "FAIL: with the password, agent $i:"; cat "$tmp/ok$i.log"; exit 1; }
done
grep -q "^step *6/6" "$tmp/ok0.log" "$tmp/ok1.log" || { echo "FAIL: no step 6"; cat "$tmp/ok0.log"; exit 1; }
ps -eo args | grep -F "s3cret" | grep -v grep && { echo "FAIL: the password is on a command line"; exit 1; }
echo "ok   password from TESSERA_RDZV_PASSWORD_FILE: the job trained to step 6"

job acl authjob2 TESSERA_RDZV_USER=alice TESSERA_RDZV_PASSWORD=alice-pw
for i in 0 1; do
  [ "$(cat "$tmp/acl$i.rc")" = 0 ] || { echo "FAIL: ACL user, agent $i:"; cat "$tmp/acl$i.log"; exit 1; }
done
echo "ok   ACL user alice (keys authjob2/* only): the job trained to the end"

job wrong authjob3 TESSERA_RDZV_PASSWORD=nope
one_line wrong "rendezvous store $url refused the credentials of TESSERA_RDZV_PASSWORD(_FILE): WRONGPASS"
job none authjob4
one_line none "rendezvous store $url refused PING: NOAUTH .*TESSERA_RDZV_PASSWORD_FILE"
job nofile authjob5 TESSERA_RDZV_PASSWORD_FILE="$tmp/missing"
one_line nofile "TESSERA_RDZV_PASSWORD_FILE=$tmp/missing: No such file or directory"
job acl_wrong authjob6 TESSERA_RDZV_USER=alice TESSERA_RDZV_PASSWORD=s3cret-default
one_line acl_wrong "refused the credentials of TESSERA_RDZV_USER and TESSERA_RDZV_PASSWORD(_FILE): WRONGPASS"
