#!/usr/bin/env bash
# The checkpoint folder lock (issue #18 item 4, docs/formats/checkpoint.md
# "The lock"): a second job on a folder in use exits at once with one line
# naming the holder's job, host and pid; after the holder is killed with -9,
# a new job takes its stale lock over and resumes from its checkpoint.
set -uo pipefail
tessera=$1; tests=$2
export OMP_NUM_THREADS=1
tmp=$(mktemp -d)
holder=""
cleanup() { [ -n "$holder" ] && kill -9 "$holder" 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
source "$tests/cli/dp_common.inc"
status=0
fail() { echo "FAIL $*"; status=1; }
ck="$tmp/ck"
common=(--config "$tmp/cfg.toml" --set train.micro_batch=2 --set train.steps=100000 --set "checkpoint.dir=$ck")

# The holder: trains "forever", a checkpoint every 5 steps.
"$tessera" train "${common[@]}" --set checkpoint.every=5 >"$tmp/holder.log" 2>&1 &
holder=$!
for _ in $(seq 300); do [ -e "$ck/latest" ] && break; kill -0 $holder 2>/dev/null || break; sleep 0.1; done
[ -e "$ck/latest" ] || { cat "$tmp/holder.log"; echo "FAIL the holder published no checkpoint in 30 s"; exit 1; }

# A second job on the folder: refused in one line naming the holder.
start=$(date +%s%N)
timeout 30 "$tessera" train "${common[@]}" --set train.steps=10 >"$tmp/second.out" 2>&1
rc=$?; took_ms=$(( ($(date +%s%N) - start) / 1000000 ))
host=${TESSERA_HOST:-$(hostname)}
want="^tessera: error: checkpoint.dir: $ck is locked by job cfg on host $host \\(pid $holder, since [0-9: -]+\\): "
if [ $rc -ne 1 ] || [ "$(wc -l <"$tmp/second.out")" -ne 1 ] || ! grep -qE "$want" "$tmp/second.out"; then
  fail "second job: exit $rc, want 1 and one line /$want/:"; cat "$tmp/second.out"
else
  echo "ok   second job refused in ${took_ms} ms: $(cat "$tmp/second.out")"
fi
grep -q "\"pid\":$holder," "$ck/LOCK" || fail "the refused job changed the lock file: $(cat "$ck/LOCK")"
kill -0 $holder 2>/dev/null || fail "the holder stopped: $(tail -3 "$tmp/holder.log")"

# kill -9: the lock is stale; a new job takes it over and resumes.
kill -9 $holder; wait $holder 2>/dev/null; holder=""
step=$(sed 's/step-0*//' "$ck/latest")
timeout 60 "$tessera" train "${common[@]}" --resume latest --set train.stop_at=$((step + 2)) >"$tmp/third.out" 2>&1
rc=$?
if [ $rc -ne 0 ]; then
  fail "the job after kill -9 exited $rc:"; cat "$tmp/third.out"
else
  grep -qE "^checkpoint.dir: took over the lock of job cfg on host $host \\(pid [0-9]+, since .*\\), which ended without releasing it" \
    "$tmp/third.out" || fail "no takeover line: $(head -3 "$tmp/third.out")"
  grep -q "^resumed from $ck/step-0*$step at step $step " "$tmp/third.out" || fail "did not resume at step $step: $(head -3 "$tmp/third.out")"
  grep -q "^stopped after step $((step + 2))" "$tmp/third.out" || fail "did not train 2 steps: $(tail -3 "$tmp/third.out")"
  [ -s "$ck/LOCK" ] && fail "the lock file still names a holder after a clean end: $(cat "$ck/LOCK")"
  [ $status -eq 0 ] && echo "ok   after kill -9, a new job took the stale lock over and resumed at step $step"
fi
exit $status
