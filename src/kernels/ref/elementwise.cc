// GELU and residual add.
#include <cmath>

#include "kernels/ref/ops.h"

namespace tessera::ref {

namespace {
constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi)
}

void gelu_forward(float* out, const float* inp, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    float x = inp[i];
    float cube = 0.044715f * x * x * x;
    out[i] = 0.5f * x * (1.0f + std::tanh(kGeluScale * (x + cube)));
  }
}

void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    float x = inp[i];
    float cube = 0.044715f * x * x * x;
    float tanh_arg = kGeluScale * (x + cube);
    float tanh_out = std::tanh(tanh_arg);
    float sech2 = 1.0f - tanh_out * tanh_out;
    float local_grad = 0.5f * (1.0f + tanh_out) + x * 0.5f * sech2 * kGeluScale * (1.0f + 3.0f * 0.044715f * x * x);
    dinp[i] += local_grad * dout[i];
  }
}

void residual_forward(float* out, const float* inp1, const float* inp2, int64_t n) {
  for (int64_t i = 0; i < n; i++) out[i] = inp1[i] + inp2[i];
}

void residual_backward(float* dinp1, float* dinp2, const float* dout, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    dinp1[i] += dout[i];
    dinp2[i] += dout[i];
  }
}

}  // namespace tessera::ref
