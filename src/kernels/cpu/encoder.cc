// Token + position embedding. B batch, T time, C channels, V vocabulary.
//
// Both directions are pure memory traffic, so the loops are plain and
// OpenMP-threaded; the compiler vectorises the inner row loops.
#include <omp.h>

#include "kernels/cpu/ops.h"

namespace tessera::cpu {

namespace {
// Below this many elements a fork/join costs more than the work.
constexpr int64_t kParallelMin = 32768;
}  // namespace

void encoder_forward(float* out, const int* inp, const float* wte, const float* wpe, int B, int T, int C) {
  const int64_t N = static_cast<int64_t>(B) * T;
#pragma omp parallel for schedule(static) if (N * C > kParallelMin)
  for (int64_t bt = 0; bt < N; bt++) {
    float* out_bt = out + bt * C;
    const float* wte_ix = wte + static_cast<int64_t>(inp[bt]) * C;
    if (!wpe) {
#pragma omp simd
      for (int i = 0; i < C; i++) out_bt[i] = wte_ix[i];
      continue;
    }
    const float* wpe_t = wpe + (bt % T) * C;
#pragma omp simd
    for (int i = 0; i < C; i++) out_bt[i] = wte_ix[i] + wpe_t[i];
  }
}

// Different positions may carry the same token id, so splitting positions
// between threads would race on dwte rows. Instead a thread owns the token
// ids with id % nthreads == tid: it scans all ids and adds only the rows it
// owns. That is race-free without atomics or scratch, touches whole rows
// (no cache line of dwte is written by two threads when C is a multiple of
// 16), and every element receives its contributions in the same (b, t) order
// as the reference, so the result does not depend on the thread count. A
// batch of one repeated token runs on one thread, correctly. dwpe rows are
// split by position t.
void encoder_backward(float* dwte, float* dwpe, const float* dout, const int* inp, int B, int T, int C) {
  const int64_t N = static_cast<int64_t>(B) * T;
#pragma omp parallel if (N * C > kParallelMin)
  {
    const int nthreads = omp_get_num_threads();
    const int tid = omp_get_thread_num();
    for (int64_t bt = 0; bt < N; bt++) {
      if (inp[bt] % nthreads != tid) continue;
      const float* dout_bt = dout + bt * C;
      float* dwte_ix = dwte + static_cast<int64_t>(inp[bt]) * C;
#pragma omp simd
      for (int i = 0; i < C; i++) dwte_ix[i] += dout_bt[i];
    }
#pragma omp for schedule(static) nowait
    for (int t = 0; t < (dwpe ? T : 0); t++) {
      float* dwpe_t = dwpe + static_cast<int64_t>(t) * C;
      for (int b = 0; b < B; b++) {
        const float* dout_bt = dout + (static_cast<int64_t>(b) * T + t) * C;
#pragma omp simd
        for (int i = 0; i < C; i++) dwpe_t[i] += dout_bt[i];
      }
    }
  }
}

}  // namespace tessera::cpu
