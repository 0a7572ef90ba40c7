#!/usr/bin/env bash
# `tessera route` in front of two real `tessera serve` workers: answers equal
# the worker's own (completions and chat, streamed and not, greedy); the
# model id, token ids and usage are rewritten as the client asked; errors:
# the router's own (bad JSON, wrong model, API key, a non-boolean stream,
# 411), a worker's 400 passed through, 503 with no worker up, 429 past
# --max-inflight; a stream cut mid-way by a worker error continues on the
# other worker with exactly the uninterrupted text; the "resume" field at
# the worker continues a sequence exactly; bad flags; promtool on /metrics.
set -euo pipefail
tessera=$1; tests=$2
tmp=$(mktemp -d)
source "$tests/cli/serve_common.inc"

# ---- flags -------------------------------------------------------------------------------
for bad in "--tier gpu" "--tier gpu=127.0.0.1:80" "--tier gpu=http://127.0.0.1:99999" "--tier GPU=http://127.0.0.1:80" \
           "--tier a=http://127.0.0.1:80 --tier a=http://127.0.0.1:81" "--tier a=http://127.0.0.1:80,"; do
  set +e
  # shellcheck disable=SC2086
  timeout 10 "$tessera" route --port 0 $bad >"$tmp/out" 2>&1
  rc=$?
  set -e
  [ $rc -ge 1 ] && [ $rc -le 2 ] && [ "$(wc -l <"$tmp/out")" = 1 ] && grep -q "tier\|URL\|worker" "$tmp/out" ||
    { echo "route $bad: exit $rc, not one line naming the tier:"; cat "$tmp/out"; exit 1; }
done
echo "bad --tier flags: one line each"

serve_model "$tmp/m"
model="$tmp/m/run/model.safetensors"
serve_start a --model "$model" --served-model-name tiny --api-key wk --fault-injection --threads 1
serve_start b --model "$model" --served-model-name tiny-b --api-key wk --threads 1
route_start r --tier "gpu=$a_url" --tier "cpu=$b_url" --served-model-name tiny --api-key rk --worker-api-key wk \
  --health-interval 0.1 --health-timeout 1 --hold-down 0.5

# No worker up: 503 at once after --wait-for-worker; /health 503.
route_start dead --tier "gpu=http://127.0.0.1:9" --wait-for-worker 0.3

python3 - "$a_url" "$b_url" "$r_url" "$dead_url" <<'PY'
import http.client, json, sys, threading, time, urllib.parse

a, b, r, dead = sys.argv[1:5]

def call(url, path, body=None, key=None, raw=None, headers=None, method=None):
    u = urllib.parse.urlparse(url)
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    h = {"Content-Type": "application/json"}
    if key:
        h["Authorization"] = "Bearer " + key
    h.update(headers or {})
    data = raw if raw is not None else (None if body is None else json.dumps(body))
    c.request(method or ("GET" if data is None else "POST"), path, data, h)
    resp = c.getresponse()
    text = resp.read().decode()
    c.close()
    return resp.status, text, resp

def events(text):
    ev = [l[6:] for l in text.split("\n") if l.startswith("data: ")]
    assert ev and ev[-1] == "[DONE]", text[-300:]
    return [json.loads(e) for e in ev[:-1]]

def stream_text(chunks, chat):
    out = ""
    for c in chunks:
        if c["choices"]:
            ch = c["choices"][0]
            out += ch["delta"].get("content", "") if chat else ch["text"]
    return out

fails = []
def check(cond, what):
    if not cond:
        fails.append(what)
        print("FAIL", what)

