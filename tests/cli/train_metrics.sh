#!/usr/bin/env bash
# tessera train --metrics-port: each rank serves Prometheus /metrics while it
# trains, with its rank, dp, tp, pp, host and job labels; promtool accepts
# the text; a port in use is one error line before training; a finished run
# frees its port; and a real Prometheus server scrapes both ranks of a
# 2-rank job (tessera launch -n 2).
#
# No sleeps to wait for training: TESSERA_FAULT=stall@0:5 holds rank 0
# before step 6's backward (src/train/trainer.cc), so every rank has done
# exactly 5 steps while it is scraped, and the run is then killed.
set -uo pipefail
tessera=$1; tests=$2
tmp=$(mktemp -d)
pids=()
cleanup() {
  local p
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
  for p in $(pgrep -f "$tmp/" 2>/dev/null); do kill -9 "$p" 2>/dev/null; done
  wait 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
source "$tests/cli/dp_common.inc"  # $tmp/cfg.toml: 2 layers, dim 32, seq 32, micro_batch 8, 10 steps
cp "$tmp/cfg.toml" "$tmp/mjob.toml"  # job label: the config file's stem
# One OpenMP thread, as the MPI tests use: with two on a busy 2-core machine
# a run of this tiny model sometimes takes 50 s instead of 0.5 s.
export OMP_NUM_THREADS=1
status=0
pass() { echo "ok   $1 [$(( $(date +%s) - t0 )) s]"; }
flunk() { echo "FAIL $1"; status=1; }
t0=$(date +%s)

# free_ports N: a base port B with B .. B+N-1 free on 127.0.0.1.
free_ports() {
  python3 - "$1" <<'PY'
import random, socket, sys
n = int(sys.argv[1])
for _ in range(500):
    base = random.randint(20000, 60000)
    socks = []
    try:
        for p in range(base, base + n):
            s = socket.socket()
            s.bind(("127.0.0.1", p))
            socks.append(s)
    except OSError:
        continue
    finally:
        for s in socks:
            s.close()
    print(base)
    sys.exit(0)
sys.exit(1)
PY
}
# wait_for SECONDS CMD...: runs CMD every 0.1 s until it succeeds.
wait_for() {
  local end=$(( $(date +%s) + $1 )); shift
  until "$@"; do [ "$(date +%s)" -ge "$end" ] && return 1; sleep 0.1; done
}
scrape() { curl -sf --max-time 2 "http://127.0.0.1:$1/metrics"; }
# value PORT SERIES_PREFIX: the value of the first sample line starting so.
value() { scrape "$1" | grep -F "$2" | head -1 | awk '{print $NF}'; }
at_step() { [ "$(value "$1" "tessera_train_steps_total{")" = "$2" ]; }

host=${TESSERA_HOST:-$(hostname)}
p1=$(free_ports 1); pq=$(free_ports 1)
b=$(free_ports 3); p2=$(( b + 1 ))  # the 2-rank job on p2, p2+1; b for a second job whose rank 1 collides

# A Prometheus server for the 2-rank job below, started first (it takes a
# few seconds): ranks on p2 and p2+1, every second. honor_labels keeps the
# job label Tessera exposes (else Prometheus renames it exported_job).
cat >"$tmp/prometheus.yml" <<YAML
global:
  scrape_interval: 1s
  scrape_timeout: 1s
scrape_configs:
  - job_name: tessera
    honor_labels: true
    static_configs:
      - targets: ['127.0.0.1:$p2', '127.0.0.1:$(( p2 + 1 ))']
YAML
prometheus --config.file="$tmp/prometheus.yml" --storage.tsdb.path="$tmp/tsdb" \
  --web.listen-address="127.0.0.1:$pq" --log.level=warn >"$tmp/prometheus.log" 2>&1 &
prom=$!; pids+=("$prom")

# ---- One process: the text, its labels, promtool ------------------------
TESSERA_FAULT=stall@0:5 "$tessera" train --config "$tmp/mjob.toml" --metrics-port "$p1" \
  --set checkpoint.dir="$tmp/run1" --set checkpoint.every=2 >"$tmp/one.out" 2>"$tmp/one.err" &
one=$!; pids+=("$one")
if wait_for 60 at_step "$p1" 5; then pass "one rank: /metrics on port $p1 shows 5 steps while training"
else flunk "one rank: no /metrics at 5 steps on $p1"; cat "$tmp/one.out" "$tmp/one.err"; fi
scrape "$p1" >"$tmp/one.prom"
labels="dp=\"0\",host=\"$host\",job=\"mjob\",pp=\"0\",rank=\"0\",tp=\"0\""
for want in "tessera_train_steps_total{$labels} 5" "tessera_train_tokens_total{$labels} 1280" \
            "tessera_train_step_seconds_count{$labels} 5" "tessera_train_step_seconds_bucket{$labels,le=\"+Inf\"} 5" \
            "# TYPE tessera_train_step_seconds histogram" "# TYPE process_cpu_seconds_total counter" \
            "tessera_train_step_part_seconds{dp=\"0\",host=\"$host\",job=\"mjob\",part=\"comm\",pp=\"0\",rank=\"0\",tp=\"0\"} " \
            "tessera_train_memory_bytes{dp=\"0\",host=\"$host\",job=\"mjob\",kind=\"params\",pp=\"0\",rank=\"0\",tp=\"0\"} " \
            "tessera_train_loss{$labels} " "tessera_train_learning_rate{$labels} " "tessera_train_grad_norm{$labels} " \
            "tessera_train_mfu{$labels} " "tessera_train_tokens_per_second{$labels} " "tessera_train_val_loss{$labels} " \
            "tessera_train_checkpoint_stall_seconds_total{$labels} " "tessera_train_checkpoint_write_seconds_count{$labels} " \
            "process_start_time_seconds{$labels} " "process_open_fds{$labels} "; do
  grep -qF -- "$want" "$tmp/one.prom" || flunk "one rank: no line '$want'"
done
# Every sample line carries every label; the positive figures are positive.
for l in 'dp="0"' "host=\"$host\"" 'job="mjob"' 'pp="0"' 'rank="0"' 'tp="0"'; do
  n=$(grep -v '^#' "$tmp/one.prom" | grep -vcF "$l")
  [ "$n" -eq 0 ] || flunk "one rank: $n sample lines without $l"
done
for series in process_cpu_seconds_total process_resident_memory_bytes tessera_train_checkpoints_total \
              tessera_train_checkpoint_bytes_total; do
  v=$(grep "^$series{" "$tmp/one.prom" | awk '{print $NF}')
  awk -v v="$v" 'BEGIN { exit !(v + 0 > 0) }' || flunk "one rank: $series is '$v', want > 0"
done
if promtool check metrics <"$tmp/one.prom" >"$tmp/promtool.out" 2>&1; then
  pass "one rank: promtool check metrics accepts the text ($(grep -vc '^#' "$tmp/one.prom") samples), labels $labels"
else flunk "one rank: promtool check metrics:"; cat "$tmp/promtool.out"; fi
[ -s "$tmp/promtool.out" ] && { flunk "one rank: promtool has remarks:"; cat "$tmp/promtool.out"; }

# A second job on the same port: one error line, before any training.
if "$tessera" train --config "$tmp/mjob.toml" --metrics-port "$p1" --set checkpoint.dir="$tmp/run2" \
   >"$tmp/busy.out" 2>"$tmp/busy.err"; then flunk "port in use: a second job on port $p1 started"
elif [ "$(wc -l <"$tmp/busy.err")" -eq 1 ] && grep -q "cannot serve metrics on 127.0.0.1:$p1" "$tmp/busy.err" \
     && ! grep -q "^step" "$tmp/busy.out"; then pass "port in use: $(cat "$tmp/busy.err")"
else flunk "port in use: want one error line and no step:"; cat "$tmp/busy.err" "$tmp/busy.out"; fi
# SIGTERM now stops a run at the next step with a checkpoint; this one is
# stalled by its fault, so it is ended as a hung rank is.
kill -9 "$one"; wait "$one" 2>/dev/null

# A run left alone: scraped while it trains (1000 steps, a second or two),
# then it exits 0 and frees its port.
"$tessera" train --config "$tmp/mjob.toml" --metrics-port "$p1" --set checkpoint.dir="$tmp/run3" \
  --set train.steps=1000 >"$tmp/done.out" 2>"$tmp/done.err" &
done_pid=$!; pids+=("$done_pid")
live=""
while [ -z "$live" ] && kill -0 "$done_pid" 2>/dev/null; do
  v=$(value "$p1" "tessera_train_steps_total{")
  [ -n "$v" ] && [ "$v" -gt 0 ] && [ "$v" -lt 1000 ] && live=$v
  sleep 0.1
done
wait "$done_pid"; rc=$?
[ -n "$live" ] && pass "live run: scraped at step $live of 1000" || flunk "live run: no scrape between steps 1 and 999"
if [ $rc -eq 0 ] && grep -q "^metrics: http://127.0.0.1:$p1/metrics" "$tmp/done.out"; then
  if scrape "$p1" >/dev/null; then flunk "finished run: port $p1 still answers"
  else pass "finished run: exit 0, port $p1 closed"; fi
else flunk "finished run: exit $rc"; cat "$tmp/done.out" "$tmp/done.err"; fi

# ---- Two ranks under tessera launch, scraped by Prometheus -----------------
TESSERA_FAULT=stall@0:5 "$tessera" launch -n 2 -- train --config "$tmp/mjob.toml" --metrics-port "$p2" \
  --set parallel.dp=2 --set train.micro_batch=4 --set parallel.timeout=120 --set checkpoint.dir="$tmp/run4" \
  >"$tmp/two.out" 2>"$tmp/two.err" &
two=$!; pids+=("$two")
for r in 0 1; do
  port=$(( p2 + r ))
  if wait_for 60 at_step "$port" 5 && scrape "$port" | grep -qF "tessera_train_steps_total{dp=\"$r\",host=\"$host\",job=\"mjob\",pp=\"0\",rank=\"$r\",tp=\"0\"} 5"
  then pass "two ranks: port $port serves rank=\"$r\" dp=\"$r\" at 5 steps"
  else flunk "two ranks: port $port:"; scrape "$port" | grep steps_total; cat "$tmp/two.out" "$tmp/two.err"; fi
done
# Network figures (comm/traffic.h): bytes to and from the other rank, the
# all-reduce's achieved bus bandwidth; promtool accepts the 2-rank text.
scrape "$p2" >"$tmp/two.prom"
for dir in sent received; do
  v=$(grep "^tessera_train_comm_bytes_total{direction=\"$dir\",.*peer=\"1\"" "$tmp/two.prom" | awk '{print $NF}')
  awk -v v="$v" 'BEGIN { exit !(v + 0 > 0) }' && pass "two ranks: rank 0 $dir $v bytes to/from peer 1" ||
    flunk "two ranks: tessera_train_comm_bytes_total{direction=\"$dir\",peer=\"1\"} is '$v', want > 0"
done
v=$(grep '^tessera_train_comm_bus_bandwidth_bytes_per_second{.*op="all_reduce"' "$tmp/two.prom" | awk '{print $NF}')
awk -v v="$v" 'BEGIN { exit !(v + 0 > 0) }' && pass "two ranks: all-reduce busbw $v B/s" ||
  flunk "two ranks: all-reduce busbw '$v', want > 0"
promtool check metrics <"$tmp/two.prom" >"$tmp/promtool2.out" 2>&1 && [ ! -s "$tmp/promtool2.out" ] &&
  pass "two ranks: promtool check metrics accepts rank 0's text" ||
  { flunk "two ranks: promtool:"; cat "$tmp/promtool2.out"; }
# A second 2-rank job on b: its rank 1 wants b+1, which rank 0 above holds.
# Every rank stops before training; rank 0 says which rank and address.
"$tessera" launch -n 2 -- train --config "$tmp/mjob.toml" --metrics-port "$b" --set parallel.dp=2 \
  --set train.micro_batch=4 --set checkpoint.dir="$tmp/run5" >"$tmp/busy2.out" 2>"$tmp/busy2.err"; rc=$?
if [ $rc -ne 0 ] && [ "$(grep -c '^tessera: error' "$tmp/busy2.err")" -eq 1 ] && ! grep -q "^step" "$tmp/busy2.out" \
   && grep -q "^tessera: error: rank 1 on host [^:]*: cannot serve metrics on 127.0.0.1:$p2 " "$tmp/busy2.err"; then
  pass "two ranks, port in use: $(grep '^tessera: error' "$tmp/busy2.err" | cut -c1-80)..."
else flunk "two ranks, port in use: exit $rc, want one error line naming rank 1:"; cat "$tmp/busy2.err"; fi

# query EXPR: "rank value" per series from Prometheus' HTTP API.
query() {
  curl -sf --max-time 2 "http://127.0.0.1:$pq/api/v1/query" --data-urlencode "query=$1" |
    python3 -c 'import json, sys
for s in json.load(sys.stdin)["data"]["result"]:
    m = s["metric"]
    if m.get("job") == "mjob": print(m["rank"], s["value"][1])'
}
both_ranks() { [ "$(query "$1" | awk '$2 > 0 {print $1}' | sort | tr '\n' ' ')" = "0 1 " ]; }
for q in tessera_train_steps_total tessera_train_tokens_total tessera_train_step_seconds_count \
         process_resident_memory_bytes; do
  if wait_for 30 both_ranks "$q"; then pass "prometheus: $q > 0 for rank 0 and 1 ($(query "$q" | tr '\n' ' '))"
  else flunk "prometheus: $q not > 0 for both ranks: $(query "$q" | tr '\n' ' ')"; cat "$tmp/prometheus.log"; fi
done

# ---- Nothing left behind --------------------------------------------------
kill "$two" "$prom"; wait "$two" "$prom" 2>/dev/null
none_left() { ! pgrep -f "$tmp/" >/dev/null; }
if wait_for 20 none_left; then pass "no process left"
else flunk "processes left:"; pgrep -af "$tmp/"; fi
echo "took $(( $(date +%s) - t0 )) s"
exit $status
