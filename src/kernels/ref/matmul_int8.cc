// The INT8 matmul's oracle: plain loops, int64 accumulation (ops.inc).
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/ref/ops.h"

namespace tessera::ref {

namespace {
// Symmetric int8 quantization of n values: the scale and the codes.
float quantize_row(int8_t* q, const float* x, int n) {
  float amax = 0.0f;
  for (int i = 0; i < n; i++) amax = std::max(amax, std::fabs(x[i]));
  const float scale = amax > 0.0f ? amax / 127.0f : 1.0f;
  for (int i = 0; i < n; i++) {
    const float r = std::round(x[i] / scale);  // half away from zero
    q[i] = static_cast<int8_t>(std::clamp(r, -127.0f, 127.0f));
  }
  return scale;
}
}  // namespace

void quantize_weights_int8(int8_t* wq, float* wscale, const float* weight, int OC, int C) {
  for (int o = 0; o < OC; o++)
    wscale[o] = quantize_row(wq + static_cast<int64_t>(o) * C, weight + static_cast<int64_t>(o) * C, C);
}

void matmul_int8_forward(float* out, const float* inp, const int8_t* wq, const float* wscale, const float* bias,
                         int N, int C, int OC) {
  std::vector<int8_t> xq(C);
  for (int i = 0; i < N; i++) {
    const float xs = quantize_row(xq.data(), inp + static_cast<int64_t>(i) * C, C);
    for (int o = 0; o < OC; o++) {
      const int8_t* w = wq + static_cast<int64_t>(o) * C;
      int64_t acc = 0;
      for (int c = 0; c < C; c++) acc += static_cast<int64_t>(xq[c]) * w[c];
      out[static_cast<int64_t>(i) * OC + o] =
          static_cast<float>(acc) * xs * wscale[o] + (bias ? bias[o] : 0.0f);
    }
  }
}

}  // namespace tessera::ref
