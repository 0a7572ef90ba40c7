// Causal multi-head self-attention. B batch, T time, C channels, NH heads,
// hs = C / NH head size. inp (B,T,3C) holds q, k, v side by side, so head h
// of q, k and v is a (T, hs) matrix at column offset h*hs, C + h*hs and
// 2C + h*hs with leading dimension 3C: every product below is a strided
// oneDNN sgemm on those views, without copies.
//
// Work is split over (b, h) pairs, one OpenMP task each; oneDNN runs
// single-threaded inside the parallel region. With fewer than two pairs the
// loop runs serially and oneDNN threads each gemm itself.
//
// Causality: query rows are processed in blocks of kRowBlock; a block of
// rows [r0, r1) only meets keys [0, r1), so the gemms skip the blocks above
// the diagonal (3/8 of the flops at T = 256). Entries above the diagonal
// inside a diagonal block are computed by the gemm and then overwritten
// (masked to 0) by the softmax.
//
// preatt is left unwritten (ops.inc allows it): the scores are computed
// straight into att and turned into probabilities in place, which saves a
// write and a read of a (B,NH,T,T) tensor. In the backward, datt and dpreatt
// accumulate exactly as in the reference on and below the diagonal; above
// it they are left 0 (the caller zeroes them).
#include <algorithm>
#include <cmath>
#include <cstring>

#include <oneapi/dnnl/dnnl.h>

#include "core/check.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/vec_math.h"


