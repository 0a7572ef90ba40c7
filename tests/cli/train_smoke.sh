#!/usr/bin/env bash
# `tessera train` end to end on real text: validation loss falls, metrics
# and weights are written, eval and sample read the weights back; and the
# data errors a user hits first give one clear line.
set -euo pipefail
tessera=$1; tests=$2
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

# Real English text every Debian system has (base-files); fall back to the
# project's own docs.
inputs=()
for f in /usr/share/common-licenses/{GPL-3,GPL-2,LGPL-2.1,Apache-2.0,MPL-2.0}; do [ -f "$f" ] && inputs+=("$f"); done
[ ${#inputs[@]} -ge 2 ] || inputs=("$tests/../docs" "$tests/../README.md")
"$tessera" prepare --input "${inputs[@]}" --tokenizer byte --out "$tmp/data" --val-fraction 0.2

cat >"$tmp/cfg.toml" <<TOML
[model]
layers = 2
heads = 4
dim = 64
vocab = 256
context = 64
[data]
train = "$tmp/data/train_*.bin"
val = "$tmp/data/val_*.bin"
[train]
micro_batch = 8
seq = 64
steps = 80
lr = 3e-3
min_lr = 3e-4
warmup = 10
eval_every = 40
eval_batches = 8
[checkpoint]
dir = "$tmp/run"
[log]
metrics = "$tmp/run/metrics.jsonl"
TOML
out=$("$tessera" train --config "$tmp/cfg.toml")
echo "$out" | tail -4
line=$(echo "$out" | grep '^validation loss:')
first=$(echo "$line" | awk '{print $3}'); last=$(echo "$line" | awk '{print $5}')
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 1.0) }' || { echo "validation loss did not fall: $line"; exit 1; }
[ "$(grep -c '"loss"' "$tmp/run/metrics.jsonl")" -eq 80 ] || { echo "want 80 step records in metrics.jsonl"; exit 1; }
[ "$(grep -c '"val_loss"' "$tmp/run/metrics.jsonl")" -eq 3 ] || { echo "want 3 val_loss records"; exit 1; }
grep -q '"tokens_per_s"' "$tmp/run/metrics.jsonl"
"$tessera" eval --weights "$tmp/run/model.safetensors" --tokens "$tmp/data/val_000000.bin" --batch 4 --seq 64 --max-batches 4
"$tessera" sample --weights "$tmp/run/model.safetensors" --tokenizer byte --prompt "the " --tokens 16 --seed 3 >"$tmp/s1"
"$tessera" sample --weights "$tmp/run/model.safetensors" --tokenizer byte --prompt "the " --tokens 16 --seed 3 >"$tmp/s2"
cmp -s "$tmp/s1" "$tmp/s2" || { echo "same seed gave different text"; exit 1; }

# Vocabulary mismatch: ids up to 255 against a model with 100.
if "$tessera" train --config "$tmp/cfg.toml" --set model.vocab=100 2>"$tmp/err"; then echo "vocab mismatch accepted"; exit 1; fi
[ "$(wc -l <"$tmp/err")" -eq 1 ] && grep -q "does model.vocab match" "$tmp/err" || { cat "$tmp/err"; exit 1; }
# A shard with the wrong magic.
printf 'not a shard at all, not even close to 1024 bytes' >"$tmp/data/train_bad.bin"
if "$tessera" train --config "$tmp/cfg.toml" 2>"$tmp/err"; then echo "corrupt shard accepted"; exit 1; fi
[ "$(wc -l <"$tmp/err")" -eq 1 ] && grep -q "train_bad.bin" "$tmp/err" || { cat "$tmp/err"; exit 1; }
echo "train smoke test passed"
