#include "nn/vocab_parallel.h"

#include <cmath>
#include <limits>

namespace tessera {

void vocab_parallel_encoder_forward(float* out, const int* inp, const float* wte, int v0, int Vl, const float* wpe,
                                    int B, int T, int C) {
#pragma omp parallel for schedule(static)
  for (int64_t bt = 0; bt < int64_t{B} * T; bt++) {
    const int t = static_cast<int>(bt % T);
    const int64_t row = int64_t{inp[bt]} - v0;
    const float* w = row >= 0 && row < Vl ? wte + row * C : nullptr;
    const float* p = wpe ? wpe + int64_t{t} * C : nullptr;
    float* o = out + bt * C;
    for (int i = 0; i < C; i++) o[i] = (w ? w[i] : 0.0f) + (p ? p[i] : 0.0f);
  }
}

void vocab_parallel_encoder_backward(float* dwte, float* dwpe, const float* dout, const int* inp, int v0, int Vl,
                                     int B, int T, int C) {
  for (int64_t bt = 0; bt < int64_t{B} * T; bt++) {
    const int64_t row = int64_t{inp[bt]} - v0;
    if (row < 0 || row >= Vl) continue;
    float* d = dwte + row * C;
    const float* g = dout + bt * C;
    for (int i = 0; i < C; i++) d[i] += g[i];
  }
#pragma omp parallel for schedule(static)
  for (int t = 0; t < (dwpe ? T : 0); t++) {
    float* d = dwpe + int64_t{t} * C;
    for (int b = 0; b < B; b++) {
      const float* g = dout + (int64_t{b} * T + t) * C;
      for (int i = 0; i < C; i++) d[i] += g[i];
    }
  }
}

void vocab_parallel_ce_max(float* row_max, const float* logits, int N, int Vl, int valid) {
#pragma omp parallel for schedule(static)
  for (int i = 0; i < N; i++) {
    const float* x = logits + int64_t{i} * Vl;
    float m = -std::numeric_limits<float>::infinity();
    for (int j = 0; j < valid; j++) m = x[j] > m ? x[j] : m;
    row_max[i] = m;
  }
}

void vocab_parallel_ce_exp(float* sums, float* probs, int* local_targets, const float* logits, const int* targets,
                           const float* row_max, int N, int Vl, int valid, int v0) {
#pragma omp parallel for schedule(static)
  for (int i = 0; i < N; i++) {
    const float* x = logits + int64_t{i} * Vl;
    float* p = probs + int64_t{i} * Vl;
    const float m = row_max[i];
    double s = 0.0;
    for (int j = 0; j < valid; j++) {
      p[j] = std::exp(x[j] - m);
      s += p[j];
    }
    for (int j = valid; j < Vl; j++) p[j] = 0.0f;
    const int t = targets[i] - v0;
    const bool mine = t >= 0 && t < valid;
    local_targets[i] = mine ? t : -1;
    sums[i] = static_cast<float>(s);
    sums[N + i] = mine ? x[t] - m : 0.0f;
  }
}

void vocab_parallel_ce_finish(float* losses, float* probs, const float* row_max, const float* sums, int N, int Vl,
                              int valid) {
#pragma omp parallel for schedule(static)
  for (int i = 0; i < N; i++) {
    const float s = sums[i];
    losses[i] = std::log(s) - sums[N + i];
    float* p = probs + int64_t{i} * Vl;
    const float inv = 1.0f / s;
    for (int j = 0; j < valid; j++) p[j] *= inv;
  }
}

}  // namespace tessera
