#!/usr/bin/env bash
# Bad input gets one clear error line on stderr, a non-zero exit, no crash.
set -uo pipefail
tessera=$1; tests=$2
ref=$tests/reference
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
failures=0

# expect_error NAME PATTERN -- command...: exit 1 or 2, one stderr line matching PATTERN.
expect_error() {
  local name=$1 pattern=$2; shift 3
  "$@" >"$tmp/out" 2>"$tmp/err"; local rc=$?
  local lines; lines=$(wc -l <"$tmp/err")
  if [ $rc -ne 1 ] && [ $rc -ne 2 ]; then
    echo "FAIL $name: exit $rc (want 1 or 2)"; cat "$tmp/err"; failures=$((failures+1)); return
  fi
  if [ "$lines" -ne 1 ] || ! grep -qiE "$pattern" "$tmp/err"; then
    echo "FAIL $name: stderr should be one line matching /$pattern/, got:"; cat "$tmp/err"; failures=$((failures+1)); return
  fi
  echo "ok   $name: $(cat "$tmp/err")"
}

# Weights of the wrong shape: a config.json that disagrees with the tensors.
mkdir -p "$tmp/wrong"; cp "$ref/gpt2_tiny.safetensors" "$tmp/wrong/"
sed 's/"n_embd": 64/"n_embd": 32/' "$ref/config.json" >"$tmp/wrong/config.json"
expect_error wrong-shape "shape" -- "$tessera" eval --weights "$tmp/wrong/gpt2_tiny.safetensors" --tokens "$ref/eval.bin" --batch 4 --seq 16

# Token ids >= vocab: byte tokens (up to 255) against a model with V=99.
printf 'the quick brown fox jumps over the lazy dog, zzzzzzzz ~~~~ {{{{ }}}} ||||\n%.0s' {1..4} >"$tmp/doc.txt"
"$tessera" prepare --input "$tmp/doc.txt" --tokenizer byte --out "$tmp/bytes" --val-fraction 0 >/dev/null
expect_error token-out-of-vocab "outside the vocabulary" -- "$tessera" eval --weights "$ref/gpt2_tiny.safetensors" --tokens "$tmp/bytes/train_000000.bin" --batch 1 --seq 16

# T > context.
expect_error seq-over-context "context" -- "$tessera" eval --weights "$ref/gpt2_tiny.safetensors" --tokens "$ref/eval.bin" --batch 1 --seq 64

# Unknown flags.
expect_error unknown-flag "bogus" -- "$tessera" eval --bogus --weights "$ref/gpt2_tiny.safetensors" --tokens "$ref/eval.bin"
expect_error unknown-command "unknown command .train2." -- "$tessera" train2
# The KV cache's element type: a value it does not take, and fp16 on CUDA
# (refused before a model is loaded or a GPU looked for).
expect_error kv-dtype-value "kv-dtype: bf16 not in \{fp32,f16\}" -- "$tessera" serve --model "$ref/gpt2_tiny.safetensors" --kv-dtype bf16
expect_error kv-dtype-cuda "kv-dtype f16 runs on the CPU \(the CUDA kernels read an fp32 cache\)" -- "$tessera" serve --model "$ref/gpt2_tiny.safetensors" --backend cuda --kv-dtype f16

# Truncated weights and token files.
head -c 1000 "$ref/gpt2_tiny.safetensors" >"$tmp/wrong/trunc.safetensors"; cp "$ref/config.json" "$tmp/wrong/"
expect_error truncated-weights "trunc.safetensors" -- "$tessera" eval --weights "$tmp/wrong/trunc.safetensors" --tokens "$ref/eval.bin"
head -c 1100 "$ref/eval.bin" >"$tmp/trunc.bin"
expect_error truncated-tokens "trunc.bin" -- "$tessera" eval --weights "$ref/gpt2_tiny.safetensors" --tokens "$tmp/trunc.bin" --batch 1 --seq 16
head -c 100 "$ref/eval.bin" >"$tmp/short.bin"
expect_error header-only "short.bin" -- "$tessera" eval --weights "$ref/gpt2_tiny.safetensors" --tokens "$tmp/short.bin"

# Too few tokens for one batch.
expect_error too-few-tokens "fewer than one batch" -- "$tessera" eval --weights "$ref/gpt2_tiny.safetensors" --tokens "$ref/eval.bin" --batch 16 --seq 16

