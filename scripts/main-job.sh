#!/usr/bin/env bash
# The README's main job: set up, tokenize a small English text this machine
# ships (Debian's license texts), train configs/tiny.toml for about a minute,
# and show the validation loss falling.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
tessera=build/release/tessera

"$tessera" info
# Debian ships these texts on every system (base-files); the project's own
# docs are the fallback.
inputs=()
for f in /usr/share/common-licenses/{GPL-3,GPL-2,LGPL-3,LGPL-2.1,Apache-2.0,MPL-2.0,Artistic,GFDL-1.3}; do
  [ -f "$f" ] && inputs+=("$f")
done
[ ${#inputs[@]} -ge 2 ] || inputs=(README.md docs)
"$tessera" prepare --input "${inputs[@]}" --tokenizer byte --out data/tiny --val-fraction 0.15
"$tessera" train --config configs/tiny.toml "$@"
"$tessera" eval --weights runs/tiny/model.safetensors --tokens data/tiny/val_000000.bin --batch 8 --seq 128
