#!/usr/bin/env bash
# tessera plan: bad input gets one clear line; --json has its documented
# shape; the scenarios keep their order; and predictions of this machine's
# own runs (committed profile docs/profiles/dev-vm.json and committed
# measured step times tests/plan/measured-dev-vm.tsv) stay within the error
# docs/planner.md reports.
set -uo pipefail
tessera=$1; tests=$2
root=$(cd "$tests/.." && pwd)
E=$root/examples/clusters
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
failures=0
fail() { echo "FAIL $*"; failures=$((failures + 1)); }

expect_error() {
  local name=$1 pattern=$2; shift 3
  "$@" >"$tmp/out" 2>"$tmp/err"; local rc=$?
  if [ $rc -ne 1 ] && [ $rc -ne 2 ]; then fail "$name: exit $rc (want 1 or 2)"; cat "$tmp/err"; return; fi
  if [ "$(wc -l <"$tmp/err")" -ne 1 ] || ! grep -qiE -- "$pattern" "$tmp/err"; then
    fail "$name: stderr should be one line matching /$pattern/, got:"; cat "$tmp/err"; return
  fi
  echo "ok   $name: $(cat "$tmp/err")"
}

# 1. Bad input.
printf '[node]\ntype = "B300"\ncount = 1\nprice_per_hour = 1\n' >"$tmp/unknown.toml"
expect_error unknown-node-type "unknown node type 'B300' \(catalogue: .*A100-80GB" -- "$tessera" plan --model gpt2-124m --cluster "$tmp/unknown.toml"
printf '[node]\ntype = "A100-80GB"\nprice_per_hour = 1\n' >"$tmp/nocount.toml"
expect_error missing-count "nocount.toml: missing node.count" -- "$tessera" plan --model gpt2-124m --cluster "$tmp/nocount.toml"
printf '[node]\ntype = "A100-80GB"\ncount = 2\nprice_per_hour = 1\n[network]\ninter = "ethernet"\n' >"$tmp/nogbps.toml"
expect_error missing-gbps "missing network.gbps" -- "$tessera" plan --model gpt2-124m --cluster "$tmp/nogbps.toml"
printf '[node]\ncount = 1\nprice_per_hour = 1\n' >"$tmp/notype.toml"
expect_error missing-type "missing node.type or node.profile" -- "$tessera" plan --model gpt2-124m --cluster "$tmp/notype.toml"
printf '[node]\ntype = "A100-80GB"\ncount = 1\n' >"$tmp/noprice.toml"
expect_error missing-price "missing node.price_per_hour" -- "$tessera" plan --model gpt2-124m --cluster "$tmp/noprice.toml"
printf '[node]\nprofile = "nope.json"\ncount = 1\nprice_per_hour = 0\n' >"$tmp/noprofile.toml"
expect_error missing-profile "cannot read profile .*nope.json" -- "$tessera" plan --model gpt2-124m --cluster "$tmp/noprofile.toml"
expect_error fits-nowhere "fits on no cluster given .*GB per device, has" -- "$tessera" plan --model megatron-145b --cluster "$E/a100x4-nvlink.toml"
expect_error unknown-model "unknown model 'gpt9' \(known: gpt2-124m" -- "$tessera" plan --model gpt9 --cluster "$E/a100x4-nvlink.toml"
expect_error no-cluster-file "does not exist" -- "$tessera" plan --model gpt2-124m --cluster "$tmp/none.toml"
expect_error bad-layout "--layout: 'dp' is not KEY=N" -- "$tessera" plan --model gpt2-124m --cluster "$E/a100x4-nvlink.toml" --layout dp
expect_error bad-tokens "--tokens '12X' is not a count" -- "$tessera" plan --model gpt2-124m --cluster "$E/a100x4-nvlink.toml" --tokens 12X

# 2. --json shape.
if "$tessera" plan --model gpt2-124m --tokens 10B --cluster "$E/a100x8-nvlink.toml" --cluster "$E/epyc7763x128.toml" --json >"$tmp/p.json" 2>"$tmp/p.err"; then
  if python3 - "$tmp/p.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
