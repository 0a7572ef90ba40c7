#!/usr/bin/env bash
# `tessera serve --model DIR` of a Hugging Face Llama folder (issue #30): a
# random-weight Llama (GQA, untied head) with the real Llama 3.1
# tokenizer.json, tokenizer_config.json (its chat template) and a
# generation_config.json with Llama 3's three end ids. The server renders chat
# messages through the template; the prompt ids it reports equal the
# oracle's: python3-jinja2 rendering as transformers' apply_chat_template
# (trim_blocks, lstrip_blocks) and Hugging Face's own tokenizer
# (@huggingface/tokenizers) encoding without added tokens. Streaming
# concatenates to the plain text; tools and response_format get their 400.
set -euo pipefail
tessera=$1; tests=$2
clients="$tests/clients"
root=$(cd "$tests/.." && pwd)
export OMP_NUM_THREADS=1
tok="$root/data/raw/tokenizers/llama3_1"
[ -f "$tok/tokenizer.json" ] || { echo "FAIL $tok is missing: run scripts/setup.sh (scripts/fetch-data.sh)"; exit 1; }
[ -f "$clients/node_modules/openai/package.json" ] || { echo "FAIL tests/clients is not installed: run scripts/setup.sh"; exit 1; }
tmp=$(mktemp -d)
source "$tests/cli/serve_common.inc"

# The folder: one training step of a Llama config with Llama 3's vocabulary.
"$tessera" prepare --input /usr/share/common-licenses/{GPL-3,GPL-2,LGPL-2.1,Apache-2.0} --tokenizer byte --out "$tmp/data" \
  --val-fraction 0.25 >/dev/null
cat >"$tmp/cfg.toml" <<TOML
[model]
arch = "llama"
layers = 2
heads = 4
kv_heads = 2
dim = 64
mlp_hidden = 96
vocab = 128256
context = 256
[data]
train = "$tmp/data/train_*.bin"
val = "$tmp/data/val_*.bin"
[train]
micro_batch = 1
seq = 32
steps = 1
warmup = 0
eval_every = 0
eval_batches = 1
[checkpoint]
dir = "$tmp/llama"
TOML
"$tessera" train --config "$tmp/cfg.toml" >"$tmp/train.log" 2>&1 || { cat "$tmp/train.log"; exit 1; }
cp "$tok/tokenizer.json" "$tok/tokenizer_config.json" "$tmp/llama/"
echo '{"bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009]}' >"$tmp/llama/generation_config.json"

cat >"$tmp/messages.json" <<'JSON'
[{"role": "system", "content": "You are terse.  "},
 {"role": "user", "content": "Grüße aus Zürich — 日本語も。 What's 2+2?\n"}]
JSON
# The oracle: render as transformers does, encode with Hugging Face's tokenizer.
python3 - "$tok/tokenizer_config.json" "$tmp/messages.json" >"$tmp/rendered.json" <<'PY'
import json, sys
import jinja2
cfg = json.load(open(sys.argv[1]))
env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
text = env.from_string(cfg["chat_template"]).render(messages=json.load(open(sys.argv[2])), add_generation_prompt=True,
                                                   bos_token=cfg["bos_token"], eos_token=cfg["eos_token"])
print(json.dumps(text))
PY
(cd "$clients" && node tokenizer_oracle.mjs "$tok" <"$tmp/rendered.json") \
  | python3 -c 'import json,sys; print(json.dumps(json.loads(sys.stdin.readline())["plain"]))' >"$tmp/oracle.json"

serve_start srv --model "$tmp/llama" --served-model-name llama-tiny --threads 1
status=0
if grep -q "the folder's chat template, end ids 128001 128008 128009" "$tmp/srv.log"; then
  echo "ok   the server took the folder's tokenizer, template and end ids: $(grep -m1 'chat template' "$tmp/srv.log")"
else echo "FAIL the server's assets:"; cat "$tmp/srv.log"; status=1; fi
grep -q "KV=2" "$tmp/srv.log" || { echo "FAIL the ready line does not describe a GQA model:"; cat "$tmp/srv.log"; status=1; }
node "$clients/openai_chat_template.mjs" "${srv_url##*:}" llama-tiny "$tmp/oracle.json" "$tmp/messages.json" || status=1
# Still serving after the refusals.
code=$(curl -s -o /dev/null -w '%{http_code}' "$srv_url/v1/completions" -H 'Content-Type: application/json' \
  -d '{"prompt": "Hello", "max_tokens": 2}')
[ "$code" = 200 ] && echo "ok   still serving after the refusals" || { echo "FAIL a completion after the refusals: $code"; status=1; }
serve_stop srv

# generation_config.json's sampling values are the defaults of requests that
# leave them out (vLLM's behaviour): temperature 0 makes two requests with
# different seeds give the same (greedy) text; one that sets its own
# temperature keeps it. A value out of range is one line at start-up.
cp -r "$tmp/llama" "$tmp/greedy"
echo '{"eos_token_id": [128001, 128008, 128009], "temperature": 0.0, "top_p": 0.9}' >"$tmp/greedy/generation_config.json"
serve_start gr --model "$tmp/greedy" --served-model-name llama-tiny --threads 1
grep -q "sampling defaults temperature 0 top_p 0.9" "$tmp/gr.log" ||
  { echo "FAIL the ready line does not name the sampling defaults:"; cat "$tmp/gr.log"; status=1; }
