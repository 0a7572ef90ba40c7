#!/usr/bin/env bash
# tessera train --trace DIR and tessera trace merge: a dp=2 x pp=2 job (4
# ranks) writes one valid trace-event file per rank with every span the
# timeline promises (forward and backward per layer, each gradient bucket's
# all-reduce, pipeline sends and receives, the optimizer, checkpoint staging
# and writing, evaluation; all with the step); the merged file has every
# rank on rank 0's clock and each pipeline send before its matching
# receive ends. Bad input: an unwritable trace folder is refused before
# training, and merge names a missing folder, an empty one and a corrupt file.
set -euo pipefail
tessera=$1; tests=$2
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
source "$tests/cli/dp_common.inc"  # $tmp/cfg.toml: 2 layers, dim 32, seq 32; mpirun_np
status=0
t0=$(date +%s)
pass() { echo "ok   $1 [$(( $(date +%s) - t0 )) s]"; }
flunk() { echo "FAIL $1"; status=1; }

# Two micro-batches per step through the two stages, a checkpoint at step 2,
# evaluation at the start and the end; several buckets (bucket_mb 0.05).
if mpirun_np 4 "$tessera" train --config "$tmp/cfg.toml" --set parallel.dp=2 --set parallel.pp=2 \
    --set train.micro_batch=2 --set train.grad_accum=2 --set train.steps=3 --set checkpoint.every=2 \
    --set "checkpoint.dir=$tmp/run" --trace "$tmp/trace" >"$tmp/train.log" 2>&1; then
  pass "a dp=2 x pp=2 run with --trace"
else
  cat "$tmp/train.log"; flunk "a dp=2 x pp=2 run with --trace"
fi
grep -q "trace: wrote $tmp/trace/trace-rank-0.json" "$tmp/train.log" || flunk "rank 0 names the trace it wrote"

if "$tessera" trace merge "$tmp/trace" --out "$tmp/merged.json" >"$tmp/merge.log" 2>&1 &&
   grep -q "merged 4 rank(s) (0,1,2,3)" "$tmp/merge.log"; then
  pass "tessera trace merge: $(cat "$tmp/merge.log")"
else
  cat "$tmp/merge.log"; flunk "tessera trace merge"
fi

python3 - "$tmp/trace" "$tmp/merged.json" <<'PY' || status=1
import json, sys, collections
trace_dir, merged_path = sys.argv[1], sys.argv[2]
bad = 0
def fail(msg):
    global bad
    print("FAIL " + msg); bad = 1

# Every rank: its own valid file, its spans, the step on each.
want_all = ["step", "forward", "backward", "forward layer", "backward layer", "optimizer", "evaluate",
            "checkpoint stage", "checkpoint write", "allreduce post", "allreduce wait", "pipeline flush"]
want_stage = {0: ["send act", "recv grad", "forward embedding", "backward embedding"],
              1: ["recv act", "send grad", "forward head", "backward head"]}
for rank in range(4):
    path = f"{trace_dir}/trace-rank-{rank}.json"
    with open(path) as f:
        j = json.load(f)  # a ValueError fails the test
    meta = j["otherData"]["tessera"]
    if meta["rank"] != rank: fail(f"{path}: rank {meta['rank']}")
    events = j["traceEvents"]
    names = collections.Counter(e["name"] for e in events if e["ph"] == "X")
    stage = meta["pp"]
    for n in want_all + want_stage[stage]:
        if names[n] == 0: fail(f"rank {rank} (pp{stage}): no '{n}' span")
    # Forward and backward per layer: stage s holds layer s; 3 steps x 2
    # micro-batches, plus the evaluation forwards.
    layers = {e["args"]["layer"] for e in events if e["name"] in ("forward layer", "backward layer")}
    if layers != {stage}: fail(f"rank {rank}: layers {layers}, want {{{stage}}}")
    if names["backward layer"] != 6: fail(f"rank {rank}: {names['backward layer']} backward layer spans, want 6")
    async_b = [e for e in events if e["ph"] == "b" and e["name"] == "allreduce bucket"]
    async_e = {e["id"] for e in events if e["ph"] == "e" and e["name"] == "allreduce bucket"}
    if not async_b or any(e["id"] not in async_e for e in async_b):
        fail(f"rank {rank}: bucket all-reduces not all begun and ended ({len(async_b)} begun)")
    steps = {e["args"]["step"] for e in events if e["ph"] == "X"} if all(
        "step" in e.get("args", {}) for e in events if e["ph"] == "X") else None
    if steps is None: fail(f"rank {rank}: a span without its step")
    elif not {0, 1, 2, 3} <= steps: fail(f"rank {rank}: steps {sorted(steps)}, want 0 (evaluation) to 3")
    procs = [e for e in events if e["ph"] == "M" and e["name"] == "process_name"]
    if not procs or not procs[0]["args"]["name"].startswith(f"rank {rank} (dp"):
        fail(f"rank {rank}: process_name {procs}")
    threads = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    if "training" not in threads or "checkpoint writer" not in threads:
        fail(f"rank {rank}: thread names {threads}")
    if "clock_offset_us" not in meta or "clock_error_us" not in meta: fail(f"rank {rank}: no clock offset")
if not bad: print("ok   every rank's file is valid trace-event JSON with every span and the step")

