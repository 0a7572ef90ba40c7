#!/usr/bin/env bash
# The Llama family in training (model.arch = "llama": RMSNorm, rotary
# positions, SwiGLU, 4 query heads over 2 key/value heads, untied head):
# dp, tp, pp, ZeRO-1 and their 2x2x2 composition train exactly like one rank
# (1e-5); a checkpoint of dp2 + ZeRO-1 resumes at tp2 x pp2; a run stopped
# and resumed ends with the uninterrupted run's weights bit for bit; the
# gathered weights are a Hugging Face Llama folder that `tessera eval` reads.
set -euo pipefail
tessera=$1; tests=$2
export OMP_NUM_THREADS=1
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
source "$tests/cli/dp_common.inc"
sed -i 's/^layers = 2/layers = 4\narch = "llama"\nkv_heads = 2\nmlp_hidden = 96/; s/^heads = 2/heads = 4/; s/^dim = 32/dim = 64/' \
  "$tmp/cfg.toml"
run() { local out=$1; shift; "$@" --set "log.metrics=$tmp/$out.jsonl" >"$tmp/$out.log" 2>&1 || { cat "$tmp/$out.log"; exit 1; }; }
layout() {  # layout NAME DP TP PP [--set ...]: 8 sequences a step
  local name=$1 dp=$2 tp=$3 pp=$4; shift 4
  local n=$((dp * tp * pp)) launcher=()
  [ $n -gt 1 ] && launcher=(mpirun_np $n)
  run "$name" "${launcher[@]}" "$tessera" train --config "$tmp/cfg.toml" --set train.micro_batch=$((8 / dp)) \
    --set parallel.dp=$dp --set parallel.tp=$tp --set parallel.pp=$pp --set "checkpoint.dir=$tmp/$name" "$@"
}
status=0
layout base 1 1 1
grep -q 'rmsnorm' "$tmp/base.log" && grep -q 'KV=2' "$tmp/base.log" \
  || { echo "FAIL the run does not describe a Llama model:"; head -5 "$tmp/base.log"; status=1; }
for l in "2 1 1" "1 2 1" "1 1 2" "2 2 2" "2 2 2 --set parallel.zero=1"; do
  name="l$(echo "$l" | tr -c 'a-z0-9' '_')"
  layout "$name" $l
  same_losses "$tmp/base.jsonl" "$tmp/$name.jsonl" 1e-5 "llama $l vs one rank" || status=1
done

# tp must split whole key/value heads: one line, before any rank starts.
if "$tessera" train --config "$tmp/cfg.toml" --set parallel.tp=4 --set parallel.dp=1 >"$tmp/tp4.out" 2>&1; then
  echo "FAIL tp=4 over 2 key/value heads was accepted"; status=1
elif grep -q "model.kv_heads (2) must be divisible by parallel.tp (4)" "$tmp/tp4.out"; then
  echo "ok   tp=4 over 2 key/value heads: $(grep -m1 kv_heads "$tmp/tp4.out")"
else echo "FAIL tp=4: $(cat "$tmp/tp4.out")"; status=1; fi

# Stop at step 5 (dp2 + ZeRO-1, a checkpoint there), resume at tp2 x pp2: the
# rest of the losses are one rank's.
layout z 2 1 1 --set parallel.zero=1 --set checkpoint.every=5 --set train.stop_at=5
layout zr 1 2 2 --set "checkpoint.dir=$tmp/z" --resume latest
cat "$tmp/z.jsonl" "$tmp/zr.jsonl" >"$tmp/z_then_zr.jsonl"  # steps 1-5, then 6-10
same_losses "$tmp/base.jsonl" "$tmp/z_then_zr.jsonl" 1e-5 "dp2+ZeRO-1 checkpoint resumed at tp2 x pp2" || status=1

# Same layout, stopped and resumed: the final weights equal the uninterrupted run's.
layout s 1 1 1 --set checkpoint.every=5 --set train.stop_at=5
layout s 1 1 1 --set checkpoint.every=5 --resume latest
if cmp -s "$tmp/base/model.safetensors" "$tmp/s/model.safetensors"; then
  echo "ok   stopped at 5 and resumed: final weights bitwise equal to the uninterrupted run's"
else echo "FAIL resumed run's final weights differ"; status=1; fi

# kill -9 mid-step (the run stalls before step S's backward, S in 3..7,
# checkpoints every 2), then --resume latest: the final weights equal the
# uninterrupted run's, bit for bit.
RANDOM=11
steps=$(( RANDOM % 5 + 3 ))
TESSERA_FAULT="stall@0:$steps" "$tessera" train --config "$tmp/cfg.toml" --set train.micro_batch=8 \
  --set checkpoint.every=2 --set "checkpoint.dir=$tmp/k" --set "log.metrics=$tmp/k.jsonl" >"$tmp/k.log" 2>&1 &
pid=$!
for _ in $(seq 3000); do
  [ "$(grep -c '"loss"' "$tmp/k.jsonl" 2>/dev/null)" -ge $steps ] 2>/dev/null && break
  kill -0 $pid 2>/dev/null || break
  sleep 0.01
done
kill -9 $pid 2>/dev/null || true
wait $pid 2>/dev/null || true
if grep -q "^saved" "$tmp/k.log"; then echo "FAIL the run to kill finished first"; status=1; fi
layout k 1 1 1 --set checkpoint.every=2 --resume latest
if cmp -s "$tmp/base/model.safetensors" "$tmp/k/model.safetensors"; then
  echo "ok   kill -9 in step $((steps + 1)) and resumed: final weights bitwise equal to the uninterrupted run's"
else echo "FAIL kill -9 after $steps steps: the resumed run's final weights differ"; status=1; fi

# The gathered 2x2x2 weights: a Llama folder; eval gives the trainer's last loss.
python3 - "$tmp/l2_2_2_/config.json" <<'PY' || status=1
import json, sys
c = json.load(open(sys.argv[1]))
ok = c["architectures"] == ["LlamaForCausalLM"] and c["num_key_value_heads"] == 2 and c["tie_word_embeddings"] is False
print(("ok  " if ok else "FAIL") + " exported config.json: %s kv_heads=%d tied=%s" % (c["architectures"][0], c["num_key_value_heads"], c["tie_word_embeddings"]))
sys.exit(0 if ok else 1)
PY
want=$(grep '"val_loss"' "$tmp/l2_2_2_.jsonl" | tail -1 | sed 's/.*"val_loss":\([-0-9.eE+]*\).*/\1/')
got=$("$tessera" eval --weights "$tmp/l2_2_2_" --tokens "$(ls "$tmp"/data/val_*.bin | head -1)" \
  --batch 4 --seq 32 --max-batches 2 | tail -1 | sed 's/.*"loss": *\([-0-9.eE+]*\).*/\1/')
if awk -v a="$want" -v b="$got" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d < 1e-4) }'; then
  echo "ok   the exported folder: tessera eval gives $got, the trainer said $want"
else echo "FAIL the exported folder: tessera eval gives '$got', the trainer said $want"; status=1; fi
exit $status
