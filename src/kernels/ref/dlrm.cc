// Reference recommendation (DLRM) ops: plain loops, the oracle for
// kernels/cpu/dlrm.cc. Letters as in ops.inc (B samples, D dimension, F
// features, P pairs, L ids).
#include <algorithm>
#include <cmath>
#include <map>
#include <vector>

#include "kernels/ref/ops.h"

namespace tessera::ref {

void embedding_bag_forward(float* out, int64_t ldo, const float* table, const int* ids, const int* offsets, int B,
                           int D, Pooling pooling) {
  for (int b = 0; b < B; b++) {
    float* o = out + b * ldo;
    for (int d = 0; d < D; d++) o[d] = 0.0f;
    for (int p = offsets[b]; p < offsets[b + 1]; p++) {
      const float* row = table + static_cast<int64_t>(ids[p]) * D;
      for (int d = 0; d < D; d++) o[d] += row[d];
    }
    const int n = offsets[b + 1] - offsets[b];
    if (pooling == Pooling::kMean && n > 0)
      for (int d = 0; d < D; d++) o[d] /= static_cast<float>(n);
  }
}

int embedding_bag_backward(int* rows, float* drows, const float* dout, int64_t ldd, const int* ids,
                           const int* offsets, int B, int D, Pooling pooling) {
  std::map<int, std::vector<float>> grads;
  for (int b = 0; b < B; b++) {
    const int n = offsets[b + 1] - offsets[b];
    const float scale = pooling == Pooling::kMean ? 1.0f / static_cast<float>(n) : 1.0f;
    for (int p = offsets[b]; p < offsets[b + 1]; p++) {
      std::vector<float>& g = grads[ids[p]];
      g.resize(D, 0.0f);
      for (int d = 0; d < D; d++) g[d] += dout[b * ldd + d] * scale;
    }
  }
  int u = 0;
  for (const auto& [row, g] : grads) {
    rows[u] = row;
    for (int d = 0; d < D; d++) drows[static_cast<int64_t>(u) * D + d] = g[d];
    u++;
  }
  return u;
}

void interaction_forward(float* out, const float* feat, int B, int F, int D) {
  const int P = F * (F - 1) / 2;
  for (int b = 0; b < B; b++) {
    const float* x = feat + static_cast<int64_t>(b) * F * D;
    float* o = out + static_cast<int64_t>(b) * (D + P);
    for (int d = 0; d < D; d++) o[d] = x[d];
    int k = D;
    for (int i = 1; i < F; i++)
      for (int j = 0; j < i; j++) {
        float dot = 0.0f;
        for (int d = 0; d < D; d++) dot += x[i * D + d] * x[j * D + d];
        o[k++] = dot;
      }
  }
}

void interaction_backward(float* dfeat, const float* dout, const float* feat, int B, int F, int D) {
  const int P = F * (F - 1) / 2;
  for (int b = 0; b < B; b++) {
    const float* x = feat + static_cast<int64_t>(b) * F * D;
    float* dx = dfeat + static_cast<int64_t>(b) * F * D;
    const float* g = dout + static_cast<int64_t>(b) * (D + P);
    for (int d = 0; d < D; d++) dx[d] += g[d];
    int k = D;
    for (int i = 1; i < F; i++)
      for (int j = 0; j < i; j++) {
        const float gk = g[k++];
        for (int d = 0; d < D; d++) {
          dx[i * D + d] += gk * x[j * D + d];
          dx[j * D + d] += gk * x[i * D + d];
        }
      }
  }
}

void relu_forward(float* out, const float* inp, int64_t n) {
  for (int64_t i = 0; i < n; i++) out[i] = inp[i] > 0.0f ? inp[i] : 0.0f;
}

void relu_backward(float* dinp, const float* inp, const float* dout, int64_t n) {
  for (int64_t i = 0; i < n; i++)
    if (inp[i] > 0.0f) dinp[i] += dout[i];
}

void bce_logits_forward(float* losses, const float* logits, const float* labels, int N) {
  for (int i = 0; i < N; i++) {
    const double x = logits[i], y = labels[i];
    losses[i] = static_cast<float>(std::max(x, 0.0) - x * y + std::log1p(std::exp(-std::fabs(x))));
  }
}

void bce_logits_backward(float* dlogits, const float* logits, const float* labels, float dloss, int N) {
  for (int i = 0; i < N; i++) {
    const double s = 1.0 / (1.0 + std::exp(-static_cast<double>(logits[i])));
    dlogits[i] += static_cast<float>((s - labels[i]) * dloss);
  }
}

}  // namespace tessera::ref
