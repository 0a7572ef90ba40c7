#!/usr/bin/env bash
# Process lifetime (issue #18 item 4): kill -9 of `tessera launch` used to
# leave mpirun and every rank training on as orphans. Now the job ends with
# it: mpirun gets SIGTERM when the launcher dies (PR_SET_PDEATHSIG) and ends
# its ranks (without the fix they trained on: this test failed). A 2-rank job
# (dp=2) is killed that way while it trains; within 15 s no process of it
# may be left. Then the checkpoint lock its rank 0 held is stale: a 1-rank
# job takes it over and resumes from the 2-rank checkpoint.
set -uo pipefail
tessera=$1; tests=$2
export OMP_NUM_THREADS=1
tmp=$(mktemp -d)
ck="$tmp/ck"  # in every command line of the job: pgrep -f finds its processes
cleanup() { for p in $(pgrep -f "$ck"); do kill -9 "$p" 2>/dev/null; done; rm -rf "$tmp"; }
trap cleanup EXIT
source "$tests/cli/dp_common.inc"
status=0
fail() { echo "FAIL $*"; status=1; }
common=(--config "$tmp/cfg.toml" --set train.micro_batch=2 --set train.steps=100000 --set "checkpoint.dir=$ck")

"$tessera" launch -n 2 --threads 1 -- train "${common[@]}" --set parallel.dp=2 --set checkpoint.every=5 \
  >"$tmp/job.log" 2>&1 &
launcher=$!
for _ in $(seq 600); do [ -e "$ck/latest" ] && break; kill -0 $launcher 2>/dev/null || break; sleep 0.1; done
[ -e "$ck/latest" ] || { cat "$tmp/job.log"; echo "FAIL the job published no checkpoint in 60 s"; exit 1; }
before=$(pgrep -f "$ck" | wc -l)
[ "$before" -ge 3 ] || fail "want the launcher, mpirun and 2 ranks running, found $before: $(pgrep -af "$ck")"

kill -9 $launcher
start=$(date +%s%N); left=""
for _ in $(seq 150); do
  left=$(pgrep -af "$ck")
  [ -z "$left" ] && break
  sleep 0.1
done
took_ms=$(( ($(date +%s%N) - start) / 1000000 ))
if [ -n "$left" ]; then
  fail "15 s after kill -9 of tessera launch, its job still runs:"; echo "$left"
else
  echo "ok   kill -9 of tessera launch: all $((before - 1)) processes of its job ended in ${took_ms} ms"
fi
wait $launcher 2>/dev/null

step=$(sed 's/step-0*//' "$ck/latest")
timeout 60 "$tessera" train "${common[@]}" --resume latest --set train.stop_at=$((step + 2)) >"$tmp/resume.out" 2>&1
rc=$?
if [ $rc -ne 0 ]; then
  fail "the 1-rank job after the kill exited $rc:"; cat "$tmp/resume.out"
elif ! grep -q "^resumed from $ck/step-0*$step at step $step " "$tmp/resume.out"; then
  fail "no resume at step $step:"; head -3 "$tmp/resume.out"
elif grep -q "^checkpoint.dir: took over the lock of job cfg" "$tmp/resume.out"; then
  echo "ok   a 1-rank job took the dead 2-rank job's lock over and resumed at step $step"
elif grep -q "stopped by .* published and verified" "$tmp/job.log"; then
  # On a loaded machine the ranks may still be alive when mpirun's SIGTERM
  # comes: they stop on it (train/stop.h), publish a verified checkpoint
  # and release the lock, so there is none to take over.
  echo "ok   the ranks stopped on mpirun's SIGTERM at a verified step-$step; a 1-rank job resumed there"
else
  fail "no takeover of the lock, and no stop on SIGTERM in the job's log:"; head -3 "$tmp/resume.out"; tail -3 "$tmp/job.log"
fi
exit $status