assert j["schema"] == "tessera.plan" and j["version"] == 1, "schema"
assert j["model"]["parameters"] == 124439808, j["model"]["parameters"]
assert len(j["clusters"]) == 2
for c in j["clusters"]:
    for k in ("name", "node", "source", "nodes", "ranks", "price_per_hour", "layouts"):
        assert k in c, k
    assert 1 <= len(c["layouts"]) <= 3
    for L in c["layouts"]:
        for k in ("layout", "fits", "step_s", "tokens_per_s", "mfu", "train_s", "cost_usd", "breakdown_s", "memory_bytes", "bottleneck", "terms"):
            assert k in L, k
        b = L["breakdown_s"]
        parts = b["compute"] + b["bubble"] + b["tp_comm"] + b["p2p"] + b["dp_exposed"] + b["optimizer"] + b["checkpoint"]
        assert abs(parts - L["step_s"]) < 1e-6 * L["step_s"], "breakdown adds up"
        assert 0 < L["mfu"] < 1 and L["fits"] and L["memory_bytes"]["total"] <= L["memory_bytes"]["capacity"]
        assert abs(L["train_s"] - 10e9 / L["tokens_per_s"]) < 1e-6 * L["train_s"]
PY
  then echo "ok   --json shape"; else fail "--json shape"; cat "$tmp/p.json" | head -30; fi
else fail "--json run: $(cat "$tmp/p.err")"; fi

# 3. The seed scenario's order: 16 on InfiniBand < 8 on NVLink <= 16 on
# Ethernet < 8 on Ethernet < 4 on NVLink (docs/planner.md).
order=$("$tessera" plan --model llama2-7b --seq 2048 --global-batch 512 --top 1 --json --cluster "$E/a100x4-nvlink.toml" \
  --cluster "$E/a100x8-ethernet.toml" --cluster "$E/a100x8-nvlink.toml" --cluster "$E/a100x16-ethernet.toml" \
  --cluster "$E/a100x16-infiniband.toml" |
  python3 -c 'import json,sys; c=json.load(sys.stdin)["clusters"]; print(" ".join(x["name"] for x in sorted(c, key=lambda x: x["layouts"][0]["step_s"])))')
want="16xA100-infiniband 8xA100-nvlink 16xA100-ethernet 8xA100-ethernet 4xA100-nvlink"
[ "$order" = "$want" ] && echo "ok   7B scenario order: $order" || fail "7B scenario order: $order (want $want)"

# 3b. A Hugging Face config.json priced as the model it describes
# (Meta-Llama-3-8B's published config): the checkpoint's parameter count, GQA
# and SwiGLU in the shape; the same as the preset; a Llama 2 7B is priced
# differently from the same size with 8 key/value heads.
cat >"$tmp/llama3-8b.json" <<'JSON'
{"architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336,
 "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8, "vocab_size": 128256,
 "max_position_embeddings": 8192, "rms_norm_eps": 1e-05, "rope_theta": 500000.0, "hidden_act": "silu",
 "tie_word_embeddings": false, "attention_bias": false, "model_type": "llama"}
JSON
if "$tessera" plan --hf-config "$tmp/llama3-8b.json" --seq 8192 --global-batch 64 --top 1 --json \
     --cluster "$E/a100x8-nvlink.toml" >"$tmp/hf.json" 2>"$tmp/hf.err" &&
   "$tessera" plan --model llama3-8b --global-batch 64 --top 1 --json --cluster "$E/a100x8-nvlink.toml" >"$tmp/preset.json" &&
   python3 - "$tmp/hf.json" "$tmp/preset.json" <<'PY'
import json, sys
hf, preset = (json.load(open(f)) for f in sys.argv[1:3])
m = hf["model"]
assert m["parameters"] == 8030261248, m["parameters"]
assert m["kv_heads"] == 8 and m["mlp_hidden"] == 14336, m
assert "rmsnorm" in m["shape"] and "swiglu" in m["shape"] and "untied" in m["shape"], m["shape"]
a, b = hf["clusters"][0]["layouts"][0], preset["clusters"][0]["layouts"][0]
assert abs(a["step_s"] - b["step_s"]) < 1e-9 * b["step_s"], (a["step_s"], b["step_s"])
PY
then echo "ok   --hf-config Meta-Llama-3-8B: 8,030,261,248 parameters, priced as the llama3-8b preset"
else fail "--hf-config: $(cat "$tmp/hf.err")"; fi
sed 's/"LlamaForCausalLM"/"FalconForCausalLM"/' "$tmp/llama3-8b.json" >"$tmp/falcon.json"
expect_error "--hf-config unknown architecture" "FalconForCausalLM" x "$tessera" plan --hf-config "$tmp/falcon.json" --cluster "$E/a100x8-nvlink.toml"