# Config typos, wrong types and unsupported layouts in `tessera train`.
printf '[model]\nlayers = 1\n[data]\ntrain = "%s"\n[train]\nsteps = 1\n[checkpoint]\ndir = "%s"\n' "$tmp/bytes/train_000000.bin" "$tmp/run" >"$tmp/ok.toml"
expect_error config-typo "did you mean 'train.micro_batch'" -- "$tessera" train --config "$tmp/ok.toml" --set train.micro_bach=4
expect_error config-type "must be an integer" -- "$tessera" train --config "$tmp/ok.toml" --set train.steps=many
expect_error tp-heads "model.heads .4. must be divisible by parallel.tp .3." -- "$tessera" train --config "$tmp/ok.toml" --set parallel.tp=3
expect_error pp-layers "parallel.pp .2. exceeds model.layers .1." -- "$tessera" train --config "$tmp/ok.toml" --set parallel.pp=2
expect_error stages-count "parallel.stages lists 2 stage.s. but parallel.pp is 1" -- "$tessera" train --config "$tmp/ok.toml" --set parallel.stages=2,1
expect_error stages-item "\"x\" is not a positive layer count" -- "$tessera" train --config "$tmp/ok.toml" --set parallel.stages=1,x
expect_error schedule "parallel.schedule must be" -- "$tessera" train --config "$tmp/ok.toml" --set parallel.schedule=zigzag
expect_error on-busy "checkpoint.on_busy must be .wait. or .skip., got .maybe." -- "$tessera" train --config "$tmp/ok.toml" --set checkpoint.on_busy=maybe
expect_error resume-missing "$tmp/none: not a checkpoint" -- "$tessera" train --config "$tmp/ok.toml" --resume "$tmp/none"
expect_error export-missing "$tmp/none: not a checkpoint" -- "$tessera" export "$tmp/none" --out "$tmp/x.safetensors"
"$tessera" train --config "$tmp/ok.toml" --set checkpoint.every=1 --set "checkpoint.dir=$tmp/ck1" >/dev/null 2>&1
expect_error resume-other-model "holds a model L=1 .* but the config asks for L=2" -- "$tessera" train --config "$tmp/ok.toml" --set model.layers=2 --set "checkpoint.dir=$tmp/ck1" --resume latest
expect_error dp-without-launch "1 rank.s. are running" -- "$tessera" train --config "$tmp/ok.toml" --set parallel.dp=2
# A model too big for memory (about 1.6 TB of parameters): refused by the
# memory plan before any allocation (it was an abort, exit 134, then the
# arena's out-of-memory line); the arena's own error is the gtests' to check.
expect_error model-too-big "the job needs at least [0-9.]+ GB .*params 1649.4 GB" -- "$tessera" train --config "$tmp/ok.toml" --set model.layers=8 --set model.heads=1 --set model.dim=65536
printf '[model]\nlayers = \n' >"$tmp/broken.toml"
expect_error config-syntax "broken.toml:2" -- "$tessera" train --config "$tmp/broken.toml"

# --- Issue #18, item 1's safety net: a std::filesystem exception or std::bad_alloc
# that escapes a command is one line and exit 1, not terminate (exit 134).
# A model path longer than NAME_MAX makes std::filesystem::is_directory throw.
expect_error filesystem-exception "filesystem error.*File name too long" -- "$tessera" serve --model "$tmp/$(printf 'a%.0s' {1..300})" --port 0
# An 8 GB (sparse) weights file read whole under a 2 GB address-space limit.
# Sanitizer builds cannot run under such a limit.
if ! ldd "$tessera" 2>/dev/null | grep -qE 'libasan|libtsan'; then
  truncate -s 8G "$tmp/huge.safetensors"
  expect_error bad-alloc "out of memory" -- bash -c 'ulimit -v 2000000 && exec "$@"' _ "$tessera" eval --weights "$tmp/huge.safetensors" --tokens "$ref/eval.bin"
  rm -f "$tmp/huge.safetensors"
fi

