// The Llama family's ops of ops.inc (RMSNorm, rotary embedding, SwiGLU) as
// plain loops: the oracle.
#include <cmath>

#include "kernels/ref/ops.h"

namespace tessera::ref {

void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int N, int C, float eps) {
  for (int i = 0; i < N; i++) {
    const float* x = inp + static_cast<int64_t>(i) * C;
    float ss = 0.0f;
    for (int c = 0; c < C; c++) ss += x[c] * x[c];
    const float s = 1.0f / std::sqrt(ss / C + eps);
    float* y = out + static_cast<int64_t>(i) * C;
    for (int c = 0; c < C; c++) y[c] = x[c] * s * weight[c];
    rstd[i] = s;
  }
}

// y = w * x * s with s = (mean(x^2) + eps)^-1/2: dx = s (g - xhat mean(g
// xhat)) for g = w dy and xhat = x s.
void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                      const float* rstd, int N, int C) {
  for (int i = 0; i < N; i++) {
    const float* dy = dout + static_cast<int64_t>(i) * C;
    const float* x = inp + static_cast<int64_t>(i) * C;
    float* dx = dinp + static_cast<int64_t>(i) * C;
    const float s = rstd[i];
    float dot = 0.0f;
    for (int c = 0; c < C; c++) dot += weight[c] * dy[c] * x[c] * s;
    dot /= C;
    for (int c = 0; c < C; c++) {
      const float xhat = x[c] * s;
      dweight[c] += dy[c] * xhat;
      dx[c] += s * (weight[c] * dy[c] - xhat * dot);
    }
  }
}

namespace {
// Turns the query and key heads of one row by +-angle (sign 1 forward, -1
// backward).
void rotate_row(float* row, int pos, const float* inv_freq, int heads, int hs, float sign) {
  const int half = hs / 2;
  for (int i = 0; i < half; i++) {
    const float a = static_cast<float>(pos) * inv_freq[i];
    const float c = std::cos(a), s = sign * std::sin(a);
    for (int h = 0; h < heads; h++) {
      float* x = row + static_cast<int64_t>(h) * hs;
      const float x1 = x[i], x2 = x[i + half];
      x[i] = x1 * c - x2 * s;
      x[i + half] = x2 * c + x1 * s;
    }
  }
}
}  // namespace

void rope_forward(float* qkv, const int* pos, const float* inv_freq, int N, int NH, int KV, int hs) {
  const int64_t W = static_cast<int64_t>(NH + 2 * KV) * hs;
  for (int n = 0; n < N; n++) rotate_row(qkv + n * W, pos[n], inv_freq, NH + KV, hs, 1.0f);
}

void rope_backward(float* dqkv, const int* pos, const float* inv_freq, int N, int NH, int KV, int hs) {
  const int64_t W = static_cast<int64_t>(NH + 2 * KV) * hs;
  for (int n = 0; n < N; n++) rotate_row(dqkv + n * W, pos[n], inv_freq, NH + KV, hs, -1.0f);
}

void swiglu_forward(float* out, const float* inp, int N, int F) {
  for (int n = 0; n < N; n++) {
    const float* gate = inp + static_cast<int64_t>(n) * 2 * F;
    const float* up = gate + F;
    for (int i = 0; i < F; i++) {
      const float g = gate[i];
      out[static_cast<int64_t>(n) * F + i] = g / (1.0f + std::exp(-g)) * up[i];
    }
  }
}

// d/dg silu(g) = sig(g) (1 + g (1 - sig(g))).
void swiglu_backward(float* dinp, const float* inp, const float* dout, int N, int F) {
  for (int n = 0; n < N; n++) {
    const float* gate = inp + static_cast<int64_t>(n) * 2 * F;
    const float* up = gate + F;
    float* dgate = dinp + static_cast<int64_t>(n) * 2 * F;
    float* dup = dgate + F;
    const float* dy = dout + static_cast<int64_t>(n) * F;
    for (int i = 0; i < F; i++) {
      const float g = gate[i];
      const float sig = 1.0f / (1.0f + std::exp(-g));
      dgate[i] += dy[i] * up[i] * sig * (1.0f + g * (1.0f - sig));
      dup[i] += dy[i] * g * sig;
    }
  }
}

}  // namespace tessera::ref