# 4. Serving (--serve): memory, decode and prefill a device, per cluster;
# int8 on a CPU and bf16 on a GPU unless --serve-dtype says otherwise.
if "$tessera" plan --serve --model gpt2-124m --serve-batch 8 --json --cluster "$E/this-machine.toml" \
     --cluster "$E/h100x8.toml" >"$tmp/serve.json" 2>"$tmp/serve.err" &&
   python3 - "$tmp/serve.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
assert j["schema"] == "tessera.plan.serve" and j["version"] == 1, j["schema"]
assert j["job"] == {"batch": 8, "prompt": 128, "tokens": 128}, j["job"]
cpu, gpu = j["clusters"]
assert (cpu["dtype"], gpu["dtype"]) == ("int8", "bf16"), (cpu["dtype"], gpu["dtype"])
assert cpu["replicas"] == 1 and gpu["replicas"] == 8, (cpu["replicas"], gpu["replicas"])
for c in (cpu, gpu):
    assert c["fits"], c
    d = c["decode"]
    assert d["tokens_per_s"] > 0 and d["step_s"] > 0 and c["prefill_tokens_per_s"] > 0, c
    assert abs(d["tokens_per_s"] * d["step_s"] - 8) < 1e-6, d
    assert abs(d["cluster_tokens_per_s"] - c["replicas"] * d["tokens_per_s"]) < 1e-6 * d["cluster_tokens_per_s"], d
# bf16 weights read twice the int8 bytes a step.
assert abs(gpu["decode"]["read_bytes_per_step"] - 2 * cpu["decode"]["read_bytes_per_step"]) < 1, (gpu, cpu)
assert gpu["usd_per_million_tokens"] > 0 and cpu["usd_per_million_tokens"] == 0
PY
then echo "ok   --serve: gpt2-124m on this machine (int8) and 8 x H100 (bf16)"
else fail "--serve --json: $(cat "$tmp/serve.err")"; fi
if "$tessera" plan --serve --model gpt2-124m --cluster "$E/this-machine.toml" >"$tmp/serve.txt" 2>&1 &&
   grep -q '^  decode: at most [0-9]* tokens/s' "$tmp/serve.txt" && grep -q '^  prefill: ' "$tmp/serve.txt"; then
  echo "ok   --serve text: $(grep '^  decode' "$tmp/serve.txt")"
else fail "--serve text:"; cat "$tmp/serve.txt"; fi
expect_error "--serve int8 on a GPU" "int8 is a CPU tier of Tessera's" x "$tessera" plan --serve --serve-dtype int8 --model gpt2-124m --cluster "$E/h100x8.toml"
expect_error "--serve with a training flag" "--tokens prices training; --serve prices serving" x "$tessera" plan --serve --tokens 10B --model gpt2-124m --cluster "$E/this-machine.toml"
expect_error "a serving flag without --serve" "--serve-batch is a --serve flag" x "$tessera" plan --serve-batch 8 --model gpt2-124m --cluster "$E/this-machine.toml"
expect_error "--serve a DLRM" "a DLRM is not served" x "$tessera" plan --serve --model dlrm-500m --cluster "$E/this-machine.toml"
expect_error "--serve doesn't fit" "fits on no cluster given .*GB of weights" x "$tessera" plan --serve --model llama3-405b --serve-dtype fp32 --cluster "$E/this-machine.toml"

# 5. This machine's own runs, predicted from its committed profile.
if out=$(PLAN_VS=cpu bash "$root/scripts/plan-validate.sh" "$tessera" "$tests/plan/measured-dev-vm.tsv" 15 s1 s1b16 m1 g1 s_dp2 s_dp4 s_tp2 s_dp2pp2 m_tp2 2>&1); then
  echo "ok   dev-VM runs within 15%:"; echo "$out" | grep '^| [smg]'
else fail "dev-VM runs: a prediction is off by more than 15%:"; echo "$out"; fi

[ $failures -eq 0 ] && echo "all plan checks passed" || { echo "$failures failure(s)"; exit 1; }
