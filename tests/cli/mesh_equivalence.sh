#!/usr/bin/env bash
# Tensor and pipeline parallelism, composed with data parallelism: every
# dp x tp x pp layout with each axis in {1, 2} (up to 8 ranks), plus tp=4,
# pp=4, uneven stages, GPipe and ZeRO-1, trains exactly like one rank with the
# same global batch (8 sequences a step). The model (L=4, NH=4) allows tp and
# pp up to 4. Then memory per rank against the layout, and a stalled stage.
set -euo pipefail
tessera=$1; tests=$2
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
source "$tests/cli/dp_common.inc"
sed -i 's/^layers = 2/layers = 4/; s/^heads = 2/heads = 4/; s/^dim = 32/dim = 64/' "$tmp/cfg.toml"
run() { local out=$1; shift; "$@" --set "log.metrics=$tmp/$out.jsonl" --set "checkpoint.dir=$tmp/$out" >"$tmp/$out.log" 2>&1 || { cat "$tmp/$out.log"; exit 1; }; }
# layout DP TP PP [extra --set ...]: a run with the global batch split over dp.
layout() {
  local dp=$1 tp=$2 pp=$3; shift 3
  local name="dp${dp}_tp${tp}_pp${pp}${1:+_$(printf '%s' "$*" | tr -c 'a-z0-9' '_')}"
  local n=$((dp * tp * pp)) launcher=()
  [ $n -gt 1 ] && launcher=(mpirun_np $n)
  local extra=()
  for s in "$@"; do extra+=(--set "$s"); done
  run "$name" "${launcher[@]}" "$tessera" train --config "$tmp/cfg.toml" --set train.micro_batch=2 \
    --set train.grad_accum=$((4 / dp)) --set parallel.dp=$dp --set parallel.tp=$tp --set parallel.pp=$pp "${extra[@]}"
  echo "$name"
}

status=0
base=$(layout 1 1 1)
# fp32; tp and pp change summation orders only (the all-reduced partial
# sums, the vocabulary-parallel softmax, the gradient norm): 1e-5 relative.
for l in "2 1 1" "1 2 1" "1 1 2" "2 2 1" "2 1 2" "1 2 2" "2 2 2" "1 4 1" "1 1 4" \
         "1 1 2 parallel.stages=3,1" "1 1 4 parallel.schedule=gpipe" "2 2 2 parallel.zero=1" \
         "2 1 2 parallel.zero=1 parallel.schedule=gpipe"; do
  name=$(layout $l)
  same_losses "$tmp/$base.jsonl" "$tmp/$name.jsonl" 1e-5 "$name vs dp1_tp1_pp1" || status=1
done
# 1F1B and GPipe run the same micro-batches in the same order: equal losses.
same_losses "$tmp/dp1_tp1_pp4.jsonl" "$tmp/dp1_tp1_pp4_parallel_schedule_gpipe.jsonl" 1e-6 "1F1B vs GPipe, pp=4" || status=1

# The final weights gathered from the tp x pp shards (rank 0 writes the whole
# model) give the trainer's own last validation loss in `tessera eval`.
want=$(grep '"val_loss"' "$tmp/dp2_tp2_pp2.jsonl" | tail -1 | sed 's/.*"val_loss":\([-0-9.eE+]*\).*/\1/')
got=$("$tessera" eval --weights "$tmp/dp2_tp2_pp2/model.safetensors" --tokens "$(ls "$tmp"/data/val_*.bin | head -1)" \
  --batch 2 --seq 32 --max-batches 2 | tail -1 | sed 's/.*"loss": *\([-0-9.eE+]*\).*/\1/')
if awk -v a="$want" -v b="$got" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d < 1e-4) }'; then
  echo "ok   gathered weights of dp2_tp2_pp2: tessera eval gives $got, the trainer said $want"
else echo "FAIL gathered weights of dp2_tp2_pp2: tessera eval gives '$got', the trainer said $want"; status=1; fi

# Memory per rank (largest over ranks), from the metrics.
mem() { grep -m1 "\"$2\"" "$tmp/$1.jsonl" | sed "s/.*\"$2\":\([-0-9.eE+]*\).*/\1/"; }
ratio_at_most() {  # NAME FIELD MAX
  local r; r=$(awk -v a="$(mem "$1" "$2")" -v b="$(mem "$base" "$2")" 'BEGIN { printf "%.3f", a / b }')
  if awk -v r="$r" -v m="$3" 'BEGIN { exit !(r <= m) }'; then echo "ok   $1 $2: ${r}x of one rank's (<= $3)"
  else echo "FAIL $1 $2: ${r}x of one rank's, want <= $3"; status=1; fi
}
# Layers hold ~85% of this model's parameters; the first stage also holds the
# embeddings, and tp ranks replicate the layernorms and wpe.
ratio_at_most dp1_tp2_pp1 mem_params_mb 0.55
ratio_at_most dp1_tp1_pp2 mem_params_mb 0.60
ratio_at_most dp1_tp2_pp2 mem_params_mb 0.32
ratio_at_most dp1_tp4_pp1 mem_params_mb 0.30
ratio_at_most dp1_tp2_pp1 mem_activations_mb 0.80
# ZeRO-1 shards the optimizer state over dp on top of tp x pp.
ratio_at_most dp2_tp2_pp2_parallel_zero_1 mem_optimizer_mb 0.17
# 1F1B keeps at most pp micro-batches in flight, GPipe all 4.
a=$(mem dp1_tp1_pp4 mem_activations_mb); g=$(mem dp1_tp1_pp4_parallel_schedule_gpipe mem_activations_mb)
if awk -v a="$a" -v g="$g" 'BEGIN { exit !(a < g) }'; then echo "ok   activations pp=4: 1F1B $a MB < GPipe $g MB"
else echo "FAIL activations pp=4: 1F1B $a MB, GPipe $g MB"; status=1; fi
for f in bubble_ms p2p_ms mem_params_mb; do
  grep -q "\"$f\"" "$tmp/dp1_tp1_pp2.jsonl" || { echo "FAIL no $f in the metrics"; status=1; }
done

# A stage that stalls mid-step (stage 1 of 4, before its first backward):
# its neighbours stop with the deadline error naming it; no hang.
set +e
start=$(date +%s)
timeout 120 mpirun --allow-run-as-root --oversubscribe --bind-to none -np 4 -x OMP_NUM_THREADS=1 \
  -x TESSERA_FAULT=stall@1:2 "$tessera" train --config "$tmp/cfg.toml" --set train.micro_batch=2 \
  --set train.grad_accum=4 --set parallel.pp=4 --set parallel.timeout=3 >"$tmp/stall.out" 2>"$tmp/stall.err"
rc=$?; took=$(( $(date +%s) - start ))
set -e
if [ $rc -eq 0 ] || [ $rc -eq 124 ]; then echo "FAIL stall: exit $rc after ${took}s (want an error, no hang)"; status=1; fi
if ! grep -E "timed out after 3.0 s" "$tmp/stall.err" | grep -qE "peers \[1\]"; then
  echo "FAIL stall: no deadline error naming stage 1:"; cat "$tmp/stall.err"; status=1
else
  echo "ok   stall: exit $rc after ${took}s: $(grep -m1 'timed out' "$tmp/stall.err")"
fi
exit $status
