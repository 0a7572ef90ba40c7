#!/usr/bin/env bash
# Builds llama.cpp's llama-bench and llama-batched-bench, the reference the
# CPU serving benchmarks compare against, llama-completion and
# llama-tokenize (bench/llamacpp_greedy.sh), and llama-quantize (llama.cpp's
# own quantized files for tests/reference). Only for benchmarking: nothing of
# llama.cpp is linked into Tessera.
#   bench/llamacpp_build.sh            # build (or reuse) and print the paths
#   eval "$(bench/llamacpp_build.sh)"  # sets LLAMA_BENCH and LLAMA_BATCHED_BENCH
#
# Source: the npm package node-llama-cpp ships llama.cpp as a git bundle
# (package/llama/gitRelease.bundle, one squashed commit; the upstream tag is
# in package/llama/llama.cpp.info.json). The version and the tarball's
# sha512 are pinned below; the tarball comes from the npm registry with
# `npm pack` (no install scripts, no dependencies, no prebuilt binaries) and
# the bundle is cloned locally (no network). node-llama-cpp's own patches
# (package/llama/patches) are not applied: the binaries are upstream
# llama.cpp at the pinned commit.
#
# Build: Release, GGML_NATIVE=ON (-march=native), OpenMP, static libraries,
# CPU backend only (no CUDA/Vulkan/Metal/BLAS), no HTTPS/curl, no tests,
# examples, server or app; only the five targets are built. Needs cmake,
# ninja (or make), g++ with OpenMP (Debian: build-essential, which brings
# libgomp), git, npm and tar; it fails with a message rather than installing
# anything.
#
# TESSERA_LLAMACPP_ISA=avx2 builds for AVX2 instead (GGML_NATIVE=OFF; AVX,
# AVX2, FMA, F16C, BMI2 on; every AVX-512 and VNNI variant off), in a folder
# of its own: the side by side of a machine without AVX-512 (the Zen 3 the
# issue was measured on) on one that has it, with Tessera capped to match
# (DNNL_MAX_CPU_ISA=AVX2, bench/llamacpp_vs.sh).
#
# Cache: $TESSERA_LLAMACPP_DIR (default /var/tmp/tessera-llamacpp), one
# folder per pinned version. A second run with the same version, flags,
# compiler and CPU finds the stamp and the binaries and builds nothing.
#   TESSERA_LLAMACPP_JOBS   parallel compile jobs (default: nproc)
#   TESSERA_LLAMACPP_FORCE  1 to rebuild even when the stamp matches
# Progress goes to stderr; stdout is only the four lines
#   LLAMA_BENCH=/path/llama-bench
#   LLAMA_BATCHED_BENCH=/path/llama-batched-bench
#   LLAMA_COMPLETION=/path/llama-completion
#   LLAMA_TOKENIZE=/path/llama-tokenize
#   LLAMA_QUANTIZE=/path/llama-quantize   (tests/reference/make_llamacpp_quantized.sh:
#                                          llama.cpp's own Q4_K_M and Q4_0 files)
set -euo pipefail

version=3.22.1
tgz_sha512=6e5b488a9b9699cd76dc7eed30880318a4ac4ab866865418795502e3c5d38d55bb5c624988927209d95333343f2e25a83e4183a5c2f816f883a60c3ba9f4e20f
llama_commit=de3ff815ea7d559ee917f063901b8986f038abc6  # HEAD of the bundle in $version

cache=${TESSERA_LLAMACPP_DIR:-/var/tmp/tessera-llamacpp}
jobs=${TESSERA_LLAMACPP_JOBS:-$(nproc)}
isa=${TESSERA_LLAMACPP_ISA:-native}
root=$cache/node-llama-cpp-$version
src=$root/llama.cpp
case $isa in
  native) build=$root/build ;;
  avx2) build=$root/build-avx2 ;;
  *) echo "llamacpp_build: error: TESSERA_LLAMACPP_ISA=$isa (native or avx2)" >&2; exit 2 ;;
esac
bins=("$build/bin/llama-bench" "$build/bin/llama-batched-bench" "$build/bin/llama-completion" "$build/bin/llama-tokenize"
      "$build/bin/llama-quantize")

log() { echo "llamacpp_build: $*" >&2; }
die() { log "error: $*"; exit 1; }

for tool in cmake g++ git npm tar sha512sum; do
  command -v "$tool" >/dev/null || die "$tool not found (Debian: cmake, build-essential, git, npm); not installing it"
done
generator=(-G Ninja)
command -v ninja >/dev/null || { generator=(-G "Unix Makefiles"); log "ninja not found, using make"; }

