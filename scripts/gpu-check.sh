#!/usr/bin/env bash
# The GPU check: on a machine with NVIDIA GPUs (written for one H200, 16
# cores, no network), from a copy of this tree:
#   packages   scripts/setup.sh --packages-only (apt-get only if some are missing)
#   toolkit    nvidia-smi, nvcc, the NCCL header/library
#   configure  cmake, TESSERA_CUDA=ON, into build/gpu (sm_XX of the GPU found)
#   build      tessera, tessera_tests, tessera_mpi_tests
#   info       tessera info (devices, NCCL)
#   cuda-tests tessera_tests --gtest_filter='*Cuda*:*cuda*:-*CudaDlrm*' (device API, every kernel
#              of the op table vs the oracle, the DLRM ops' included; GPT on CUDA vs the CPU and
#              vs the PyTorch reference)
#   cuda-dlrm  tessera_tests --gtest_filter='*CudaDlrm*': what only the DLRM kernels on CUDA promise
#              (a deterministic sparse backward, batches with no ids) and the sparse optimizers
#   nccl-np1   tessera_mpi_tests --gtest_filter='Nccl*' at -np 1
#   nccl-npN   the same at -np N, N = min(GPUs, 4), when there are 2 or more
#   cuda-train tests/cli/cuda_train.sh: train.device = "cuda", bitwise checkpoint
#              resume and ZeRO-1 on one GPU; with 2+ GPUs also dp=2 over NCCL vs
#              dp=1, ZeRO-1 vs plain, and a dp=2 resume
#   cuda-serve tests/cli/cuda_serve.sh: serve --backend cuda's greedy text against the
#              CPU's, alone and 8 at once; NVML gauges from a CUDA training rank
#   doctor     tessera doctor --quick --save $OUT/profile.json (the GPU checks: launch
#              latency, PCIe pinned/pageable, device bandwidth, bf16 GEMM, allocation)
#   bench-train  tessera bench train, GPT-2 124M shapes (B=16, T=1024, bf16),
#              with --backend cuda if `bench train --help` lists it; else
#              recorded as not available (the CPU run is not a GPU check)
#   bench-allreduce  tessera bench allreduce --backend nccl at -np 1 (and -np N)
#   bench-dlrm-ops  tessera bench dlrm-ops --backend cuda --json (lookup GB/s vs a device
#              copy, sparse backward, Adagrad, interaction), if its --help lists --backend
# Every step has a timeout and the script goes on past a failing one; the
# whole run stays under ~8 minutes (later steps get what is left of a 470 s
# budget). Logs and a summary (summary.txt, summary.json) go to $OUT when
# set, else ./gpu-check-out. Exit status 0 when no step failed or timed out.
set -uo pipefail
cd "$(dirname "$0")/.."
root="$(pwd)"
out="${OUT:-$root/gpu-check-out}"
mkdir -p "$out"
build="${GPU_CHECK_BUILD_DIR:-$root/build/gpu}"
budget_s=${GPU_CHECK_BUDGET_S:-470}
t_start=$(date +%s)
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}
mpirun_cmd=(mpirun --allow-run-as-root --oversubscribe -x OMP_NUM_THREADS -x NCCL_DEBUG)

names=() statuses=() secs=() notes=()
record() {  # name status seconds note
  names+=("$1") statuses+=("$2") secs+=("$3") notes+=("$4")
  printf '%-16s %-7s %5ss  %s\n' "$1" "$2" "$3" "$4" | tee -a "$out/progress.txt"
}
left() { echo $(( budget_s - ($(date +%s) - t_start) )); }

# step NAME LIMIT_S CMD...: runs CMD with its output in $out/NAME.log, under
# min(LIMIT_S, what is left of the budget). Sets $step_rc.
step() {
  local name="$1" limit="$2"
  shift 2
  local remaining
  remaining=$(left)
  if [ "$remaining" -lt 15 ]; then
    record "$name" SKIP 0 "no time left in the ${budget_s} s budget"
    step_rc=125
    return
  fi
  [ "$limit" -gt "$remaining" ] && limit=$remaining
  local t0
  t0=$(date +%s)
  echo "\$ $*" >"$out/$name.log"
  timeout --kill-after=10 "$limit" "$@" >>"$out/$name.log" 2>&1
  step_rc=$?
  local dt=$(( $(date +%s) - t0 ))
  if [ $step_rc -eq 0 ]; then
    record "$name" PASS "$dt" "${step_note:-}"
  elif [ $step_rc -eq 124 ] || [ $step_rc -eq 137 ]; then
    record "$name" TIMEOUT "$dt" "killed after ${limit} s; see $name.log"
  else
    record "$name" FAIL "$dt" "exit $step_rc; $(grep -m1 -iE 'error|fail' "$out/$name.log" | cut -c1-160)"
  fi
  step_note=""
}