# ---- answers equal the worker's ----
for chat in (False, True):
    path = "/v1/chat/completions" if chat else "/v1/completions"
    base = {"max_tokens": 40, "temperature": 0}
    if chat:
        base["messages"] = [{"role": "user", "content": "What is free software?"}]
    else:
        base["prompt"] = "This program is free software"
    s, direct, _ = call(a, path, base, key="wk")
    check(s == 200, f"direct {path}: {s}")
    direct = json.loads(direct)
    want = direct["choices"][0]["message"]["content"] if chat else direct["choices"][0]["text"]
    s, got, resp = call(r, path, dict(base, model="tiny"), key="rk")
    check(s == 200, f"routed {path}: {s} {got[:200]}")
    got = json.loads(got)
    check((got["choices"][0]["message"]["content"] if chat else got["choices"][0]["text"]) == want,
          f"routed {path} text differs")
    check(got["model"] == "tiny" and got["usage"] == direct["usage"], f"routed {path}: model/usage {got}")
    check(resp.getheader("X-Tessera-Tier") == "gpu", f"routed {path}: tier header {resp.getheader('X-Tessera-Tier')}")
    s, st, _ = call(r, path, dict(base, stream=True), key="rk")
    chunks = events(st)
    check(stream_text(chunks, chat) == want, f"routed stream {path} text differs")
    check(len({c["id"] for c in chunks}) == 1 and all(c["model"] == "tiny" for c in chunks), f"stream ids/models")
    check(all("token_ids" not in c["choices"][0] and "usage" not in c for c in chunks if c["choices"]),
          "token_ids or usage leaked into a stream that did not ask")
    s, st, _ = call(r, path, dict(base, stream=True, return_token_ids=True, stream_options={"include_usage": True}),
                    key="rk")
    chunks = events(st)
    ids = [t for c in chunks if c["choices"] for t in c["choices"][0]["token_ids"]]
    check(len(ids) == 40 and chunks[-1]["usage"]["completion_tokens"] == 40, f"token ids {len(ids)}, usage")
print("routed answers equal the worker's (completions, chat, streamed or not)")

# ---- errors ----
cases = [
    ("bad JSON", dict(raw="{", key="rk"), 400),
    ("a JSON array", dict(raw="[1]", key="rk"), 400),
    ("wrong model", dict(body={"model": "gpt-9", "prompt": "x"}, key="rk"), 404),
    ("no key", dict(body={"prompt": "x"}), 401),
    ("wrong key", dict(body={"prompt": "x"}, key="nope"), 401),
    ("stream not boolean", dict(body={"prompt": "x", "stream": "yes"}, key="rk"), 400),
    ("resume from a client", dict(body={"prompt": "x", "resume": {}}, key="rk"), 400),
    ("worker's 400 (max_tokens)", dict(body={"prompt": "x", "max_tokens": -1}, key="rk"), 400),
    ("worker's 400 in a stream", dict(body={"prompt": "x", "max_tokens": -1, "stream": True}, key="rk"), 400),
]
for name, kw, want in cases:
    s, text, _ = call(r, "/v1/completions", **kw)
    ok = s == want
    try:
        err = json.loads(text)["error"]
        ok = ok and isinstance(err["message"], str) and err["message"]
    except Exception:
        ok = False
    check(ok, f"{name}: HTTP {s} {text[:200]}, want {want} with an OpenAI error")
s, text, _ = call(r, "/v1/completions", body={"prompt": "x", "max_tokens": -1}, key="rk")
check(json.loads(text)["error"]["param"] == "max_tokens", "the worker's error is passed through as it is")
s, text, _ = call(r, "/v1/nothing", body={}, key="rk")
check(s == 404 and "error" in json.loads(text), f"unknown endpoint: {s}")
s, text, _ = call(r, "/v1/completions", raw='{"prompt":"x"}', key="rk", headers={"Transfer-Encoding": "chunked"})
check(s in (400, 411), f"chunked body: {s}")
s, text, _ = call(dead, "/v1/completions", body={"prompt": "x"})
check(s == 503 and "no worker" in json.loads(text)["error"]["message"], f"no worker up: {s} {text[:200]}")
s, text, _ = call(dead, "/health")
check(s == 503 and json.loads(text)["active_tier"] is None, f"no worker up: /health {s} {text[:200]}")
print("router errors, and the worker's passed through")

