// Introspection of the CPU matmul's primitive cache (kernels/cpu/matmul.cc),
// for tests and diagnostics, and the few-row fp32 matmul the model's decode
// steps run. The matmul ops themselves are in ops.h.
// Thread safety: both functions may be called from any thread at any time.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tessera::cpu {

// Compiled oneDNN matmul primitives held by the process-wide cache now. Never
// more than matmul_cache_capacity() (least recently used ones are dropped;
// a thread still running one keeps it alive until its own binding goes).
size_t matmul_cache_size();
// The bound on matmul_cache_size().
size_t matmul_cache_capacity();
// Primitives compiled since the process started (a dropped one compiled
// again counts again).
uint64_t matmul_primitives_compiled();
// True when a matmul whose row count (N of ops.inc) is `rows` runs on a
// primitive compiled for exactly that count; false when it shares one
// compiled with a run-time row count (see matmul.cc for the rule and why).
bool matmul_rows_get_exact_primitive(int64_t rows);

// The fp32 matmul of a few rows, out (N, OC) = inp (N, C) @ weight (OC, C)^T
// + bias (may be null), with Tessera's own weight-streaming loops
// (matmul_f32_rows.cc) instead of oneDNN: what a decode step runs, where
// reading the weights is the whole cost. Any N is correct; the model uses it
// for N <= kFewRowsMax (bench/kernels_bench.cc, BM_MatmulF32Rows, compares
// the two). Each output is one dot product, the same whatever N is.
constexpr int kFewRowsMax = 8;
void matmul_f32_rows(float* out, const float* inp, const float* weight, const float* bias, int N, int C, int OC);

// on: every oneDNN matmul primitive, when it is first built, prints its
// shape and oneDNN's implementation name to stderr (which kernel a shape
// gets; the CLI turns it on for TESSERA_VERBOSE_MATMUL=1). Off by default.
void set_verbose_matmul(bool on);

}  // namespace tessera::cpu
