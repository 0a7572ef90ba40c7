// The DLRM cost breakdown of `tessera bench dlrm-ops` (docs/performance.md):
// where a single-process DLRM step goes, each part against this machine's
// own ceiling. Lookups are bound by memory, so the embedding-bag forward is
// measured as bandwidth (the table rows it reads, plus its ids and output)
// against the STREAM triad; the MLPs are matrix products, so their forward
// and backward are measured as GFLOP/s against the fp32 GEMM peak; and the
// whole forward + backward of nn::Dlrm gives the share of each.
//
// Letters as in nn/dlrm.h (B batch, D dimension, T tables, E rows per table,
// L ids per bag). Ids are uniform over the rows (each lookup a cache miss on
// tables far larger than the caches: the worst case, and the one the 60%-of-
// triad goal is set for). Allocates T*E*D floats of tables; uses every
// OpenMP thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace tessera::perf {

struct DlrmOpsOptions {
  int tables = 26;           // T
  int64_t rows = 150000;     // E of every table
  int dim = 64;              // D
  int batch = 2048;          // B
  int ids_per_bag = 1;       // L (Criteo: one category per table and sample)
  std::vector<int> bottom = {512, 256, 64};  // the last must equal dim
  std::vector<int> top = {512, 256};
  int num_dense = 13;
  int iters = 5;             // timed repetitions of each part (the best is kept)
  uint64_t seed = 1;
};

struct DlrmOpsResult {
  // Embedding-bag forward over every table for one batch.
  double lookup_s = 0;
  double lookup_bytes = 0;  // rows read (B*L*T*D*4) + ids and offsets + pooled output written
  double lookup_gbps = 0;   // GB/s (1e9 bytes)
  double triad_gbps = 0;    // STREAM triad measured in the same run
  // Bottom and top MLP, forward and backward (matmul_forward/backward of
  // every layer at the batch), 6*B*in*out FLOPs per layer.
  double mlp_s = 0, mlp_flops = 0, mlp_gflops = 0;
  double gemm_peak_gflops = 0;  // fp32 square 1024 GEMM, same run
  // The dot interaction (interaction_forward + backward) of the (B, F, D)
  // features, F = T + 1: 6*B*P*D FLOPs (P = F(F-1)/2 pairs; forward 2*P*D
  // per sample, backward 4*P*D), against the same GEMM peak.
  double interaction_s = 0, interaction_flops = 0, interaction_gflops = 0;
  // nn::Dlrm forward + backward (no optimizer step) on the same batch.
  double step_s = 0;
  int64_t lookups = 0;       // ids per batch (B*L*T)
  int64_t params = 0;
};

// Errors: a configuration nn::DlrmConfig refuses (InvalidArgument naming it).
Result<DlrmOpsResult> bench_dlrm_ops(const DlrmOpsOptions& o);

// `--device cuda` (perf/cuda_dlrm_bench.cc): the sparse half of the step on
// device 0 with the CUDA kernels (kernels/cuda/dlrm.cu), the same tables,
// batch and ids as above. Lookups are measured as bandwidth against a
// device-to-device copy of the same run (reads + writes); the other parts as
// times. No MLPs (the DLRM model does not run on CUDA). Timed on the host
// around a device synchronize, best of `iters` (after one untimed run), so a
// part is never faster than its kernel launches. Allocates T*E*D floats of
// tables (and T*E of Adagrad state) on the device.
struct DlrmCudaOpsResult {
  std::string device;       // cuda::device_summary(0)
  double lookup_s = 0;      // embedding-bag forward, every table
  double lookup_bytes = 0;  // as DlrmOpsResult's
  double lookup_gbps = 0;
  double copy_gbps = 0;     // cudaMemcpy device to device, 2 x bytes / time
  double backward_s = 0;    // embedding-bag backward (sort-based sparse gradient), every table
  double adagrad_s = 0;     // row-wise Adagrad on every table's touched rows
  double interaction_s = 0; // interaction forward + backward, F = T + 1
  int64_t lookups = 0;      // ids per batch (B*L*T)
  int64_t unique_rows = 0;  // distinct rows touched, summed over tables
  int64_t table_params = 0; // T*E*D
};
// Errors: bad sizes (InvalidArgument); no device or CUDA not compiled in,
// out of device memory (Unavailable, ResourceExhausted: the CUDA error).
Result<DlrmCudaOpsResult> bench_dlrm_ops_cuda(const DlrmOpsOptions& o);

}  // namespace tessera::perf
