#!/usr/bin/env bash
# Sharded checkpoints (docs/formats/checkpoint.md): bitwise resume on the same
# layout, resharding to other layouts, export to the Hugging Face layout, and
# faults (corrupt shards, failing writes, SIGKILL at random moments).
# Model L=4 NH=4 C=64, 20 steps of 8 sequences; checkpoints every 5 steps,
# the interrupted runs stop at step 10 (train.stop_at) and resume.
# CHECKPOINT_RESUME_ONLY=sigkill runs only the SIGKILL section (and the resume
# of a finished run), to repeat it many times.
set -euo pipefail
tessera=$1; tests=$2
export OMP_NUM_THREADS=1  # runs share two cores with other tests; keep OpenMP from spinning
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
source "$tests/cli/dp_common.inc"
sed -i 's/^layers = 2/layers = 4/; s/^heads = 2/heads = 4/; s/^dim = 32/dim = 64/; s/^steps = 10/steps = 20/' "$tmp/cfg.toml"
status=0
fail() { echo "FAIL $*"; status=1; }
run() { local out=$1; shift; "$@" --set "log.metrics=$tmp/$out.jsonl" >"$tmp/$out.log" 2>&1 || { cat "$tmp/$out.log"; exit 1; }; }
# train NAME DP TP PP [args...]: 8 sequences a step whatever the layout.
train() {
  local name=$1 dp=$2 tp=$3 pp=$4; shift 4
  local n=$((dp * tp * pp)) launcher=()
  [ $n -gt 1 ] && launcher=(mpirun_np $n)
  run "$name" "${launcher[@]}" "$tessera" train --config "$tmp/cfg.toml" --set train.micro_batch=$((8 / dp)) \
    --set parallel.dp=$dp --set parallel.tp=$tp --set parallel.pp=$pp --set checkpoint.every=5 "$@"
}
all_losses() { for f in "$@"; do losses "$tmp/$f.jsonl"; done; }

# --- SIGKILL at random moments (mid-step, mid-write, after the final
# checkpoint): the latest published checkpoint verifies after every kill, and
# the end state is the uninterrupted run's, bit for bit: the same final
# weights, and every step's loss, whichever attempt wrote it, the same.
# 150 steps, a checkpoint every 3. The first three attempts are killed once
# they have trained a random 1-30 steps, so at least three kills happen however
# fast or slow the machine is; the next nine 0.1-0.9 s after their start (in
# start-up, mid-step, mid-write, or after they wrote their last checkpoint:
# the next attempt then resumes a finished run); then one runs to the end.
"$tessera" train --config "$tmp/cfg.toml" --set train.micro_batch=8 --set train.steps=150 --set "checkpoint.dir=$tmp/k150" \
  --set "log.metrics=$tmp/full150.jsonl" >"$tmp/full150.log" 2>&1 || { cat "$tmp/full150.log"; exit 1; }
dir="$tmp/kill"; RANDOM=7; kills=0; last=""
kill_run() {  # kill_run ATTEMPT [args...]: one attempt in the background, its pid in $pid
  local attempt=$1; shift
  "$tessera" train --config "$tmp/cfg.toml" --set train.micro_batch=8 --set train.steps=150 --set checkpoint.every=3 \
    --set checkpoint.keep=2 --set "checkpoint.dir=$dir" --set "log.metrics=$tmp/kill_$attempt.jsonl" "$@" \
    >"$tmp/kill_$attempt.log" 2>&1 &
  pid=$!
}
for attempt in $(seq 1 13); do
  resume=(); [ -e "$dir/latest" ] && resume=(--resume latest)
  kill_run $attempt "${resume[@]}"
  if [ $attempt -le 3 ]; then
    steps=$(( RANDOM % 30 + 1 ))
    for _ in $(seq 3000); do  # at most about a minute
      [ "$(grep -c '"loss"' "$tmp/kill_$attempt.jsonl" 2>/dev/null)" -ge $steps ] 2>/dev/null && break
      kill -0 $pid 2>/dev/null || break
      sleep 0.02
    done
  elif [ $attempt -le 12 ]; then
    sleep "0.$(( RANDOM % 9 + 1 ))"
  fi
  if [ $attempt -le 12 ]; then kill -9 $pid 2>/dev/null || true; fi
  rc=0; wait $pid 2>/dev/null || rc=$?
  if [ $rc -eq 137 ]; then  # killed (a run that had already ended keeps its own status)
    kills=$((kills + 1))
    if [ -e "$dir/latest" ]; then
      "$tessera" checkpoint verify "$dir" >/dev/null 2>"$tmp/verify.err" || { fail "after kill $kills: $(cat "$tmp/verify.err")"; break; }
    fi
    continue
  fi
  [ $rc -eq 0 ] || { cat "$tmp/kill_$attempt.log"; fail "attempt $attempt exited $rc"; break; }
  last=$attempt; break
