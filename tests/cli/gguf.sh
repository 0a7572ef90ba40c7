#!/usr/bin/env bash
# GGUF files through the CLI (issue #31 item 4): tessera quantize writes
# GGUF files of a random-weight Llama (GQA, untied head, Llama 2's
# SentencePiece vocabulary) and of GPT-2 (its BPE vocabulary); sample reads
# them with their own vocabulary and gives the folder's greedy text (F32:
# the fp32 model's, Q4_0: the int4 tier's, Q4_K: --dtype int4k's); serve
# answers a completion from a 4-bit file; a registry version stores
# model.int4.gguf and serves it; and broken files (truncated at many
# places, flipped bytes, a directory, a FIFO) get one error line and a
# plain exit 1, never a crash or a hang.
set -euo pipefail
tessera=$1; tests=$2
root=$(cd "$tests/.." && pwd)
cd "$root"  # data/raw/gpt2: the default --vocab of sample and quantize
export OMP_NUM_THREADS=1
spm="$root/data/raw/tokenizers/llama2"
[ -f "$spm/tokenizer.json" ] || { echo "FAIL $spm is missing: run scripts/setup.sh (scripts/fetch-data.sh)"; exit 1; }
tmp=$(mktemp -d)
source "$tests/cli/serve_common.inc"
fail() { echo "FAIL $*"; exit 1; }

# A small Llama with Llama 2's vocabulary (32000), and GPT-2 124M's shape cut
# to 2 layers with GPT-2's vocabulary.
"$tessera" synth model --preset tinyllama-1.1b --layers 2 --dim 256 --heads 8 --kv-heads 2 --mlp-hidden 512 \
  --context 256 --dtype fp32 --out "$tmp/llama" >/dev/null
cp "$spm/tokenizer.json" "$spm/tokenizer_config.json" "$tmp/llama/"
"$tessera" synth model --preset gpt2-124m --layers 2 --context 256 --dtype fp32 --out "$tmp/gpt2" >/dev/null

sample() { "$tessera" sample --weights "$1" --prompt "The jury said" --tokens 12 --temperature 0 "${@:2}" 2>/dev/null; }
for m in llama gpt2; do
  for t in f32 int4 int4k; do
    "$tessera" quantize --weights "$tmp/$m" --out "$tmp/$m-$t.gguf" --dtype $t >/dev/null
  done
  want=$(sample "$tmp/$m")
  got=$(sample "$tmp/$m-f32.gguf")
  [ "$got" = "$want" ] || fail "$m: F32 GGUF greedy text '$got' differs from the folder's '$want'"
  # Q4_0: the int4 tier's own blocks; the head of a GQA model gathers its input, so the text is compared.
  want=$(sample "$tmp/$m" --dtype int4)
  got=$(sample "$tmp/$m-int4.gguf")
  [ "$got" = "$want" ] || fail "$m: Q4_0 GGUF greedy text '$got' differs from --dtype int4's '$want'"
  [ "$(sample "$tmp/$m-int4.gguf" --dtype int4)" = "$got" ] || fail "$m: --dtype int4 changed a 4-bit file's text"
  echo "ok $m: F32 and Q4_0 GGUF files give the folder's greedy text ($(printf '%q' "$got"))"
done
# The vocabulary travels in the file: tokenize with it alone.
ids=$(printf 'The jury said' | "$tessera" tokenize --tokenizer "$tmp/llama-f32.gguf")
want=$(printf 'The jury said' | "$tessera" tokenize --tokenizer "$spm")
[ "$ids" = "$want" ] || fail "the GGUF vocabulary encodes to $ids, Llama 2's tokenizer.json to $want"
echo "ok the Llama file's SentencePiece vocabulary encodes as Llama 2's tokenizer.json: $ids"

# Serving a 4-bit file: its vocabulary and end ids, a completion.
serve_start s --model "$tmp/llama-int4.gguf" --max-seqs 4
grep -q "int4 from the file's blocks" "$tmp/s.log" || fail "serve did not log the int4 tier: $(cat "$tmp/s.log")"
name=$(curl -sf "$s_url/v1/models" | python3 -c 'import json, sys; print(json.load(sys.stdin)["data"][0]["id"])')
out=$(curl -s "$s_url/v1/completions" -H 'content-type: application/json' \
  -d "{\"model\": \"$name\", \"prompt\": \"The jury said\", \"max_tokens\": 5, \"temperature\": 0}")
python3 - "$out" <<'PY'
import json, sys
j = json.loads(sys.argv[1])
assert j["usage"]["prompt_tokens"] == 4, j  # <s> The jury said
assert j["usage"]["completion_tokens"] >= 1, j
PY
serve_stop s
echo "ok serve answers from a Q4_0 GGUF file with its own vocabulary"

# The registry's int4 file.
reg="$tmp/reg"
"$tessera" registry add demo --from "$tmp/gpt2" --quantize int4 --registry "$reg" >/dev/null
"$tessera" registry show demo --registry "$reg" | grep -q "model.int4.gguf" || fail "no model.int4.gguf in the version"
serve_start r --registry "$reg" --model demo --dtype int4 --tokenizer byte
grep -q "int4 from the file's blocks" "$tmp/r.log" || fail "the registry's int4 file was not loaded: $(cat "$tmp/r.log")"
serve_stop r
echo "ok registry add --quantize int4 stores model.int4.gguf and serve --dtype int4 loads it"

# Broken files: one line, exit 1.
f="$tmp/gpt2-int4.gguf"
size=$(stat -c %s "$f")
check_refused() {  # FILE WHAT
  local rc=0
  timeout 60 "$tessera" sample --weights "$1" --prompt a --tokens 1 --tokenizer byte >/dev/null 2>"$tmp/err" || rc=$?
  [ "$rc" = 1 ] || fail "$2: exit $rc ($(head -c 300 "$tmp/err"))"
  [ "$(wc -l <"$tmp/err")" = 1 ] || fail "$2: not one line: $(cat "$tmp/err")"
}
for cut in 0 3 4 8 24 100 1000 4000 65536 $((size / 2)) $((size - 100)); do
  head -c "$cut" "$f" >"$tmp/cut.gguf"
  printf 'GGUF' | dd of="$tmp/cut.gguf" conv=notrunc status=none  # the magic, so the GGUF reader answers
  check_refused "$tmp/cut.gguf" "cut at $cut bytes"
done
python3 - "$f" "$tmp/flip" <<'PY'
import random, sys
data = bytearray(open(sys.argv[1], "rb").read(200000))
rng = random.Random(31)
for k in range(12):
    d = bytearray(data)
    for _ in range(8):
        i = rng.randrange(4, 4096)  # the header, metadata and tensor infos
        d[i] = rng.randrange(256)
    open(f"{sys.argv[2]}{k}.gguf", "wb").write(d)
PY
for k in $(seq 0 11); do
  rc=0
  timeout 60 "$tessera" sample --weights "$tmp/flip$k.gguf" --prompt a --tokens 1 --tokenizer byte >/dev/null 2>"$tmp/err" || rc=$?
  { [ "$rc" = 0 ] || [ "$rc" = 1 ]; } || fail "flipped file $k: exit $rc ($(head -c 300 "$tmp/err"))"
done
mkfifo "$tmp/fifo.gguf"
check_refused "$tmp/fifo.gguf" "a FIFO"
echo "ok truncated, flipped and special files give one error line"
echo "ALL OK"
