#!/usr/bin/env bash
# tessera plan for DLRM jobs (docs/planner.md, "DLRM"): bad input gets one
# clear line; --json has its documented shape (the breakdown adds up to the
# step, the all-to-all bytes are the sharding's); a train config gives the
# same job as the flags; the search picks table-wise where the link is slow;
# a job that fits nowhere is refused naming the memory. No timing.
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

A4=$E/a100x4-nvlink.toml
# 1. Bad input.
expect_error gpt-config 'model.kind is "gpt"; tessera plan --config reads DLRM configs' -- "$tessera" plan --config "$root/configs/tiny.toml" --cluster "$A4"
expect_error bottom-not-dim "bottom MLP must end in the embedding dimension 64 \(got 32\)" -- "$tessera" plan --model dlrm-500m --bottom-mlp 512,32 --cluster "$A4"
expect_error bad-rows "--table-rows: 'x' is not a positive integer" -- "$tessera" plan --model dlrm-500m --table-rows 1000,x --cluster "$A4"
expect_error rows-vs-tables "--table-rows gives 2 sizes but --tables is 3" -- "$tessera" plan --tables 3 --table-rows 10,20 --cluster "$A4"
expect_error bad-samples "--samples '4X' is not a count" -- "$tessera" plan --model dlrm-500m --samples 4X --cluster "$A4"
expect_error gpt-flag "--layers is a GPT flag; this is a DLRM plan" -- "$tessera" plan --model dlrm-500m --layers 2 --cluster "$A4"
expect_error bad-placement "placement" -- "$tessera" plan --model dlrm-500m --placement diagonal --cluster "$A4"
expect_error unknown-dlrm "unknown DLRM model 'dlrm-9t' \(known: dlrm-500m\)" -- "$tessera" plan --model dlrm-9t --cluster "$A4"
expect_error bad-config-key "unknown key|did you mean" -- "$tessera" plan --config "$root/configs/dlrm_500m.toml" --set model.embeding_dim=8 --cluster "$A4"
# 26 tables of 2 billion rows x 64 floats: 13 TB, on 4 GPUs of 80 GB.
expect_error fits-nowhere "fits on no cluster given .*needs .* GB per rank \(tables .*\), has .* GB" -- \
  "$tessera" plan --model dlrm-500m --table-rows 2000000000 --cluster "$A4"

# 2. --json shape: both placements on 4 A100s and 128 CPU nodes.
if "$tessera" plan --model dlrm-500m --samples 4.4B --top 2 --cluster "$A4" --cluster "$E/epyc7763x128.toml" --json \
    >"$tmp/p.json" 2>"$tmp/p.err"; then
  if python3 - "$tmp/p.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
assert j["schema"] == "tessera.plan" and j["version"] == 1
m = j["model"]
assert m["kind"] == "dlrm" and m["tables"] == 26 and m["dim"] == 64, m
assert m["parameters"] == 26 * 300000 * 64 + m["mlp_parameters"], m
# bottom 13-512-256-64, top (64 + 27*26/2 = 415)-512-256-1, weights and biases
mlp = sum(i * o + o for i, o in [(13, 512), (512, 256), (256, 64), (415, 512), (512, 256), (256, 1)])
assert m["mlp_parameters"] == mlp, (m["mlp_parameters"], mlp)
assert len(j["clusters"]) == 2
for c in j["clusters"]:
    assert len(c["layouts"]) == 2 and {L["placement"] for L in c["layouts"]} == {"table", "row"}, c["name"]
    assert c["layouts"][0]["step_s"] <= c["layouts"][1]["step_s"], "sorted by time"
    for L in c["layouts"]:
        b = L["breakdown_s"]
        assert abs(sum(b.values()) - L["step_s"]) < 1e-9 * L["step_s"], "breakdown adds up"
        assert all(v >= 0 for v in b.values()) and b["lookup"] > 0 and b["mlp"] > 0 and b["alltoall"] > 0
        mem = L["memory_bytes"]
        assert L["fits"] and mem["total"] <= mem["capacity"]
        parts = sum(v for k, v in mem.items() if k not in ("total", "capacity"))
        assert abs(parts - mem["total"]) < 1e-6 * mem["total"]
        assert abs(L["train_s"] - 4.4e9 / L["samples_per_s"]) < 1e-6 * L["train_s"]
        assert abs(L["samples_per_s"] - 2048 / L["step_s"]) < 1e-6 * L["samples_per_s"]
        names = {t["name"] for t in L["terms"]}
        assert {"lookup", "update", "alltoall", "allreduce", "mlp", "mem.tables"} <= names, names