# --- Issue #18, item 8: values that cannot train, refused when the config is
# read. Nothing may reach stdout (no model line, no step) before a refusal.
expect_early() {  # NAME PATTERN -- command...: expect_error, and an empty stdout
  expect_error "$@"
  if [ -s "$tmp/out" ]; then echo "FAIL $1: it started before refusing:"; head -3 "$tmp/out"; failures=$((failures+1)); fi
}
expect_early beta2 "train.beta2 must be in \[0, 1\), got 2" -- "$tessera" train --config "$tmp/ok.toml" --set train.beta2=2.0
expect_early beta1 "train.beta1 must be in \[0, 1\), got 1" -- "$tessera" train --config "$tmp/ok.toml" --set train.beta1=1.0
expect_early warmup-over-steps "train.warmup .2. exceeds train.steps .1." -- "$tessera" train --config "$tmp/ok.toml" --set train.warmup=2
expect_early stop-at-over-steps "train.stop_at .2. exceeds train.steps .1." -- "$tessera" train --config "$tmp/ok.toml" --set train.stop_at=2
expect_early ckpt-dir-empty "checkpoint.dir is empty" -- "$tessera" train --config "$tmp/ok.toml" --set checkpoint.dir=

# --- Issue #18, item 1: a job that cannot fit in the host's memory (these
# were OOM-killed or aborted) is refused before anything is allocated, in
# one line giving what it needs and what the host has.
fit="the job needs at least [0-9.]+ GB \(this rank at least [0-9.]+ GB: params .*\) but .* has [0-9.]+ GB \((physical memory|the cgroup's memory limit)\)"
expect_error too-many-layers "$fit" -- timeout 60 "$tessera" train --config "$tmp/ok.toml" --set model.layers=100000
expect_error too-wide "$fit" -- timeout 60 "$tessera" train --config "$tmp/ok.toml" --set model.dim=65536 --set model.heads=1
expect_error too-long-context "$fit" -- timeout 60 "$tessera" train --config "$tmp/ok.toml" --set model.context=1000000000
# grad_accum=1e9 was OOM-killed listing 2e9 pipeline ops: refused when read.
expect_early grad-accum-huge "'train.grad_accum' must be <= 262144, got 1000000000" -- timeout 20 "$tessera" train --config "$tmp/ok.toml" --set train.grad_accum=1000000000

# --- Issue #18, item 1: a safetensors header of 50 MB of '[' took 3.8 GB and
# 15 s before its error; now its nesting is counted before the JSON parser
# builds anything: one line, in seconds, under a 2 GB address-space limit.
# And a config.json saying n_layer=100000 beside a 2-layer file allocated
# about 10 GB before a tensor was found missing; now the tensors are checked
# against the config first (eval, sample and serve load the same way).
limited() { bash -c 'ulimit -v 2000000 && exec "$@"' _ "$@"; }
if ! ldd "$tessera" 2>/dev/null | grep -qE 'libasan|libtsan'; then
  mkdir -p "$tmp/nest"; cp "$ref/config.json" "$tmp/nest/"
  python3 -c "import struct,sys; n=50_000_000; sys.stdout.buffer.write(struct.pack('<Q', n) + b'[' * n)" >"$tmp/nest/deep.safetensors"
  t0=$(date +%s%N)
  expect_error nested-header "deep.safetensors: header is not a safetensors header: JSON nests deeper than 3 level.s. at byte 3" -- limited timeout 20 "$tessera" eval --weights "$tmp/nest/deep.safetensors" --tokens "$ref/eval.bin"
  ms=$(( ($(date +%s%N) - t0) / 1000000 ))
  if [ $ms -gt 5000 ]; then echo "FAIL nested-header: took ${ms} ms (want under 5 s)"; failures=$((failures+1)); fi
  rm -f "$tmp/nest/deep.safetensors"
  cp "$ref/gpt2_tiny.safetensors" "$tmp/nest/"
  sed 's/"n_layer": 2/"n_layer": 100000/' "$ref/config.json" >"$tmp/nest/config.json"
  layers="gpt2_tiny.safetensors: the model \\(L=100000.*\\) has 100000 layer.s. but the file holds 2 \\(h.0 .. h.1\\) \\(the shape is from .*config.json\\)"
  expect_error eval-config-layers "$layers" -- limited timeout 20 "$tessera" eval --weights "$tmp/nest/gpt2_tiny.safetensors" --tokens "$ref/eval.bin"
  expect_error sample-config-layers "$layers" -- limited timeout 20 "$tessera" sample --weights "$tmp/nest/gpt2_tiny.safetensors" --tokens 1
  # (serve's threads do not start under the address-space limit: no ulimit)
  timeout 20 "$tessera" serve --model "$tmp/nest/gpt2_tiny.safetensors" --port 0 >/dev/null 2>"$tmp/err"; rc=$?
  if [ $rc -eq 1 ] && tail -1 "$tmp/err" | grep -qE "$layers"; then
    echo "ok   serve-config-layers: $(tail -1 "$tmp/err")"
  else
    echo "FAIL serve-config-layers: exit $rc"; cat "$tmp/err"; failures=$((failures+1))
  fi
  sed 's/"n_embd": 64/"n_embd": 65536/' "$ref/config.json" >"$tmp/nest/config.json"
  expect_error eval-config-wide "tensor '(transformer.)?wte.weight' has shape \\[99, 64\\], the model .* needs \\[99, 65536\\]" -- limited timeout 20 "$tessera" eval --weights "$tmp/nest/gpt2_tiny.safetensors" --tokens "$ref/eval.bin"