echo "gpu-check: logs in $out" | tee "$out/progress.txt"

# ---- packages and toolkit ----------------------------------------------------
step packages 120 bash scripts/setup.sh --packages-only

nvcc=""
for c in "${CUDACXX:-}" "$(command -v nvcc 2>/dev/null)" /usr/local/cuda/bin/nvcc; do
  [ -n "$c" ] && [ -x "$c" ] && nvcc="$c" && break
done
{
  echo "\$ nvidia-smi"; timeout 30 nvidia-smi 2>&1
  echo "\$ nvcc --version"; [ -n "$nvcc" ] && "$nvcc" --version 2>&1
  echo "\$ nccl"; ls /usr/local/cuda/include/nccl.h /usr/include/nccl.h /usr/local/cuda/lib*/libnccl.so* \
                     /usr/lib/x86_64-linux-gnu/libnccl.so* 2>/dev/null
} >"$out/toolkit.log" 2>&1
gpus=$(timeout 30 nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
gpus=${gpus:-0}
cc=$(timeout 30 nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .')
if [ -z "$nvcc" ]; then
  record toolkit FAIL 0 "no nvcc (CUDA toolkit) found; see toolkit.log"
elif [ "$gpus" -eq 0 ]; then
  record toolkit FAIL 0 "nvidia-smi lists no GPU; see toolkit.log"
else
  record toolkit PASS 0 "$gpus GPU(s), compute capability ${cc:-?}, $("$nvcc" --version | grep -o 'release [0-9.]*')"
fi

# ---- configure and build -----------------------------------------------------
archs=""
[[ "$cc" =~ ^[0-9]+$ ]] && archs="-DTESSERA_CUDA_ARCHITECTURES=${cc}-real"  # only this GPU's code: half the nvcc time
cmake_args=(-S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DTESSERA_CUDA=ON -DTESSERA_BUILD_BENCH=OFF)
command -v ninja >/dev/null && [ ! -f "$build/CMakeCache.txt" ] && cmake_args+=(-G Ninja)
[ -n "$nvcc" ] && cmake_args+=(-DCMAKE_CUDA_COMPILER="$nvcc")
[ -n "$archs" ] && cmake_args+=("$archs")
step configure 90 cmake "${cmake_args[@]}"
nccl_line=$(grep -m1 'NCCL communicator:' "$out/configure.log" | sed 's/^-- //')
[ -n "$nccl_line" ] && echo "  $nccl_line" | tee -a "$out/progress.txt"

step_note="$(nproc) jobs"
step build 330 cmake --build "$build" -j"$(nproc)" --target tessera tessera_tests tessera_mpi_tests
tessera="$build/tessera"

# ---- tests -------------------------------------------------------------------
step info 30 "$tessera" info

# Skipped tests mean there was no device (or no NCCL): a pass, but say so.
skipped_note() {
  local n
  n=$(grep -m1 -oE '\[  SKIPPED \] [0-9]+ test' "$out/$1.log" 2>/dev/null | grep -oE '[0-9]+')
  # The last reason given (the first may be a test that skips because NCCL *is* compiled).
  [ -n "$n" ] && echo "$n test(s) skipped: $(grep -A1 'Skipped$' "$out/$1.log" | grep -v -e 'Skipped$' -e '^--$' |
                                              tail -1 | cut -c1-140)"
}
step cuda-tests 120 "$build/tests/tessera_tests" --gtest_filter='*Cuda*:*cuda*:-*CudaDlrm*' --gtest_color=no
s=$(skipped_note cuda-tests); [ -n "$s" ] && notes[${#notes[@]}-1]="$s"

step cuda-dlrm 60 "$build/tests/tessera_tests" --gtest_filter='*CudaDlrm*' --gtest_color=no
s=$(skipped_note cuda-dlrm); [ -n "$s" ] && notes[${#notes[@]}-1]="$s"

step nccl-np1 120 "${mpirun_cmd[@]}" -np 1 "$build/tests/tessera_mpi_tests" --gtest_filter='Nccl*' --gtest_color=no
s=$(skipped_note nccl-np1); [ -n "$s" ] && notes[${#notes[@]}-1]="$s"
np=$(( gpus < 4 ? gpus : 4 ))
if [ "$np" -ge 2 ]; then
  step "nccl-np$np" 150 "${mpirun_cmd[@]}" -np "$np" "$build/tests/tessera_mpi_tests" --gtest_color=no
else
  record nccl-npN SKIP 0 "$gpus GPU(s): NCCL needs one device per rank, so only -np 1 runs"
fi

step cuda-train 150 bash tests/cli/cuda_train.sh "$tessera" tests
s=$(grep -m1 '^skip:' "$out/cuda-train.log" | cut -c1-140); [ -n "$s" ] && notes[${#notes[@]}-1]="$s"

step cuda-serve 120 bash tests/cli/cuda_serve.sh "$tessera" tests
s=$(grep -m1 -e '^skip:' -e '^note' "$out/cuda-serve.log" | cut -c1-140); [ -n "$s" ] && notes[${#notes[@]}-1]="$s"

step doctor 120 "$tessera" doctor --quick --save "$out/profile.json" --dir "$build"

# ---- benchmarks --------------------------------------------------------------
# GPT-2 124M: 12 layers, 12 heads, 768 channels, vocab 50257; micro-batch 16 x 1024 tokens, bf16.
gpt2_124m=(--layers 12 --heads 12 --dim 768 --vocab 50257 --batch 16 --seq 1024 --dtype bf16 --steps 10 --warmup 2)
"$tessera" bench train --help >"$out/bench-train-help.log" 2>&1
if grep -q -- '--backend' "$out/bench-train-help.log"; then
  step bench-train 150 "$tessera" bench train "${gpt2_124m[@]}" --backend cuda
  grep '^{' "$out/bench-train.log" | tail -1 >"$out/bench-train.json"
else
  record bench-train SKIP 0 "not available: 'tessera bench train --help' lists no --backend (the CUDA model path is not built yet)"
fi

step bench-allreduce 90 "${mpirun_cmd[@]}" -np 1 "$tessera" bench allreduce --backend nccl -b 8 -e 512M -f 4 -n 20 -w 5 -c 1
if [ "$np" -ge 2 ]; then
  step "bench-allreduce-np$np" 90 "${mpirun_cmd[@]}" -np "$np" "$tessera" bench allreduce --backend nccl \
    -b 8 -e 512M -f 4 -n 20 -w 5 -c 1
fi

# The DLRM sparse ops: 26 tables of 150k x 64 (1 GB), batch 2048 and 65536.
"$tessera" bench dlrm-ops --help >"$out/bench-dlrm-ops-help.log" 2>&1
if grep -q -- '--backend' "$out/bench-dlrm-ops-help.log"; then
  step bench-dlrm-ops 60 bash -c '"$0" bench dlrm-ops --backend cuda --json &&
    "$0" bench dlrm-ops --backend cuda --json --batch 65536' "$tessera"
  grep '^{' "$out/bench-dlrm-ops.log" >"$out/bench-dlrm-ops.json"
else
  record bench-dlrm-ops SKIP 0 "not available: 'tessera bench dlrm-ops --help' lists no --backend"
fi

# ---- summary -----------------------------------------------------------------
total=$(( $(date +%s) - t_start ))
bad=0
{
  echo "gpu-check summary ($(date -u +%Y-%m-%dT%H:%M:%SZ), ${total} s, $gpus GPU(s))"
  [ -n "${nccl_line:-}" ] && echo "$nccl_line"
  for i in "${!names[@]}"; do
    printf '%-20s %-7s %5ss  %s\n' "${names[$i]}" "${statuses[$i]}" "${secs[$i]}" "${notes[$i]}"
    case "${statuses[$i]}" in FAIL | TIMEOUT) bad=$((bad + 1)) ;; esac
  done
  echo "$bad step(s) failed or timed out"
} >"$out/summary.txt"
{
  printf '{"seconds": %d, "gpus": %d, "failed": %d, "steps": [' "$total" "$gpus" "$bad"
  for i in "${!names[@]}"; do
    note=${notes[$i]//\\/\\\\}
    note=${note//\"/\\\"}
    printf '%s{"name": "%s", "status": "%s", "seconds": %s, "note": "%s"}' "$([ "$i" -gt 0 ] && echo ', ')" \
      "${names[$i]}" "${statuses[$i]}" "${secs[$i]}" "$note"
  done
  printf ']}\n'
} >"$out/summary.json"
echo
cat "$out/summary.txt"
[ "$bad" -eq 0 ]
