#!/usr/bin/env bash
# `tessera bench serve` without a server: bad flags, a bad URL and a refused
# connection each give one error line and a non-zero exit within seconds,
# never a hang. (Runs against the real server are tests/cli/serve_*.sh.)
set -uo pipefail
tessera=$1
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
failures=0
fail() { echo "FAIL $*"; failures=$((failures+1)); }

# expect NAME CODE PATTERN ARGS...: exit CODE within 10 s, one stderr line
# matching PATTERN, nothing on stdout.
expect() {
  local name=$1 code=$2 pattern=$3; shift 3
  local t0=$SECONDS rc
  timeout 10 "$tessera" bench serve "$@" >"$tmp/out" 2>"$tmp/err"; rc=$?
  if [ $rc -eq "$code" ] && [ "$(wc -l <"$tmp/err")" -eq 1 ] && grep -q -- "$pattern" "$tmp/err" &&
     grep -q "^tessera: error: " "$tmp/err" && [ ! -s "$tmp/out" ]; then
    echo "ok   $name ($((SECONDS - t0)) s): $(cat "$tmp/err")"
  else fail "$name: exit $rc (want $code)"; cat "$tmp/out" "$tmp/err"; fi
}

# A loopback port with nothing listening, held so for the whole test.
source "$(dirname "$0")/ports.inc"
closed_port port
url="http://127.0.0.1:$port"

expect "no --url" 2 "needs --url"
expect "--concurrency with --rate" 2 "excludes" --url "$url" --concurrency 4 --rate 2
expect "zero requests" 2 "--requests" --url "$url" --requests 0
expect "negative max tokens" 2 "--max-tokens" --url "$url" --max-tokens -1
expect "URL without a scheme" 2 "is not http" --url "127.0.0.1:$port"
expect "URL of another scheme" 2 "is not http" --url "ftp://127.0.0.1:$port"
expect "port out of range" 2 "port 70000" --url "http://127.0.0.1:70000"
expect "connection refused" 1 "cannot reach $url" --url "$url" --requests 4 --stream
expect "connection refused with --model" 1 "cannot reach $url" --url "$url" --model gpt2 --rate 5

[ $failures -eq 0 ]