gpu = j["clusters"][0]["layouts"][0]
assert gpu["breakdown_s"]["launch"] > 0 and gpu["memory_bytes"]["staging"] == 0, "GPU: launches, no staging in HBM"
cpu = j["clusters"][1]["layouts"][0]
assert cpu["breakdown_s"]["launch"] == 0 and cpu["memory_bytes"]["staging"] > 0
PY
  then echo "ok   --json shape"; else fail "--json shape"; head -40 "$tmp/p.json"; fi
else fail "--json run: $(cat "$tmp/p.err")"; fi

# 3. The all-to-all bytes are the sharding's: 2 ranks, B = 2048, D = 64.
# Table-wise: each rank's 13 tables x the other's 1024 samples x 256 B,
# forward and backward; row-wise: all 26 tables' partial sums. One rank: none.
a2a() {  # placement cluster [flags...] -> alltoall_bytes of the best layout
  local p=$1 c=$2; shift 2
  "$tessera" plan --model dlrm-500m --placement "$p" --cluster "$c" --json "$@" |
    python3 -c 'import json,sys; L=json.load(sys.stdin)["clusters"][0]["layouts"][0]; print(int(L["alltoall_bytes"]), L["breakdown_s"]["alltoall"] > 0)'
}
got=$(a2a table "$E/this-machine-netns-1g.toml"); want="$((2 * 13 * 1024 * 256)) True"
[ "$got" = "$want" ] && echo "ok   table-wise all-to-all bytes: $got" || fail "table-wise all-to-all bytes: $got (want $want)"
got=$(a2a row "$E/this-machine-netns-1g.toml"); want="$((2 * 26 * 1024 * 256)) True"
[ "$got" = "$want" ] && echo "ok   row-wise all-to-all bytes: $got" || fail "row-wise all-to-all bytes: $got (want $want)"
got=$(a2a table "$E/this-machine.toml"); want="0 False"
[ "$got" = "$want" ] && echo "ok   one rank: no all-to-all" || fail "one rank: $got (want $want)"

# 4. On the 1 Gbit/s emulated cluster the search keeps tables whole (the
# row-wise all-to-all moves twice the bytes); --explain names the terms.
out=$("$tessera" plan --model dlrm-500m --cluster "$E/this-machine-netns-1g.toml" --explain 2>&1)
[ -n "$(echo "$out" | grep -E '^  1 +table-wise')" ] && echo "ok   1 Gbit/s: table-wise first" || { fail "1 Gbit/s: table-wise should come first"; echo "$out"; }
for t in lookup update alltoall allreduce mem.tables; do
  [ -n "$(echo "$out" | grep -E "^ +$t ")" ] || fail "--explain lacks the term $t"
done

# 5. A train config gives the same job as the flags: tables from the shard's
# header (3 tables, hash size 500, 13 dense), rows from model.table_rows.
"$tessera" synth clicks --rows 200 --tables 3 --cardinality 50 --out "$tmp/c.tsv" >/dev/null 2>&1 &&
  "$tessera" prepare --format criteo --tables 3 --hash-size 500 --input "$tmp/c.tsv" --out "$tmp/s" >/dev/null 2>&1 ||
  fail "synth/prepare"
from_config=$("$tessera" plan --config "$root/configs/dlrm_500m.toml" --set data.train="$tmp/s/train.bin" \
  --set train.steps=10 --cluster "$A4" --json | python3 -c 'import json,sys; j=json.load(sys.stdin); m=j["model"]; print(m["tables"], m["table_rows"][0], m["dense"], m["global_batch"], int(j["samples"]), j["clusters"][0]["layouts"][0]["step_s"])')
from_flags=$("$tessera" plan --model dlrm-500m --tables 3 --samples 20480 --cluster "$A4" --json |
  python3 -c 'import json,sys; j=json.load(sys.stdin); m=j["model"]; print(m["tables"], m["table_rows"][0], m["dense"], m["global_batch"], int(j["samples"]), j["clusters"][0]["layouts"][0]["step_s"])')
[ -n "$from_config" ] && [ "$from_config" = "$from_flags" ] && echo "ok   config = flags: $from_config" ||
  fail "config gives '$from_config', flags '$from_flags'"

[ $failures -eq 0 ] && echo "all DLRM plan checks passed" || { echo "$failures failure(s)"; exit 1; }
