// The CPU measurements of `tessera doctor`, `bench gemm` and `bench decode`:
// GEMM throughput through the kernels training and serving use, STREAM triad
// bandwidth, allocation and page-fault cost, thread scaling, disk write
// bandwidth with fsync. Each returns the best (or mean, as stated) of a few
// runs and allocates its own buffers. Not thread-safe with each other: each
// uses every core (run one at a time).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "kernels/precision.h"

namespace tessera::perf {

enum class GemmDtype { kFP32, kBF16, kINT8 };
const char* gemm_dtype_name(GemmDtype d);  // "fp32", "bf16", "int8"

struct GemmShape {
  int M, N, K;  // out (M,N) = inp (M,K) @ weight (N,K)^T; name "MxNxK"
};

// Best GFLOP/s (int8: GOP/s) of one shape over `iters` timed samples (each
// repeating the product until it lasts about 10 ms), after one untimed run
// that builds the primitive. fp32 and bf16 through
// cpu::matmul_forward (the training path), int8 through
// cpu::matmul_int8_forward (the inference tier; its per-row quantisation of
// the input is inside the timing, as in serving).
double gemm_gflops(const GemmShape& s, GemmDtype dtype, int iters);
// Square n x n x n, fp32 or bf16 (what `bench gemm` reports).
double measure_matmul_gflops(int n, MatmulPrecision prec, int iters);

// The doctor's sizes: squares 128..2048 (and 4096 when !quick), and GPT
// shapes with M in {64, 256, 1024, 2048} and (N,K) in {(768,768),
// (2304,768), (3072,768), (768,3072)}.
std::vector<GemmShape> doctor_gemm_shapes(bool quick);

// Why `dtype` is not measured on this CPU ("" when it is): bf16 needs
// AVX512-BF16 or AMX (elsewhere Tessera computes it in fp32), int8 needs
// AVX2 at least.
std::string gemm_skip_reason(GemmDtype dtype);

// STREAM triad a = b + s*c over three arrays of `n` floats each (far larger
// than the caches), all OpenMP threads, best of `reps`; 3 arrays of traffic
// per element as STREAM counts. GB/s (1e9 bytes).
double triad_gb_per_s(int64_t n = int64_t{1} << 25, int reps = 5);

// The read roof a decode step can reach (issue #31 item 1): every OpenMP
// thread streams its part of one buffer of `n` 64-bit words (512 MB by
// default, far past any last-level cache) and XORs it into registers,
// writing nothing; best of `reps`, which take turns reading a thread's part
// as 8, 1 and 4 streams walked together (AVX2; one plain stream without
// it): a single stream a thread reads 1.2-1.7x less than several on Zen 3. A decode step reads its weights the same
// way, so this, not the triad (which also writes, and counts its write-
// allocate traffic as STREAM does), is the bound bench decode reports
// against. The buffer is in 2 MiB pages, as the weights of the inference
// tiers are (core/huge_pages.h; 4 KiB under TESSERA_HUGE_PAGES=0, as they
// then are). GB/s (1e9 bytes).
double read_gb_per_s(int64_t n = int64_t{1} << 26, int reps = 5);

// The same read roof over memory that is already there (a model's weights:
// what a decode step streams, measured without allocating anything): every
// thread XORs its share of each block's whole 64-bit words, the streams
// of read_gb_per_s in the same turns (one repetition: 8 a thread); best of
// `reps`. Past the last-level cache only when the blocks add up to several
// times it. GB/s (1e9 bytes); 0 for no bytes.
struct ReadBlock {
  const void* data;
  size_t bytes;
};
double read_gb_per_s_over(const std::vector<ReadBlock>& blocks, int reps = 5);

// The last-level cache of CPU 0, bytes, from sysfs (the highest cache
// index's size; glibc's sysconf(_SC_LEVEL3_CACHE_SIZE) said 320 MB for a
// 32 MB L3 on a Zen 4 VM); 32 MiB when sysfs has none.
int64_t last_level_cache_bytes();

// Mean ns of one malloc(bytes) + touching its first byte + free, over iters.
double malloc_ns(size_t bytes, int iters);
// Mean ns per page of first-touching `bytes` of fresh anonymous memory
// (mmap, a write to every 4 KiB page, munmap): the page-fault cost.
double page_fault_ns(size_t bytes);

// fp32 GEMM GFLOP/s on `threads` OpenMP threads (out (n, n+16*threads) =
// (n,n) @ (n, n+16*threads)^T: each count gets its own primitive, since
// oneDNN fixes the thread count when it builds one).
double threads_fp32_gflops(int threads, int n, int iters);

// Writes `bytes` in 1 MiB blocks to a new file in `dir`, fsyncs it and
// removes it: MB/s (1e6 bytes) including the fsync. Errors name the path.
Result<double> disk_write_fsync_mb_per_s(const std::string& dir, int64_t bytes);

}  // namespace tessera::perf
