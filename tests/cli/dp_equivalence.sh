#!/usr/bin/env bash
# Data parallelism on MPI gives the same training as one rank with the same
# global batch: dp=2 vs grad_accum=2, dp=2 x grad_accum=2 vs grad_accum=4,
# ZeRO-1 vs plain dp. Each distributed run also checks at its end that the
# parameters are bit-identical across ranks (xxhash64), or fails.
set -euo pipefail
tessera=$1; tests=$2
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
source "$tests/cli/dp_common.inc"
run() { local out=$1; shift; "$@" --set "log.metrics=$tmp/$out.jsonl" --set "checkpoint.dir=$tmp/$out" >"$tmp/$out.log" 2>&1 || { cat "$tmp/$out.log"; exit 1; }; }

run dp1_ga2 "$tessera" train --config "$tmp/cfg.toml" --set train.micro_batch=4 --set train.grad_accum=2
run dp2_ga1 mpirun_np 2 "$tessera" train --config "$tmp/cfg.toml" --set train.micro_batch=4 --set parallel.dp=2
run dp1_ga4 "$tessera" train --config "$tmp/cfg.toml" --set train.micro_batch=2 --set train.grad_accum=4
run dp2_ga2 mpirun_np 2 "$tessera" train --config "$tmp/cfg.toml" --set train.micro_batch=2 --set train.grad_accum=2 --set parallel.dp=2
run dp2_zero mpirun_np 2 "$tessera" train --config "$tmp/cfg.toml" --set train.micro_batch=4 --set parallel.dp=2 --set parallel.zero=1
run dp4_zero mpirun_np 4 "$tessera" train --config "$tmp/cfg.toml" --set train.micro_batch=1 --set train.grad_accum=2 --set parallel.dp=4 --set parallel.zero=1

# fp32, different summation orders only: 1e-5 relative.
status=0
same_losses "$tmp/dp1_ga2.jsonl" "$tmp/dp2_ga1.jsonl" 1e-5 "dp=2 vs dp=1 x grad_accum=2" || status=1
same_losses "$tmp/dp1_ga4.jsonl" "$tmp/dp2_ga2.jsonl" 1e-5 "dp=2 x grad_accum=2 vs dp=1 x grad_accum=4" || status=1
same_losses "$tmp/dp2_ga1.jsonl" "$tmp/dp2_zero.jsonl" 1e-5 "ZeRO-1 vs plain dp=2" || status=1
same_losses "$tmp/dp1_ga4.jsonl" "$tmp/dp4_zero.jsonl" 1e-5 "dp=4 ZeRO-1 x grad_accum=2 vs dp=1 x grad_accum=4" || status=1
grep -q "ZeRO-1" "$tmp/dp2_zero.log" || { echo "ZeRO-1 run did not say so"; status=1; }
grep -q '"comm_ms"' "$tmp/dp2_ga1.jsonl" || { echo "no comm_ms in metrics"; status=1; }
exit $status
