// LayerNorm over the channel dimension. N rows (B*T), C channels.
//
// Rows are independent, so both directions thread over rows. A row (C floats,
// 3 KiB for GPT-2 small) stays in L1 once read, so the statistics take two
// passes over the cached row (mean, then the centred sum of squares, which
// is more accurate than sum/sumsq) while memory sees a single read of inp
// and a single write of out. dweight and dbias are sums over rows; each
// thread accumulates its rows into private partial sums and the partials are
// then added into dweight/dbias in a fixed order: no atomics, and the result
// does not depend on scheduling. The per-row work is compiled for AVX-512,
// AVX2 and baseline x86-64 (target_clones, chosen at load time): the
// reductions are latency-bound chains, so wider vectors matter even though
// the data is cached.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include <omp.h>

#include "kernels/cpu/ops.h"
#include "kernels/cpu/vec_math.h"


namespace tessera::cpu {

namespace {

constexpr float kEps = 1e-5f;
constexpr int64_t kParallelMin = 16384;  // elements; below this, no fork
constexpr int kFloatsPerLine = 16;       // partial-sum rows are line-aligned

// One row: y (C) = (x - mean) * rstd * weight + bias; *mean_out, *rstd_out.
TESSERA_CPU_CLONES void layernorm_forward_row(float* y, float* mean_out, float* rstd_out, const float* x,
                                              const float* weight, const float* bias, int C) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int c = 0; c < C; c++) sum += x[c];
  const float m = sum / C;
  float sq = 0.0f;
#pragma omp simd reduction(+ : sq)
  for (int c = 0; c < C; c++) sq += (x[c] - m) * (x[c] - m);
  const float s = 1.0f / std::sqrt(sq / C + kEps);
#pragma omp simd
  for (int c = 0; c < C; c++) y[c] = s * (x[c] - m) * weight[c] + bias[c];
  *mean_out = m;
  *rstd_out = s;
}

// One row of the backward: dx (C) += ...; the row's dweight and dbias terms
// go into this thread's partial sums dw_part, db_part (C).
TESSERA_CPU_CLONES void layernorm_backward_row(float* dx, float* dw_part, float* db_part, const float* dy,
                                               const float* x, const float* weight, float m, float s, int C) {
  float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
#pragma omp simd reduction(+ : dnorm_mean, dnorm_norm_mean)
  for (int c = 0; c < C; c++) {
    const float norm = (x[c] - m) * s;
    const float dnorm = weight[c] * dy[c];
    dnorm_mean += dnorm;
    dnorm_norm_mean += dnorm * norm;
  }
  dnorm_mean /= C;
  dnorm_norm_mean /= C;
#pragma omp simd
  for (int c = 0; c < C; c++) {
    const float norm = (x[c] - m) * s;
    const float dnorm = weight[c] * dy[c];
    db_part[c] += dy[c];
    dw_part[c] += norm * dy[c];
    dx[c] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s;
  }
}

}  // namespace

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int N, int C) {
#pragma omp parallel for schedule(static) if (static_cast<int64_t>(N) * C > kParallelMin)
  for (int i = 0; i < N; i++) {
    const int64_t row = static_cast<int64_t>(i) * C;
    layernorm_forward_row(out + row, mean + i, rstd + i, inp + row, weight, bias, C);
  }
}

void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const float* weight, const float* mean, const float* rstd, int N, int C) {
  const bool parallel = static_cast<int64_t>(N) * C > kParallelMin;
  const int max_threads = parallel ? omp_get_max_threads() : 1;
  // Per-thread partials: thread k owns [dweight part | dbias part] at
  // partials + k * 2 * stride, cache-line aligned so that no two threads
  // write the same line. Owned by the calling thread; only grows.
  const int64_t stride = (static_cast<int64_t>(C) + kFloatsPerLine - 1) / kFloatsPerLine * kFloatsPerLine;
  const size_t needed = static_cast<size_t>(max_threads * 2 * stride + kFloatsPerLine);
  thread_local std::vector<float> scratch;
  if (scratch.size() < needed) scratch.resize(needed);
  const uintptr_t base = reinterpret_cast<uintptr_t>(scratch.data());
  const uintptr_t line = kFloatsPerLine * sizeof(float);
  float* partials = reinterpret_cast<float*>((base + line - 1) / line * line);

#pragma omp parallel num_threads(max_threads) if (parallel)
  {
    const int nthreads = omp_get_num_threads();  // may be fewer than max_threads
    float* dw_part = partials + omp_get_thread_num() * 2 * stride;
    float* db_part = dw_part + stride;
    std::fill(dw_part, dw_part + 2 * stride, 0.0f);

#pragma omp for schedule(static)
    for (int i = 0; i < N; i++) {
      const int64_t row = static_cast<int64_t>(i) * C;
      layernorm_backward_row(dinp + row, dw_part, db_part, dout + row, inp + row, weight, mean[i], rstd[i], C);
    }
    // The implicit barrier above makes every partial complete.
#pragma omp for schedule(static)
    for (int c = 0; c < C; c++) {
      float dw = 0.0f, db = 0.0f;
      for (int k = 0; k < nthreads; k++) {
        dw += partials[k * 2 * stride + c];
        db += partials[k * 2 * stride + stride + c];
      }
      dweight[c] += dw;
      dbias[c] += db;
    }
  }
}

}  // namespace tessera::cpu
