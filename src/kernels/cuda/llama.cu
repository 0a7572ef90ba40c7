// The Llama family's ops of ops.inc on CUDA: RMSNorm, rotary embedding,
// SwiGLU and grouped-query attention (the plain kernel set, as attention.cu:
// one thread per output element, looping over the reduced index in the
// oracle's order, so nothing races and results are deterministic).
// Dimension letters as in ops.inc; W = (NH + 2KV) * hs is a qkv row.
#include <cmath>

#include "kernels/cuda/attention_rows.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

namespace tessera::cuda {

namespace {

constexpr int kBlock = 256;
constexpr int kRowsPerBlock = 8;  // RMSNorm: one warp per row
constexpr int kRows = 8;          // dweight: rows per block column

#define TESSERA_GRID_STRIDE(i, n)                                                        \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)

// ---- RMSNorm: one warp per row.
__global__ void rmsnorm_forward_kernel(float* out, float* rstd, const float* inp, const float* weight, int N, int C,
                                       float eps) {
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  if (row >= N) return;  // whole warp
  const float* x = inp + static_cast<int64_t>(row) * C;
  float ss = 0.0f;
  for (int c = lane; c < C; c += kWarpSize) ss += x[c] * x[c];
  ss = warp_sum(ss);
  const float s = 1.0f / sqrtf(ss / C + eps);
  float* y = out + static_cast<int64_t>(row) * C;
  for (int c = lane; c < C; c += kWarpSize) y[c] = x[c] * s * weight[c];
  if (lane == 0) rstd[row] = s;
}

__global__ void rmsnorm_backward_dinp_kernel(float* dinp, const float* dout, const float* inp, const float* weight,
                                             const float* rstd, int N, int C) {
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  if (row >= N) return;
  const int64_t base = static_cast<int64_t>(row) * C;
  const float s = rstd[row];
  float dot = 0.0f;
  for (int c = lane; c < C; c += kWarpSize) dot += weight[c] * dout[base + c] * inp[base + c] * s;
  dot = warp_sum(dot) / C;
  for (int c = lane; c < C; c += kWarpSize) {
    const float xhat = inp[base + c] * s;
    dinp[base + c] += s * (weight[c] * dout[base + c] - xhat * dot);
  }
}

// dweight: block (32, kRows), as layernorm.cu's parameter gradient.
__global__ void rmsnorm_backward_weight_kernel(float* dweight, const float* dout, const float* inp, const float* rstd,
                                               int N, int C) {
  __shared__ float part[kRows][kWarpSize];
  const int c = blockIdx.x * kWarpSize + threadIdx.x;
  float acc = 0.0f;
  if (c < C) {
    for (int r = threadIdx.y; r < N; r += kRows) {
      const int64_t i = static_cast<int64_t>(r) * C + c;
      acc += dout[i] * inp[i] * rstd[r];
    }
  }
  part[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    for (int k = 1; k < kRows; k++) acc += part[k][threadIdx.x];
    dweight[c] += acc;
  }
}

// ---- Rotary embedding: one thread per (row, head of q or k, pair).
__global__ void rope_kernel(float* qkv, const int* pos, const float* inv_freq, int N, int heads, int hs, int64_t W,
                            float sign) {
  const int half = hs / 2;
  const int64_t n = static_cast<int64_t>(N) * heads * half;
  TESSERA_GRID_STRIDE(k, n) {
    const int i = static_cast<int>(k % half);
    const int h = static_cast<int>((k / half) % heads);
    const int64_t row = k / (static_cast<int64_t>(half) * heads);
    float sn, cs;
    sincosf(static_cast<float>(pos[row]) * inv_freq[i], &sn, &cs);
    sn *= sign;
    float* x = qkv + row * W + static_cast<int64_t>(h) * hs;
    const float x1 = x[i], x2 = x[i + half];
    x[i] = x1 * cs - x2 * sn;
    x[i + half] = x2 * cs + x1 * sn;
  }
}

// ---- SwiGLU: one thread per (row, hidden unit).
__global__ void swiglu_forward_kernel(float* out, const float* inp, int F, int64_t n) {
  TESSERA_GRID_STRIDE(k, n) {
    const int64_t row = k / F;
    const int i = static_cast<int>(k % F);
    const float g = inp[row * 2 * F + i], u = inp[row * 2 * F + F + i];
    out[k] = g / (1.0f + expf(-g)) * u;
  }
}

__global__ void swiglu_backward_kernel(float* dinp, const float* inp, const float* dout, int F, int64_t n) {
  TESSERA_GRID_STRIDE(k, n) {
    const int64_t row = k / F;
    const int i = static_cast<int>(k % F);
    const float g = inp[row * 2 * F + i], u = inp[row * 2 * F + F + i];
    const float sig = 1.0f / (1.0f + expf(-g));
    dinp[row * 2 * F + i] += dout[k] * u * sig * (1.0f + g * (1.0f - sig));
    dinp[row * 2 * F + F + i] += dout[k] * g * sig;
  }
}

// ---- Grouped-query attention (plain). Offsets of query head h, and of
// key and value head g, at (b, t).
struct Gqa {
  int B, T, NH, KV, hs;
  __device__ int64_t row(int b, int t) const { return (static_cast<int64_t>(b) * T + t) * (NH + 2 * KV) * hs; }
  __device__ int64_t q(int b, int t, int h) const { return row(b, t) + static_cast<int64_t>(h) * hs; }
  __device__ int64_t k(int b, int t, int g) const { return row(b, t) + static_cast<int64_t>(NH + g) * hs; }
  __device__ int64_t v(int b, int t, int g) const { return row(b, t) + static_cast<int64_t>(NH + KV + g) * hs; }
  __device__ int64_t att(int b, int h, int t) const { return ((static_cast<int64_t>(b) * NH + h) * T + t) * T; }
  __device__ int64_t out(int b, int t, int h) const {
    return (static_cast<int64_t>(b) * T + t) * NH * hs + static_cast<int64_t>(h) * hs;
  }
};

__global__ void gqa_scores_kernel(float* preatt, const float* inp, Gqa d, float scale) {
  const int T = d.T;
  const int64_t n = static_cast<int64_t>(d.B) * d.NH * T * T;
  TESSERA_GRID_STRIDE(i, n) {
    const int t2 = static_cast<int>(i % T), t = static_cast<int>((i / T) % T);
    const int h = static_cast<int>((i / (static_cast<int64_t>(T) * T)) % d.NH);
    const int b = static_cast<int>(i / (static_cast<int64_t>(T) * T * d.NH));
    float v = 0.0f;
    if (t2 <= t) {
      const float* q = inp + d.q(b, t, h);
      const float* k = inp + d.k(b, t2, h % d.KV);
      for (int j = 0; j < d.hs; j++) v += q[j] * k[j];
      v *= scale;
    }
    preatt[i] = v;
  }
}

__global__ void gqa_values_kernel(float* out, const float* att, const float* inp, Gqa d) {
  const int64_t Q = static_cast<int64_t>(d.NH) * d.hs;
  const int64_t n = static_cast<int64_t>(d.B) * d.T * Q;
  TESSERA_GRID_STRIDE(i, n) {
    const int c = static_cast<int>(i % Q), t = static_cast<int>((i / Q) % d.T);
    const int b = static_cast<int>(i / (Q * d.T));
    const int h = c / d.hs, j = c % d.hs;
    const float* a = att + d.att(b, h, t);
    float acc = 0.0f;
    for (int t2 = 0; t2 <= t; t2++) acc += a[t2] * inp[d.v(b, t2, h % d.KV) + j];
    out[i] = acc;
  }
}

__global__ void gqa_datt_kernel(float* datt, const float* dout, const float* inp, Gqa d) {
  const int T = d.T;
  const int64_t n = static_cast<int64_t>(d.B) * d.NH * T * T;
  TESSERA_GRID_STRIDE(i, n) {
    const int t2 = static_cast<int>(i % T), t = static_cast<int>((i / T) % T);
    if (t2 > t) continue;
    const int h = static_cast<int>((i / (static_cast<int64_t>(T) * T)) % d.NH);
    const int b = static_cast<int>(i / (static_cast<int64_t>(T) * T * d.NH));
    const float* v = inp + d.v(b, t2, h % d.KV);
    const float* dy = dout + d.out(b, t, h);
    float acc = 0.0f;
    for (int j = 0; j < d.hs; j++) acc += v[j] * dy[j];
    datt[i] += acc;
  }
}

// dq(b,t,h)[j] += scale * sum over t2 <= t of dpreatt[b,h,t,t2] * k(b,t2,h%KV)[j].
__global__ void gqa_dq_kernel(float* dinp, const float* dpreatt, const float* inp, Gqa d, float scale) {
  const int64_t Q = static_cast<int64_t>(d.NH) * d.hs;
  const int64_t n = static_cast<int64_t>(d.B) * d.T * Q;
  TESSERA_GRID_STRIDE(i, n) {
    const int c = static_cast<int>(i % Q), t = static_cast<int>((i / Q) % d.T);
    const int b = static_cast<int>(i / (Q * d.T));
    const int h = c / d.hs, j = c % d.hs;
    const float* dpre = dpreatt + d.att(b, h, t);
    float acc = 0.0f;
    for (int t2 = 0; t2 <= t; t2++) acc += inp[d.k(b, t2, h % d.KV) + j] * dpre[t2];
    dinp[d.q(b, t, h) + j] += acc * scale;
  }
}

// dk and dv of key/value head g sum over the NH/KV query heads h = m*KV + g
// that read it: one thread per (b, t2, g, j) writes both.
__global__ void gqa_dkv_kernel(float* dinp, const float* dout, const float* dpreatt, const float* att,
                               const float* inp, Gqa d, float scale) {
  const int64_t Ck = static_cast<int64_t>(d.KV) * d.hs;
  const int64_t n = static_cast<int64_t>(d.B) * d.T * Ck;
  TESSERA_GRID_STRIDE(i, n) {
    const int c = static_cast<int>(i % Ck), t2 = static_cast<int>((i / Ck) % d.T);
    const int b = static_cast<int>(i / (Ck * d.T));
    const int g = c / d.hs, j = c % d.hs;
    float dk = 0.0f, dv = 0.0f;
    for (int h = g; h < d.NH; h += d.KV) {
      for (int t = t2; t < d.T; t++) {
        dk += inp[d.q(b, t, h) + j] * dpreatt[d.att(b, h, t) + t2];
        dv += att[d.att(b, h, t) + t2] * dout[d.out(b, t, h) + j];
      }
    }
    dinp[d.k(b, t2, g) + j] += dk * scale;
    dinp[d.v(b, t2, g) + j] += dv;
  }
}

#undef TESSERA_GRID_STRIDE

}  // namespace

void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int N, int C, float eps) {
  if (N == 0 || C == 0) return;
  rmsnorm_forward_kernel<<<ceil_div(N, kRowsPerBlock), kRowsPerBlock * kWarpSize>>>(out, rstd, inp, weight, N, C,
                                                                                   eps);
  CHECK_CUDA_LAUNCH();
}

