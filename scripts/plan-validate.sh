#!/usr/bin/env bash
# Predicts, with `tessera plan` and this machine's profile, the step time of
# each run that scripts/plan-measure.sh measured, and prints predicted vs
# measured (docs/planner.md, "Validation").
# Usage: scripts/plan-validate.sh TESSERA MEASURED.tsv [MAX_ERROR_PCT [NAME...]]
# MEASURED.tsv is plan-measure.sh's output: the table gives the error
# against the wall-clock median step (column 2) and against the CPU-time
# step (column 7; docs/planner.md says where each holds); MAX_ERROR_PCT
# applies to the wall error, or to the CPU-time one with PLAN_VS=cpu.
# With MAX_ERROR_PCT, exits 1 when a listed run (default: every run) is off
# by more than that.
set -euo pipefail
tessera=$1; measured=$2; bound=${3:-}; shift $(( $# < 3 ? $# : 3 ))
root=$(cd "$(dirname "$0")/.." && pwd)
S="--layers 4 --heads 4 --dim 256"; M="--layers 6 --heads 8 --dim 512"; G="--layers 12 --heads 12 --dim 768 --seq 64"
declare -A spec=(
  [s1]="1 this-machine $S dp=1,tp=1,pp=1,mb=8,ga=1"        [s1b16]="1 this-machine $S dp=1,tp=1,pp=1,mb=16,ga=1"
  [m1]="1 this-machine $M dp=1,tp=1,pp=1,mb=8,ga=1"        [g1]="1 this-machine $G dp=1,tp=1,pp=1,mb=4,ga=1"
  [s_dp2]="2 this-machine $S dp=2,tp=1,pp=1,mb=8,ga=1"     [s_dp4]="4 this-machine $S dp=4,tp=1,pp=1,mb=4,ga=1"
  [s_tp2]="2 this-machine $S dp=1,tp=2,pp=1,mb=8,ga=1"     [s_pp2]="2 this-machine $S dp=1,tp=1,pp=2,mb=4,ga=4"
  [s_pp2m8]="2 this-machine $S dp=1,tp=1,pp=2,mb=2,ga=8" [s_dp2pp2]="4 this-machine $S dp=2,tp=1,pp=2,mb=4,ga=4"
  [m_tp2]="2 this-machine $M dp=1,tp=2,pp=1,mb=8,ga=1"     [g_dp2]="2 this-machine $G dp=2,tp=1,pp=1,mb=4,ga=1"
  [s_dp2_1g]="1 this-machine-netns-1g $S dp=2,tp=1,pp=1,mb=8,ga=1"
  [s_dp2_10g]="1 this-machine-netns-10g $S dp=2,tp=1,pp=1,mb=8,ga=1"
  [m_dp2_1g]="1 this-machine-netns-1g $M dp=2,tp=1,pp=1,mb=8,ga=1"
)
want=" $* "
status=0; sum=0; n=0
echo "| run | ranks | layout | measured wall, median (ms) | measured CPU-time step (ms) | predicted (ms) | error vs wall | error vs CPU time | predicted bottleneck |"
echo "|---|---|---|---|---|---|---|---|---|"
while IFS=$'\t' read -r name wall _ _ _ _ cpu; do
  ms=$wall; [ "${PLAN_VS:-wall}" = cpu ] && ms=${cpu:-$wall}
  [ -n "${spec[$name]:-}" ] || continue
  [ $# -gt 0 ] && [[ "$want" != *" $name "* ]] && continue
  read -r ranks cluster rest <<<"${spec[$name]}"
  layout=${rest##* }; model=${rest% *}
  seq=128; [[ "$model" == *"--seq 64"* ]] && seq=""
  out=$("$tessera" plan $model ${seq:+--seq $seq} --vocab 50257 --context 256 --dtype fp32 --layout "$layout" \
    --cluster "$root/examples/clusters/$cluster.toml" --ranks-per-node "$ranks" --json)
  read -r pred bott < <(python3 -c 'import json,sys; L=json.load(sys.stdin)["clusters"][0]["layouts"][0]; print(L["step_s"]*1e3, L["bottleneck"])' <<<"$out")
  err=$(awk -v p="$pred" -v m="$ms" 'BEGIN { printf "%+.1f", 100 * (p - m) / m }')
  ew=$(awk -v p="$pred" -v m="$wall" 'BEGIN { printf "%+.1f%%", 100 * (p - m) / m }')
  ec=$(awk -v p="$pred" -v m="${cpu:-0}" 'BEGIN { if (m > 0) printf "%+.1f%%", 100 * (p - m) / m; else printf "-" }')
  [ "$cluster" = this-machine ] || ranks="2 (netns ${cluster##*-})"
  printf "| %s | %s | %s | %.0f | %s | %.0f | %s | %s | %s |\n" "$name" "$ranks" "$layout" "$wall" "${cpu:--}" "$pred" "$ew" "$ec" "$bott"
  sum=$(awk -v s="$sum" -v e="$err" 'BEGIN { print s + (e < 0 ? -e : e) }'); n=$((n + 1))
  if [ -n "$bound" ] && awk -v e="$err" -v b="$bound" 'BEGIN { exit !(e > b || e < -b) }'; then status=1; fi
done <"$measured"
[ $n -gt 0 ] && awk -v s="$sum" -v n="$n" -v w="${PLAN_VS:-wall}" 'BEGIN { printf "\nmean absolute error (vs %s) over %d runs: %.1f%%\n", w, n, s / n }'
exit $status
