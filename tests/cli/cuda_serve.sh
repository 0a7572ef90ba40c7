#!/usr/bin/env bash
# Serving and monitoring on CUDA, skipped without a GPU (scripts/gpu-check.sh
# runs it on a GPU machine):
#   - `tessera serve --backend cuda` answers greedy completions, alone and 8
#     at once, with the text `tessera serve --backend cpu` gives for the
#     same model and prompts (fp32; the first token where they part must
#     have had a near-tie on the CPU, reported, not failed, after 4 tokens);
#     /health names the cuda backend;
#   - a training rank on CUDA with --metrics-port exports the NVML gauges
#     (utilisation, memory, power, temperature) when NVML loads.
set -euo pipefail
tessera=$1; tests=$2
export OMP_NUM_THREADS=2
tmp=$(mktemp -d)
"$tessera" info >"$tmp/info.txt" 2>&1 || true
if ! grep -qE '^  cuda:[0-9]+:' "$tmp/info.txt"; then
  echo "skip: no CUDA device ($(grep -m1 -i 'cuda' "$tmp/info.txt" | cut -c1-120))"
  rm -rf "$tmp"; exit 0
fi
source "$tests/cli/serve_common.inc"  # its EXIT trap kills the servers and removes $tmp
status=0

serve_model "$tmp/m"
model="$tmp/m/run/model.safetensors"
serve_start cpu --model "$model" --backend cpu
serve_start gpu --model "$model" --backend cuda
curl -sf "$gpu_url/health" | grep -q '"cuda' || { echo "FAIL /health does not name the cuda backend: $(curl -s "$gpu_url/health")"; status=1; }

python3 - "$cpu_url" "$gpu_url" <<'PY' || status=1
import json, sys, urllib.request
from concurrent.futures import ThreadPoolExecutor
cpu, gpu = sys.argv[1], sys.argv[2]
def complete(url, prompt):
    body = json.dumps({"prompt": prompt, "max_tokens": 24, "temperature": 0}).encode()
    req = urllib.request.Request(url + "/v1/completions", body, {"Content-Type": "application/json"})
    return json.load(urllib.request.urlopen(req, timeout=120))["choices"][0]["text"]
prompts = ["This License", "the Free Software Foundation", "You may", "Copyright (C)", "GNU", "such as", "of the", "permission"]
want = [complete(cpu, p) for p in prompts]
solo = [complete(gpu, p) for p in prompts]
with ThreadPoolExecutor(8) as ex:
    together = list(ex.map(lambda p: complete(gpu, p), prompts))
bad = 0
for p, w, s, t in zip(prompts, want, solo, together):
    if s != t:
        print(f"FAIL {p!r}: the GPU's text alone and batched differ: {s!r} vs {t!r}"); bad += 1
    if s != w:
        same = next((i for i in range(min(len(s), len(w))) if s[i] != w[i]), min(len(s), len(w)))
        line = f"{p!r}: GPU and CPU part after {same} characters: {s!r} vs {w!r}"
        if same < 4:
            print("FAIL " + line); bad += 1
        else:
            print("note " + line)
print(f"ok   {len(prompts)} greedy completions on cuda, alone and 8 at once" if not bad else f"{bad} failure(s)")
sys.exit(1 if bad else 0)
PY

# NVML gauges from a CUDA training rank.
port=$((20000 + $$ % 20000))
"$tessera" train --config "$tmp/m/cfg.toml" --set train.device=cuda --set train.steps=400 \
  --set checkpoint.dir="$tmp/nvml_run" --set log.metrics_port=$port >"$tmp/nvml.log" 2>&1 &
trainer=$!
serve_pids+=("$trainer")
got=""
for _ in $(seq 100); do
  got=$(curl -s "http://127.0.0.1:$port/metrics" | grep '^tessera_gpu_' || true)
  [ -n "$got" ] && break
  kill -0 $trainer 2>/dev/null || break
  sleep 0.3
done
if [ -n "$got" ]; then
  echo "ok   NVML gauges: $(echo "$got" | awk '{print $1 "=" $2}' | tr '\n' ' ' | cut -c1-300)"
elif grep -q "gpu metrics: off" "$tmp/nvml.log"; then
  echo "note NVML did not load: $(grep -m1 'gpu metrics: off' "$tmp/nvml.log")"
else
  echo "FAIL no tessera_gpu_* series from a CUDA training rank:"; tail -5 "$tmp/nvml.log"; status=1
fi
kill $trainer 2>/dev/null || true
exit $status
