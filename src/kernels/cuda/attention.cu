// Causal multi-head self-attention, the plain kernel set: correct and
// obvious rather than fast (the oracle for flash_attention.cu, and the
// fallback), then the model's choice between the two (ops.h).
// B batch, T time, C channels, NH heads, hs = C/NH head size.
// inp (B,T,3C) holds q, k, v; preatt, att, dpreatt, datt (B,NH,T,T).
// Every kernel gives each thread one output element and loops over the
// reduced index in the oracle's order, so nothing races and results are
// deterministic. Work is O(B NH T^2 hs) per kernel.
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "kernels/cuda/attention_rows.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

namespace tessera::cuda {

namespace {

constexpr int kBlock = 256;

#define TESSERA_GRID_STRIDE(i, n)                                                        \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)

// The row (b, h, t) of a (B,NH,T,T) buffer.
__device__ __forceinline__ int64_t att_row(int b, int h, int t, int NH, int T) {
  return ((static_cast<int64_t>(b) * NH + h) * T + t) * T;
}
// The start of head h of q (part 0), k (1) or v (2) at (b, t) in inp.
__device__ __forceinline__ int64_t qkv_at(int b, int t, int part, int h, int T, int C, int hs) {
  return (static_cast<int64_t>(b) * T + t) * 3 * C + part * C + h * hs;
}

// preatt[b,h,t,t2] = scale * q(b,t,h) . k(b,t2,h) for t2 <= t, else 0.
__global__ void scores_kernel(float* preatt, const float* inp, int B, int T, int C, int NH, float scale) {
  const int hs = C / NH;
  const int64_t n = static_cast<int64_t>(B) * NH * T * T;
  TESSERA_GRID_STRIDE(i, n) {
    const int t2 = static_cast<int>(i % T);
    const int t = static_cast<int>((i / T) % T);
    const int h = static_cast<int>((i / (static_cast<int64_t>(T) * T)) % NH);
    const int b = static_cast<int>(i / (static_cast<int64_t>(T) * T * NH));
    float v = 0.0f;
    if (t2 <= t) {
      const float* q = inp + qkv_at(b, t, 0, h, T, C, hs);
      const float* k = inp + qkv_at(b, t2, 1, h, T, C, hs);
      for (int j = 0; j < hs; j++) v += q[j] * k[j];
      v *= scale;
    }
    preatt[i] = v;
  }
}

// out[b,t,h*hs+j] = sum over t2 <= t of att[b,h,t,t2] * v(b,t2,h)[j].
__global__ void att_values_kernel(float* out, const float* att, const float* inp, int B, int T, int C, int NH) {
  const int hs = C / NH;
  const int64_t n = static_cast<int64_t>(B) * T * C;
  TESSERA_GRID_STRIDE(i, n) {
    const int c = static_cast<int>(i % C);
    const int t = static_cast<int>((i / C) % T);
    const int b = static_cast<int>(i / (static_cast<int64_t>(C) * T));
    const int h = c / hs, j = c % hs;
    const float* a = att + att_row(b, h, t, NH, T);
    float acc = 0.0f;
    for (int t2 = 0; t2 <= t; t2++) acc += a[t2] * inp[qkv_at(b, t2, 2, h, T, C, hs) + j];
    out[i] = acc;
  }
}

// datt[b,h,t,t2] += v(b,t2,h) . dout(b,t,h) for t2 <= t.
__global__ void datt_kernel(float* datt, const float* dout, const float* inp, int B, int T, int C, int NH) {
  const int hs = C / NH;
  const int64_t n = static_cast<int64_t>(B) * NH * T * T;
  TESSERA_GRID_STRIDE(i, n) {
    const int t2 = static_cast<int>(i % T);
    const int t = static_cast<int>((i / T) % T);
    if (t2 > t) continue;
    const int h = static_cast<int>((i / (static_cast<int64_t>(T) * T)) % NH);
    const int b = static_cast<int>(i / (static_cast<int64_t>(T) * T * NH));
    const float* v = inp + qkv_at(b, t2, 2, h, T, C, hs);
    const float* dy = dout + (static_cast<int64_t>(b) * T + t) * C + h * hs;
    float acc = 0.0f;
    for (int j = 0; j < hs; j++) acc += v[j] * dy[j];
    datt[i] += acc;
  }
}

// dv(b,t2,h)[j] += sum over t >= t2 of att[b,h,t,t2] * dout(b,t,h)[j].
__global__ void dv_kernel(float* dinp, const float* dout, const float* att, int B, int T, int C, int NH) {
  const int hs = C / NH;
  const int64_t n = static_cast<int64_t>(B) * T * C;
  TESSERA_GRID_STRIDE(i, n) {
    const int c = static_cast<int>(i % C);
    const int t2 = static_cast<int>((i / C) % T);
    const int b = static_cast<int>(i / (static_cast<int64_t>(C) * T));
    const int h = c / hs;
    float acc = 0.0f;
    for (int t = t2; t < T; t++)
      acc += att[att_row(b, h, t, NH, T) + t2] * dout[(static_cast<int64_t>(b) * T + t) * C + c];
    dinp[qkv_at(b, t2, 2, h, T, C, hs) + c % hs] += acc;
  }
}

// dq(b,t,h)[j] += scale * sum over t2 <= t of dpreatt[b,h,t,t2] * k(b,t2,h)[j].
__global__ void dq_kernel(float* dinp, const float* dpreatt, const float* inp, int B, int T, int C, int NH,
                          float scale) {
  const int hs = C / NH;
  const int64_t n = static_cast<int64_t>(B) * T * C;
  TESSERA_GRID_STRIDE(i, n) {
    const int c = static_cast<int>(i % C);
    const int t = static_cast<int>((i / C) % T);
    const int b = static_cast<int>(i / (static_cast<int64_t>(C) * T));
    const int h = c / hs, j = c % hs;
    const float* dpre = dpreatt + att_row(b, h, t, NH, T);
    float acc = 0.0f;
    for (int t2 = 0; t2 <= t; t2++) acc += inp[qkv_at(b, t2, 1, h, T, C, hs) + j] * dpre[t2];
    dinp[qkv_at(b, t, 0, h, T, C, hs) + j] += acc * scale;
  }
}

// dk(b,t2,h)[j] += scale * sum over t >= t2 of dpreatt[b,h,t,t2] * q(b,t,h)[j].
__global__ void dk_kernel(float* dinp, const float* dpreatt, const float* inp, int B, int T, int C, int NH,
                          float scale) {
  const int hs = C / NH;
  const int64_t n = static_cast<int64_t>(B) * T * C;
  TESSERA_GRID_STRIDE(i, n) {
    const int c = static_cast<int>(i % C);
    const int t2 = static_cast<int>((i / C) % T);
    const int b = static_cast<int>(i / (static_cast<int64_t>(C) * T));
    const int h = c / hs, j = c % hs;
    float acc = 0.0f;
    for (int t = t2; t < T; t++) acc += inp[qkv_at(b, t, 0, h, T, C, hs) + j] * dpreatt[att_row(b, h, t, NH, T) + t2];
    dinp[qkv_at(b, t2, 1, h, T, C, hs) + j] += acc * scale;
  }
}

#undef TESSERA_GRID_STRIDE

}  // namespace

void attention_forward(float* out, float* preatt, float* att, const float* inp, int B, int T, int C, int NH) {
  if (B == 0 || T == 0 || C == 0) return;
  const float scale = 1.0f / std::sqrt(static_cast<float>(C / NH));
  const int64_t n_att = static_cast<int64_t>(B) * NH * T * T;
  const int rows = B * NH * T;
  const int warps_per_block = kBlock / kWarpSize;
  scores_kernel<<<grid_for(n_att, kBlock), kBlock>>>(preatt, inp, B, T, C, NH, scale);
  CHECK_CUDA_LAUNCH();
  causal_softmax_kernel<<<ceil_div(rows, warps_per_block), kBlock>>>(att, preatt, rows, T);
  CHECK_CUDA_LAUNCH();
  att_values_kernel<<<grid_for(static_cast<int64_t>(B) * T * C, kBlock), kBlock>>>(out, att, inp, B, T, C, NH);
  CHECK_CUDA_LAUNCH();
}

void attention_backward(float* dinp, float* dpreatt, float* datt, const float* dout, const float* inp,
                        const float* att, int B, int T, int C, int NH) {
  if (B == 0 || T == 0 || C == 0) return;
  const float scale = 1.0f / std::sqrt(static_cast<float>(C / NH));
  const int64_t n_att = static_cast<int64_t>(B) * NH * T * T;
  const int64_t n_out = static_cast<int64_t>(B) * T * C;
  const int rows = B * NH * T;
  const int warps_per_block = kBlock / kWarpSize;
  // Order matters: softmax backward reads the finished datt, and dq/dk read
  // the finished dpreatt (kernels on one stream run in order).
  datt_kernel<<<grid_for(n_att, kBlock), kBlock>>>(datt, dout, inp, B, T, C, NH);
  CHECK_CUDA_LAUNCH();
  dv_kernel<<<grid_for(n_out, kBlock), kBlock>>>(dinp, dout, att, B, T, C, NH);
  CHECK_CUDA_LAUNCH();
  softmax_backward_kernel<<<ceil_div(rows, warps_per_block), kBlock>>>(dpreatt, datt, att, rows, T);
  CHECK_CUDA_LAUNCH();
  dq_kernel<<<grid_for(n_out, kBlock), kBlock>>>(dinp, dpreatt, inp, B, T, C, NH, scale);
  CHECK_CUDA_LAUNCH();
  dk_kernel<<<grid_for(n_out, kBlock), kBlock>>>(dinp, dpreatt, inp, B, T, C, NH, scale);
  CHECK_CUDA_LAUNCH();
}

namespace {
std::atomic<AttentionImpl> g_attention_preference{AttentionImpl::kFlash};
}  // namespace

void set_attention_preference(AttentionImpl impl) { g_attention_preference.store(impl); }

AttentionImpl attention_impl(int hs) {
  return hs <= kFlashMaxHeadSize ? g_attention_preference.load() : AttentionImpl::kPlain;
}

int64_t attention_saved_floats(int T, int hs) { return attention_impl(hs) == AttentionImpl::kFlash ? 1 : T; }

int64_t attention_scratch_floats(int T, int hs) { return attention_impl(hs) == AttentionImpl::kFlash ? 1 : T; }

void model_attention_forward(float* out, float* preatt, float* att, const float* inp, int B, int T, int C, int NH) {
  if (B == 0 || T == 0 || C == 0) return;
  if (attention_impl(C / NH) == AttentionImpl::kFlash) {
    flash_attention_forward(out, /*lse=*/att, inp, B, T, C, NH);
  } else {
    attention_forward(out, preatt, att, inp, B, T, C, NH);
  }
}

void model_attention_backward(float* dinp, float* dpreatt, float* datt, const float* dout, const float* inp,
                              const float* out, const float* att, int B, int T, int C, int NH) {
  if (B == 0 || T == 0 || C == 0) return;
  if (attention_impl(C / NH) == AttentionImpl::kFlash) {
    flash_attention_backward(dinp, /*dsum=*/datt, dout, inp, out, /*lse=*/att, B, T, C, NH);
  } else {
    attention_backward(dinp, dpreatt, datt, dout, inp, att, B, T, C, NH);
  }
}

}  // namespace tessera::cuda
