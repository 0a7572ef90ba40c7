#!/usr/bin/env bash
# Errors the world causes (issue #12 item 6) end a command with one
# "tessera: error:" line naming what failed and exit 1: never an abort
# (exit 134), a std::bad_alloc or a core dump.
#   - CUDA asked for where there is none (a build without CUDA, or no GPU):
#     train (train.device = "cuda"), sample, serve and bench train
#     --backend cuda. Skipped on a machine with a GPU.
#   - Memory the process cannot get, under an address-space limit (ulimit -v)
#     the host-memory checks do not see: train's model, serve's KV cache
#     and HTTP request threads, bench train's model.
set -uo pipefail
tessera=$1; tests=$2
ref=$tests/reference
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
failures=0

# expect_fail NAME PATTERN -- command...: exit 1, one stderr line, matching PATTERN.
expect_fail() {
  local name=$1 pattern=$2; shift 3
  "$@" >"$tmp/out" 2>"$tmp/err"; local rc=$?
  local lines; lines=$(wc -l <"$tmp/err")
  if [ $rc -ne 1 ]; then
    echo "FAIL $name: exit $rc (want 1)"; tail -5 "$tmp/err"; failures=$((failures+1)); return
  fi
  if [ "$lines" -ne 1 ] || ! grep -qE "^tessera: error: .*$pattern" "$tmp/err"; then
    echo "FAIL $name: stderr should be one line matching /$pattern/, got:"; cat "$tmp/err"; failures=$((failures+1)); return
  fi
  echo "ok   $name: $(cat "$tmp/err")"
}

# expect_fail_last NAME PATTERN -- command...: exit 1, the last stderr line
# the error (serve says where it listens while it loads).
expect_fail_last() {
  local name=$1 pattern=$2; shift 3
  "$@" >"$tmp/out" 2>"$tmp/err"; local rc=$?
  if [ $rc -ne 1 ] || ! tail -1 "$tmp/err" | grep -qE "^tessera: error: .*$pattern" || [ "$(grep -c 'tessera: error' "$tmp/err")" -ne 1 ]; then
    echo "FAIL $name: exit $rc (want 1), stderr's last line should match /$pattern/, got:"; cat "$tmp/err"; failures=$((failures+1)); return
  fi
  echo "ok   $name: $(tail -1 "$tmp/err")"
}

printf 'the quick brown fox jumps over the lazy dog\n%.0s' {1..50} >"$tmp/doc.txt"
"$tessera" prepare --input "$tmp/doc.txt" --tokenizer byte --out "$tmp/bytes" --val-fraction 0 >/dev/null
cfg() {  # cfg NAME: a one-step CPU job with its own checkpoint folder
  printf '[model]\nlayers = 1\nheads = 4\ndim = 64\nvocab = 256\ncontext = 32\n[data]\ntrain = "%s"\n[train]\nmicro_batch = 2\nseq = 32\nsteps = 1\n[checkpoint]\ndir = "%s"\n' \
    "$tmp/bytes/train_000000.bin" "$tmp/run_$1" >"$tmp/$1.toml"
  echo "$tmp/$1.toml"
}

# --- CUDA where there is none.
nocuda="(CUDA backend is not compiled|no CUDA device)"
"$tessera" info >"$tmp/info.txt" 2>&1 || true
if grep -qE '^  cuda:[0-9]+:' "$tmp/info.txt"; then
  echo "skip cuda cases: a CUDA device is present"
else
  expect_fail train-cuda "has no usable CUDA device.*$nocuda|$nocuda" -- timeout 60 "$tessera" train --config "$(cfg cuda)" --set train.device=cuda
  expect_fail sample-cuda "--backend cuda: $nocuda" -- timeout 60 "$tessera" sample --weights "$ref/gpt2_tiny.safetensors" --tokens 4 --backend cuda
  expect_fail_last serve-cuda "$nocuda" -- timeout 60 "$tessera" serve --model "$ref/gpt2_tiny.safetensors" --port 0 --backend cuda
  expect_fail bench-train-cuda "$nocuda" -- timeout 60 "$tessera" bench train --backend cuda --layers 1 --heads 4 --dim 64 --vocab 256 --batch 1 --seq 16 --steps 1 --warmup 0
fi
# The full-recompute baseline is CPU-only: a usage mistake, one line.
expect_fail sample-no-cache-cuda "--no-cache runs on the CPU only|$nocuda" -- timeout 60 "$tessera" sample --weights "$ref/gpt2_tiny.safetensors" --tokens 4 --backend cuda --no-cache

# --- Out of memory under an address-space limit. Sanitizer builds cannot
# run under such a limit.
if ldd "$tessera" 2>/dev/null | grep -qE 'libasan|libtsan'; then
  echo "skip out-of-memory cases: sanitizer build"
else
  limited() { local kb=$1; shift; bash -c 'ulimit -v "$0" && exec "$@"' "$kb" "$@"; }
  oom="out of memory"
  # 1.3 GB of parameters (5 GB with gradients and AdamW moments: what the
  # host-memory plan checks) under a 1.5 GB limit the plan cannot see (the
  # binary maps about 1 GB of libraries): the allocation is what fails.
  big=$(cfg big)
  expect_fail train-oom "the parameters of L=1 NH=16 C=5120 V=256 maxT=32: cannot allocate a [0-9.]+ MB host arena: $oom" -- \
    limited 1500000 timeout 120 "$tessera" train --config "$big" --set model.heads=16 --set model.dim=5120
  expect_fail bench-train-oom "the parameters of L=1 NH=16 C=5120 V=256 maxT=16: cannot allocate a [0-9.]+ MB host arena: $oom" -- \
    limited 1500000 timeout 120 "$tessera" bench train --layers 1 --heads 16 --dim 5120 --vocab 256 --batch 1 --seq 16 --steps 1 --warmup 0 --peak-gflops 100
  # A KV cache of 4.7 GB (8 KB a block), under the host-memory check's figure
  # but over a 3 GB limit (2.3 GB was enough while cuBLASLt's mappings took
  # their share of the limit): a server that cannot allocate reports it, so that
  # whatever started it (a router's tier, a supervisor) can fall back. The
  # model: one step of a vocabulary the byte tokenizer fits. Few HTTP
  # threads (one per place in the batch and the queue), so that their
  # stacks fit under the limit.
  timeout 120 "$tessera" train --config "$(cfg small)" >"$tmp/train.log" 2>&1 || { cat "$tmp/train.log"; exit 1; }
  expect_fail_last serve-kv-oom "the KV cache \(600000 blocks of 16\): cannot allocate a [0-9.]+ MB host arena: $oom" -- \
    limited 3000000 timeout 60 "$tessera" serve --model "$tmp/run_small/model.safetensors" --port 0 --kv-blocks 600000 --max-seqs 1 --max-queue 1
  # Its HTTP request threads (one per place in the batch and the queue, 512
  # here) each reserve a stack: under a 2 GB limit they cannot all be made.
  # cpp-httplib's own pool threw into std::terminate from its listen thread.
  expect_fail_last serve-threads "cannot start 512 HTTP request threads \([0-9]+ started\)" -- \
    limited 2000000 timeout 60 "$tessera" serve --model "$tmp/run_small/model.safetensors" --port 0 --kv-blocks 64 --max-seqs 8 --max-queue 1000
fi

[ $failures -eq 0 ] || { echo "$failures failure(s)"; exit 1; }
echo "all world errors reported in one line"
