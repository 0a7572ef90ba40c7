// The Llama family's ops of ops.inc on the CPU: RMSNorm, rotary embedding
// and SwiGLU. All three are memory-bound row kernels, threaded over rows.
//
// RMSNorm follows layernorm.cc: a row stays in L1 between its reduction and
// its write, and dweight is summed from per-thread partials in a fixed order
// (no atomics; the result does not depend on scheduling). Rotary embedding
// computes each row's hs/2 cosines and sines once (libm, as precise as the
// reference) and turns all NH + KV heads of the row with them. SwiGLU uses
// the vectorisable exp of vec_math.h, as GELU does.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include <omp.h>

#include "kernels/cpu/ops.h"
#include "kernels/cpu/vec_math.h"

namespace tessera::cpu {

namespace {

constexpr int64_t kParallelMin = 16384;  // elements; below this, no fork
constexpr int kFloatsPerLine = 16;

TESSERA_CPU_CLONES void rmsnorm_forward_row(float* y, float* rstd_out, const float* x, const float* weight, int C,
                                            float eps) {
  float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
  for (int c = 0; c < C; c++) ss += x[c] * x[c];
  const float s = 1.0f / std::sqrt(ss / C + eps);
#pragma omp simd
  for (int c = 0; c < C; c++) y[c] = x[c] * s * weight[c];
  *rstd_out = s;
}

TESSERA_CPU_CLONES void rmsnorm_backward_row(float* dx, float* dw_part, const float* dy, const float* x,
                                             const float* weight, float s, int C) {
  float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
  for (int c = 0; c < C; c++) dot += weight[c] * dy[c] * x[c] * s;
  dot /= C;
#pragma omp simd
  for (int c = 0; c < C; c++) {
    const float xhat = x[c] * s;
    dw_part[c] += dy[c] * xhat;
    dx[c] += s * (weight[c] * dy[c] - xhat * dot);
  }
}

// Turns `heads` heads of one row by the angles whose cosines and signed
// sines are cs, sn (half = hs/2 each).
TESSERA_CPU_CLONES void rotate_heads(float* row, const float* cs, const float* sn, int heads, int hs) {
  const int half = hs / 2;
  for (int h = 0; h < heads; h++) {
    float* x1 = row + static_cast<int64_t>(h) * hs;
    float* x2 = x1 + half;
#pragma omp simd
    for (int i = 0; i < half; i++) {
      const float a = x1[i], b = x2[i];
      x1[i] = a * cs[i] - b * sn[i];
      x2[i] = b * cs[i] + a * sn[i];
    }
  }
}

void rope(float* qkv, const int* pos, const float* inv_freq, int N, int NH, int KV, int hs, float sign) {
  const int64_t W = static_cast<int64_t>(NH + 2 * KV) * hs;
  const int half = hs / 2;
#pragma omp parallel if (static_cast<int64_t>(N) * W > kParallelMin)
  {
    thread_local std::vector<float> trig;
    if (static_cast<int>(trig.size()) < hs) trig.resize(hs);
    float* cs = trig.data();
    float* sn = cs + half;
#pragma omp for schedule(static)
    for (int n = 0; n < N; n++) {
      for (int i = 0; i < half; i++) {
        const float a = static_cast<float>(pos[n]) * inv_freq[i];
        cs[i] = std::cos(a);
        sn[i] = sign * std::sin(a);
      }
      rotate_heads(qkv + n * W, cs, sn, NH + KV, hs);
    }
  }
}

TESSERA_CPU_CLONES void swiglu_forward_row(float* out, const float* gate, const float* up, int F) {
#pragma omp simd
  for (int i = 0; i < F; i++) out[i] = gate[i] / (1.0f + exp_approx(-gate[i])) * up[i];
}

TESSERA_CPU_CLONES void swiglu_backward_row(float* dgate, float* dup, const float* gate, const float* up,
                                            const float* dy, int F) {
#pragma omp simd
  for (int i = 0; i < F; i++) {
    const float g = gate[i];
    const float sig = 1.0f / (1.0f + exp_approx(-g));
    dgate[i] += dy[i] * up[i] * sig * (1.0f + g * (1.0f - sig));
    dup[i] += dy[i] * g * sig;
  }
}

}  // namespace

void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int N, int C, float eps) {
#pragma omp parallel for schedule(static) if (static_cast<int64_t>(N) * C > kParallelMin)
  for (int i = 0; i < N; i++) {
    const int64_t row = static_cast<int64_t>(i) * C;
    rmsnorm_forward_row(out + row, rstd + i, inp + row, weight, C, eps);
  }
}

void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                      const float* rstd, int N, int C) {
  const bool parallel = static_cast<int64_t>(N) * C > kParallelMin;
  const int max_threads = parallel ? omp_get_max_threads() : 1;
  const int64_t stride = (static_cast<int64_t>(C) + kFloatsPerLine - 1) / kFloatsPerLine * kFloatsPerLine;
  const size_t needed = static_cast<size_t>(max_threads * stride + kFloatsPerLine);
  thread_local std::vector<float> scratch;
  if (scratch.size() < needed) scratch.resize(needed);
  const uintptr_t base = reinterpret_cast<uintptr_t>(scratch.data());
  const uintptr_t line = kFloatsPerLine * sizeof(float);
  float* partials = reinterpret_cast<float*>((base + line - 1) / line * line);
#pragma omp parallel num_threads(max_threads) if (parallel)
  {
    const int nthreads = omp_get_num_threads();
    float* dw_part = partials + omp_get_thread_num() * stride;
    std::fill(dw_part, dw_part + stride, 0.0f);
#pragma omp for schedule(static)
    for (int i = 0; i < N; i++) {
      const int64_t row = static_cast<int64_t>(i) * C;
      rmsnorm_backward_row(dinp + row, dw_part, dout + row, inp + row, weight, rstd[i], C);
    }
#pragma omp for schedule(static)
    for (int c = 0; c < C; c++) {
      float dw = 0.0f;
      for (int k = 0; k < nthreads; k++) dw += partials[k * stride + c];
      dweight[c] += dw;
    }
  }
}

void rope_forward(float* qkv, const int* pos, const float* inv_freq, int N, int NH, int KV, int hs) {
  rope(qkv, pos, inv_freq, N, NH, KV, hs, 1.0f);
}

void rope_backward(float* dqkv, const int* pos, const float* inv_freq, int N, int NH, int KV, int hs) {
  rope(dqkv, pos, inv_freq, N, NH, KV, hs, -1.0f);
}

void swiglu_forward(float* out, const float* inp, int N, int F) {
#pragma omp parallel for schedule(static) if (static_cast<int64_t>(N) * F > kParallelMin)
  for (int n = 0; n < N; n++) {
    const float* gate = inp + static_cast<int64_t>(n) * 2 * F;
    swiglu_forward_row(out + static_cast<int64_t>(n) * F, gate, gate + F, F);
  }
}

void swiglu_backward(float* dinp, const float* inp, const float* dout, int N, int F) {
#pragma omp parallel for schedule(static) if (static_cast<int64_t>(N) * F > kParallelMin)
  for (int n = 0; n < N; n++) {
    const int64_t row = static_cast<int64_t>(n) * 2 * F;
    swiglu_backward_row(dinp + row, dinp + row + F, inp + row, inp + row + F, dout + static_cast<int64_t>(n) * F, F);
  }
}

}  // namespace tessera::cpu
