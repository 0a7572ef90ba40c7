#!/usr/bin/env bash
# Slow clients cannot silence `tessera serve` or `tessera route`: 1,000
# "slowloris" connections against each (a request line, then one header
# line every 3 s, reopened when the server closes them; from 200 loopback
# addresses) while real requests keep coming (Poisson, 20 a second, so
# the test leaves the machine to the others), for a minute. Every normal
# request is answered within 1 s, /health and /metrics answer throughout,
# the slow connections are closed at the header deadline (5 s) with a 408,
# and afterwards nothing leaked: descriptors and threads of both servers
# are what they were before.
set -euo pipefail
tessera=$1; tests=$2
tmp=$(mktemp -d)
source "$tests/cli/serve_common.inc"

serve_model "$tmp/m"
serve_start w --model "$tmp/m/run/model.safetensors"
route_start r --tier main="$w_url"
field() { python3 -c "import json,sys; d=json.load(sys.stdin); print(eval(sys.argv[1]), end='')" "$1"; }
fds() { ls "/proc/$1/fd" | wc -l; }
threads() { ls "/proc/$1/task" | wc -l; }
# Both servers warm (the router's worker connections open) before counting.
curl -sf -d '{"prompt":[1,2,3],"max_tokens":2}' "$r_url/v1/completions" >/dev/null
w_fds=$(fds "$w_pid"); w_threads=$(threads "$w_pid")
r_fds=$(fds "$r_pid"); r_threads=$(threads "$r_pid")

seconds=60
for name in w r; do
  url_var="${name}_url"
  "$tessera" bench serve --url "${!url_var}" --slow-connections 1000 --duration $seconds --requests 1000000 \
    --rate 20 --max-in-flight 4 --prompt-tokens 16 --max-tokens 4 --json >"$tmp/$name.json" 2>"$tmp/$name.err" &
  eval "${name}_bench=\$!"
done
# Meanwhile curl asks both for /health and /metrics, each within 1 s.
sleep 2
probes=0
end=$((SECONDS + seconds - 6))
while [ $SECONDS -lt $end ]; do
  for u in "$w_url" "$r_url"; do
    for path in /health /metrics; do
      curl -s -o /dev/null --max-time 1 -w '%{http_code}' "$u$path" >"$tmp/probe" || true
      [ "$(cat "$tmp/probe")" = 200 ] || { echo "$u$path: HTTP '$(cat "$tmp/probe")' (want 200 within 1 s) under the slow connections"; exit 1; }
      probes=$((probes + 1))
    done
  done
  sleep 0.5
done
for name in w r; do
  bench_var="${name}_bench"
  wait "${!bench_var}" || { echo "bench serve against $name failed:"; cat "$tmp/$name.err"; exit 1; }
  j=$(cat "$tmp/$name.json")
  completed=$(field 'd["completed"]' <<<"$j"); failed=$(field 'd["failed"]' <<<"$j")
  max_ms=$(field 'd["max_e2el_ms"]' <<<"$j"); closed=$(field 'd["slow_answered_408"]' <<<"$j")
  opened=$(field 'd["slow_opened"]' <<<"$j"); refused=$(field 'd["slow_answered_503"]' <<<"$j")
  [ "$failed" = 0 ] && [ "$completed" -ge 100 ] || { echo "$name: $completed completed, $failed failed: $j"; exit 1; }
  python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) < 1000 else 1)" "$max_ms" ||
    { echo "$name: the slowest normal request took $max_ms ms (want < 1000) under 1000 slow connections"; exit 1; }
  # 1000 held, closed at 5 s, reopened: about 1000 x 60 / 5 closed in the minute.
  [ "$closed" -ge 8000 ] && [ "$refused" = 0 ] ||
    { echo "$name: $closed slow connections closed with 408 and $refused refused, of $opened opened (want >= 8000 closed at the 5 s deadline, none refused)"; exit 1; }
  echo "$name: $completed requests in ${seconds} s beside 1000 slow connections, slowest ${max_ms} ms; $closed slow ones closed with 408 ($opened opened)"
done
timeouts=$(curl -sf "$w_url/metrics" | awk '$1 == "tessera_http_read_timeouts_total{phase=\"headers\"}" { print $2 }')
[ "${timeouts%.*}" -ge 8000 ] || { echo "serve's tessera_http_read_timeouts_total{phase=\"headers\"} is '$timeouts' (want >= 8000)"; exit 1; }

# Nothing leaked: the slow connections' descriptors are closed, no thread is left.
sleep 1
for name in w r; do
  pid_var="${name}_pid"; fd0_var="${name}_fds"; th0_var="${name}_threads"
  now_fds=$(fds "${!pid_var}"); now_threads=$(threads "${!pid_var}")
  [ "$now_fds" -le $((${!fd0_var} + 2)) ] && [ "$now_threads" = "${!th0_var}" ] ||
    { echo "$name: $now_fds descriptors and $now_threads threads after the run (before: ${!fd0_var} and ${!th0_var})"; ls -l "/proc/${!pid_var}/fd"; exit 1; }
done
echo "serve and route: $probes health and metrics probes answered within 1 s; descriptors and threads as before"
serve_stop r
serve_stop w