fi

# --- Issue #18, item 8: a token id >= vocab late in a shard (token 1500 of
# 2000: one step may never draw it) is reported when the shard is opened,
# naming the shard file, not the glob, with its place in the file; for
# data.val as for data.train.
mkdir -p "$tmp/vbad"
python3 - "$tmp/vbad/bad_000000.bin" <<'PY'
import struct, sys
tokens = [97] * 2000
tokens[1500] = 250
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256i", 20240520, 1, len(tokens), *([0] * 253)))
    f.write(struct.pack("<%dH" % len(tokens), *tokens))
PY
expect_early train-token-over-vocab "$tmp/vbad/bad_000000.bin: token id 250 at token 1500 \(byte offset 4024\) is outside the vocabulary \[0, 200\) \(does model.vocab match" -- "$tessera" train --config "$tmp/ok.toml" --set "checkpoint.dir=$tmp/ck_ok" --set model.vocab=200 --set "data.train=$tmp/vbad/bad_*.bin"
expect_early val-token-over-vocab "$tmp/vbad/bad_000000.bin: token id 250 at token 1500 .* \(does model.vocab match" -- "$tessera" train --config "$tmp/ok.toml" --set "checkpoint.dir=$tmp/ck_ok" --set model.vocab=200 --set "data.val=$tmp/vbad/bad_*.bin"

# --- Issue #18, item 3: only regular files are inputs. A FIFO with no writer used to
# block open() forever (hence `timeout`: a hang fails as exit 124).
mkfifo "$tmp/fifo"
mkdir -p "$tmp/fifos" "$tmp/dirshard.bin"; mkfifo "$tmp/fifos/val_000000.bin"
expect_error fifo-eval-weights "$tmp/fifo: is a FIFO, not a regular file" -- timeout 20 "$tessera" eval --weights "$tmp/fifo" --tokens "$ref/eval.bin"
expect_error fifo-eval-tokens "$tmp/fifo: is a FIFO, not a regular file" -- timeout 20 "$tessera" eval --weights "$ref/gpt2_tiny.safetensors" --tokens "$tmp/fifo"
expect_error device-eval-tokens "/dev/zero: is a character device, not a regular file" -- timeout 20 "$tessera" eval --weights "$ref/gpt2_tiny.safetensors" --tokens /dev/zero
expect_error fifo-sample-weights "$tmp/fifo: is a FIFO, not a regular file" -- timeout 20 "$tessera" sample --weights "$tmp/fifo" --tokens 1
expect_error fifo-train-data "$tmp/fifo: is a FIFO, not a regular file" -- timeout 20 "$tessera" train --config "$tmp/ok.toml" --set "checkpoint.dir=$tmp/ck_ok" --set "data.train=$tmp/fifo"
expect_error fifo-val-glob "$tmp/fifos/val_000000.bin: is a FIFO, not a regular file" -- timeout 20 "$tessera" train --config "$tmp/ok.toml" --set "checkpoint.dir=$tmp/ck_ok" --set "data.val=$tmp/fifos/val_*.bin"
expect_error folder-train-data "$tmp/dirshard.bin: is a folder, not a regular file" -- timeout 20 "$tessera" train --config "$tmp/ok.toml" --set "checkpoint.dir=$tmp/ck_ok" --set "data.train=$tmp/dirshard.bin"
expect_error fifo-init-from "$tmp/fifo: is a FIFO, not a regular file" -- timeout 20 "$tessera" train --config "$tmp/ok.toml" --set "checkpoint.dir=$tmp/ck_ok" --set "model.init_from=$tmp/fifo"
expect_error fifo-config "$tmp/fifo: is a FIFO, not a regular file" -- timeout 20 "$tessera" train --config "$tmp/fifo"
# serve prints its "listening" line first: the error is its last line.
timeout 20 "$tessera" serve --model "$tmp/fifo" --port 0 >/dev/null 2>"$tmp/err"; rc=$?
if [ $rc -eq 1 ] && tail -1 "$tmp/err" | grep -q "$tmp/fifo: is a FIFO, not a regular file"; then
  echo "ok   fifo-serve-model: $(tail -1 "$tmp/err")"
