#!/usr/bin/env bash
# `tessera serve` under load, with real curl clients: back-pressure (200s and
# 429s only, every 200 complete), a client that disconnects mid-stream frees
# its KV blocks, preemption in a pool too small still gives every request
# its solo text, a request waiting past --queue-timeout gets 503, SIGTERM
# lets in-flight streams finish while new requests get 503 and exits 0, and
# `tessera bench serve` against the real server. Tests that need requests to
# last use a slower (bigger, untrained) model than the tiny trained one.
set -euo pipefail
tessera=$1; tests=$2
tmp=$(mktemp -d)
source "$tests/cli/serve_common.inc"

serve_model "$tmp/m"
model="$tmp/m/run/model.safetensors"
serve_slow_model "$tmp/slow"
field() { python3 -c "import json,sys; d=json.load(sys.stdin); print(eval(sys.argv[1]), end='')" "$1"; }

# ---- back-pressure: 2 running, 2 waiting, a burst of 20 -------------------------------
# The slow model: each request lasts a few hundred ms, far longer than the
# burst takes to arrive.
serve_start bp --model "$tmp/slow/run/model.safetensors" --max-seqs 2 --max-queue 2
pids=()
for i in $(seq 1 20); do
  curl -s -o "$tmp/bp$i" -w '%{http_code}' --max-time 60 \
    -d "{\"prompt\":[$((i + 10)),66,67],\"max_tokens\":120,\"ignore_eos\":true}" "$bp_url/v1/completions" >"$tmp/bp$i.code" &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p" || true; done
ok=0; limited=0
for i in $(seq 1 20); do
  code=$(cat "$tmp/bp$i.code")
  case $code in
    200)
      [ "$(field 'd["choices"][0]["finish_reason"], d["usage"]["completion_tokens"]' <"$tmp/bp$i")" = "('length', 120)" ] ||
        { echo "burst request $i: incomplete 200: $(cat "$tmp/bp$i")"; exit 1; }
      ok=$((ok + 1)) ;;
    429)
      [ "$(field 'd["error"]["type"]' <"$tmp/bp$i")" = rate_limit_error ] || { echo "429 body: $(cat "$tmp/bp$i")"; exit 1; }
      limited=$((limited + 1)) ;;
    *) echo "burst request $i: HTTP $code: $(cat "$tmp/bp$i")"; exit 1 ;;
  esac
done
[ $ok -ge 4 ] && [ $limited -ge 1 ] || { echo "burst: $ok OK, $limited limited (want >= 4 OK and some 429s)"; exit 1; }
kill -0 "$bp_pid" || { echo "server died in the burst"; exit 1; }
serve_stop bp
echo "burst of 20 against max-seqs 2, max-queue 2: $ok x 200 (all complete), $limited x 429"

# ---- preemption: 6 sequences growing to 210-250 positions in a pool of 24 blocks (384) -----
serve_start pre --model "$model" --max-seqs 6 --kv-blocks 24
text=$(head -c 3000 /usr/share/common-licenses/Apache-2.0 | tr -d '\0')
for i in $(seq 0 5); do
  printf '%s' "${text:$((i * 300)):$((40 + 8 * i))}" >"$tmp/pp$i"
  python3 -c 'import json,sys; print(json.dumps({"prompt":open(sys.argv[1]).read(),"max_tokens":170,"temperature":0.8,"top_k":40,"seed":int(sys.argv[2])}))' \
    "$tmp/pp$i" "$((7 + i))" >"$tmp/preq$i"
done
# Sent from one process's threads at once: any two of them overlapping need
# more than the pool (2 x 14-16 blocks > 24).
python3 - "${pre_url#http://}" "$tmp" <<'PY'
import http.client, sys, threading
host, port = sys.argv[1].split(":"); tmp = sys.argv[2]
go = threading.Barrier(6)
def send(i):
    body = open(f"{tmp}/preq{i}", "rb").read()
    c = http.client.HTTPConnection(host, int(port), timeout=120)
    go.wait()
    c.request("POST", "/v1/completions", body=body)
    r = c.getresponse()
    open(f"{tmp}/presp{i}", "wb").write(r.read())
threads = [threading.Thread(target=send, args=(i,)) for i in range(6)]
for t in threads: t.start()
for t in threads: t.join()
PY
preempted=$(serve_metric "$pre_url" tessera_preemptions_total)
for i in $(seq 0 5); do
  "$tessera" sample --weights "$model" --tokenizer byte --prompt "$(cat "$tmp/pp$i")" --tokens 170 \
    --temperature 0.8 --top-k 40 --seed $((7 + i)) 2>/dev/null >"$tmp/psample$i"
  python3 - "$tmp/psample$i" "$tmp/pp$i" "$tmp/presp$i" <<'PY' || { echo "preempted request $i differs from its solo run"; exit 1; }
import json, sys
out = open(sys.argv[1], "rb").read(); p = open(sys.argv[2], "rb").read()
want = out[len(p):-1].split(b"\0")[0].decode("utf-8", "replace")
got = json.load(open(sys.argv[3]))["choices"][0]["text"]
assert got == want, (got, want)
PY
done
awk -v n="$preempted" 'BEGIN { exit !(n > 0) }' || { echo "no preemption happened (tessera_preemptions_total $preempted)"; exit 1; }
[ "$(serve_metric "$pre_url" tessera_kv_cache_usage_ratio)" = 0 ]
serve_stop pre
echo "preemption ($preempted times) left every request with its solo text"