# The merged file: all ranks, one clock; each send before its receive ends.
with open(merged_path) as f:
    m = json.load(f)
ev = m["traceEvents"]
pids = {e["pid"] for e in ev if e["ph"] != "M"}
if pids != {0, 1, 2, 3}: fail(f"merged: pids {pids}")
ts = [e["ts"] for e in ev if e["ph"] != "M"]
if ts != sorted(ts) or min(ts) != 0: fail("merged: events not in time order from 0")
sends = {e["args"]["msg"]: e for e in ev if e["ph"] == "X" and e["name"] in ("send act", "send grad")}
recvs = {e["args"]["msg"]: e for e in ev if e["ph"] == "X" and e["name"] in ("recv act", "recv grad")}
if set(sends) != set(recvs) or len(sends) == 0:
    fail(f"merged: {len(sends)} sends, {len(recvs)} receives, {len(set(sends) ^ set(recvs))} unmatched")
kinds = collections.Counter()
for msg, s in sends.items():
    r = recvs.get(msg)
    if r is None: continue
    kinds[s["name"]] += 1
    if s["pid"] == r["pid"]: fail(f"merged: send and receive of {msg} on one rank")
    if s["ts"] > r["ts"] + r["dur"]:
        fail(f"merged: {s['name']} rank {s['pid']} at {s['ts']} after its receive on rank {r['pid']} ended "
             f"({r['ts']} + {r['dur']})")
flows_s = {e["id"] for e in ev if e["ph"] == "s"}
flows_f = {e["id"] for e in ev if e["ph"] == "f"}
if flows_s != flows_f or len(flows_s) != len(sends): fail("merged: flow arrows do not pair up")
# 3 steps x 2 micro-batches x 2 pipelines, each way; evaluation: 2 batches
# over 2 replicas, twice.
if kinds["send act"] != 12 + 4 or kinds["send grad"] != 12: fail(f"merged: messages {dict(kinds)}")
if not bad:
    print(f"ok   merged: 4 ranks on one clock, {len(sends)} sends each before its receive ends "
          f"(clock error <= {m['otherData']['tessera']['max_clock_error_us']} us)")
sys.exit(bad)
PY

# The ping-pong estimate (used for ranks on other hosts), forced on ranks
# that share rank 0's clock: the true offset is 0, so the estimate must be
# within its own error bound of 0.
if TESSERA_TRACE_PING=1 mpirun_np 2 -x TESSERA_TRACE_PING "$tessera" train --config "$tmp/cfg.toml" \
    --set parallel.dp=2 --set train.steps=2 --set "checkpoint.dir=$tmp/run3" --trace "$tmp/ping" >"$tmp/ping.log" 2>&1 &&
   python3 - "$tmp/ping/trace-rank-1.json" <<'PY'; then
import json, sys
m = json.load(open(sys.argv[1]))["otherData"]["tessera"]
ok = m["clock_source"] == "ping-pong with rank 0" and abs(m["clock_offset_us"]) <= m["clock_error_us"] + 1e-3
print(f"{'ok  ' if ok else 'FAIL'} ping-pong on one host: offset {m['clock_offset_us']} us, "
      f"error bound {m['clock_error_us']} us (round trip {m['clock_rtt_us']} us)")
sys.exit(0 if ok else 1)
PY
  :
else
  cat "$tmp/ping.log"; flunk "the forced ping-pong estimate"
fi

# Bad input: one line each, before training.
if mpirun_np 2 "$tessera" train --config "$tmp/cfg.toml" --set parallel.dp=2 --set "checkpoint.dir=$tmp/run2" \
    --trace /proc/tessera-trace >"$tmp/bad.out" 2>"$tmp/bad.err"; then
  flunk "an unwritable --trace folder was accepted"
elif [ "$(grep -c 'tessera: error:' "$tmp/bad.err")" = 1 ] && grep -q 'log.trace (--trace)' "$tmp/bad.err" &&
     ! grep -q '^step' "$tmp/bad.out"; then
  pass "an unwritable --trace folder: $(grep 'tessera: error:' "$tmp/bad.err")"
else
  cat "$tmp/bad.out" "$tmp/bad.err"; flunk "an unwritable --trace folder: not one error line before training"
fi
merge_refuses() {  # NAME DIR WANT: merge fails with exit 1 and one line containing WANT
  local rc=0
  "$tessera" trace merge "$2" --out "$tmp/m.json" >"$tmp/m.out" 2>"$tmp/m.err" || rc=$?
  if [ $rc = 1 ] && [ "$(wc -l <"$tmp/m.err")" = 1 ] && grep -qF -- "$3" "$tmp/m.err"; then pass "merge, $1: $(cat "$tmp/m.err")"
  else cat "$tmp/m.err"; flunk "merge, $1: exit $rc"; fi
}
merge_refuses "a missing folder" "$tmp/nope" "$tmp/nope"
mkdir "$tmp/empty"
merge_refuses "a folder without traces" "$tmp/empty" "no trace-rank-*.json"
cp -r "$tmp/trace" "$tmp/corrupt"
head -c 300 "$tmp/trace/trace-rank-2.json" >"$tmp/corrupt/trace-rank-2.json"
merge_refuses "a truncated file" "$tmp/corrupt" "trace-rank-2.json"
exit $status
