#include <cmath>

#include "kernels/ref/ops.h"

namespace tessera::ref {

// Row layout of inp: NH queries, KV keys, KV values of hs floats each.
void attention_gqa_forward(float* out, float* preatt, float* att, const float* inp, int B, int T, int NH, int KV,
                           int hs) {
  const int64_t W = static_cast<int64_t>(NH + 2 * KV) * hs;  // inp row
  const int64_t Co = static_cast<int64_t>(NH) * hs;           // out row
  const int64_t koff = static_cast<int64_t>(NH) * hs, voff = static_cast<int64_t>(NH + KV) * hs;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  for (int b = 0; b < B; b++) {
    for (int t = 0; t < T; t++) {
      for (int h = 0; h < NH; h++) {
        const int g = h % KV;
        const float* q = inp + (static_cast<int64_t>(b) * T + t) * W + h * hs;
        float* pre = preatt + ((static_cast<int64_t>(b) * NH + h) * T + t) * T;
        float* a = att + ((static_cast<int64_t>(b) * NH + h) * T + t) * T;
        // scores and their max, over keys t2 <= t
        float maxval = -INFINITY;
        for (int t2 = 0; t2 <= t; t2++) {
          const float* k = inp + (static_cast<int64_t>(b) * T + t2) * W + koff + g * hs;
          float v = 0.0f;
          for (int i = 0; i < hs; i++) v += q[i] * k[i];
          v *= scale;
          pre[t2] = v;
          if (v > maxval) maxval = v;
        }
        float sum = 0.0f;
        for (int t2 = 0; t2 <= t; t2++) {
          float e = std::exp(pre[t2] - maxval);
          a[t2] = e;
          sum += e;
        }
        for (int t2 = 0; t2 < T; t2++) {
          if (t2 <= t) {
            a[t2] /= sum;
          } else {
            a[t2] = 0.0f;
            pre[t2] = 0.0f;
          }
        }
        float* o = out + (static_cast<int64_t>(b) * T + t) * Co + h * hs;
        for (int i = 0; i < hs; i++) o[i] = 0.0f;
        for (int t2 = 0; t2 <= t; t2++) {
          const float* v = inp + (static_cast<int64_t>(b) * T + t2) * W + voff + g * hs;
          for (int i = 0; i < hs; i++) o[i] += a[t2] * v[i];
        }
      }
    }
  }
}

void attention_gqa_backward(float* dinp, float* dpreatt, float* datt, const float* dout, const float* inp,
                            const float* att, int B, int T, int NH, int KV, int hs) {
  const int64_t W = static_cast<int64_t>(NH + 2 * KV) * hs;
  const int64_t Co = static_cast<int64_t>(NH) * hs;
  const int64_t koff = static_cast<int64_t>(NH) * hs, voff = static_cast<int64_t>(NH + KV) * hs;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  for (int b = 0; b < B; b++) {
    for (int t = 0; t < T; t++) {
      for (int h = 0; h < NH; h++) {
        const int g = h % KV;
        const float* a = att + ((static_cast<int64_t>(b) * NH + h) * T + t) * T;
        float* da = datt + ((static_cast<int64_t>(b) * NH + h) * T + t) * T;
        float* dpre = dpreatt + ((static_cast<int64_t>(b) * NH + h) * T + t) * T;
        const float* q = inp + (static_cast<int64_t>(b) * T + t) * W + h * hs;
        float* dq = dinp + (static_cast<int64_t>(b) * T + t) * W + h * hs;
        const float* dy = dout + (static_cast<int64_t>(b) * T + t) * Co + h * hs;
        // out = att @ v
        for (int t2 = 0; t2 <= t; t2++) {
          const float* v = inp + (static_cast<int64_t>(b) * T + t2) * W + voff + g * hs;
          float* dv = dinp + (static_cast<int64_t>(b) * T + t2) * W + voff + g * hs;
          for (int i = 0; i < hs; i++) {
            da[t2] += v[i] * dy[i];
            dv[i] += a[t2] * dy[i];
          }
        }
        // softmax: dpre[j] += a[j] * (da[j] - sum_i a[i] da[i])
        float dot = 0.0f;
        for (int t2 = 0; t2 <= t; t2++) dot += a[t2] * da[t2];
        for (int t2 = 0; t2 <= t; t2++) dpre[t2] += a[t2] * (da[t2] - dot);
        // pre = scale * q . k
        for (int t2 = 0; t2 <= t; t2++) {
          const float* k = inp + (static_cast<int64_t>(b) * T + t2) * W + koff + g * hs;
          float* dk = dinp + (static_cast<int64_t>(b) * T + t2) * W + koff + g * hs;
          for (int i = 0; i < hs; i++) {
            dq[i] += k[i] * dpre[t2] * scale;
            dk[i] += q[i] * dpre[t2] * scale;
          }
        }
      }
    }
  }
}

void attention_forward(float* out, float* preatt, float* att, const float* inp, int B, int T, int C, int NH) {
  attention_gqa_forward(out, preatt, att, inp, B, T, NH, NH, C / NH);
}

void attention_backward(float* dinp, float* dpreatt, float* datt, const float* dout, const float* inp,
                        const float* att, int B, int T, int C, int NH) {
  attention_gqa_backward(dinp, dpreatt, datt, dout, inp, att, B, T, NH, NH, C / NH);
}

}  // namespace tessera::ref
