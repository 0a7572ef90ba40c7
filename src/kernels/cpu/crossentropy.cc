// Fused softmax + cross-entropy over the vocabulary. N rows (B*T), V real
// columns, Vp padded columns (a multiple of 128).
//
// Rows are independent and threaded. Within a row the forward makes three
// passes (max; exp and sum; scale), but a row of logits plus its row of
// probabilities (2 x 196 KiB for GPT-2) stays in L2, so memory sees one read
// of logits and one write of probs. The row loop is compiled for AVX-512,
// AVX2 and baseline x86-64 (target_clones, chosen at load time) around an exp
// that vectorises; libm's expf would keep the loop scalar.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/cpu/ops.h"

#if defined(__GNUC__) && !defined(__clang__)
#define TESSERA_CPU_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define TESSERA_CPU_CLONES
#endif

namespace tessera::cpu {

namespace {

constexpr int64_t kParallelMin = 32768;  // elements; below this, no fork

// exp(x) for fp32, within 1.5 ulp on [-87.3, 88.3]; 0 below -87.3 (and for
// -inf), saturates at exp(88.3) = 2.2e38 above (and for +inf), NaN stays
// NaN. x = n ln2 + r with |r| <= ln2/2; exp(r) by the Cephes expf
// polynomial; 2^n goes straight into the exponent bits, n being rounded by
// adding 1.5 * 2^23, which leaves it in the low mantissa bits.
//
// Written without a single branch or '?:' so that GCC vectorises loops
// calling it at every ISA level: a select whose arms differ lets PRE fold the
// constant arm and leave floating-point work on one path only, which
// -ftrapping-math then refuses to if-convert. The clamps are therefore bit
// masks on the integer image of x (fp32 bits order like int32 for positive
// values and like uint32 for negative ones).
inline float exp_approx(float x) {
  constexpr float kMagic = 12582912.0f;      // 1.5 * 2^23
  constexpr int32_t kHiBits = 0x42b0999a;    // 88.3f
  constexpr uint32_t kLoBits = 0xc2ae999au;  // -87.3f
  int32_t xi;
  std::memcpy(&xi, &x, 4);
  const int32_t nan_mask = -static_cast<int32_t>((xi & 0x7fffffff) > 0x7f800000);
  const int32_t hi_mask = -static_cast<int32_t>(xi > kHiBits);
  const int32_t lo_mask = -static_cast<int32_t>(static_cast<uint32_t>(xi) > kLoBits);
  xi = (xi & ~hi_mask) | (kHiBits & hi_mask);
  xi = (xi & ~lo_mask) | (static_cast<int32_t>(kLoBits) & lo_mask);
  float xc;
  std::memcpy(&xc, &xi, 4);
  const float t = xc * 1.44269504088896341f + kMagic;
  const float n = t - kMagic;
  float r = xc - n * 0.693359375f;  // ln2 in two parts, the first exact in n * it
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float e = p * r * r + r + 1.0f;
  int32_t t_bits, magic_bits;
  std::memcpy(&t_bits, &t, 4);
  std::memcpy(&magic_bits, &kMagic, 4);
  const int32_t scale_bits = (t_bits - magic_bits + 127) << 23;
  float scale;
  std::memcpy(&scale, &scale_bits, 4);
  const float y = e * scale;
  int32_t y_bits;
  std::memcpy(&y_bits, &y, 4);
  y_bits = (y_bits & ~lo_mask) | (nan_mask & 0x7fc00000);
  float out;
  std::memcpy(&out, &y_bits, 4);
  return out;
}

// One row: p (Vp) = softmax(x[0:V]) with zero padding; returns
// -log p[target] in the log-sum-exp form log(sum) - (x[target] - max), which
// stays finite when p[target] underflows. The sum is kept in double, as in
// the reference: V terms of up to 1 each.
TESSERA_CPU_CLONES float crossentropy_row(float* p, const float* x, int target, int V, int Vp) {
  float maxval = -INFINITY;
#pragma omp simd reduction(max : maxval)
  for (int j = 0; j < V; j++) maxval = x[j] > maxval ? x[j] : maxval;
  double sum = 0.0;
#pragma omp simd reduction(+ : sum)
  for (int j = 0; j < V; j++) {
    const float e = exp_approx(x[j] - maxval);
    p[j] = e;
    sum += e;
  }
  const float inv_sum = static_cast<float>(1.0 / sum);
#pragma omp simd
  for (int j = 0; j < V; j++) p[j] *= inv_sum;
  for (int j = V; j < Vp; j++) p[j] = 0.0f;
  return static_cast<float>(std::log(sum) - (x[target] - maxval));
}

TESSERA_CPU_CLONES void crossentropy_backward_row(float* dx, const float* p, int target, float dloss, int V) {
#pragma omp simd
  for (int j = 0; j < V; j++) {
    const float indicator = j == target ? 1.0f : 0.0f;
    dx[j] += (p[j] - indicator) * dloss;
  }
}

}  // namespace

void crossentropy_softmax_forward(float* losses, float* probs, const float* logits, const int* targets, int N,
                                  int V, int Vp) {
#pragma omp parallel for schedule(static) if (static_cast<int64_t>(N) * V > kParallelMin)
  for (int i = 0; i < N; i++) {
    const int64_t row = static_cast<int64_t>(i) * Vp;
    losses[i] = crossentropy_row(probs + row, logits + row, targets[i], V, Vp);
  }
}

void crossentropy_softmax_backward(float* dlogits, const float* probs, const int* targets, float dloss, int N,
                                   int V, int Vp) {
#pragma omp parallel for schedule(static) if (static_cast<int64_t>(N) * V > kParallelMin)
  for (int i = 0; i < N; i++) {
    const int64_t row = static_cast<int64_t>(i) * Vp;
    crossentropy_backward_row(dlogits + row, probs + row, targets[i], dloss, V);
  }
}

}  // namespace tessera::cpu
