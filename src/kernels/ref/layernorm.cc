#include <cmath>

#include "kernels/ref/ops.h"

namespace tessera::ref {

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int N, int C) {
  const float eps = 1e-5f;
  for (int i = 0; i < N; i++) {
    const float* x = inp + static_cast<int64_t>(i) * C;
    float m = 0.0f;
    for (int c = 0; c < C; c++) m += x[c];
    m /= C;
    float var = 0.0f;
    for (int c = 0; c < C; c++) var += (x[c] - m) * (x[c] - m);
    var /= C;
    float s = 1.0f / std::sqrt(var + eps);
    float* y = out + static_cast<int64_t>(i) * C;
    for (int c = 0; c < C; c++) y[c] = s * (x[c] - m) * weight[c] + bias[c];
    mean[i] = m;
    rstd[i] = s;
  }
}

void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const float* weight, const float* mean, const float* rstd, int N, int C) {
  for (int i = 0; i < N; i++) {
    const float* dy = dout + static_cast<int64_t>(i) * C;
    const float* x = inp + static_cast<int64_t>(i) * C;
    float* dx = dinp + static_cast<int64_t>(i) * C;
    float m = mean[i], s = rstd[i];
    // Two reductions: mean of dnorm and mean of dnorm * norm.
    float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
    for (int c = 0; c < C; c++) {
      float norm = (x[c] - m) * s;
      float dnorm = weight[c] * dy[c];
      dnorm_mean += dnorm;
      dnorm_norm_mean += dnorm * norm;
    }
    dnorm_mean /= C;
    dnorm_norm_mean /= C;
    for (int c = 0; c < C; c++) {
      float norm = (x[c] - m) * s;
      float dnorm = weight[c] * dy[c];
      dbias[c] += dy[c];
      dweight[c] += norm * dy[c];
      dx[c] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s;
    }
  }
}

}  // namespace tessera::ref