text() {  # SEED [FIELDS]
  curl -s "$gr_url/v1/completions" -H 'Content-Type: application/json' \
    -d "{\"prompt\": \"Hello there\", \"max_tokens\": 12, \"seed\": $1 ${2:-}}" | python3 -c 'import json,sys; b=sys.stdin.read(); print(json.loads(b)["choices"][0]["text"] if "choices" in b else "ERROR " + b)'
}
a=$(text 1); b=$(text 2); c=$(text 1 ', "temperature": 1.5'); d=$(text 2 ', "temperature": 1.5')
if [ "$a" = "$b" ] && [ "$c" != "$d" ]; then
  echo "ok   generation_config's temperature 0 is the default; a request's own temperature wins"
else echo "FAIL sampling defaults: seeds 1/2 without temperature '$a' / '$b', with temperature 1.5 '$c' / '$d'"; status=1; fi
fp32_text=$a
mb() { sed -n 's/.*KV cache [0-9]* blocks of [0-9]* positions (\([0-9.]*\) MB, \([a-z0-9]*\)).*/\1 \2/p' "$1" | head -1; }
fp32_kv=$(mb "$tmp/gr.log")
serve_stop gr

# --kv-dtype f16 (llama.cpp's cache type): the same blocks in half the
# memory, and the server generates (the fp16 kernels against their oracle:
# CpuKvF16.*, the model's logits near the fp32 cache's: KVCacheTest).
serve_start gr16 --model "$tmp/greedy" --served-model-name llama-tiny --threads 1 --kv-dtype f16
f16_kv=$(mb "$tmp/gr16.log")
gr_url=$gr16_url
f16_text=$(text 1)
if [ "${fp32_kv#* }" = fp32 ] && [ "${f16_kv#* }" = f16 ] &&
   awk -v a="${fp32_kv% *}" -v b="${f16_kv% *}" 'BEGIN { exit !(b > 0 && (a / b - 2) ^ 2 < 1e-4) }' &&
   [ -n "$f16_text" ] && [ "${f16_text#ERROR}" = "$f16_text" ]; then
  echo "ok   --kv-dtype f16: KV cache $f16_kv against $fp32_kv; greedy text '$f16_text' (fp32 cache: '$fp32_text')"
else echo "FAIL --kv-dtype f16: KV cache '$f16_kv' against '$fp32_kv', text '$f16_text'"; cat "$tmp/gr16.log"; status=1; fi
serve_stop gr16
echo '{"temperature": 7}' >"$tmp/greedy/generation_config.json"
if "$tessera" serve --model "$tmp/greedy" --port 0 >"$tmp/bad.out" 2>"$tmp/bad.err"; then
  echo "FAIL a temperature of 7 was served"; status=1
elif [ "$(grep -c '^tessera: error:' "$tmp/bad.err")" = 1 ] &&
     tail -1 "$tmp/bad.err" | grep -q "generation_config.json: temperature 7 is not a number in \[0, 2\]"; then
  echo "ok   a bad generation_config.json temperature is one error line: $(tail -1 "$tmp/bad.err")"
else echo "FAIL a bad generation_config.json:"; cat "$tmp/bad.err"; status=1; fi

# Through the registry: the tokenizer, template and end ids travel with the
# weights (checksummed), and the promoted version serves the same prompt ids.
# With --quantize int8 the version holds the Llama INT8 file too, which
# `--dtype int8` serves (the same template, so the same prompt ids).
"$tessera" registry add llama-tiny --from "$tmp/llama" --registry "$tmp/reg" --quantize int8 >"$tmp/reg.out" 2>&1 \
  || { echo "FAIL registry add:"; cat "$tmp/reg.out"; exit 1; }
for f in tokenizer.json tokenizer_config.json generation_config.json; do
  grep -q "\"$f\"" "$tmp/reg/llama-tiny/1/manifest.json" || { echo "FAIL $f is not in the version's manifest"; status=1; }
done
serve_start reg --registry "$tmp/reg" --model llama-tiny --threads 1
node "$clients/openai_chat_template.mjs" "${reg_url##*:}" llama-tiny "$tmp/oracle.json" "$tmp/messages.json" \
  | sed 's/^/registry: /' || status=1
serve_stop reg
serve_start reg8 --registry "$tmp/reg" --model llama-tiny --threads 1 --dtype int8
grep -q "int8 on cpu" "$tmp/reg8.log" || { echo "FAIL the registry's INT8 version is not served in int8:"; cat "$tmp/reg8.log"; status=1; }
node "$clients/openai_chat_template.mjs" "${reg8_url##*:}" llama-tiny "$tmp/oracle.json" "$tmp/messages.json" \
  | sed 's/^/registry int8: /' || status=1
serve_stop reg8
exit $status
