#!/usr/bin/env bash
# The same GGUF file decodes the same greedy text in llama.cpp and in
# Tessera (issue #31, "Verify"), and tokenizes prompts to the same ids:
# F32 files of a GPT-2 124M (GPT-2's vocabulary), of a small Llama (GQA,
# untied head, Llama 2's SentencePiece vocabulary) and of the same Llama
# with Llama 3's rotary scaling (rope_freqs.weight in the file; an original
# context of 64, so that the prompts' positions turn the scaled frequencies
# far from the unscaled ones), random weights, written by the project's
# converter; and a small Qwen2 (GGUF's qwen2 architecture: q, k and v
# biases, made random here since synth model zeroes them; Qwen3's byte-level
# vocabulary, the same as Qwen2.5's). Not a CI test: it needs llama.cpp, built by
# bench/llamacpp_build.sh (12 minutes on 2 cores the first time).
#   bench/llamacpp_greedy.sh [TOKENS=16]
set -euo pipefail
cd "$(dirname "$0")/.."
tokens=${1:-16}
tessera=$PWD/build/release/tessera
eval "$(bash bench/llamacpp_build.sh)"
work=${TESSERA_LLAMACPP_DIR:-/var/tmp/tessera-llamacpp}/models
mkdir -p "$work"
if [ ! -f "$work/gpt2/config.json" ]; then
  "$tessera" synth model --preset gpt2-124m --dtype fp32 --out "$work/gpt2" >&2
fi
if [ ! -f "$work/llama-small/config.json" ]; then
  "$tessera" synth model --preset tinyllama-1.1b --layers 4 --dim 512 --heads 8 --kv-heads 2 --mlp-hidden 1024 \
    --dtype fp32 --out "$work/llama-small" >&2
  cp data/raw/tokenizers/llama2/tokenizer.json data/raw/tokenizers/llama2/tokenizer_config.json "$work/llama-small/"
fi
if [ ! -f "$work/llama3-small/config.json" ]; then
  rm -rf "$work/llama3-small" && cp -r "$work/llama-small" "$work/llama3-small"
  python3 - "$work/llama3-small/config.json" <<'PY'
import json, sys
path = sys.argv[1]
c = json.load(open(path))
c["rope_scaling"] = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 64}
json.dump(c, open(path, "w"), indent=2)
PY
fi
if [ ! -f "$work/qwen2-small/config.json" ]; then
  "$tessera" synth model --preset qwen2.5-0.5b --layers 4 --dim 512 --heads 8 --kv-heads 2 --mlp-hidden 1024 \
    --vocab 151669 --dtype fp32 --out "$work/qwen2-small" >&2
  cp data/raw/tokenizers/qwen3/tokenizer.json data/raw/tokenizers/qwen3/tokenizer_config.json "$work/qwen2-small/"
  python3 - "$work/qwen2-small/model.safetensors" <<'PY'
import json, random, struct, sys
random.seed(7)
with open(sys.argv[1], "r+b") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    header = json.loads(f.read(n))
    for name, t in header.items():
        if name.endswith(("q_proj.bias", "k_proj.bias", "v_proj.bias")):
            begin, end = t["data_offsets"]
            f.seek(8 + n + begin)
            f.write(struct.pack("<%df" % ((end - begin) // 4), *[random.uniform(-1, 1) for _ in range((end - begin) // 4)]))
PY
fi
prompts=("The jury said" "Once upon a time, in a land far away" "def f(x):" "1, 2, 3, 4," "Ünïcödé café")
status=0
for model in gpt2 llama-small llama3-small qwen2-small; do
  f=$work/$model-greedy-f32.gguf
  "$tessera" quantize --weights "$work/$model" --out "$f" --dtype f32 >&2
  same=0
  for p in "${prompts[@]}"; do
    ours=$("$tessera" sample --weights "$f" --prompt "$p" --tokens "$tokens" --temperature 0 2>/dev/null)
    theirs=$("$LLAMA_COMPLETION" -m "$f" -p "$p" -n "$tokens" --temp 0 -t 2 -no-cnv --simple-io 2>/dev/null </dev/null)
    # llama-completion prints a SentencePiece prompt with the space its
    # normalizer prepends; the continuations are compared as text.
    theirs=${theirs# }
    ids_ours=$(printf '%s' "$p" | "$tessera" tokenize --tokenizer "$f" 2>/dev/null | tr -d ' ' || true)
    ids_theirs=$("$LLAMA_TOKENIZE" -m "$f" -p "$p" --ids --log-disable 2>/dev/null | tail -1 | tr -d ' ')
    [ "$ids_ours" = "$ids_theirs" ] || { status=1; echo "$model: prompt ids differ for $p"; }
    if [ "$ours" = "$theirs" ]; then
      same=$((same + 1))
    elif [ -n "$theirs" ] && [ "${ours#"$theirs"}" != "$ours" ]; then
      # llama-completion sometimes prints one token fewer than -n asks.
      same=$((same + 1))
      echo "$model: identical as far as llama.cpp printed for '$p' (it printed ${#theirs} bytes, Tessera ${#ours})"
    else
      status=1
      printf '%s: differs for %q\n  tessera:   %q\n  llama.cpp: %q\n' "$model" "$p" "$ours" "$theirs"
    fi
    printf '%s: %q ids: tessera %s, llama.cpp %s\n' "$model" "$p" "$ids_ours" "$ids_theirs"
  done
  echo "$model: $same of ${#prompts[@]} greedy continuations ($tokens tokens) identical"
done
exit $status
