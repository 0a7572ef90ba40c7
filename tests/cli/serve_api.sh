#!/usr/bin/env bash
# `tessera serve` through its HTTP API with curl: completions equal
# `tessera sample`'s tokens (greedy and seeded sampling), alone and 16 at
# once; streamed chunks concatenate to the non-streamed text; chat; a table
# of bad requests gets OpenAI-shaped errors with the right status; /metrics
# passes promtool; /v1/models and /health.
set -euo pipefail
tessera=$1; tests=$2
tmp=$(mktemp -d)
source "$tests/cli/serve_common.inc"

serve_model "$tmp/m"
model="$tmp/m/run/model.safetensors"
serve_start srv --model "$model" --served-model-name tiny --api-key sekret --max-body 65536 --max-seqs 8
url=$srv_url
auth=(-H "Authorization: Bearer sekret")

# post PATH BODY: the response body on stdout, the status in $tmp/status.
post() {
  curl -s -o "$tmp/body" -w '%{http_code}' "${auth[@]}" -H 'Content-Type: application/json' \
    --data-binary "$2" "$url$1" >"$tmp/status"
  cat "$tmp/body"
}
field() { python3 -c "import json,sys; d=json.load(sys.stdin); print(eval(sys.argv[1]), end='')" "$1"; }

# tessera sample's continuation of a prompt: its stdout is the prompt, the
# tokens, then a newline; the server stops at end-of-text (byte 0).
sample_text() {
  local prompt=$1; shift
  "$tessera" sample --weights "$model" --tokenizer byte --prompt "$prompt" "$@" 2>/dev/null >"$tmp/sample"
  python3 - "$tmp/sample" "$prompt" <<'PY'
import sys
out = open(sys.argv[1], "rb").read()
p = sys.argv[2].encode()
assert out.startswith(p) and out.endswith(b"\n"), out
print(out[len(p):-1].split(b"\0")[0].decode("utf-8", "replace"), end="")
PY
}

# ---- greedy and seeded sampling equal tessera sample -----------------------------
for prompt in "the " "This program is free software" "Licensor shall" "x"; do
  want=$(sample_text "$prompt" --tokens 40 --temperature 0)
  body=$(python3 -c 'import json,sys; print(json.dumps({"model":"tiny","prompt":sys.argv[1],"max_tokens":40,"temperature":0}))' "$prompt")
  got=$(post /v1/completions "$body" | field 'd["choices"][0]["text"]')
  [ "$(cat "$tmp/status")" = 200 ] || { echo "greedy '$prompt': HTTP $(cat "$tmp/status"): $(cat "$tmp/body")"; exit 1; }
  [ "$got" = "$want" ] || { echo "greedy '$prompt': server '$got' != sample '$want'"; exit 1; }
  want=$(sample_text "$prompt" --tokens 40 --temperature 0.8 --top-k 40 --seed 7)
  body=$(python3 -c 'import json,sys; print(json.dumps({"prompt":sys.argv[1],"max_tokens":40,"temperature":0.8,"top_k":40,"seed":7}))' "$prompt")
  got=$(post /v1/completions "$body" | field 'd["choices"][0]["text"]')
  [ "$got" = "$want" ] || { echo "seeded '$prompt': server '$got' != sample '$want'"; exit 1; }
done
echo "greedy and seeded completions equal tessera sample"

# ---- 16 requests at once, different prompts and lengths: each equals its own run --------
text=$(head -c 4000 /usr/share/common-licenses/GPL-3 | tr -d '\0')
pids=()
for i in $(seq 0 15); do
  len=$((1 + i * 13))
  prompt=${text:$((i * 97)):$len}
  printf '%s' "$prompt" >"$tmp/prompt$i"
  python3 -c 'import json,sys; print(json.dumps({"prompt":open(sys.argv[1]).read(),"max_tokens":30,"temperature":0.7,"top_k":40,"seed":int(sys.argv[2])}))' \
    "$tmp/prompt$i" "$((100 + i))" >"$tmp/req$i"
done
for i in $(seq 0 15); do
  curl -s "${auth[@]}" --data-binary @"$tmp/req$i" "$url/v1/completions" >"$tmp/resp$i" &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done
for i in $(seq 0 15); do
  want=$(sample_text "$(cat "$tmp/prompt$i")" --tokens 30 --temperature 0.7 --top-k 40 --seed $((100 + i)))
  got=$(field 'd["choices"][0]["text"]' <"$tmp/resp$i")
  [ "$got" = "$want" ] || { echo "concurrent request $i: server '$got' != sample '$want'"; exit 1; }
done
echo "16 concurrent requests each equal their solo run"