else
  echo "FAIL fifo-serve-model: exit $rc"; cat "$tmp/err"; failures=$((failures+1))
fi

# --- Issue #18, item 1: the memory check of serving: weights + KV cache
# against the host's memory, refused with both figures before the cache is
# allocated (a cache larger than the host used to be an allocation failure
# or an OOM kill). serve prints its "listening" line first: the error is its last.
serve_refuses() {  # NAME PATTERN serve-args...
  local name=$1 pattern=$2; shift 2
  timeout 30 "$tessera" serve --model "$ref/gpt2_tiny.safetensors" --port 0 "$@" >/dev/null 2>"$tmp/err"; local rc=$?
  if [ $rc -eq 1 ] && tail -1 "$tmp/err" | grep -qE "$pattern"; then
    echo "ok   $name: $(tail -1 "$tmp/err")"
  else
    echo "FAIL $name: exit $rc"; cat "$tmp/err"; failures=$((failures+1))
  fi
}
serve_fit="needs [0-9.]+ GB \\(weights [0-9.]+ GB, KV cache [0-9.]+ GB: [0-9]+ blocks of 16 positions\\) but this host has [0-9.]+ GB \\((physical memory|the cgroup's memory limit)\\)"
# The largest values the flags take: 2^24 blocks (275 GB for this model), 10 TB.
if [ "$(awk '/MemTotal/ {print $2}' /proc/meminfo)" -lt 250000000 ]; then
  serve_refuses serve-kv-blocks "gpt2_tiny $serve_fit" --kv-blocks 16777216
fi
serve_refuses serve-kv-memory "gpt2_tiny $serve_fit" --kv-memory 10000000

# --- Issue #18, item 2: outputs checked at start-up, before anything trains.
# Each used to train every step and then die of an uncaught
# std::filesystem::filesystem_error (exit 134), or to fail only at the end.
echo x >"$tmp/afile"
expect_early ckpt-dir-is-a-file "checkpoint.dir: $tmp/afile: is a regular file, not a folder" -- "$tessera" train --config "$tmp/ok.toml" --set "checkpoint.dir=$tmp/afile"
expect_early ckpt-dir-uncreatable "checkpoint.dir: $tmp/afile/sub: cannot create the folder: Not a directory" -- "$tessera" train --config "$tmp/ok.toml" --set "checkpoint.dir=$tmp/afile/sub"
# A folder that takes no new files, even for root.
expect_early ckpt-dir-unwritable "checkpoint.dir: /proc/self: cannot create files in the folder" -- "$tessera" train --config "$tmp/ok.toml" --set checkpoint.dir=/proc/self
if [ "$(id -u)" != 0 ]; then  # permission bits do not stop root
  mkdir -p "$tmp/ro"; chmod 555 "$tmp/ro"
  expect_early ckpt-dir-read-only "checkpoint.dir: $tmp/ro: cannot create files in the folder" -- "$tessera" train --config "$tmp/ok.toml" --set "checkpoint.dir=$tmp/ro"
  chmod 755 "$tmp/ro"
fi
expect_early metrics-uncreatable-folder "log.metrics: $tmp/afile: cannot create the folder" -- "$tessera" train --config "$tmp/ok.toml" --set "checkpoint.dir=$tmp/ck_ok" --set "log.metrics=$tmp/afile/m.jsonl"
expect_early metrics-is-a-folder "log.metrics: $tmp: cannot open for writing" -- "$tessera" train --config "$tmp/ok.toml" --set "checkpoint.dir=$tmp/ck_ok" --set "log.metrics=$tmp"
expect_error export-out-is-a-folder "out: $tmp: is a folder, not a regular file" -- "$tessera" export "$tmp/ck1" --out "$tmp"
expect_error export-out-under-a-file "out: $tmp/afile: is a regular file, not a folder" -- "$tessera" export "$tmp/ck1" --out "$tmp/afile/x.safetensors"
expect_error export-out-unwritable "out: /proc/self: cannot create files in the folder" -- "$tessera" export "$tmp/ck1" --out /proc/self/x.safetensors

[ $failures -eq 0 ] || { echo "$failures failure(s)"; exit 1; }
echo "all bad-input cases gave one clear line"
