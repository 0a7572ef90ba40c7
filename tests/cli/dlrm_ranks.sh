#!/usr/bin/env bash
# tessera train with model.kind = "dlrm" over ranks (docs/dlrm.md,
# "Sharding"): the tables model-parallel (table-wise and row-wise), the MLPs
# data-parallel. Every step's loss at 2 and 3 ranks equals one process's
# within 1e-5 relative, and a checkpoint written at 2 ranks (row-wise) resumes
# at 1 and at 3 ranks (resharded by rows) on the same losses.
set -euo pipefail
tessera=$1
export OMP_NUM_THREADS=1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
mpirun_np() { local n=$1; shift; timeout 120 mpirun --allow-run-as-root --oversubscribe --bind-to none -np "$n" -x OMP_NUM_THREADS=1 "$@"; }

"$tessera" synth clicks --rows 6000 --tables 5 --cardinality 40 --crosses 0 --out c.tsv >/dev/null
"$tessera" prepare --format criteo --tables 5 --hash-size 300 --input c.tsv --out s >/dev/null
cat >cfg.toml <<'EOF'
[model]
kind = "dlrm"
embedding_dim = 8
bottom = [16, 8]
top = [16]

[data]
train = "s/train.bin"
val = "s/val.bin"

[train]
batch = 67          # not a multiple of 2 or 3: uneven slices
steps = 20
seed = 5

[checkpoint]
every = 10

[log]
every = 1
EOF

# run NAME RANKS [--set ...]: trains into run-NAME, metrics NAME.jsonl.
run() {
  local name=$1 np=$2; shift 2
  local cmd=("$tessera" train --config cfg.toml --set "checkpoint.dir=run-$name" --set "log.metrics=$name.jsonl" "$@")
  if [ "$np" = 1 ]; then "${cmd[@]}" >"$name.log" 2>&1 || { cat "$name.log"; exit 1; }
  else mpirun_np "$np" "${cmd[@]}" >"$name.log" 2>&1 || { cat "$name.log"; exit 1; }; fi
}
run one 1
run table2 2 --set parallel.placement=table
run row3 3 --set parallel.placement=row
# Row-wise at 2 ranks, stopped after step 10 (its checkpoint), then resumed
# from that checkpoint at 1 and at 3 ranks.
run half2 2 --set parallel.placement=row --set train.stop_at=10
cp -r run-half2 run-res1 && cp -r run-half2 run-res3
rm -f run-res1/LOCK run-res3/LOCK
run res1 1 --resume latest
run res3 3 --set parallel.placement=auto --resume latest
grep -q "resumed from .*step-00000010.* at step 10" res3.log || { cat res3.log; exit 1; }

python3 - <<'EOF'
import json
def losses(name):
    return {r["step"]: r["loss"] for r in map(json.loads, open(f"{name}.jsonl")) if "loss" in r}
ref = losses("one")
assert sorted(ref) == list(range(1, 21)), sorted(ref)
def same(name, steps):
    got = losses(name)
    assert sorted(got) == list(steps), (name, sorted(got))
    for s in steps:
        rel = abs(got[s] - ref[s]) / abs(ref[s])
        assert rel < 1e-5, (name, s, got[s], ref[s], rel)
same("table2", range(1, 21))
same("row3", range(1, 21))
same("half2", range(1, 11))
same("res1", range(11, 21))
same("res3", range(11, 21))
auc = lambda n: [r["val_auc"] for r in map(json.loads, open(f"{n}.jsonl")) if "val_auc" in r][-1]
for n in ("table2", "row3", "res1", "res3"):
    assert abs(auc(n) - auc("one")) < 1e-4, (n, auc(n), auc("one"))
print("dlrm over ranks: losses of 2 and 3 ranks and of resumes at 1 and 3 ranks equal one process's")
EOF
