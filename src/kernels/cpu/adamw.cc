// AdamW, fused: one pass in which params, m and v are each read and written
// once and grads read once (28 bytes of traffic per parameter), threaded
// over fixed-size blocks. The block loop is compiled for AVX-512, AVX2 and
// baseline x86-64 (target_clones, chosen at load time) so the sqrt and
// divide keep up with memory.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/cpu/ops.h"
#include "kernels/cpu/vec_math.h"


namespace tessera::cpu {

namespace {

constexpr int64_t kBlock = 16384;        // parameters per task
constexpr int64_t kParallelMin = 65536;  // below this, no fork

// sqrt(x) for x >= 0 to about 3 ulp: the bit-trick guess for 1/sqrt(x)
// refined by three Newton steps, times x (0 gives 0; denormal x comes out
// too small, which eps hides). std::sqrt would be
// exact, but without -fno-math-errno GCC guards every call with a branch to
// libm for negative inputs, which keeps the whole loop scalar (2.3x slower
// at 124M parameters).
inline float sqrt_nonneg(float x) {
  int32_t bits;
  std::memcpy(&bits, &x, 4);
  bits = 0x5f375a86 - (bits >> 1);
  float y;
  std::memcpy(&y, &bits, 4);
  const float half_x = 0.5f * x;
  y = y * (1.5f - half_x * y * y);
  y = y * (1.5f - half_x * y * y);
  y = y * (1.5f - half_x * y * y);
  return x * y;
}

// The step's constants, computed once per call.
struct AdamWStep {
  float beta1, beta2, one_minus_beta1, one_minus_beta2;
  float inv_bc1, inv_bc2;  // 1 / bias corrections
  float lr, eps, weight_decay, grad_scale;
};

TESSERA_CPU_CLONES void adamw_block(float* params, const float* grads, float* m, float* v, int64_t n,
                                    const AdamWStep& s) {
#pragma omp simd
  for (int64_t i = 0; i < n; i++) {
    const float g = grads[i] * s.grad_scale;
    const float mi = s.beta1 * m[i] + s.one_minus_beta1 * g;
    const float vi = s.beta2 * v[i] + s.one_minus_beta2 * g * g;
    m[i] = mi;
    v[i] = vi;
    const float mhat = mi * s.inv_bc1;
    const float vhat = vi * s.inv_bc2;
    params[i] -= s.lr * (mhat / (sqrt_nonneg(vhat) + s.eps) + s.weight_decay * params[i]);
  }
}

}  // namespace

void adamw_update(float* params, const float* grads, float* m, float* v, int64_t n, const AdamWParams& hp) {
  const float bc1 = 1.0f - std::pow(hp.beta1, static_cast<float>(hp.t));
  const float bc2 = 1.0f - std::pow(hp.beta2, static_cast<float>(hp.t));
  const AdamWStep step{.beta1 = hp.beta1,
                       .beta2 = hp.beta2,
                       .one_minus_beta1 = 1.0f - hp.beta1,
                       .one_minus_beta2 = 1.0f - hp.beta2,
                       .inv_bc1 = 1.0f / bc1,
                       .inv_bc2 = 1.0f / bc2,
                       .lr = hp.lr,
                       .eps = hp.eps,
                       .weight_decay = hp.weight_decay,
                       .grad_scale = hp.grad_scale};
  const int64_t nblocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (int64_t b = 0; b < nblocks; b++) {
    const int64_t lo = b * kBlock;
    adamw_block(params + lo, grads + lo, m + lo, v + lo, std::min(kBlock, n - lo), step);
  }
}

}  // namespace tessera::cpu