done
# step loss: every loss line of a metrics file.
step_losses() { paste -d' ' <(grep '"loss"' "$1" | grep -o '"step":[0-9]*' | cut -d: -f2) <(losses "$1"); }
step_losses "$tmp/full150.jsonl" >"$tmp/want_losses.txt"
for a in $(seq 1 "${last:-0}"); do step_losses "$tmp/kill_$a.jsonl"; done >"$tmp/got_losses.txt"
# "LINES MISMATCHES FINAL FIRST-MISMATCH": FINAL is the last loss written for step 150 by any attempt.
read -r n bad final first < <(awk 'NR == FNR { want[$1] = $2; next }
  { n++; if ($2 "" != want[$1] "") { bad++; if (first == "") first = "step " $1 ": " $2 " vs " want[$1] } if ($1 == 150) final = $2 }
  END { printf "%d %d %s %s\n", n, bad, final == "" ? "-" : final, first }' "$tmp/want_losses.txt" "$tmp/got_losses.txt")
want=$(losses "$tmp/full150.jsonl" | tail -1)
how="trained to the end"; [ -n "$last" ] && grep -q "already finished" "$tmp/kill_$last.log" && how="resumed a finished run"
if [ -n "$last" ] && [ $kills -ge 3 ] && [ "$bad" -eq 0 ] && [ "$final" = "$want" ] &&
   cmp -s "$tmp/k150/model.safetensors" "$dir/model.safetensors"; then
  echo "ok   SIGKILL x$kills: every latest checkpoint verified; the last attempt $how; $n step losses and the final" \
    "weights identical to the uninterrupted run (step 150 loss $final)"
else
  fail "SIGKILL loop: ${last:+attempt $last finished, }$kills kills; $n step losses, $bad different (${first:-none});" \
    "step 150 loss '$final' vs $want; final weights $(cmp -s "$tmp/k150/model.safetensors" "$dir/model.safetensors" && echo identical || echo DIFFERENT)"
  for a in $(seq 1 13); do [ -e "$tmp/kill_$a.log" ] && { echo "--- attempt $a"; tail -3 "$tmp/kill_$a.log"; }; done
fi

# --- A resume of a finished run (latest is step 150 of 150): one line says
# so, it exits 0, trains no step and writes the same final weights.
rm -f "$dir/model.safetensors"
rc=0; kill_run again --resume latest; wait $pid || rc=$?
if [ $rc -eq 0 ] && [ "$(grep -c "^already finished: .*step-00000150 is at step 150 of train.steps = 150" "$tmp/kill_again.log")" -eq 1 ] &&
   ! grep -q '"loss"' "$tmp/kill_again.jsonl" && ! grep -q "^step " "$tmp/kill_again.log" &&
   cmp -s "$tmp/k150/model.safetensors" "$dir/model.safetensors"; then
  echo "ok   resume of a finished run: $(grep "already finished" "$tmp/kill_again.log")"
else fail "resume of a finished run: exit $rc"; cat "$tmp/kill_again.log"; fi
[ "${CHECKPOINT_RESUME_ONLY:-}" = sigkill ] && exit $status

# --- Bitwise resume on the same layout: 20 steps == 10 + resume + 10.
for l in "1 1 1" "2 1 1" "2 1 1 --set parallel.zero=1" "1 2 2"; do
  set -- $l; dp=$1 tp=$2 pp=$3; shift 3
  tag="${dp}x${tp}x${pp}${1:+_zero}"
  train "full_$tag" $dp $tp $pp --set "checkpoint.dir=$tmp/full_$tag" "$@"
  train "a_$tag" $dp $tp $pp --set "checkpoint.dir=$tmp/ck_$tag" --set train.stop_at=10 "$@"
  train "b_$tag" $dp $tp $pp --set "checkpoint.dir=$tmp/ck_$tag" --resume latest "$@"
  grep -q "resumed from .*step-00000010 at step 10" "$tmp/b_$tag.log" || fail "$tag: did not resume at step 10"
  if cmp -s <(all_losses "full_$tag") <(all_losses "a_$tag" "b_$tag"); then echo "ok   bitwise resume $tag: 20 losses identical"
  else fail "bitwise resume $tag:"; paste <(all_losses "full_$tag") <(all_losses "a_$tag" "b_$tag") | head -20; fi
done

# --- Resharding: saved at dp=2 x tp=2 (ZeRO-1) at step 10, resumed as pp=2,
# dp=4 (and ZeRO-1), and one rank: the uninterrupted one-rank run within
# 1e-5 relative (summation orders differ between layouts).
train save_2x2 2 2 1 --set "checkpoint.dir=$tmp/ck_2x2" --set train.stop_at=10 --set parallel.zero=1
ten() { losses "$tmp/full_1x1x1.jsonl" | tail -n 10 >"$tmp/want10.txt"; losses "$tmp/$1.jsonl" >"$tmp/got10.txt"; }
for l in "1 1 2" "4 1 1" "4 1 1 --set parallel.zero=1" "1 1 1"; do
  set -- $l; dp=$1 tp=$2 pp=$3; shift 3
  name="reshard_${dp}x${tp}x${pp}${1:+_zero}"
  cp -r "$tmp/ck_2x2" "$tmp/ck_$name"
  train "$name" $dp $tp $pp --set "checkpoint.dir=$tmp/ck_$name" --resume latest "$@"
  paste <(losses "$tmp/full_1x1x1.jsonl" | tail -n 10) <(losses "$tmp/$name.jsonl") | awk -v name="$name" '
    { n++; d = $1 - $2; if (d < 0) d = -d; r = d / $1; if (r > worst) worst = r; if (r > 1e-5) bad = 1 }
    END { if (n != 10 || bad) { printf "FAIL %s: %d steps, worst relative difference %.2e\n", name, n, worst; exit 1 }
          printf "ok   %s: steps 11-20 within %.2e of the one-rank run\n", name, worst }' || status=1
done

# --- Export: the merged model in the HF layout gives the trainer's own
# validation loss in `tessera eval`.
"$tessera" export "$tmp/full_1x2x2" --out "$tmp/export/model.safetensors" >"$tmp/export.log" 2>&1 || { cat "$tmp/export.log"; fail "export"; }
"$tessera" eval --weights "$tmp/export/model.safetensors" --tokens "$(ls "$tmp"/data/val_*.bin | head -1)" --batch 8 --seq 32 \
  --max-batches 2 >"$tmp/eval.log" 2>&1 || { cat "$tmp/eval.log"; fail "eval of the export"; }
want=$(grep '"val_loss"' "$tmp/full_1x2x2.jsonl" | tail -1 | sed 's/.*"val_loss":\([-0-9.eE+]*\).*/\1/')
got=$(grep -oE 'loss[^0-9]*[0-9]+\.[0-9]+' "$tmp/eval.log" | head -1 | grep -oE '[0-9]+\.[0-9]+$')
if awk -v a="$want" -v b="$got" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d < 1e-3) }'; then
  echo "ok   export: tessera eval gives $got, the trainer's last val loss $want"