# ---- streaming: chunks concatenate to the non-streamed text; one chunk a token; [DONE] ----
for endpoint in completions chat/completions; do
  if [ $endpoint = completions ]; then
    base='"prompt":"The licenses for most software"'
  else
    base='"messages":[{"role":"system","content":"Answer briefly."},{"role":"user","content":"What is free software?"}]'
  fi
  plain=$(post /v1/$endpoint "{$base,\"max_tokens\":48,\"temperature\":0.9,\"seed\":3}")
  [ "$(cat "$tmp/status")" = 200 ] || { echo "$endpoint: HTTP $(cat "$tmp/status"): $plain"; exit 1; }
  curl -sN "${auth[@]}" --data-binary "{$base,\"max_tokens\":48,\"temperature\":0.9,\"seed\":3,\"stream\":true,\"stream_options\":{\"include_usage\":true}}" \
    "$url/v1/$endpoint" >"$tmp/stream"
  python3 - "$tmp/stream" "$endpoint" "$plain" <<'PY'
import json, sys
raw = open(sys.argv[1], encoding="utf-8").read()
chat = sys.argv[2] != "completions"
plain = json.loads(sys.argv[3])
events = [e for e in raw.split("\n\n") if e.strip()]
assert all(e.startswith("data: ") for e in events), raw[:500]
assert events[-1] == "data: [DONE]", events[-1]
chunks = [json.loads(e[6:]) for e in events[:-1]]
text, tokens, reasons, usage = "", 0, [], None
for c in chunks:
    assert c["object"] == ("chat.completion.chunk" if chat else "text_completion"), c
    if c.get("usage"):
        usage = c["usage"]
    for ch in c["choices"]:
        piece = ch["delta"].get("content", "") if chat else ch["text"]
        text += piece or ""
        if ch.get("finish_reason"):
            reasons.append(ch["finish_reason"])
        if chat and "role" in ch["delta"]:
            continue  # the opening chunk carries the role, no token
        tokens += 1
want = plain["choices"][0]["message"]["content"] if chat else plain["choices"][0]["text"]
assert text == want, (text, want)
assert reasons == [plain["choices"][0]["finish_reason"]], reasons
assert usage == plain["usage"], (usage, plain["usage"])
# One chunk per token, unless the end came without one (end-of-text or a stop string).
assert tokens == usage["completion_tokens"] or reasons == ["stop"], (tokens, usage)
if chat:
    assert plain["choices"][0]["message"]["role"] == "assistant"
PY
done
echo "streamed completions and chat equal their non-streamed text"

# ---- stop strings and logprobs --------------------------------------------------------
python3 - "$url" <<'PY'
import json, sys, urllib.request
url = sys.argv[1]
def post(body):
    req = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Authorization": "Bearer sekret"})
    return json.load(urllib.request.urlopen(req, timeout=60))
base = {"prompt": "The licenses for most software", "max_tokens": 60, "temperature": 0.9, "seed": 11}
full = post(base)["choices"][0]["text"]
# A stop string from the middle of the text: the answer ends just before its first occurrence.
stop = full[20:23]
cut = post(dict(base, stop=[stop, "\u0001never"]))
assert cut["choices"][0]["finish_reason"] == "stop", cut
assert cut["choices"][0]["text"] == full[:full.index(stop)], (cut["choices"][0]["text"], full, stop)
# logprobs: one entry per token, the token's own log-probability <= 0, 3 alternatives each.
lp = post(dict(base, max_tokens=8, logprobs=3))
l = lp["choices"][0]["logprobs"]
assert len(l["tokens"]) == len(l["token_logprobs"]) == len(l["top_logprobs"]) == 8, l
assert all(x <= 0 for x in l["token_logprobs"]) and all(len(t) <= 3 for t in l["top_logprobs"]), l
if lp["choices"][0]["text"].isascii():  # a token cutting a character is shown alone as U+FFFD
    assert "".join(l["tokens"]) == lp["choices"][0]["text"], l
print("stop strings cut the text; logprobs are well-formed")
PY

