#!/usr/bin/env bash
# Failover measurements of hybrid serving (docs/performance.md "Failover"):
# the drill of tests/cli/route_drill.py, longer, on a real model: a primary
# fp32 worker and an INT8 CPU worker behind `tessera route`, a steady load,
# then SIGKILL, SIGSTOP, 500s and a device error on the primary in turn.
# Prints, per fault: time from the fault to the switch and to the first
# request answered by the cpu tier, the failback time after healing, the
# requests retried, and p50/p99 latency before, during and after.
#   bench/failover_drill.sh [MODEL.safetensors] [OUT.json]
# MODEL: default the main job's runs/brown/model.safetensors.
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:-runs/brown/model.safetensors}
out=${2:-}
[ -f "$model" ] || { echo "failover_drill: no model at $model (run scripts/main-job.sh first)" >&2; exit 2; }
OMP_NUM_THREADS=1 python3 tests/cli/route_drill.py --tessera build/release/tessera --model "$model" \
  --gpu-args "--threads 1" --cpu-args "--dtype int8 --threads 1" --threads 4 --max-tokens 32 --phase 5 \
  --hold-down 2 ${out:+--json "$out"}