# ---- queue timeout: a request not admitted in time gets 503 -----------------------------
serve_start qt --model "$tmp/slow/run/model.safetensors" --max-seqs 1 --queue-timeout 0.02
# The slow model, one place, six requests of 250 tokens (most of a second
# each) at once: the first runs, later
# ones wait longer than 0.02 s for the place.
pids=()
for i in $(seq 1 6); do
  curl -s -o "$tmp/qt$i" -w '%{http_code}' -d "{\"prompt\":[$i],\"max_tokens\":250,\"ignore_eos\":true}" \
    "$qt_url/v1/completions" >"$tmp/qt$i.code" &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done
ok=0; late=0
for i in $(seq 1 6); do
  case $(cat "$tmp/qt$i.code") in
    200) ok=$((ok + 1)) ;;
    503) grep -q "waited more than" "$tmp/qt$i" || { echo "503 without the reason: $(cat "$tmp/qt$i")"; exit 1; }
         late=$((late + 1)) ;;
    *) echo "queue timeout: HTTP $(cat "$tmp/qt$i.code"): $(cat "$tmp/qt$i")"; exit 1 ;;
  esac
done
[ $ok -ge 1 ] && [ $late -ge 1 ] || { echo "queue timeout: $ok x 200, $late x 503 (want both)"; exit 1; }
serve_stop qt
echo "requests waiting past --queue-timeout got 503 ($late of 6)"

# ---- cancellation: a client gone mid-stream frees its blocks ---------------------------
# The slow model: 1000 tokens take seconds; the client reads 5 chunks and
# closes the connection.
serve_start slow --model "$tmp/slow/run/model.safetensors" --max-seqs 4
python3 - "${slow_url#http://}" <<'PY'
import http.client, sys
host, port = sys.argv[1].split(":")
c = http.client.HTTPConnection(host, int(port), timeout=30)
c.request("POST", "/v1/completions", body='{"prompt":"the ","max_tokens":1000,"ignore_eos":true,"stream":true}')
r = c.getresponse()
assert r.status == 200, r.status
chunks = 0
while chunks < 5:
    line = r.fp.readline()
    assert line, "the stream ended early"
    chunks += line.startswith(b"data: {")
c.sock.close()
PY
freed=0
for i in $(seq 1 50); do
  if [ "$(serve_metric "$slow_url" tessera_kv_cache_usage_ratio)" = 0 ] &&
     [ "$(serve_metric "$slow_url" tessera_requests_running)" = 0 ]; then freed=1; break; fi
  sleep 0.1
done
[ $freed = 1 ] || { echo "KV blocks still in use after the client left: $(serve_metric "$slow_url" tessera_kv_cache_usage_ratio)"; exit 1; }
made=$(serve_metric "$slow_url" tessera_generation_tokens_total)
awk -v n="$made" 'BEGIN { exit !(n < 1000) }' || { echo "the request ran to the end ($made tokens): no cancellation seen"; exit 1; }
echo "a client that disconnected mid-stream freed its KV blocks after $made of 1000 tokens"

# ---- SIGTERM under load: in-flight streams finish, new requests get 503, exit 0 -----------
serve_stop slow
# A drain long enough for a loaded machine (4 x 600 tokens of the slow model
# took over 30 s under another test suite).
serve_start term --model "$tmp/slow/run/model.safetensors" --max-seqs 4 --drain-timeout 300
pids=()
for i in $(seq 1 4); do
  curl -sN -d "{\"prompt\":[$i],\"max_tokens\":600,\"ignore_eos\":true,\"stream\":true}" \
    "$term_url/v1/completions" >"$tmp/term$i" &
  pids+=($!)
done
for i in $(seq 1 4); do
  for _ in $(seq 1 100); do grep -q '^data: {' "$tmp/term$i" 2>/dev/null && break; sleep 0.05; done
done
kill -TERM "$term_pid"
code=$(curl -s -o "$tmp/late" -w '%{http_code}' -d '{"prompt":"x","max_tokens":5}' "$term_url/v1/completions" || true)
for p in "${pids[@]}"; do wait "$p"; done
rc=0; wait "$term_pid" || rc=$?
[ "$code" = 503 ] || { echo "a request after SIGTERM got HTTP $code: $(cat "$tmp/late")"; exit 1; }
[ $rc = 0 ] || { echo "the server exited $rc after SIGTERM"; cat "$tmp/term.log"; exit 1; }
for i in $(seq 1 4); do
  [ "$(tail -n 2 "$tmp/term$i" | head -n 1)" = "data: [DONE]" ] || { echo "stream $i cut by SIGTERM: $(tail -c 300 "$tmp/term$i")"; exit 1; }
  grep -q '"finish_reason":"length"' "$tmp/term$i" || { echo "stream $i did not finish"; exit 1; }
done
grep -q "drained; exiting" "$tmp/term.log"
echo "SIGTERM: 4 in-flight streams finished, a new request got 503, exit 0"

# ---- tessera bench serve against the real server -------------------------------------------
serve_start b --model "$model" --max-seqs 8
"$tessera" bench serve --url "$b_url" --concurrency 4 --requests 12 --prompt-tokens 32 --max-tokens 24 --stream --json \
  >"$tmp/bench.json"
python3 - "$tmp/bench.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
assert r["completed"] == 12 and r["failed"] == 0, r
assert r["total_output_tokens"] == 12 * 24 and r["total_input_tokens"] == 12 * 32, r
assert r["output_throughput"] > 0 and r["p50_ttft_ms"] > 0 and r["p99_itl_ms"] >= r["p50_itl_ms"], r
PY
"$tessera" bench serve --url "$b_url" --rate 50 --requests 10 --prompt-tokens 8 --max-tokens 8 --json >"$tmp/bench2.json"
[ "$(field 'd["completed"]' <"$tmp/bench2.json")" = 10 ]
serve_stop b
echo "bench serve: closed loop and Poisson runs complete with exact token counts"
echo "serve load test passed"
