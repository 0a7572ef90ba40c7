#!/usr/bin/env bash
# `tessera eval` on the committed PyTorch reference gives PyTorch's loss.
set -euo pipefail
tessera=$1; tests=$2
ref=$tests/reference
out=$("$tessera" eval --weights "$ref/gpt2_tiny.safetensors" --tokens "$ref/eval.bin" --batch 4 --seq 16)
echo "$out"
ours=$(echo "$out" | sed -n 's/.*"loss": \([0-9.eE+-]*\).*/\1/p')
torch=$(tr -d '\n ' < "$ref/reference.json" | sed -n 's/.*"eval":{[^}]*"loss":\([0-9.eE+-]*\).*/\1/p')
tokens=$(echo "$out" | sed -n 's/.*"tokens": \([0-9]*\).*/\1/p')
echo "ours=$ours torch=$torch tokens=$tokens"
[ "$tokens" = 192 ] || { echo "expected 192 tokens (3 batches of 4x16)"; exit 1; }
# fp32 against fp32 with another summation order: 1e-5 relative.
awk -v a="$ours" -v b="$torch" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 1e-5 * b) }' \
  || { echo "loss $ours differs from PyTorch's $torch by more than 1e-5 relative"; exit 1; }
