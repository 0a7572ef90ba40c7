#!/usr/bin/env bash
# Decode and prefill of a TinyLlama-1.1B-shaped model (issue #30, "Measure";
# docs/performance.md, "TinyLlama-1.1B decode"): 22 layers, 2048 channels,
# 32 query and 4 key/value heads, SwiGLU 5632, vocabulary 32000, random
# weights, through the serving forward (paged KV cache) in fp32, bf16 and
# int8, at batch 1, 8 and 32, against the bandwidth limit (the bytes a step
# reads / measured triad).
#   bench/tinyllama_decode.sh [BATCHES=1,8,32] [PROMPT=64] [TOKENS=16]
set -euo pipefail
cd "$(dirname "$0")/.."
tessera=build/release/tessera
batches=${1:-1,8,32}
prompt=${2:-64}
tokens=${3:-16}
for dtype in fp32 bf16 int8; do
  "$tessera" bench decode --preset tinyllama-1.1b --dtype "$dtype" --batch "$batches" --prompt "$prompt" \
    --tokens "$tokens" 2>&1
done
