#!/usr/bin/env bash
# Model-parallel DLRM (`tessera bench dlrm-parallel`) trains like one rank:
# 2 and 4 MPI ranks, table-wise, row-wise and planned placement, a global
# batch that does not split evenly (13), 10 steps: every step's loss and the
# final model (MLPs, every table, the Adagrad state) within 1e-5 relative of
# the 1-rank run. Then one clear error for a budget the tables cannot fit.
set -euo pipefail
tessera=$1
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
export OMP_NUM_THREADS=1
mpirun_np() { local n=$1; shift; timeout 120 mpirun --allow-run-as-root --oversubscribe --bind-to none -np "$n" -x OMP_NUM_THREADS=1 "$@"; }
flags=(--table-rows 40,7,90,25,11,60 --dim 8 --bottom 16,8 --top 16 --dense 5 --batch 13 --steps 10 --bag 2 --seed 3)

run() {  # run NAME NP PLACEMENT [flags...]
  local name=$1 np=$2 placement=$3; shift 3
  local cmd=("$tessera" bench dlrm-parallel "${flags[@]}" --placement "$placement" --dump "$tmp/$name.bin" "$@")
  if [ "$np" -eq 1 ]; then "${cmd[@]}" >"$tmp/$name.out" 2>"$tmp/$name.err" || { cat "$tmp/$name.err"; exit 1; }
  else mpirun_np "$np" "${cmd[@]}" >"$tmp/$name.out" 2>"$tmp/$name.err" || { cat "$tmp/$name.err"; exit 1; }; fi
}

# compare REF GOT: losses and dumps within 1e-5 relative (the dump as a whole,
# normalised: |got - ref| / |ref|).
compare() {
  python3 - "$tmp/$1" "$tmp/$2" <<'PY'
import array, json, math, sys
ref, got = sys.argv[1], sys.argv[2]
def losses(p):
    return [json.loads(l)["loss"] for l in open(p + ".out") if l.startswith('{"step"')]
lr, lg = losses(ref), losses(got)
assert len(lr) == 10 and len(lg) == 10, (len(lr), len(lg))
for i, (a, b) in enumerate(zip(lr, lg)):
    assert abs(a - b) <= 1e-5 * abs(a), f"step {i + 1}: loss {b} vs {a}"
def dump(p):
    a = array.array("f"); a.frombytes(open(p + ".bin", "rb").read()); return a
dr, dg = dump(ref), dump(got)
assert len(dr) == len(dg), (len(dr), len(dg))
num = math.sqrt(sum((x - y) ** 2 for x, y in zip(dr, dg))); den = math.sqrt(sum(x * x for x in dr))
assert num <= 1e-5 * den, f"model differs: normalised error {num / den:.3g}"
print(f"ok   {got.split('/')[-1]}: 10 losses and {len(dr)} floats match (normalised error {num / den:.2g})")
PY
}

run np1 1 table
for np in 2 4; do
  for placement in table row auto; do
    run "np${np}_$placement" "$np" "$placement"
    compare np1 "np${np}_$placement"
  done
done
grep -q '^# dlrm-parallel: 4 rank(s), placement row' "$tmp/np4_row.out" || { echo "no plan line"; cat "$tmp/np4_row.out"; exit 1; }
grep -q '"summary": "dlrm-parallel", "ranks": 4' "$tmp/np4_row.out" || { echo "no summary"; exit 1; }

# A budget (MiB) the tables cannot fit: one error line, exit 1.
set +e
mpirun_np 2 "$tessera" bench dlrm-parallel "${flags[@]}" --budget-mb 0.001 >"$tmp/budget.out" 2>"$tmp/budget.err"
rc=$?
set -e
if [ $rc -eq 0 ] || [ "$(grep -c 'tessera: error:' "$tmp/budget.err")" -ne 1 ] ||
   [ -z "$(grep 'tessera: error: dlrm placement: the tables need' "$tmp/budget.err")" ]; then
  echo "FAIL budget: want one error line, got exit $rc:"; cat "$tmp/budget.err"; exit 1
fi
echo "ok   budget too small: $(grep 'tessera: error' "$tmp/budget.err")"
echo "dlrm parallel: all cases passed"