flags=(
  -DCMAKE_BUILD_TYPE=Release
  -DBUILD_SHARED_LIBS=OFF
  -DGGML_NATIVE=ON
  -DGGML_OPENMP=ON
  -DGGML_CPU=ON -DGGML_CCACHE=OFF
  -DGGML_BLAS=OFF -DGGML_CUDA=OFF -DGGML_HIP=OFF -DGGML_VULKAN=OFF -DGGML_METAL=OFF
  -DGGML_SYCL=OFF -DGGML_OPENCL=OFF -DGGML_RPC=OFF -DGGML_BACKEND_DL=OFF
  -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF
  -DLLAMA_BUILD_COMMON=ON -DLLAMA_BUILD_TOOLS=ON
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF
  -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_TOOLS_INSTALL=OFF
)
if [ "$isa" = avx2 ]; then
  flags=("${flags[@]/-DGGML_NATIVE=ON/-DGGML_NATIVE=OFF}"
    -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX_VNNI=OFF
    -DGGML_AVX512=OFF -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF)
fi
# -march=native binaries are only valid on the CPU that built them.
cpu="$(grep -m1 '^model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), flags $(grep -m1 '^flags' /proc/cpuinfo | md5sum | cut -c1-12)"
stamp_text="node-llama-cpp $version
llama.cpp $llama_commit
$(g++ --version | head -1)
cpu $cpu
${flags[*]}"

print_paths() {
  echo "LLAMA_BENCH=${bins[0]}"
  echo "LLAMA_BATCHED_BENCH=${bins[1]}"
  echo "LLAMA_COMPLETION=${bins[2]}"
  echo "LLAMA_TOKENIZE=${bins[3]}"
  echo "LLAMA_QUANTIZE=${bins[4]}"
}

up_to_date() {
  [ "${TESSERA_LLAMACPP_FORCE:-0}" != 1 ] || return 1
  for b in "${bins[@]}"; do [ -x "$b" ] || return 1; done
  [ -f "$build/tessera.stamp" ] && [ "$(cat "$build/tessera.stamp")" = "$stamp_text" ]
}

mkdir -p "$cache"
if up_to_date; then
  log "up to date: node-llama-cpp $version, llama.cpp ${llama_commit:0:10} in $build"
  print_paths
  exit 0
fi

# One builder at a time per cache folder.
exec 9>"$cache/.lock"
flock 9
if up_to_date; then print_paths; exit 0; fi

if [ ! -f "$src/CMakeLists.txt" ] || [ "$(git -C "$src" rev-parse HEAD 2>/dev/null)" != "$llama_commit" ]; then
  log "fetching node-llama-cpp@$version from the npm registry"
  rm -rf "$root"
  tmp=$(mktemp -d "$cache/fetch.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  (cd "$tmp" && npm pack "node-llama-cpp@$version" --ignore-scripts --silent >/dev/null)
  tgz=$tmp/node-llama-cpp-$version.tgz
  [ -f "$tgz" ] || die "npm pack did not produce $tgz"
  echo "$tgz_sha512  $tgz" | sha512sum -c --quiet - || die "sha512 of $tgz differs from the pinned one"
  tar -xzf "$tgz" -C "$tmp" package/llama/gitRelease.bundle package/llama/llama.cpp.info.json
  log "llama.cpp from the package: $(tr -d ' \n' <"$tmp/package/llama/llama.cpp.info.json")"
  git -c advice.detachedHead=false clone --quiet "$tmp/package/llama/gitRelease.bundle" "$tmp/llama.cpp"
  got=$(git -C "$tmp/llama.cpp" rev-parse HEAD)
  [ "$got" = "$llama_commit" ] || die "bundle HEAD is $got, expected $llama_commit"
  mkdir -p "$root"
  cp "$tmp/package/llama/llama.cpp.info.json" "$root/"
  mv "$tmp/llama.cpp" "$src"
  rm -rf "$tmp"
  trap - EXIT
fi

log "configuring llama.cpp ${llama_commit:0:10} in $build"
rm -f "$build/tessera.stamp"
cmake -S "$src" -B "$build" "${generator[@]}" "${flags[@]}" >"$root/configure-$isa.log" 2>&1 ||
  { tail -30 "$root/configure-$isa.log" >&2; die "cmake configure failed (log: $root/configure-$isa.log)"; }
grep -q '^GGML_OPENMP_ENABLED:INTERNAL=ON' "$build/CMakeCache.txt" ||
  die "OpenMP not found by CMake (Debian: libgomp1 and gcc's omp.h from libgcc-12-dev); not installing it"

log "building llama-bench, llama-batched-bench, llama-completion, llama-tokenize and llama-quantize with $jobs jobs (log: $root/build-$isa.log)"
start=$(date +%s)
cmake --build "$build" --target llama-bench llama-batched-bench llama-completion llama-tokenize llama-quantize -j "$jobs" >"$root/build-$isa.log" 2>&1 ||
  { tail -40 "$root/build-$isa.log" >&2; die "build failed (log: $root/build-$isa.log)"; }
log "built in $(( $(date +%s) - start )) s"
for b in "${bins[@]}"; do [ -x "$b" ] || die "$b missing after the build"; done
echo "$stamp_text" >"$build/tessera.stamp"
print_paths