void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                      const float* rstd, int N, int C) {
  if (N == 0 || C == 0) return;
  rmsnorm_backward_dinp_kernel<<<ceil_div(N, kRowsPerBlock), kRowsPerBlock * kWarpSize>>>(dinp, dout, inp, weight,
                                                                                         rstd, N, C);
  CHECK_CUDA_LAUNCH();
  rmsnorm_backward_weight_kernel<<<ceil_div(C, kWarpSize), dim3(kWarpSize, kRows)>>>(dweight, dout, inp, rstd, N, C);
  CHECK_CUDA_LAUNCH();
}

void rope_forward(float* qkv, const int* pos, const float* inv_freq, int N, int NH, int KV, int hs) {
  const int64_t n = static_cast<int64_t>(N) * (NH + KV) * (hs / 2);
  if (n == 0) return;
  rope_kernel<<<grid_for(n, kBlock), kBlock>>>(qkv, pos, inv_freq, N, NH + KV, hs,
                                               static_cast<int64_t>(NH + 2 * KV) * hs, 1.0f);
  CHECK_CUDA_LAUNCH();
}

void rope_backward(float* dqkv, const int* pos, const float* inv_freq, int N, int NH, int KV, int hs) {
  const int64_t n = static_cast<int64_t>(N) * (NH + KV) * (hs / 2);
  if (n == 0) return;
  rope_kernel<<<grid_for(n, kBlock), kBlock>>>(dqkv, pos, inv_freq, N, NH + KV, hs,
                                               static_cast<int64_t>(NH + 2 * KV) * hs, -1.0f);
  CHECK_CUDA_LAUNCH();
}

