#!/usr/bin/env bash
# tessera bench dlrm-ops (CPU) at a tiny size: one JSON object whose parts,
# the dot interaction's included, are positive times and rates.
set -euo pipefail
tessera=$1
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

"$tessera" bench dlrm-ops --tables 3 --rows 1000 --dim 16 --batch 64 --iters 1 \
  --bottom 32,16 --top 32 --json >"$tmp/out"
python3 - "$tmp/out" <<'PY'
import json, sys
j = json.loads(open(sys.argv[1]).read())
for k in ("lookup_ms", "mlp_ms", "step_ms", "interaction_ms", "interaction_gflops", "interaction_pct_of_peak"):
    assert j[k] > 0, (k, j)
print("ok:", j)
PY
