#!/usr/bin/env bash
# `tessera doctor`: a --quick run (with TESSERA_DOCTOR_TINY=1: the smallest
# sizes, still real measurements) saves a profile that matches its schema
# (docs/formats/profile.md); the same profile as its own baseline passes; a
# baseline with one figure inflated is REGRESSED with exit 1 and a line naming
# it (measured and --compare); bad baselines, tolerance and --dir are one
# error line each; under mpirun with 2 ranks the communication figures appear.
set -uo pipefail
tessera=$1
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
failures=0
fail() { echo "FAIL $*"; failures=$((failures+1)); }
ok() { echo "ok   $*"; }
export TESSERA_DOCTOR_TINY=1 OMP_NUM_THREADS=2

# --- A measured run, saved.
if timeout 300 "$tessera" doctor --quick --save "$tmp/p.json" --dir "$tmp" >"$tmp/run.out" 2>"$tmp/run.err"; then
  ok "doctor --quick exits 0"
else
  fail "doctor --quick: exit $?"; cat "$tmp/run.out" "$tmp/run.err"
fi
[ -n "$(grep -E '^cpu\.mem\.triad +[0-9.]+ +GB/s' "$tmp/run.out")" ] || { fail "no triad row in the table"; cat "$tmp/run.out"; }
[ -n "$(grep -E '^# theoretical peak: fp32 [0-9.]+ GFLOP/s' "$tmp/run.out")" ] || fail "no theoretical peak line"
[ -n "$(grep -E '^cpu\.gemm\.fp32\.peak .*% of theoretical' "$tmp/run.out")" ] || fail "no gemm efficiency note"
if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
  [ -n "$(grep -E '^doctor: skipped gpu checks: no CUDA device' "$tmp/run.err")" ] || { fail "no 'skipped gpu checks: no CUDA device' line"; cat "$tmp/run.err"; }
fi

# --- The profile against its schema (stdlib only).
if python3 - "$tmp/p.json" >"$tmp/schema.out" 2>&1 <<'PY'
import json, re, sys
p = json.load(open(sys.argv[1]))
def need(obj, key, types, where=""):
    assert key in obj, f"{where}{key}: missing"
    assert isinstance(obj[key], types) and not (isinstance(obj[key], bool) and bool not in (types if isinstance(types, tuple) else (types,))), f"{where}{key}: {type(obj[key]).__name__}"
    return obj[key]
num = (int, float)
assert need(p, "schema", str) == "tessera.profile"
assert need(p, "version", int) == 1
assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", need(p, "created", str))
need(p, "tessera", str); assert need(p, "quick", bool) is True
m = need(p, "machine", dict)
for k, t in [("hostname", str), ("cpu_model", str), ("cores", int), ("threads", int), ("sockets", int),
             ("isa", list), ("clock_ghz", num), ("memory_bytes", int), ("os", str), ("onednn", str), ("mpi", str),
             ("theoretical_peak_gflops", dict)]:
    need(m, k, t, "machine.")
assert m["cores"] >= 1 and m["threads"] >= m["cores"] and m["memory_bytes"] > 0
assert all(isinstance(x, str) for x in m["isa"])
for d in ("fp32", "bf16", "int8"):
    assert need(m["theoretical_peak_gflops"], d, num) >= 0
assert "device" in m and (m["device"] is None or isinstance(m["device"], dict))
units = [(r"cpu\.gemm\.(fp32|bf16)\.(peak|\d+x\d+x\d+)", "GFLOP/s", "higher"),
         (r"cpu\.gemm\.int8\.(peak|\d+x\d+x\d+)", "GOP/s", "higher"),
         (r"cpu\.mem\.(triad|read)", "GB/s", "higher"), (r"cpu\.alloc\.(malloc_1mb_ns|page_fault_ns)", "ns", "lower"),
         (r"cpu\.threads\.\d+\.fp32", "GFLOP/s", "higher"), (r"disk\.write_fsync", "MB/s", "higher"),
         (r"comm\.(allreduce|reduce_scatter|all_gather)\.busbw\.\d+", "GB/s", "higher"),
         (r"comm\.(allreduce|reduce_scatter|all_gather)\.time_us\.\d+", "us", "lower"),
         (r"comm\.p2p\.\d+-\d+\.latency_us", "us", "lower"), (r"comm\.p2p\.\d+-\d+\.bandwidth", "GB/s", "higher"),
         (r"gpu\.(launch_latency_us|alloc_us)", "us", "lower"),
         (r"gpu\.(h2d|d2h)\.(pinned|pageable)|gpu\.mem\.bandwidth|gpu\.nccl\.allreduce\.busbw\.\d+", "GB/s", "higher"),
         (r"gpu\.gemm\.bf16\.peak", "GFLOP/s", "higher")]