# ---- bad requests: status and an OpenAI-shaped error ------------------------------------
python3 - "$url" <<'PY'
import json, sys, urllib.request, urllib.error
url = sys.argv[1]
auth = {"Authorization": "Bearer sekret"}
ids300 = json.dumps({"prompt": list(range(1, 256)) + list(range(1, 46))})
cases = [
    ("bad JSON", "POST", "/v1/completions", b'{"prompt":', auth, 400),
    ("not an object", "POST", "/v1/completions", b'[1,2]', auth, 400),
    ("empty body", "POST", "/v1/completions", b'', auth, 400),
    ("prompt of the wrong type", "POST", "/v1/completions", b'{"prompt":5}', auth, 400),
    ("negative max_tokens", "POST", "/v1/completions", b'{"prompt":"x","max_tokens":-3}', auth, 400),
    ("max_tokens as a string", "POST", "/v1/completions", b'{"prompt":"x","max_tokens":"3"}', auth, 400),
    ("temperature out of range", "POST", "/v1/completions", b'{"prompt":"x","temperature":7}', auth, 400),
    ("prompt longer than the context", "POST", "/v1/completions", ids300.encode(), auth, 400),
    ("max_tokens past the context", "POST", "/v1/completions", b'{"prompt":"x","max_tokens":1000}', auth, 400),
    ("token id >= vocab", "POST", "/v1/completions", b'{"prompt":[1,2,256]}', auth, 400),
    ("n = 2", "POST", "/v1/completions", b'{"prompt":"x","n":2}', auth, 400),
    ("stop of the wrong type", "POST", "/v1/completions", b'{"prompt":"x","stop":{"a":1}}', auth, 400),
    ("invalid UTF-8", "POST", "/v1/completions", b'{"prompt":"ab\xff\xfecd"}', auth, 400),
    ("unknown model", "POST", "/v1/completions", b'{"model":"gpt-9","prompt":"x"}', auth, 404),
    ("missing API key", "POST", "/v1/completions", b'{"prompt":"x"}', {}, 401),
    ("wrong API key", "POST", "/v1/completions", b'{"prompt":"x"}', {"Authorization": "Bearer nope"}, 401),
    ("body over the limit", "POST", "/v1/completions", b'{"prompt":"' + b"a" * 70000 + b'"}', auth, 413),
    ("chat without messages", "POST", "/v1/chat/completions", b'{"prompt":"x"}', auth, 400),
    ("chat with a bad role", "POST", "/v1/chat/completions", b'{"messages":[{"role":"robot","content":"x"}]}', auth, 400),
    ("unknown endpoint", "POST", "/v1/embeddings", b'{}', auth, 404),
    ("models without a key", "GET", "/v1/models", None, {}, 401),
]
for name, method, path, body, headers, want in cases:
    req = urllib.request.Request(url + path, data=body, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            status, text = r.status, r.read()
    except urllib.error.HTTPError as e:
        status, text = e.code, e.read()
    assert status == want, f"{name}: HTTP {status}, want {want}: {text[:300]!r}"
    err = json.loads(text)["error"]
    assert isinstance(err["message"], str) and err["message"], f"{name}: {text!r}"
    assert isinstance(err["type"], str) and err["type"], f"{name}: {text!r}"
print(f"{len(cases)} bad requests answered with the right status and error")
PY
curl -sf "$url/health" >/dev/null || { echo "server unhealthy after the bad requests"; exit 1; }
kill -0 "$srv_pid"

# ---- /v1/models, /health, /metrics ----------------------------------------------
[ "$(curl -s "${auth[@]}" "$url/v1/models" | field 'd["data"][0]["id"]')" = tiny ]
[ "$(curl -s "$url/health" | field 'd["status"] + " " + d["backend"]')" = "ok cpu" ]
curl -s "$url/metrics" >"$tmp/metrics"
promtool check metrics <"$tmp/metrics" || { echo "promtool check metrics failed"; exit 1; }
for m in tessera_requests_running tessera_requests_waiting tessera_kv_cache_usage_ratio \
         tessera_prompt_tokens_total tessera_generation_tokens_total tessera_request_success_total \
         tessera_request_errors_total tessera_time_to_first_token_seconds_bucket \
         tessera_inter_token_latency_seconds_bucket tessera_e2e_request_latency_seconds_bucket \
         tessera_request_queue_time_seconds_bucket tessera_batch_tokens_bucket; do
  grep -q "^$m" "$tmp/metrics" || { echo "/metrics lacks $m"; exit 1; }
done
grep -q '^tessera_request_errors_total{code="401"} 3' "$tmp/metrics" || { grep errors_total "$tmp/metrics"; echo "want three 401s counted"; exit 1; }
[ "$(awk '$1 == "tessera_kv_cache_usage_ratio" {print $2}' "$tmp/metrics")" = 0 ] || { echo "KV blocks still in use when idle"; exit 1; }
echo "/v1/models, /health and /metrics (promtool) are right"

serve_stop srv

# ---- the INT8 tier: --dtype int8 quantizes the matmul weights at load; tessera
# quantize writes them to a file that serves the same text ------------------------------
serve_start q --model "$model" --dtype int8
"$tessera" quantize --weights "$model" --out "$tmp/q8.safetensors" >/dev/null
serve_start q8 --model "$tmp/q8.safetensors"
body='{"prompt":"The licenses","max_tokens":12,"ignore_eos":true,"temperature":0.8,"seed":5}'
a=$(curl -s -d "$body" "$q_url/v1/completions")
b=$(curl -s -d "$body" "$q8_url/v1/completions")
[ "$(echo "$a" | field 'd["usage"]["completion_tokens"]')" = 12 ] || { echo "int8 completion: $a"; exit 1; }
[ "$(echo "$a" | field 'd["choices"][0]["text"]')" = "$(echo "$b" | field 'd["choices"][0]["text"]')" ] ||
  { echo "the INT8 file serves other text than quantizing at load: $a / $b"; exit 1; }
grep -q "int8 on cpu" "$tmp/q.log" && grep -q "int8 on cpu" "$tmp/q8.log" || { cat "$tmp/q.log" "$tmp/q8.log"; exit 1; }
serve_stop q
serve_stop q8
echo "--dtype int8 serves"
echo "serve api test passed"
