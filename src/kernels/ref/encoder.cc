#include "kernels/ref/ops.h"

namespace tessera::ref {

void encoder_forward(float* out, const int* inp, const float* wte, const float* wpe, int B, int T, int C) {
  for (int b = 0; b < B; b++) {
    for (int t = 0; t < T; t++) {
      float* out_bt = out + (static_cast<int64_t>(b) * T + t) * C;
      const float* wte_ix = wte + static_cast<int64_t>(inp[b * T + t]) * C;
      const float* wpe_t = wpe ? wpe + static_cast<int64_t>(t) * C : nullptr;
      for (int i = 0; i < C; i++) out_bt[i] = wpe_t ? wte_ix[i] + wpe_t[i] : wte_ix[i];
    }
  }
}

void encoder_backward(float* dwte, float* dwpe, const float* dout, const int* inp, int B, int T, int C) {
  for (int b = 0; b < B; b++) {
    for (int t = 0; t < T; t++) {
      const float* dout_bt = dout + (static_cast<int64_t>(b) * T + t) * C;
      float* dwte_ix = dwte + static_cast<int64_t>(inp[b * T + t]) * C;
      float* dwpe_t = dwpe ? dwpe + static_cast<int64_t>(t) * C : nullptr;
      for (int i = 0; i < C; i++) {
        dwte_ix[i] += dout_bt[i];
        if (dwpe_t) dwpe_t[i] += dout_bt[i];
      }
    }
  }
}

}  // namespace tessera::ref
