#!/usr/bin/env bash
# Loading within the memory the model needs (issue #30 item 3): weights are
# read from mapped files tensor by tensor and, for the INT8 tier, quantized
# as they are read, so the peak resident set while loading is the model's
# steady size plus one tensor. A random-weight Llama-shaped BF16 folder
# (tessera synth model, 6 layers, 1024 channels, 32000 vocabulary, untied
# head: 133M parameters) through `tessera quantize`, `tessera serve --dtype
# int8` and `tessera serve` (fp32). Peaks are /usr/bin/time's maximum
# resident set (quantize) and the VmHWM serve logs once its weights are in
# (before the KV cache and the forward's scratch), each less the
# same command's peak on a one-layer model (the shared libraries' pages),
# against bounds computed from the shape: int8 matrices + fp32 embeddings
# and norms + the largest fp32 tensor + 40 MB. Loading every fp32 weight at
# once (the old path) would need at least 200 MB more than the int8 bound.
set -euo pipefail
tessera=$1; tests=$2
tmp=$(mktemp -d)
source "$tests/cli/serve_common.inc"
export OMP_NUM_THREADS=1

L=6 C=1024 NH=16 KV=4 F=2816 V=32000
"$tessera" synth model --preset tinyllama-1.1b --layers $L --dim $C --heads $NH --kv-heads $KV --mlp-hidden $F \
  --vocab $V --context 256 --out "$tmp/big" >/dev/null
"$tessera" synth model --preset tinyllama-1.1b --layers 1 --dim 64 --heads 4 --kv-heads 2 --mlp-hidden 96 \
  --vocab 256 --context 256 --out "$tmp/tiny" >/dev/null
[ -f "$tmp/big/model.safetensors" ] || { echo "FAIL synth model wrote no model.safetensors"; ls "$tmp/big"; exit 1; }

# MB figures of the shape (hs = C/NH; the head's rows are V, a multiple of 128).
read -r layer_params int8_mb fp32_mb tensor_mb all_fp32_mb < <(python3 - $L $C $NH $KV $F $V <<'PY'
import sys
L, C, NH, KV, F, V = map(int, sys.argv[1:])
hs = C // NH
layer = (NH + 2 * KV) * hs * C + C * NH * hs + 2 * F * C + F * C
int8 = (L * layer + V * C) / 1e6              # the layers' matrices and the head, one byte each
fp32 = (V * C + (2 * L + 1) * C) * 4 / 1e6    # embeddings and norms
tensor = V * C * 4 / 1e6                      # the largest tensor, in fp32
all_fp32 = (L * layer + 2 * V * C) * 4 / 1e6  # every weight in fp32 at once
print(L * layer, int8, fp32, tensor, all_fp32)
PY
)
bound=$(python3 -c "print(round($int8_mb + $fp32_mb + $tensor_mb + 40))")
echo "shape: int8 ${int8_mb} MB, fp32 rest ${fp32_mb} MB, largest tensor ${tensor_mb} MB; bound over baseline ${bound} MB (all fp32 at once: ${all_fp32_mb} MB)"
python3 -c "import sys; sys.exit(0 if $all_fp32_mb + $int8_mb > $bound + 200 else 1)" ||
  { echo "FAIL the shape does not separate the bound from loading every fp32 weight"; exit 1; }

peak_kb() {  # peak resident KB of a command
  /usr/bin/time -f %M -o "$tmp/rss" "$@" >"$tmp/cmd.log" 2>&1 || { echo "FAIL $*:" >&2; cat "$tmp/cmd.log" >&2; return 1; }
  tail -1 "$tmp/rss"
}
check() {  # what, peak KB, baseline KB, bound MB (10^6 bytes, as the shape's figures)
  local over=$(( ($2 - $3) * 1024 / 1000000 ))
  echo "$1: peak $(( $2 * 1024 / 1000000 )) MB, baseline $(( $3 * 1024 / 1000000 )) MB, over baseline ${over} MB (bound $4 MB)"
  [ "$over" -le "$4" ] || { echo "FAIL $1 peaked ${over} MB over its baseline, more than $4 MB"; exit 1; }
}

# tessera quantize: BF16 folder -> INT8 file.
base=$(peak_kb "$tessera" quantize --weights "$tmp/tiny" --out "$tmp/tiny8/model.safetensors")
peak=$(peak_kb "$tessera" quantize --weights "$tmp/big" --out "$tmp/big8/model.safetensors")
check "quantize" "$peak" "$base" "$bound"
grep -q "peak resident" "$tmp/cmd.log" || { echo "FAIL quantize does not report its peak"; cat "$tmp/cmd.log"; exit 1; }

# tessera serve: the peak while loading, read from the running server
# (sets peak_kb; no subshell, so the EXIT trap still sees the servers).
serve_peak() {  # NAME MODEL ARGS...
  local name=$1 model=$2; shift 2
  serve_start "$name" --model "$model" --kv-blocks 16 --max-seqs 2 "$@"
  local pid_var="${name}_pid" url_var="${name}_url"
  grep -q "peak .* MB while loading" "$tmp/$name.log" ||
    { echo "FAIL serve does not log its loading peak"; cat "$tmp/$name.log"; exit 1; }
  # The server answers: the model it loaded is a working one.
  curl -sf "${!url_var}/v1/completions" -H 'Content-Type: application/json' \
    -d '{"prompt": [1, 2, 3], "max_tokens": 2, "temperature": 0}' >"$tmp/$name.json" ||
    { echo "FAIL $name: the completion failed"; cat "$tmp/$name.log"; exit 1; }
  # The peak the server logged once its weights were in (VmHWM then; the KV
  # cache and the forward's scratch come after).
  peak_kb=$(( $(sed -n 's/.*weights loaded; resident [0-9]* MB, peak \([0-9]*\) MB while loading.*/\1/p' "$tmp/$name.log") * 1000000 / 1024 ))
  serve_stop "$name"
}
serve_peak tiny8 "$tmp/tiny" --dtype int8; base=$peak_kb
serve_peak big8 "$tmp/big" --dtype int8
check "serve --dtype int8" "$peak_kb" "$base" "$bound"
# The INT8 file loads the same way (no fp32 matrices at all).
serve_peak file8 "$tmp/big8/model.safetensors" --dtype int8
check "serve of the INT8 file" "$peak_kb" "$base" "$bound"
# fp32: every weight is resident by design, plus one tensor while loading.
fp32_bound=$(python3 -c "print(round($all_fp32_mb + $tensor_mb + 40))")
serve_peak tiny "$tmp/tiny"; base=$peak_kb
serve_peak big "$tmp/big"
check "serve fp32" "$peak_kb" "$base" "$fp32_bound"
echo "PASS"
