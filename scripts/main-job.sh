#!/usr/bin/env bash
# The README's main job: set up (packages, GPT-2 vocabulary, Brown corpus,
# build), tokenize the Brown corpus with GPT-2 BPE, train configs/brown.toml
# (a small GPT-2, about 3 minutes on 2 cores), then print the validation loss
# before and after and a sample from the trained model.
# Extra arguments go to `tessera train` (e.g. --set train.steps=50).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
tessera=build/release/tessera

"$tessera" info
"$tessera" prepare --input data/raw/brown --format brown --tokenizer gpt2 --out data/brown --val-fraction 0.1
"$tessera" train --config configs/brown.toml "$@"
echo "--- sample (prompt: \"The jury said\") ---"
"$tessera" sample --weights runs/brown/model.safetensors --prompt "The jury said" --tokens 60 --temperature 0.8 --top-k 40 --seed 1
echo
