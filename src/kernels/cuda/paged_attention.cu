// The ragged-batch kernels of ops.inc on CUDA: the encoder with explicit
// positions, the KV-cache write, and attention over a paged cache (one warp
// per (row, head), an online softmax over the sequence's keys; each lane
// holds head dimensions lane, lane + 32, ... of the output, hs <= 128).
// Letters as in ops.inc. Compiled here; never run yet (no GPU lent).
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

namespace tessera::cuda {

namespace {

constexpr int kBlock = 256;
constexpr int kMaxDimsPerLane = 4;  // hs <= 128

__global__ void encoder_positions_kernel(float* out, const int* inp, const int* pos, const float* wte,
                                         const float* wpe, int C, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = i / C;
    const int c = static_cast<int>(i % C);
    out[i] = wte[static_cast<int64_t>(inp[row]) * C + c] + (wpe ? wpe[static_cast<int64_t>(pos[row]) * C + c] : 0.0f);
  }
}

// Rows of qkv hold NH queries, KV keys and KV values of hs floats
// (ops.inc); the cache rows KV*hs = Ck floats.
__global__ void kv_write_kernel(float* kcache, float* vcache, const float* qkv, const int* slots, int64_t Wq,
                                int64_t koff, int Ck, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = i / Ck;
    const int c = static_cast<int>(i % Ck);
    const int64_t dst = static_cast<int64_t>(slots[row]) * Ck + c;
    kcache[dst] = qkv[row * Wq + koff + c];
    vcache[dst] = qkv[row * Wq + koff + Ck + c];
  }
}

// One warp per (row, query head): items = N * NH; query head h reads
// key/value head h % KV.
__global__ void paged_attention_kernel(float* out, const float* qkv, const float* kcache, const float* vcache,
                                       const int* block_table, const int* seq, const int* pos, int N, int NH, int KV,
                                       int hs, int bs, int W, float scale) {
  const int64_t item = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  if (item >= static_cast<int64_t>(N) * NH) return;  // whole warps leave together
  const int i = static_cast<int>(item / NH), h = static_cast<int>(item % NH), g = h % KV;
  const int64_t Wq = static_cast<int64_t>(NH + 2 * KV) * hs, Ck = static_cast<int64_t>(KV) * hs;
  const float* q = qkv + static_cast<int64_t>(i) * Wq + h * hs;
  const int* blocks = block_table + static_cast<int64_t>(seq[i]) * W;
  float qr[kMaxDimsPerLane], acc[kMaxDimsPerLane];
  for (int j = 0; j < kMaxDimsPerLane; j++) {
    const int d = lane + j * kWarpSize;
    qr[j] = d < hs ? q[d] : 0.0f;
    acc[j] = 0.0f;
  }
  float m = -INFINITY, l = 0.0f;
  const int n_keys = pos[i] + 1;
  for (int t = 0; t < n_keys; t++) {
    const int64_t slot = static_cast<int64_t>(blocks[t / bs]) * bs + t % bs;
    const float* k = kcache + slot * Ck + g * hs;
    const float* v = vcache + slot * Ck + g * hs;
    float part = 0.0f;
    for (int j = 0; j < kMaxDimsPerLane; j++) {
      const int d = lane + j * kWarpSize;
      if (d < hs) part += qr[j] * k[d];
    }
    const float s = warp_sum(part) * scale;
    const float m_new = fmaxf(m, s);
    const float corr = __expf(m - m_new), p = __expf(s - m_new);
    l = l * corr + p;
    for (int j = 0; j < kMaxDimsPerLane; j++) {
      const int d = lane + j * kWarpSize;
      acc[j] = acc[j] * corr + (d < hs ? p * v[d] : 0.0f);
    }
    m = m_new;
  }
  float* o = out + static_cast<int64_t>(i) * NH * hs + h * hs;
  for (int j = 0; j < kMaxDimsPerLane; j++) {
    const int d = lane + j * kWarpSize;
    if (d < hs) o[d] = acc[j] / l;
  }
}

}  // namespace

void encoder_forward_positions(float* out, const int* inp, const int* pos, const float* wte, const float* wpe,
                               int N, int C) {
  const int64_t n = static_cast<int64_t>(N) * C;
  if (n == 0) return;
  encoder_positions_kernel<<<grid_for(n, kBlock), kBlock>>>(out, inp, pos, wte, wpe, C, n);
  CHECK_CUDA_LAUNCH();
}

void kv_cache_write_gqa(float* kcache, float* vcache, const float* qkv, const int* slots, int N, int NH, int KV,
                        int hs) {
  const int Ck = KV * hs;
  const int64_t n = static_cast<int64_t>(N) * Ck;
  if (n == 0) return;
  kv_write_kernel<<<grid_for(n, kBlock), kBlock>>>(kcache, vcache, qkv, slots, static_cast<int64_t>(NH + 2 * KV) * hs,
                                                   static_cast<int64_t>(NH) * hs, Ck, n);
  CHECK_CUDA_LAUNCH();
}

void kv_cache_write(float* kcache, float* vcache, const float* qkv, const int* slots, int N, int C) {
  kv_cache_write_gqa(kcache, vcache, qkv, slots, N, 1, 1, C);
}

void paged_attention_gqa_forward(float* out, const float* qkv, const float* kcache, const float* vcache,
                                 const int* block_table, const int* seq, const int* pos, int N, int NH, int KV,
                                 int hs, int bs, int W) {
  const int64_t items = static_cast<int64_t>(N) * NH;
  if (items == 0) return;
  if (hs > kMaxDimsPerLane * kWarpSize) {
    std::fprintf(stderr, "%s:%d: paged_attention_forward: head size %d above 128\n", __FILE__, __LINE__, hs);
    std::abort();
  }
  const float scale = 1.0f / sqrtf(static_cast<float>(hs));
  const int64_t threads = items * kWarpSize;
  paged_attention_kernel<<<ceil_div(threads, kBlock), kBlock>>>(out, qkv, kcache, vcache, block_table, seq, pos, N,
                                                                 NH, KV, hs, bs, W, scale);
  CHECK_CUDA_LAUNCH();
}

void paged_attention_forward(float* out, const float* qkv, const float* kcache, const float* vcache,
                             const int* block_table, const int* seq, const int* pos, int N, int C, int NH, int bs,
                             int W) {
  paged_attention_gqa_forward(out, qkv, kcache, vcache, block_table, seq, pos, N, NH, NH, C / NH, bs, W);
}

}  // namespace tessera::cuda
