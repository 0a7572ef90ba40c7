#!/usr/bin/env bash
# Runs a test binary on an emulated CPU model (qemu-user's TCG, which
# implements AVX2 and FMA since QEMU 7.2; Debian 12 ships 7.2):
#   tests/isa/emulated.sh CPU_MODEL BINARY ARGS...
# e.g. EPYC-Milan, an AMD Zen 3: AVX2, no AVX-512, no VNNI. The emulated
# cpuid is what oneDNN, core/cpu_features.cc and GCC's target_clones see.
# scripts/setup.sh installs qemu-user.
set -euo pipefail
model=$1
shift
qemu=$(command -v qemu-x86_64 || true)
[ -n "$qemu" ] || { echo "isa: qemu-x86_64 not found (scripts/setup.sh installs qemu-user)"; exit 1; }
# Check that qemu knows the model and runs the binary, before the tests.
flags=$("$qemu" -cpu "$model" "$1" --gtest_list_tests >/dev/null 2>&1 && echo ok || echo fail)
[ "$flags" = ok ] || { echo "isa: $qemu -cpu $model cannot run $1"; exit 1; }
# qemu warns once per host feature TCG lacks (pcid, x2apic, ...): not ours.
log=$(mktemp)
trap 'rm -f "$log"' EXIT
rc=0
"$qemu" -cpu "$model" "$@" >"$log" 2>&1 || rc=$?
grep -v "TCG doesn't support requested feature" "$log" || true
[ "$rc" = 0 ] || exit "$rc"
# On a CPU without VNNI the oneDNN refusal test runs and passes rather than
# skips: otherwise the emulation was not the machine this test is for (or
# the filter lost the test).
if ! grep -q "OK \] MatmulInt8.OneDnnWithoutVnniIsRefusedByTheSelfCheck" "$log"; then
  echo "isa: MatmulInt8.OneDnnWithoutVnniIsRefusedByTheSelfCheck did not run and pass on -cpu $model" \
       "(a model with VNNI or AMX, or a filter without it)"
  exit 1
fi