names = set()
for i, f in enumerate(need(p, "figures", list)):
    w = f"figures[{i}]."
    name = need(f, "name", str, w); v = need(f, "value", num, w); u = need(f, "unit", str, w); b = need(f, "better", str, w)
    assert name not in names, f"{name} twice"; names.add(name)
    rule = [r for r in units if re.fullmatch(r[0], name)]
    assert rule, f"{name}: not a figure name of the schema"
    assert (u, b) == rule[0][1:], f"{name}: unit {u} better {b}, want {rule[0][1:]}"
    assert v > 0, f"{name}: {v} is not positive"
for want in ["cpu.gemm.fp32.peak", "cpu.gemm.fp32.128x128x128", "cpu.gemm.fp32.64x768x768", "cpu.mem.triad", "cpu.mem.read",
             "cpu.alloc.malloc_1mb_ns", "cpu.alloc.page_fault_ns", "cpu.threads.1.fp32",
             f"cpu.threads.{m['cores']}.fp32", "disk.write_fsync"]:
    assert want in names, f"{want} missing"
print(f"{len(names)} figures")
PY
then ok "profile matches the schema: $(cat "$tmp/schema.out")"
else fail "profile schema:"; cat "$tmp/schema.out"
fi

# --- Baselines. Inflate one figure 10x (a higher-is-better one).
python3 - "$tmp/p.json" "$tmp/inflated.json" "$tmp/unreachable.json" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
for f in p["figures"]:
    if f["name"] == "cpu.mem.triad": f["value"] *= 10
json.dump(p, open(sys.argv[2], "w"))
# For a fresh measurement: a triad no machine reaches (10x of a figure taken
# under load can be below an idle machine's).
for f in p["figures"]:
    if f["name"] == "cpu.mem.triad": f["value"] = 1e6
json.dump(p, open(sys.argv[3], "w"))
PY
"$tessera" doctor --compare "$tmp/p.json" --baseline "$tmp/p.json" >"$tmp/eq.out" 2>"$tmp/eq.err"
rc=$?
if [ $rc -eq 0 ] && [ -z "$(grep -E 'REGRESSED' "$tmp/eq.out" "$tmp/eq.err")" ] \
   && [ "$(grep -cE ' PASS *$' "$tmp/eq.out")" -eq "$(python3 -c "import json,sys; print(len(json.load(open(sys.argv[1]))['figures']))" "$tmp/p.json")" ]; then
  ok "equal baseline: every figure PASS, exit 0"
else
  fail "equal baseline: exit $rc"; cat "$tmp/eq.out" "$tmp/eq.err"
fi
"$tessera" doctor --compare "$tmp/p.json" --baseline "$tmp/inflated.json" --tolerance 10% >"$tmp/inf.out" 2>"$tmp/inf.err"
rc=$?
if [ $rc -eq 1 ] && [ "$(grep -c '^REGRESSED ' "$tmp/inf.err")" -eq 1 ] \
   && [ -n "$(grep -E '^REGRESSED cpu\.mem\.triad: [0-9.]+ GB/s, baseline [0-9.e+]+ \(-90%, tolerance 10%\)$' "$tmp/inf.err")" ] \
   && [ -n "$(grep -E '^cpu\.mem\.triad .* REGRESSED *$' "$tmp/inf.out")" ]; then
  ok "inflated baseline (--compare): exit 1, one REGRESSED line naming cpu.mem.triad"
else
  fail "inflated baseline (--compare): exit $rc"; cat "$tmp/inf.out" "$tmp/inf.err"
