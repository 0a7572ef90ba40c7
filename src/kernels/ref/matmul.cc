#include "kernels/ref/ops.h"
#include "tensor/dtype.h"

namespace tessera::ref {

namespace {
// The value a matmul input takes at the given precision.
inline float in(float x, MatmulPrecision prec) { return prec == MatmulPrecision::kBF16 ? round_bf16(x) : x; }
}  // namespace

void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N, int C, int OC,
                    MatmulPrecision prec) {
  for (int i = 0; i < N; i++) {
    const float* x = inp + static_cast<int64_t>(i) * C;
    for (int o = 0; o < OC; o++) {
      const float* w = weight + static_cast<int64_t>(o) * C;
      double acc = 0.0;  // double: the oracle should not carry fp32 rounding noise
      for (int c = 0; c < C; c++) acc += static_cast<double>(in(x[c], prec)) * in(w[c], prec);
      out[static_cast<int64_t>(i) * OC + o] = static_cast<float>(acc) + (bias ? bias[o] : 0.0f);
    }
  }
}

void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int N, int C, int OC, MatmulPrecision prec) {
  if (dinp) {
    for (int i = 0; i < N; i++) {
      const float* dy = dout + static_cast<int64_t>(i) * OC;
      for (int c = 0; c < C; c++) {
        double acc = 0.0;
        for (int o = 0; o < OC; o++)
          acc += static_cast<double>(in(dy[o], prec)) * in(weight[static_cast<int64_t>(o) * C + c], prec);
        dinp[static_cast<int64_t>(i) * C + c] += static_cast<float>(acc);
      }
    }
  }
  for (int o = 0; o < OC; o++) {
    for (int c = 0; c < C; c++) {
      double acc = 0.0;
      for (int i = 0; i < N; i++)
        acc += static_cast<double>(in(dout[static_cast<int64_t>(i) * OC + o], prec)) *
               in(inp[static_cast<int64_t>(i) * C + c], prec);
      dweight[static_cast<int64_t>(o) * C + c] += static_cast<float>(acc);
    }
    if (dbias) {
      double acc = 0.0;
      for (int i = 0; i < N; i++) acc += dout[static_cast<int64_t>(i) * OC + o];
      dbias[o] += static_cast<float>(acc);
    }
  }
}

// Exactly the two ops the model used to call, so the CPU model is unchanged.
void matmul_gelu_forward(float* pre, float* out, const float* inp, const float* weight, const float* bias, int N,
                         int C, int OC, MatmulPrecision prec) {
  matmul_forward(pre, inp, weight, bias, N, C, OC, prec);
  gelu_forward(out, pre, static_cast<int64_t>(N) * OC);
}

}  // namespace tessera::ref