namespace tessera::cpu {

namespace {

// Query rows per gemm block: small enough to skip most of the upper
// triangle, large enough that each sgemm call amortises its overhead.
constexpr int kRowBlock = 64;

// Row-major C (M,N) = alpha op(A) op(B) + beta C.
void sgemm(char transa, char transb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
           const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  const dnnl_status_t st = dnnl_sgemm(transa, transb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  CHECK(st == dnnl_success);
}


// One row of att: row[0:n] holds scaled scores of the keys a query may see
// (n = t + 1); they become softmax probabilities and row[n:T] becomes 0.
// Kept per row, with plain 0..n loops, because GCC -O3 (loop splitting)
// stops vectorising these reductions inside a loop nest over t.
TESSERA_CPU_CLONES void softmax_causal_row(float* row, int n, int T) {
  float maxval = -INFINITY;
#pragma omp simd reduction(max : maxval)
  for (int j = 0; j < n; j++) maxval = row[j] > maxval ? row[j] : maxval;
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int j = 0; j < n; j++) {
    const float e = exp_approx(row[j] - maxval);
    row[j] = e;
    sum += e;
  }
  const float inv_sum = 1.0f / sum;
#pragma omp simd
  for (int j = 0; j < n; j++) row[j] *= inv_sum;
  std::fill(row + n, row + T, 0.0f);
}

// Softmax backward for one row with n visible keys: dp[j] += a[j] (da[j] -
// sum_i a[i] da[i]) for j < n. Columns [n, block_end) of da and dp are set
// to 0: the datt gemm put products there, and the dq/dk gemms read dp up to
// block_end, where everything above the diagonal must be 0 (the caller zeroes
// both buffers, so this changes nothing the contract promises).
TESSERA_CPU_CLONES void softmax_backward_row(float* dp, float* da, const float* a, int n, int block_end) {
  float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
  for (int j = 0; j < n; j++) dot += a[j] * da[j];
#pragma omp simd
  for (int j = 0; j < n; j++) dp[j] += a[j] * (da[j] - dot);
  std::fill(da + n, da + block_end, 0.0f);
  std::fill(dp + n, dp + block_end, 0.0f);
}

}  // namespace

void attention_forward(float* out, float* /*preatt*/, float* att, const float* inp, int B, int T, int C, int NH) {
  CHECK(NH > 0 && C % NH == 0);
  const int64_t C3 = 3 * static_cast<int64_t>(C);
  const int hs = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const int pairs = B * NH;
#pragma omp parallel for schedule(static) if (pairs > 1)
  for (int bh = 0; bh < pairs; bh++) {
    const int b = bh / NH, h = bh % NH;
    const float* q = inp + static_cast<int64_t>(b) * T * C3 + static_cast<int64_t>(h) * hs;
    const float* k = q + C;
    const float* v = q + 2 * static_cast<int64_t>(C);
    float* att_bh = att + static_cast<int64_t>(bh) * T * T;
    float* out_bh = out + static_cast<int64_t>(b) * T * C + static_cast<int64_t>(h) * hs;
    for (int r0 = 0; r0 < T; r0 += kRowBlock) {
      const int r1 = std::min(T, r0 + kRowBlock);
      const int rows = r1 - r0;
      // att[r0:r1, 0:r1] = scale * Q[r0:r1] K[0:r1]^T
      sgemm('N', 'T', rows, r1, hs, scale, q + r0 * C3, C3, k, C3, 0.0f, att_bh + static_cast<int64_t>(r0) * T, T);
      for (int t = r0; t < r1; t++) softmax_causal_row(att_bh + static_cast<int64_t>(t) * T, t + 1, T);
      // out[r0:r1] = att[r0:r1, 0:r1] V[0:r1]
      sgemm('N', 'N', rows, hs, r1, 1.0f, att_bh + static_cast<int64_t>(r0) * T, T, v, C3, 0.0f,
            out_bh + static_cast<int64_t>(r0) * C, C);
    }
  }
}

void attention_backward(float* dinp, float* dpreatt, float* datt, const float* dout, const float* inp,
                        const float* att, int B, int T, int C, int NH) {
  CHECK(NH > 0 && C % NH == 0);
  const int64_t C3 = 3 * static_cast<int64_t>(C);
  const int hs = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const int pairs = B * NH;
#pragma omp parallel for schedule(static) if (pairs > 1)
  for (int bh = 0; bh < pairs; bh++) {
    const int b = bh / NH, h = bh % NH;
    const int64_t qkv_offset = static_cast<int64_t>(b) * T * C3 + static_cast<int64_t>(h) * hs;
    const float* q = inp + qkv_offset;
    const float* k = q + C;
    const float* v = q + 2 * static_cast<int64_t>(C);
    float* dq = dinp + qkv_offset;
    float* dk = dq + C;
    float* dv = dq + 2 * static_cast<int64_t>(C);
    const float* dout_bh = dout + static_cast<int64_t>(b) * T * C + static_cast<int64_t>(h) * hs;
    const float* att_bh = att + static_cast<int64_t>(bh) * T * T;
    float* datt_bh = datt + static_cast<int64_t>(bh) * T * T;
    float* dpre_bh = dpreatt + static_cast<int64_t>(bh) * T * T;
    for (int r0 = 0; r0 < T; r0 += kRowBlock) {
      const int r1 = std::min(T, r0 + kRowBlock);
      const int rows = r1 - r0;
      const int64_t block = static_cast<int64_t>(r0) * T;  // offset of row r0 in a (T,T) matrix
      // datt[r0:r1, 0:r1] += dout[r0:r1] V[0:r1]^T
      sgemm('N', 'T', rows, r1, hs, 1.0f, dout_bh + r0 * static_cast<int64_t>(C), C, v, C3, 1.0f, datt_bh + block, T);
      // dv[0:r1] += att[r0:r1, 0:r1]^T dout[r0:r1]
      sgemm('T', 'N', r1, hs, rows, 1.0f, att_bh + block, T, dout_bh + r0 * static_cast<int64_t>(C), C, 1.0f, dv, C3);
      for (int t = r0; t < r1; t++) {
        const int64_t row = static_cast<int64_t>(t) * T;
        softmax_backward_row(dpre_bh + row, datt_bh + row, att_bh + row, t + 1, r1);
      }
      // dq[r0:r1] += scale * dpre[r0:r1, 0:r1] K[0:r1]
      sgemm('N', 'N', rows, hs, r1, scale, dpre_bh + block, T, k, C3, 1.0f, dq + r0 * C3, C3);
      // dk[0:r1] += scale * dpre[r0:r1, 0:r1]^T Q[r0:r1]
      sgemm('T', 'N', r1, hs, rows, scale, dpre_bh + block, T, q + r0 * C3, C3, 1.0f, dk, C3);
    }
  }
}

}  // namespace tessera::cpu