fi
# A fresh measurement against an unreachable baseline: the triad is named.
timeout 300 "$tessera" doctor --quick --baseline "$tmp/unreachable.json" --dir "$tmp" >"$tmp/m.out" 2>"$tmp/m.err"
rc=$?
if [ $rc -eq 1 ] && [ -n "$(grep -E '^REGRESSED cpu\.mem\.triad: ' "$tmp/m.err")" ]; then
  ok "measured run against an unreachable baseline: exit 1, cpu.mem.triad REGRESSED"
else
  fail "measured run against an unreachable baseline: exit $rc"; cat "$tmp/m.out" "$tmp/m.err"
fi

# --- Bad input: one error line each, before any measuring.
echo '{"schema": "tessera.profile", "version": 1' >"$tmp/trunc.json"
sed 's/"tessera.profile"/"something.else"/' "$tmp/p.json" >"$tmp/schema.json"
python3 -c "
import json,sys; p=json.load(open(sys.argv[1])); p['version']=7; json.dump(p,open(sys.argv[2],'w'))" "$tmp/p.json" "$tmp/version.json"
python3 -c "
import json,sys; p=json.load(open(sys.argv[1])); p['figures'][0]['value']='fast'; json.dump(p,open(sys.argv[2],'w'))" "$tmp/p.json" "$tmp/type.json"
check_bad() {  # name, want exit, want regex, args...
  local name=$1 want=$2 re=$3; shift 3
  timeout 30 "$tessera" doctor "$@" >"$tmp/bad.out" 2>"$tmp/bad.err"
  local rc=$?
  if [ $rc -eq "$want" ] && [ "$(wc -l <"$tmp/bad.err")" -eq 1 ] && [ -n "$(grep -E "^tessera: error: $re" "$tmp/bad.err")" ]; then
    ok "bad $name: exit $rc, one line"
  else
    fail "bad $name: exit $rc (want $want)"; cat "$tmp/bad.out" "$tmp/bad.err"
  fi
}
check_bad "missing baseline" 1 ".*/nope\.json: cannot read the profile" --baseline "$tmp/nope.json"
check_bad "truncated baseline" 1 ".*trunc\.json: not a tessera profile: not JSON" --baseline "$tmp/trunc.json"
check_bad "schema" 1 ".*schema\.json: not a tessera profile: schema is 'something.else'" --baseline "$tmp/schema.json"
check_bad "version" 1 ".*version\.json: not a tessera profile: profile version 7 is not supported" --baseline "$tmp/version.json"
check_bad "figure type" 1 ".*type\.json: not a tessera profile: figures\[0\]\.value: expected a number" --baseline "$tmp/type.json"
check_bad "tolerance" 2 "--tolerance: bad value 'lots'" --baseline "$tmp/p.json" --tolerance lots
check_bad "dir" 1 "--dir $tmp/no/such: not a writable directory" --dir "$tmp/no/such"
check_bad "compare" 1 ".*nothing\.json: cannot read the profile" --compare "$tmp/nothing.json"

# --- MFU against the profile (bench train --profile, the trainer's log.profile):
# MFU over the profile's theoretical peak, GEMM efficiency over its measured
# GEMM peak; without one, the theoretical peak and no GEMM efficiency.
tiny_model=(--layers 1 --heads 2 --dim 64 --vocab 256 --batch 2 --seq 32 --steps 2 --warmup 1)
if "$tessera" bench train "${tiny_model[@]}" --profile "$tmp/p.json" >"$tmp/bt.json" 2>"$tmp/bt.err" \
   && python3 - "$tmp/bt.json" "$tmp/p.json" <<'PY'