# ---- resume at the worker: the continuation equals the uninterrupted text ----
for chat in (False, True):
    path = "/v1/chat/completions" if chat else "/v1/completions"
    base = {"max_tokens": 30, "temperature": 0, "ignore_eos": True}
    if chat:
        base["messages"] = [{"role": "user", "content": "Hello"}]
    else:
        base["prompt"] = "The licenses for most software"
    s, full, _ = call(a, path, dict(base, return_token_ids=True), key="wk")
    c = json.loads(full)["choices"][0]
    text = (c["message"]["content"] if chat else c["text"]).encode()
    P, G = c["prompt_token_ids"], c["token_ids"]
    for k in (1, 5, 17):
        for sent in (0, max(0, len(bytes(G[:k])) - 3)):
            sent = min(sent, len(text))
            body = dict(base, max_tokens=30 - k, resume={"token_ids": P + G[:k], "generated": k, "sent_bytes": sent})
            s, rest, _ = call(b, path, body, key="wk")
            rc = json.loads(rest)["choices"][0]
            got = text[:sent] + (rc["message"]["content"] if chat else rc["text"]).encode()
            check(s == 200 and got == text, f"resume {path} after {k} tokens, {sent} bytes sent: {got!r} != {text!r}")
print("resume continues a sequence exactly (completions and chat)")

# ---- a stream cut by a worker error continues on the other worker ----
# The worker's stream fails after 37 tokens (fault injection) while the
# router relays it: the client still gets one stream with the uninterrupted
# greedy text.
body = {"prompt": "This program", "max_tokens": 240, "temperature": 0, "ignore_eos": True, "stream": True,
        "stream_options": {"include_usage": True}}
s, want, _ = call(b, "/v1/completions", dict(body, model="tiny-b", stream=False), key="wk")
want = json.loads(want)["choices"][0]["text"]
s, _, _ = call(a, "/admin/fault", {"fault": "error", "after_tokens": 37})
check(s == 200, f"/admin/fault after_tokens: {s}")
s, rest, _ = call(r, "/v1/completions", body, key="rk")
call(a, "/admin/fault", {"fault": "none"})
chunks = events(rest)
got = stream_text(chunks, False)
check(len({c["id"] for c in chunks}) == 1, "the continued stream has one id")
check(chunks[-1]["usage"]["completion_tokens"] == 240, f"usage {chunks[-1].get('usage')}")
check(got == want, f"continued stream text differs:\n{got!r}\n{want!r}")
s, m, _ = call(r, "/metrics")
check("tessera_route_retries_total 1" in m, "tessera_route_retries_total is not 1: the stream was not cut")
check('tessera_route_failovers_total{from="gpu",reason="http_5xx",to="cpu"} 1' in m,
      "no failover gpu -> cpu for http_5xx in /metrics")
print("a stream cut by a worker error continues on the other worker, text unchanged")

if fails:
    sys.exit(1)
PY

# ---- 429 past --max-inflight ---------------------------------------------------------------
# One request held by a hung worker fills the router; the next gets 429.
route_start one --tier "gpu=$a_url" --worker-api-key wk --max-inflight 1
curl -sf -o /dev/null -H 'Authorization: Bearer wk' -d '{"fault":"hang"}' "$a_url/admin/fault"
curl -s -o /dev/null --max-time 30 --data-binary '{"prompt":"x","max_tokens":4}' "$one_url/v1/completions" &
held=$!
sleep 0.3
code=
for i in $(seq 1 100); do
  code=$(curl -s --max-time 20 -o "$tmp/b429" -w '%{http_code}' --data-binary '{"prompt":"x","max_tokens":1}' "$one_url/v1/completions")
  [ "$code" = 429 ] && break
  sleep 0.05
done
curl -sf -o /dev/null -d '{"fault":"none"}' "$a_url/admin/fault"
wait $held || true
[ "$code" = 429 ] && grep -q max-inflight "$tmp/b429" || { echo "no 429 past --max-inflight 1 (last $code)"; exit 1; }
echo "429 past --max-inflight"

curl -sf "$r_url/metrics" >"$tmp/metrics"
promtool check metrics <"$tmp/metrics" || { echo "promtool check metrics failed"; exit 1; }
for m in tessera_route_tier_active tessera_route_failovers_total tessera_route_retries_total \
         tessera_route_worker_up tessera_route_request_duration_seconds_bucket; do
  grep -q "^$m" "$tmp/metrics" || { echo "/metrics lacks $m"; exit 1; }
done
echo "router /metrics passes promtool"
