// GELU (tanh approximation) and residual add over n elements.
//
// All four are streaming kernels: one read of each input, one write of each
// output, threaded over fixed-size blocks. GELU needs an exponential per
// element, so its block loop is compiled for AVX-512, AVX2 and baseline
// x86-64 (target_clones, chosen once at load time) around an exp that the
// compiler can vectorise; libm's expf/tanhf would keep the loop scalar.
#include <algorithm>
#include <cstring>

#include "kernels/cpu/ops.h"
#include "kernels/cpu/vec_math.h"


namespace tessera::cpu {

namespace {

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluCube = 0.044715f;
constexpr int64_t kBlock = 16384;        // elements per task (64 KiB of fp32)
constexpr int64_t kParallelMin = 65536;  // below this, no fork


// 0.5 x (1 + tanh(u)) is x * sigmoid(2u): one exp, and no cancellation in
// 1 + tanh(u) for negative x.
TESSERA_CPU_CLONES void gelu_forward_block(float* out, const float* inp, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; i++) {
    const float x = inp[i];
    const float u = kGeluScale * (x + kGeluCube * x * x * x);
    out[i] = x / (1.0f + exp_approx(-2.0f * u));
  }
}

// With s = sigmoid(2u): 0.5 (1 + tanh u) = s and sech^2 u = 4 s (1 - s).
TESSERA_CPU_CLONES void gelu_backward_block(float* dinp, const float* inp, const float* dout, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; i++) {
    const float x = inp[i];
    const float u = kGeluScale * (x + kGeluCube * x * x * x);
    const float s = 1.0f / (1.0f + exp_approx(-2.0f * u));
    const float du_dx = kGeluScale * (1.0f + 3.0f * kGeluCube * x * x);
    const float local_grad = s + 2.0f * x * s * (1.0f - s) * du_dx;
    dinp[i] += local_grad * dout[i];
  }
}

}  // namespace

void gelu_forward(float* out, const float* inp, int64_t n) {
  const int64_t nblocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (int64_t b = 0; b < nblocks; b++) {
    const int64_t lo = b * kBlock;
    gelu_forward_block(out + lo, inp + lo, std::min(kBlock, n - lo));
  }
}

void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t n) {
  const int64_t nblocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (int64_t b = 0; b < nblocks; b++) {
    const int64_t lo = b * kBlock;
    gelu_backward_block(dinp + lo, inp + lo, dout + lo, std::min(kBlock, n - lo));
  }
}

void residual_forward(float* out, const float* inp1, const float* inp2, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n > kParallelMin)
  for (int64_t i = 0; i < n; i++) out[i] = inp1[i] + inp2[i];
}

void residual_backward(float* dinp1, float* dinp2, const float* dout, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n > kParallelMin)
  for (int64_t i = 0; i < n; i++) {
    dinp1[i] += dout[i];
    dinp2[i] += dout[i];
  }
}

}  // namespace tessera::cpu
