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

// inp rows hold NH queries, KV keys and KV values (ops.inc); query head h
// reads key/value head h % KV. The forward splits over (b, h) pairs; the
// backward over (b, g) pairs of a key/value head and runs the NH/KV query
// heads that share it one after another, so no two threads add into the same
// dk, dv. With KV == NH both are the multi-head loops, call for call.
void attention_gqa_forward(float* out, float* /*preatt*/, float* att, const float* inp, int B, int T, int NH, int KV,
                           int hs) {
  CHECK(NH > 0 && KV > 0 && NH % KV == 0);
  const int64_t W = static_cast<int64_t>(NH + 2 * KV) * hs, Co = static_cast<int64_t>(NH) * hs;
  const int64_t koff = static_cast<int64_t>(NH) * hs, voff = static_cast<int64_t>(NH + KV) * hs;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const int pairs = B * NH;
#pragma omp parallel for schedule(static) if (pairs > 1)
  for (int bh = 0; bh < pairs; bh++) {
    const int b = bh / NH, h = bh % NH, g = h % KV;
    const float* row0 = inp + static_cast<int64_t>(b) * T * W;
    const float* q = row0 + static_cast<int64_t>(h) * hs;
    const float* k = row0 + koff + static_cast<int64_t>(g) * hs;
    const float* v = row0 + voff + static_cast<int64_t>(g) * hs;
    float* att_bh = att + static_cast<int64_t>(bh) * T * T;
    float* out_bh = out + static_cast<int64_t>(b) * T * Co + static_cast<int64_t>(h) * hs;
    for (int r0 = 0; r0 < T; r0 += kRowBlock) {
      const int r1 = std::min(T, r0 + kRowBlock);
      const int rows = r1 - r0;
      // att[r0:r1, 0:r1] = scale * Q[r0:r1] K[0:r1]^T
      sgemm('N', 'T', rows, r1, hs, scale, q + r0 * W, W, k, W, 0.0f, att_bh + static_cast<int64_t>(r0) * T, T);
      for (int t = r0; t < r1; t++) softmax_causal_row(att_bh + static_cast<int64_t>(t) * T, t + 1, T);
      // out[r0:r1] = att[r0:r1, 0:r1] V[0:r1]
      sgemm('N', 'N', rows, hs, r1, 1.0f, att_bh + static_cast<int64_t>(r0) * T, T, v, W, 0.0f,
            out_bh + static_cast<int64_t>(r0) * Co, Co);
    }
  }
}

void attention_gqa_backward(float* dinp, float* dpreatt, float* datt, const float* dout, const float* inp,
                            const float* att, int B, int T, int NH, int KV, int hs) {
  CHECK(NH > 0 && KV > 0 && NH % KV == 0);
  const int64_t W = static_cast<int64_t>(NH + 2 * KV) * hs, Co = static_cast<int64_t>(NH) * hs;
  const int64_t koff = static_cast<int64_t>(NH) * hs, voff = static_cast<int64_t>(NH + KV) * hs;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const int group = NH / KV;
  const int pairs = B * KV;
#pragma omp parallel for schedule(static) if (pairs > 1)
  for (int bg = 0; bg < pairs; bg++) {
    const int b = bg / KV, g = bg % KV;
    const int64_t row0 = static_cast<int64_t>(b) * T * W;
    const float* k = inp + row0 + koff + static_cast<int64_t>(g) * hs;
    const float* v = inp + row0 + voff + static_cast<int64_t>(g) * hs;
    float* dk = dinp + row0 + koff + static_cast<int64_t>(g) * hs;
    float* dv = dinp + row0 + voff + static_cast<int64_t>(g) * hs;
    for (int j = 0; j < group; j++) {
      const int h = j * KV + g;
      const int64_t bh = static_cast<int64_t>(b) * NH + h;
      const float* q = inp + row0 + static_cast<int64_t>(h) * hs;
      float* dq = dinp + row0 + static_cast<int64_t>(h) * hs;
      const float* dout_bh = dout + static_cast<int64_t>(b) * T * Co + static_cast<int64_t>(h) * hs;
      const float* att_bh = att + bh * T * T;
      float* datt_bh = datt + bh * T * T;
      float* dpre_bh = dpreatt + bh * T * T;
      for (int r0 = 0; r0 < T; r0 += kRowBlock) {
        const int r1 = std::min(T, r0 + kRowBlock);
        const int rows = r1 - r0;
        const int64_t block = static_cast<int64_t>(r0) * T;  // offset of row r0 in a (T,T) matrix
        // datt[r0:r1, 0:r1] += dout[r0:r1] V[0:r1]^T
        sgemm('N', 'T', rows, r1, hs, 1.0f, dout_bh + r0 * Co, Co, v, W, 1.0f, datt_bh + block, T);
        // dv[0:r1] += att[r0:r1, 0:r1]^T dout[r0:r1]
        sgemm('T', 'N', r1, hs, rows, 1.0f, att_bh + block, T, dout_bh + r0 * Co, Co, 1.0f, dv, W);
        for (int t = r0; t < r1; t++) {
          const int64_t row = static_cast<int64_t>(t) * T;
          softmax_backward_row(dpre_bh + row, datt_bh + row, att_bh + row, t + 1, r1);
        }
        // dq[r0:r1] += scale * dpre[r0:r1, 0:r1] K[0:r1]
        sgemm('N', 'N', rows, hs, r1, scale, dpre_bh + block, T, k, W, 1.0f, dq + r0 * W, W);
        // dk[0:r1] += scale * dpre[r0:r1, 0:r1]^T Q[r0:r1]
        sgemm('T', 'N', r1, hs, rows, scale, dpre_bh + block, T, q + r0 * W, W, 1.0f, dk, W);
      }
    }
  }
}

void attention_forward(float* out, float* preatt, float* att, const float* inp, int B, int T, int C, int NH) {
  CHECK(NH > 0 && C % NH == 0);
  attention_gqa_forward(out, preatt, att, inp, B, T, NH, NH, C / NH);
}

void attention_backward(float* dinp, float* dpreatt, float* datt, const float* dout, const float* inp,
                        const float* att, int B, int T, int C, int NH) {
  CHECK(NH > 0 && C % NH == 0);
  attention_gqa_backward(dinp, dpreatt, datt, dout, inp, att, B, T, NH, NH, C / NH);
}

}  // namespace tessera::cpu