import json, sys
r = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
p = json.load(open(sys.argv[2]))
peak = p["machine"]["theoretical_peak_gflops"]["fp32"]
gemm = [f["value"] for f in p["figures"] if f["name"] == "cpu.gemm.fp32.peak"][0]
assert r["peak_source"] == "the profile's theoretical peak", r
assert abs(r["peak_gflops"] - peak) < 0.1, (r, peak)
assert abs(r["mfu"] - r["achieved_gflops"] / peak) < 1e-3, r
assert abs(r["gemm_efficiency"] - r["achieved_gflops"] / gemm) < 2e-3 * max(1, r["gemm_efficiency"]), (r, gemm)
PY
then ok "bench train --profile: mfu against the profile's theoretical peak, gemm_efficiency against its GEMM peak"
else fail "bench train --profile"; cat "$tmp/bt.json" "$tmp/bt.err"
fi
if "$tessera" bench train "${tiny_model[@]}" >"$tmp/bt0.json" 2>"$tmp/bt0.err" \
   && [ -n "$(grep -E '"gemm_efficiency": null, .*"peak_source": "theoretical: [0-9]+ cores x [0-9]+ FLOP/cycle' "$tmp/bt0.json")" ]; then
  ok "bench train without a profile: theoretical peak, no gemm efficiency"
else fail "bench train without a profile"; cat "$tmp/bt0.json" "$tmp/bt0.err"
fi
TESSERA_PROFILE="$tmp/trunc.json" "$tessera" bench train "${tiny_model[@]}" >/dev/null 2>"$tmp/bt1.err"
rc=$?
[ $rc -eq 1 ] && [ "$(wc -l <"$tmp/bt1.err")" -eq 1 ] && [ -n "$(grep -E '^tessera: error: .*trunc\.json: not a tessera profile' "$tmp/bt1.err")" ] \
  && ok "bench train with a bad \$TESSERA_PROFILE: one error line" || { fail "bench train bad profile: exit $rc"; cat "$tmp/bt1.err"; }
mkdir -p "$tmp/data"
python3 -c "
import struct, random, sys
random.seed(1)
toks = [random.randrange(256) for _ in range(20000)]
hdr = [20240520, 1, len(toks)] + [0] * 253
open(sys.argv[1], 'wb').write(struct.pack('<256i', *hdr) + struct.pack('<%dH' % len(toks), *toks))" "$tmp/data/train_000.bin"
cat >"$tmp/cfg.toml" <<TOML
[model]
layers = 1
heads = 2
dim = 32
vocab = 256
context = 32
[data]
train = "$tmp/data/train_*.bin"
[train]
micro_batch = 2
seq = 32
steps = 3
eval_every = 0
[checkpoint]
dir = "$tmp/run"
[log]
metrics = "$tmp/run/metrics.jsonl"
profile = "$tmp/p.json"
TOML
if "$tessera" train --config "$tmp/cfg.toml" >"$tmp/train.out" 2>&1 \
   && [ -n "$(grep -E '^mfu against [0-9]+ GFLOP/s/rank \(the profile.s theoretical peak\); gemm efficiency against' "$tmp/train.out")" ] \
   && [ -n "$(grep -E '\| mfu [0-9.]+ \(gemm [0-9.]+\) \|' "$tmp/train.out")" ] \
   && [ "$(grep -c '"gemm_efficiency"' "$tmp/run/metrics.jsonl")" -eq 3 ]; then
  ok "train with log.profile: mfu and gemm efficiency on the console and in the metrics file"
else fail "train with log.profile"; cat "$tmp/train.out"; cat "$tmp/run/metrics.jsonl" 2>/dev/null
fi

# --- Under mpirun with 2 ranks: the communication figures, rank 0 writes.
if timeout 300 mpirun --allow-run-as-root --oversubscribe -np 2 -x TESSERA_DOCTOR_TINY=1 -x OMP_NUM_THREADS=1 \
     "$tessera" doctor --quick --save "$tmp/mpi.json" --dir "$tmp" >"$tmp/mpi.out" 2>"$tmp/mpi.err"; then
  if python3 - "$tmp/mpi.json" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
names = {f["name"] for f in p["figures"]}
assert p["machine"]["comm_ranks"] == 2 and p["machine"]["comm_hosts"] == 1, p["machine"]
for want in ["comm.allreduce.busbw.1048576", "comm.reduce_scatter.busbw.1024", "comm.all_gather.time_us.1048576",
             "comm.p2p.0-1.latency_us", "comm.p2p.1-0.bandwidth", "cpu.mem.triad"]:
    assert want in names, want
PY
  then ok "mpirun -np 2: comm figures and comm_ranks in the profile"
  else fail "mpirun -np 2: profile"; cat "$tmp/mpi.json"
  fi
  [ "$(grep -c '^cpu\.mem\.triad ' "$tmp/mpi.out")" -eq 1 ] || fail "mpirun -np 2: want one table (rank 0's)"
else
  fail "mpirun -np 2: exit $?"; cat "$tmp/mpi.out" "$tmp/mpi.err"
fi

[ "$failures" -eq 0 ] || { echo "$failures failure(s)"; exit 1; }
echo "all ok"