void swiglu_forward(float* out, const float* inp, int N, int F) {
  const int64_t n = static_cast<int64_t>(N) * F;
  if (n == 0) return;
  swiglu_forward_kernel<<<grid_for(n, kBlock), kBlock>>>(out, inp, F, n);
  CHECK_CUDA_LAUNCH();
}

void swiglu_backward(float* dinp, const float* inp, const float* dout, int N, int F) {
  const int64_t n = static_cast<int64_t>(N) * F;
  if (n == 0) return;
  swiglu_backward_kernel<<<grid_for(n, kBlock), kBlock>>>(dinp, inp, dout, F, n);
  CHECK_CUDA_LAUNCH();
}

void attention_gqa_forward(float* out, float* preatt, float* att, const float* inp, int B, int T, int NH, int KV,
                           int hs) {
  if (B == 0 || T == 0 || NH == 0) return;
  const Gqa d{B, T, NH, KV, hs};
  const float scale = 1.0f / sqrtf(static_cast<float>(hs));
  const int64_t n_att = static_cast<int64_t>(B) * NH * T * T;
  const int rows = B * NH * T;
  gqa_scores_kernel<<<grid_for(n_att, kBlock), kBlock>>>(preatt, inp, d, scale);
  CHECK_CUDA_LAUNCH();
  causal_softmax_kernel<<<ceil_div(rows, kBlock / kWarpSize), kBlock>>>(att, preatt, rows, T);
  CHECK_CUDA_LAUNCH();
  gqa_values_kernel<<<grid_for(static_cast<int64_t>(B) * T * NH * hs, kBlock), kBlock>>>(out, att, inp, d);
  CHECK_CUDA_LAUNCH();
}

