#!/usr/bin/env bash
# Training on CUDA (train.device = "cuda"), skipped without a GPU:
#   1 GPU:   checkpoint every 5 steps, stop at 10, --resume: the 20 losses
#            are bitwise those of the uninterrupted run; ZeRO-1 at dp=1 vs
#            plain (within 1e-5); tp = 2 is refused with a clear error.
#   2+ GPUs and NCCL: dp=2 vs dp=1 with the same global batch, ZeRO-1 vs
#            plain at dp=2 (within 1e-5), and a bitwise resume at dp=2 with
#            ZeRO-1 (sharded moments saved from and loaded into the device).
# One GPU per rank: NCCL needs it, so 2 ranks never share one device here.
set -euo pipefail
tessera=$1; tests=$2
export OMP_NUM_THREADS=1
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
"$tessera" info >"$tmp/info.txt" 2>&1 || true
gpus=$(grep -cE '^  cuda:[0-9]+:' "$tmp/info.txt" || true)
if [ "${gpus:-0}" -eq 0 ]; then
  echo "skip: no CUDA device ($(grep -m1 -i 'cuda' "$tmp/info.txt" | cut -c1-120))"
  exit 0
fi
source "$tests/cli/dp_common.inc"
sed -i 's/^steps = 10/steps = 20/' "$tmp/cfg.toml"
sed -i 's/^\[train\]/[train]\ndevice = "cuda"/' "$tmp/cfg.toml"
status=0
fail() { echo "FAIL $*"; status=1; }
run() { local out=$1; shift; "$@" --set "log.metrics=$tmp/$out.jsonl" >"$tmp/$out.log" 2>&1 || { cat "$tmp/$out.log"; exit 1; }; }
# train NAME DP [args...]: 8 sequences a step whatever dp.
train() {
  local name=$1 dp=$2; shift 2
  local launcher=()
  [ "$dp" -gt 1 ] && launcher=(mpirun_np "$dp")
  run "$name" "${launcher[@]}" "$tessera" train --config "$tmp/cfg.toml" --set train.micro_batch=$((8 / dp)) \
    --set parallel.dp="$dp" "$@"
}
all_losses() { for f in "$@"; do losses "$tmp/$f.jsonl"; done; }
# close A B NAME: 20 losses within 1e-5 relative.
close() {
  paste <(losses "$tmp/$1.jsonl") <(losses "$tmp/$2.jsonl") | awk -v name="$3" '
    { n++; d = $1 - $2; if (d < 0) d = -d; r = d / ($1 < 0 ? -$1 : $1); if (r > worst) worst = r; if (r > 1e-5) bad = 1 }
    END { if (n != 20 || bad) { printf "FAIL %s: %d steps, worst relative difference %.2e\n", name, n, worst; exit 1 }
          printf "ok   %s: 20 steps within %.2e\n", name, worst }' || status=1
}
# resume TAG DP [args...]: 20 steps == 10 + --resume + 10, bitwise when the
# device trains bitwise repeatably (two uninterrupted runs agree; the
# embedding backward's atomicAdd may make them differ in the last bits),
# else within 1e-5. The resumed parameters are checked bitwise below.
resume() {
  local tag=$1 dp=$2; shift 2
  train "full_$tag" "$dp" --set "checkpoint.dir=$tmp/full_$tag" --set checkpoint.every=5 "$@"
  train "again_$tag" "$dp" --set "checkpoint.dir=$tmp/again_$tag" --set checkpoint.every=5 "$@"
  train "a_$tag" "$dp" --set "checkpoint.dir=$tmp/ck_$tag" --set checkpoint.every=5 --set train.stop_at=10 "$@"
  cp -r "$tmp/ck_$tag" "$tmp/rt_$tag"
  train "b_$tag" "$dp" --set "checkpoint.dir=$tmp/ck_$tag" --set checkpoint.every=5 --resume latest "$@"
  grep -q "resumed from .*step-00000010 at step 10" "$tmp/b_$tag.log" || fail "$tag: did not resume at step 10"
  all_losses "a_$tag" "b_$tag" >"$tmp/resumed_$tag.txt"
  if cmp -s <(all_losses "full_$tag") <(all_losses "again_$tag"); then
    if cmp -s <(all_losses "full_$tag") "$tmp/resumed_$tag.txt"; then echo "ok   bitwise resume $tag on CUDA"
    else fail "bitwise resume $tag on CUDA:"; paste <(all_losses "full_$tag") "$tmp/resumed_$tag.txt" | head -20; fi
  else
    echo "note $tag: two uninterrupted CUDA runs differ in the last bits; resume checked within 1e-5"
    grep -h '"loss"' "$tmp/a_$tag.jsonl" "$tmp/b_$tag.jsonl" >"$tmp/resumed_$tag.jsonl"
    close "full_$tag" "resumed_$tag" "resume $tag on CUDA"
  fi
  # Round trip: resumed at step 10 with nothing left to train, the final
  # weights (read from the device) are the checkpoint's, byte for byte.
  train "rt_$tag" "$dp" --set "checkpoint.dir=$tmp/rt_$tag" --set train.steps=10 --resume latest "$@"
  "$tessera" export "$tmp/rt_$tag" --out "$tmp/rt_export_$tag/model.safetensors" >"$tmp/rt_export_$tag.log" 2>&1 ||
    { cat "$tmp/rt_export_$tag.log"; fail "export of $tag"; }
  if cmp -s "$tmp/rt_$tag/model.safetensors" "$tmp/rt_export_$tag/model.safetensors"; then
    echo "ok   round trip $tag: checkpoint -> device -> model.safetensors is bitwise the checkpoint"
  else fail "round trip $tag: the resumed weights differ from the checkpoint's"; fi
}

# ---- one GPU -------------------------------------------------------------------
resume dp1 1
train dp1_zero 1 --set parallel.zero=1 --set "checkpoint.dir=$tmp/dp1_zero"
close full_dp1 dp1_zero "ZeRO-1 vs plain at dp=1 on CUDA"
if mpirun_np 2 "$tessera" train --config "$tmp/cfg.toml" --set parallel.tp=2 --set "checkpoint.dir=$tmp/tp2" \
     >"$tmp/tp2.log" 2>&1; then
  fail "tp=2 on CUDA was not refused"
elif grep -q 'supports data parallelism only' "$tmp/tp2.log"; then echo "ok   tp=2 on CUDA refused"
else fail "tp=2 on CUDA: unexpected error:"; cat "$tmp/tp2.log"; fi

# ---- two GPUs over NCCL ---------------------------------------------------------
if [ "$gpus" -lt 2 ] || ! grep -q '^nccl: [0-9]' "$tmp/info.txt"; then
  echo "skip: dp=2 on CUDA needs 2 GPUs and NCCL ($gpus GPU(s); $(grep -m1 '^nccl' "$tmp/info.txt"))"
  exit $status
fi
train dp2 2 --set "checkpoint.dir=$tmp/dp2"
train dp2_zero 2 --set parallel.zero=1 --set "checkpoint.dir=$tmp/dp2_zero"
close full_dp1 dp2 "dp=2 vs dp=1 on CUDA"
close dp2 dp2_zero "ZeRO-1 vs plain at dp=2 on CUDA"
grep -q "ZeRO-1" "$tmp/dp2_zero.log" || fail "the ZeRO-1 run did not say so"
resume dp2_zero 2 --set parallel.zero=1
exit $status
