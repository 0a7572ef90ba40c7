#!/usr/bin/env bash
# The README's main job: set up (packages, GPT-2 vocabulary, Brown corpus,
# build the tessera program), tokenize the Brown corpus with GPT-2 BPE,
# train configs/brown.toml (a small GPT-2) data-parallel on 2 local ranks under
# mpirun, then print the validation loss before and after and a sample from
# the trained model. Each rank takes half of the config's global batch
# (micro_batch 8 -> 4 per rank), so the training is the same as on one rank.
# Extra arguments go to `tessera train` (e.g. --set train.steps=50).
set -euo pipefail
cd "$(dirname "$0")/.."
# Only the program this job runs (build/main: no tests, benchmarks or CUDA
# kernels); scripts/test.sh builds everything into build/release.
bash scripts/setup.sh --main
tessera=build/main/tessera

"$tessera" info
"$tessera" prepare --input data/raw/brown --format brown --tokenizer gpt2 --out data/brown --val-fraction 0.1
"$tessera" launch -n 2 -- train --config configs/brown.toml --set parallel.dp=2 --set train.micro_batch=4 "$@"
echo "--- sample (prompt: \"The jury said\") ---"
"$tessera" sample --weights runs/brown/model.safetensors --prompt "The jury said" --tokens 60 --temperature 0.8 --top-k 40 --seed 1
echo