void attention_gqa_backward(float* dinp, float* dpreatt, float* datt, const float* dout, const float* inp,
                            const float* att, int B, int T, int NH, int KV, int hs) {
  if (B == 0 || T == 0 || NH == 0) return;
  const Gqa d{B, T, NH, KV, hs};
  const float scale = 1.0f / sqrtf(static_cast<float>(hs));
  const int64_t n_att = static_cast<int64_t>(B) * NH * T * T;
  const int rows = B * NH * T;
  // Order matters (one stream): softmax backward reads the finished datt,
  // dq and dk the finished dpreatt.
  gqa_datt_kernel<<<grid_for(n_att, kBlock), kBlock>>>(datt, dout, inp, d);
  CHECK_CUDA_LAUNCH();
  softmax_backward_kernel<<<ceil_div(rows, kBlock / kWarpSize), kBlock>>>(dpreatt, datt, att, rows, T);
  CHECK_CUDA_LAUNCH();
  gqa_dq_kernel<<<grid_for(static_cast<int64_t>(B) * T * NH * hs, kBlock), kBlock>>>(dinp, dpreatt, inp, d, scale);
  CHECK_CUDA_LAUNCH();
  gqa_dkv_kernel<<<grid_for(static_cast<int64_t>(B) * T * KV * hs, kBlock), kBlock>>>(dinp, dout, dpreatt, att, inp,
                                                                                       d, scale);
  CHECK_CUDA_LAUNCH();
}

}  // namespace tessera::cuda
