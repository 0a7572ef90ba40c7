#!/bin/bash
# ThreadSanitizer run of the CPU matmul's thread test
# (tests/kernels/matmul_threads_test.cc), built apart from the CMake tree:
#   bash scripts/tsan-matmul.sh        # from the repository root
# Tessera's matmul, conversion, reference and test code are instrumented;
# oneDNN and libgomp are not, so TSan checks Tessera's own shared state.
# elementwise.cc is built without TSan: its ifunc resolvers (target_clones)
# crash under TSan at load time, and the test needs only its symbols.
# Run with OMP_NUM_THREADS=1: with OpenMP teams TSan cannot see libgomp's
# fork (uninstrumented) and reports each worker's first write into memory
# its team's master allocated as a race.
set -euo pipefail
cd "$(dirname "$0")/.."
out=build/tsan-matmul
mkdir -p "$out"
g++ -std=c++20 -O2 -fopenmp -Isrc -c src/kernels/cpu/elementwise.cc -o "$out/elementwise.o"
g++ -std=c++20 -O1 -g -fsanitize=thread -fopenmp -Isrc -Itests \
  src/kernels/cpu/matmul.cc src/kernels/cpu/convert.cc src/core/cpu_features.cc \
  src/kernels/ref/matmul.cc src/kernels/ref/elementwise.cc tests/kernels/matmul_threads_test.cc \
  "$out/elementwise.o" -lgtest -lgtest_main -ldnnl -lpthread -o "$out/matmul_threads_tsan"
OMP_NUM_THREADS=1 TSAN_OPTIONS="halt_on_error=1" "$out/matmul_threads_tsan"
