#!/usr/bin/env bash
# Issue #29 end to end: `tessera prepare` with the Qwen3 tokenizer.json
# writes version-2 shards (32-bit ids: the vocabulary is 151,669), each
# document after <|endoftext|>; `tessera train` trains a GPT with that
# vocabulary on them (the first loss is ln V, as for random weights); and
# `tessera sample` with the same tokenizer writes text after the prompt.
# The Llama 2 tokenizer (32,000 ids) still writes llm.c's version 1.
set -euo pipefail
tessera=$1; tests=$2
root=$(cd "$tests/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
toks="$root/data/raw/tokenizers"
[ -f "$toks/qwen3/tokenizer.json" ] || { echo "FAIL no $toks: run scripts/fetch-data.sh"; exit 1; }
inputs=(/usr/share/common-licenses/GPL-3 /usr/share/common-licenses/Apache-2.0)
"$tessera" prepare --input "${inputs[@]}" --tokenizer "$toks/qwen3" --out "$tmp/q" --val-fraction 0 >/dev/null
"$tessera" prepare --input "${inputs[@]}" --tokenizer "$toks/llama2" --out "$tmp/l" --val-fraction 0 >/dev/null
python3 - "$tmp/q/train_000000.bin" "$tmp/l/train_000000.bin" <<'PY'
import struct, sys
for path, version, width, eot in ((sys.argv[1], 2, 4, 151643), (sys.argv[2], 1, 2, 1)):
    data = open(path, "rb").read()
    magic, v, n = struct.unpack("<3i", data[:12])
    assert (magic, v) == (20240520, version), (path, magic, v)
    assert len(data) == 1024 + width * n, (path, len(data), n)
    ids = struct.unpack(f"<{n}{'I' if width == 4 else 'H'}", data[1024:])
    assert ids[0] == eot and ids.count(eot) >= 2, (path, ids[:4], ids.count(eot))
    print(f"ok   {path.split('/')[-2]}: version {v}, {n} tokens, {ids.count(eot)} documents after id {eot}, max id {max(ids)}")
PY
cat >"$tmp/cfg.toml" <<TOML
[model]
layers = 1
heads = 2
dim = 16
vocab = 151669
context = 32
[data]
train = "$tmp/q/train_*.bin"
[train]
micro_batch = 2
seq = 32
steps = 3
eval_every = 0
[checkpoint]
dir = "$tmp/run"
TOML
OMP_NUM_THREADS=2 timeout 120 "$tessera" train --config "$tmp/cfg.toml" >"$tmp/train.log" 2>&1 || { cat "$tmp/train.log"; exit 1; }
loss=$(sed -n 's/^step *1\/3 | loss \([0-9.]*\).*/\1/p' "$tmp/train.log")
python3 -c "import math,sys; l=float(sys.argv[1]); v=math.log(151669); sys.exit(0 if abs(l-v)<0.1 else 'first loss %s, ln V %.4f' % (l, v))" "$loss"
echo "ok   trained a GPT with a 151,669-token vocabulary on them: first loss $loss (ln V = 11.93)"
out=$(timeout 60 "$tessera" sample --weights "$tmp/run/model.safetensors" --tokenizer "$toks/qwen3" --prompt "Hello 日本" \
        --tokens 8 2>/dev/null)
case "$out" in "Hello 日本"?*) ;; *) echo "FAIL sample: '$out'"; exit 1 ;; esac
echo "ok   sample with the Qwen3 tokenizer: '${out:0:60}'"
