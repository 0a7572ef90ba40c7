// Token + position embedding. B batch, T time, C channels, V vocabulary.
//
// Both directions are pure memory traffic, so the loops are plain and
// OpenMP-threaded; the compiler vectorises the inner row loops.
#include <algorithm>

#include <omp.h>

#include "kernels/cpu/ops.h"

namespace tessera::cpu {

namespace {
// Below this many elements a fork/join costs more than the work.
constexpr int64_t kParallelMin = 32768;
// A thread's channel range in encoder_backward is a multiple of one cache
// line, so no two threads write the same line of dwte/dwpe.
constexpr int kChannelsPerLine = 16;
}  // namespace

void encoder_forward(float* out, const int* inp, const float* wte, const float* wpe, int B, int T, int C) {
  const int64_t N = static_cast<int64_t>(B) * T;
#pragma omp parallel for schedule(static) if (N * C > kParallelMin)
  for (int64_t bt = 0; bt < N; bt++) {
    float* out_bt = out + bt * C;
    const float* wte_ix = wte + static_cast<int64_t>(inp[bt]) * C;
    const float* wpe_t = wpe + (bt % T) * C;
#pragma omp simd
    for (int i = 0; i < C; i++) out_bt[i] = wte_ix[i] + wpe_t[i];
  }
}

// Different positions may carry the same token id, so splitting the work by
// position would race on dwte rows. Instead each thread owns a slice of the
// channels and walks every position in order: race-free without atomics or
// scratch, one pass over dout, and every dwte/dwpe element receives its
// contributions in the same (b, t) order as the reference, so the result is
// deterministic and independent of the thread count.
void encoder_backward(float* dwte, float* dwpe, const float* dout, const int* inp, int B, int T, int C) {
  const int64_t N = static_cast<int64_t>(B) * T;
#pragma omp parallel if (N * C > kParallelMin)
  {
    const int nthreads = omp_get_num_threads();
    const int tid = omp_get_thread_num();
    int slice = (C + nthreads - 1) / nthreads;
    slice = (slice + kChannelsPerLine - 1) / kChannelsPerLine * kChannelsPerLine;
    const int c0 = std::min(C, tid * slice);
    const int c1 = std::min(C, c0 + slice);
    for (int64_t bt = 0; c0 < c1 && bt < N; bt++) {
      const float* dout_bt = dout + bt * C;
      float* dwte_ix = dwte + static_cast<int64_t>(inp[bt]) * C;
      float* dwpe_t = dwpe + (bt % T) * C;
#pragma omp simd
      for (int i = c0; i < c1; i++) {
        dwte_ix[i] += dout_bt[i];
        dwpe_t[i] += dout_bt[i];
      }
    }
  }
}

}  // namespace tessera::cpu
