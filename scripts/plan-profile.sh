#!/usr/bin/env bash
# A machine profile (docs/formats/profile.md, schema tessera.profile v1) from
# `tessera bench gemm` and the STREAM triad of `tessera bench decode`, for
# calibrating `tessera plan` where `tessera doctor --save` is not available.
# Usage: scripts/plan-profile.sh TESSERA OUT.json [ITERS [TESSERA_BENCH]]
# With the Google-benchmark binary (default: bench/tessera_bench beside
# TESSERA) it also records GEMMs at GPT training shapes (BM_MatmulShape).
set -euo pipefail
tessera=$1; out=$2; iters=${3:-10}; kbench=${4:-$(dirname "$tessera")/bench/tessera_bench}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
# One thread (machine.figure_threads = 1, a field of this script's): on a shared machine 2-thread OpenMP
# figures measure the other jobs' load more than the machine.
export OMP_NUM_THREADS=1
for dt in fp32 bf16; do
  "$tessera" bench gemm --dtype $dt --sizes 64 128 256 512 1024 2048 --iters "$iters" >"$tmp/gemm_$dt.jsonl" 2>/dev/null
done
if [ -x "$kbench" ]; then
  "$kbench" --benchmark_filter=BM_MatmulShape --benchmark_min_time=0.1 --benchmark_format=json >"$tmp/shapes.json" 2>/dev/null || true
fi
# Collectives between 2 one-thread ranks of this host (comm_ranks 2, comm_hosts 1).
"$tessera" launch -n 2 --threads 1 -- bench allreduce -b 8 -e 64M -f 8 -n 20 -w 3 -c 1 --json >"$tmp/ar.jsonl" 2>/dev/null || true
"$tessera" bench decode --layers 2 --heads 2 --dim 64 --vocab 256 --context 64 --prompt 8 --tokens 4 --batch 1 \
  >/dev/null 2>"$tmp/decode.err" || true
triad=$(sed -n 's/.*triad bandwidth \([0-9.]*\) GB\/s.*/\1/p' "$tmp/decode.err" | head -1)
python3 - "$tmp" "$out" "${triad:-0}" "$("$tessera" --version 2>/dev/null || echo unknown)" <<'PY'
import json, os, socket, sys, time, platform
tmp, out, triad, version = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
figs = []
for dt in ("fp32", "bf16"):
    peak = 0
    for line in open(f"{tmp}/gemm_{dt}.jsonl"):
        r = json.loads(line)
        if "m" in r:
            figs.append({"name": f"cpu.gemm.{dt}.{r['m']}x{r['n']}x{r['k']}", "value": r["gflops"], "unit": "GFLOP/s", "better": "higher"})
        elif "peak_gflops" in r:
            peak = r["peak_gflops"]
    figs.append({"name": f"cpu.gemm.{dt}.peak", "value": peak, "unit": "GFLOP/s", "better": "higher"})
if os.path.exists(f"{tmp}/shapes.json") and os.path.getsize(f"{tmp}/shapes.json") > 0:
    for b in json.load(open(f"{tmp}/shapes.json")).get("benchmarks", []):
        m, n, k = b["name"].split("/")[1:4]
        figs.append({"name": f"cpu.gemm.fp32.{m}x{n}x{k}", "value": round(b["FLOP/s"] / 1e9, 1), "unit": "GFLOP/s", "better": "higher"})
if triad > 0:
    figs.append({"name": "cpu.mem.triad", "value": triad, "unit": "GB/s", "better": "higher"})
comm = 0
if os.path.exists(f"{tmp}/ar.jsonl"):
    for line in open(f"{tmp}/ar.jsonl"):
        try:
            r = json.loads(line)
        except ValueError:
            continue
        if "size" in r:
            comm = 2
            figs.append({"name": f"comm.allreduce.busbw.{r['size']}", "value": r["busbw"], "unit": "GB/s", "better": "higher"})
            figs.append({"name": f"comm.allreduce.time_us.{r['size']}", "value": r["time_us"], "unit": "us", "better": "lower"})
model = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
prof = {"schema": "tessera.profile", "version": 1, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "tessera": version, "quick": True,
        "machine": {"hostname": socket.gethostname(), "cpu_model": model, "cores": os.cpu_count(), "threads": os.cpu_count(), "figure_threads": 1,
                    "sockets": 1, "memory_bytes": mem, "comm_ranks": comm, "comm_hosts": 1 if comm else 0, "os": platform.platform(), "device": None,
                    "load_average": os.getloadavg()[0]},
        "figures": figs}
json.dump(prof, open(out, "w"), indent=1)
PY
echo "wrote $out (load average $(cut -d' ' -f1 /proc/loadavg))"
