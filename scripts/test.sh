#!/usr/bin/env bash
# The README's test command: set up (packages, configure, build), then run
# the whole suite under ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
ctest --preset release -j2 "$@"
