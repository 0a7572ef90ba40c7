#!/usr/bin/env bash
# A server links without MPI: the probe (server_link_probe.cc, linked
# against tessera_nn only) must not have MPI (or NCCL) among the libraries
# CMake links it with, among the shared libraries it needs, or among its
# undefined symbols; then it must run.
# Usage: check_server_link.sh PROBE LINK_CLOSURE_FILE
set -u
probe=$1 closure=$2
fail=0
# The link closure CMake wrote at configure time: every target and library
# the probe links, directly or through the layers it links.
if grep -inE 'mpi|nccl' "$closure"; then
  echo "FAIL: the probe's link closure ($closure) names MPI or NCCL (above)"; fail=1
fi
if ! grep -q '^tessera_nn$' "$closure"; then
  echo "FAIL: $closure does not list tessera_nn: not the probe's closure?"; fail=1
fi
needed=$(readelf -d "$probe" | awk '/NEEDED/ {print $NF}')
if grep -iE 'mpi|nccl' <<<"$needed"; then
  echo "FAIL: $probe needs these shared libraries (above)"; fail=1
fi
if nm -u "$probe" | grep -E ' (MPI|PMPI|nccl)_?[A-Za-z]'; then
  echo "FAIL: $probe has undefined MPI or NCCL symbols (above)"; fail=1
fi
"$probe" || { echo "FAIL: $probe did not run"; fail=1; }
if [ $fail -eq 0 ]; then
  echo "ok: $(basename "$probe") links $(grep -c '^tessera_' "$closure") tessera layers ($(grep '^tessera_' "$closure" | tr '\n' ' ')) and no MPI"
fi
exit $fail