else fail "export: tessera eval gives '$got', the trainer said $want"; cat "$tmp/eval.log"; fi

# --- Corruption: a flipped bit and a truncated shard are refused, naming the
# file and the checksum.
cp -r "$tmp/full_1x2x2" "$tmp/flip"
shard="$tmp/flip/step-00000020/shard-00001.safetensors"
printf '\x55' | dd of="$shard" bs=1 seek=$(( $(stat -c %s "$shard") - 100 )) conv=notrunc status=none
if "$tessera" checkpoint verify "$tmp/flip" >"$tmp/flip.out" 2>"$tmp/flip.err"; then fail "flipped bit verified"
elif grep -q "shard-00001.safetensors" "$tmp/flip.err" && grep -qi "xxh64\|checksum" "$tmp/flip.err"; then echo "ok   flipped bit: $(cat "$tmp/flip.err")"
else fail "flipped bit: $(cat "$tmp/flip.err")"; fi
set +e
mpirun_np 4 "$tessera" train --config "$tmp/cfg.toml" --set train.micro_batch=8 --set parallel.tp=2 --set parallel.pp=2 \
  --set "checkpoint.dir=$tmp/flip" --resume latest >"$tmp/flip_resume.out" 2>"$tmp/flip_resume.err"
rc=$?
set -e
if [ $rc -ne 0 ] && grep -q "shard-00001.safetensors" "$tmp/flip_resume.err"; then echo "ok   resume from a flipped bit refused: $(grep -m1 shard-00001 "$tmp/flip_resume.err")"
else fail "resume from a flipped bit: exit $rc"; cat "$tmp/flip_resume.err"; fi
cp -r "$tmp/full_1x1x1" "$tmp/trunc"
shard="$tmp/trunc/step-00000020/shard-00000.safetensors"
truncate -s $(( $(stat -c %s "$shard") / 2 )) "$shard"
if "$tessera" train --config "$tmp/cfg.toml" --set train.micro_batch=8 --set "checkpoint.dir=$tmp/trunc" --resume latest \
     >"$tmp/trunc.out" 2>"$tmp/trunc.err"; then fail "resume from a truncated shard succeeded"
elif [ "$(wc -l <"$tmp/trunc.err")" -eq 1 ] && grep -q "shard-00000.safetensors" "$tmp/trunc.err"; then echo "ok   truncated shard: $(cat "$tmp/trunc.err")"
else fail "truncated shard:"; cat "$tmp/trunc.err"; fi

# --- A failing write (injected EIO on rank 1 for every save after the
# first): reported, training goes on, the last good checkpoint stays latest.
set +e
TESSERA_CKPT_FAULT=eio@1 mpirun_np 2 -x TESSERA_CKPT_FAULT "$tessera" train --config "$tmp/cfg.toml" --set train.micro_batch=4 \
  --set parallel.dp=2 --set checkpoint.every=5 --set "checkpoint.dir=$tmp/eio" >"$tmp/eio.out" 2>"$tmp/eio.err"
rc=$?
set -e
if [ $rc -eq 0 ] && grep -q "rank 1" "$tmp/eio.err" && grep -q "step    20/20" "$tmp/eio.out" && [ ! -e "$tmp/eio/latest" ]; then
  echo "ok   failing write: training finished, nothing published: $(grep -m1 warning "$tmp/eio.err")"
else fail "failing write: exit $rc"; cat "$tmp/eio.err"; ls "$tmp/eio"; fi

exit $status
