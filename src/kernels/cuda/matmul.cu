// Matmul through cuBLASLt. N rows (B*T), C input channels, OC output
// channels; everything row-major as in ops.inc. cuBLASLt is column-major,
// so a row-major (R, K) matrix is handed over as a column-major (K, R) one:
//   out (N,OC)    = inp @ weight^T : D(OC,N)  = op_T(W (C,OC)) * inp (C,N)
//   dinp (N,C)   += dout @ weight  : D(C,N)  += W (C,OC) * dout (OC,N)
//   dweight (OC,C) += dout^T @ inp : D(C,OC) += inp (C,N) * op_T(dout (OC,N))
// Backward accumulates through beta = 1 (C and D are the same buffer).
// kF32 computes in plain fp32 (CUBLAS_COMPUTE_32F, no TF32) so it matches
// the oracle; kBF16 converts both inputs to bf16 scratch first and runs
// bf16 x bf16 -> fp32 with fp32 accumulation. matmul_gelu_forward is the
// forward gemm with the GELU_AUX epilogue (pre-activation out as aux).
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include <cuda_bf16.h>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cublaslt_api.h"
#include "kernels/cuda/ops.h"

namespace tessera::cuda {

namespace {

constexpr size_t kWorkspaceBytes = 32u << 20;  // what cuBLAS recommends for Hopper
constexpr int kScratchSlots = 2;               // a matmul has two inputs

// cuBLASLt's entry points (opened at run time). backend_available(kCUDA)
// has opened it before a CUDA model exists; a matmul called without that
// check ends here with the reason.
const CublasLtApi& lt() {
  static const CublasLtApi* api = [] {
    Result<const CublasLtApi*> r = cublaslt();
    CHECK_OK(r.status());
    return *r;
  }();
  return *api;
}

// One cuBLASLt handle, workspace and bf16 scratch per device, created on
// first use and never destroyed: tearing CUDA objects down from static
// destructors races the driver's own shutdown. `mu` is held for a whole
// matmul call, so the scratch a queued gemm reads is not rewritten by
// another host thread before it runs (all work goes to the legacy default
// stream, in order).
struct LtContext {
  std::mutex mu;
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  __nv_bfloat16* scratch[kScratchSlots] = {nullptr, nullptr};
  size_t scratch_elems[kScratchSlots] = {0, 0};

  // A bf16 buffer of at least `elems` elements in slot `slot`.
  __nv_bfloat16* bf16_scratch(int slot, size_t elems) {
    if (scratch_elems[slot] < elems) {
      CHECK_CUDA(cudaFree(scratch[slot]));  // cudaFree waits for queued work that may read it
      CHECK_CUDA(cudaMalloc(&scratch[slot], elems * sizeof(__nv_bfloat16)));
      scratch_elems[slot] = elems;
    }
    return scratch[slot];
  }
};

LtContext& context_for_current_device() {
  static std::mutex mu;
  static std::vector<LtContext*> contexts;  // by device ordinal; leaked on purpose (above)
  int device = 0;
  CHECK_CUDA(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(mu);
  if (static_cast<int>(contexts.size()) <= device) contexts.resize(device + 1, nullptr);
  if (contexts[device] == nullptr) {
    auto ctx = std::make_unique<LtContext>();
    CHECK_CUBLAS(lt().Create(&ctx->handle));
    CHECK_CUDA(cudaMalloc(&ctx->workspace, kWorkspaceBytes));
    contexts[device] = ctx.release();
  }
  return *contexts[device];
}

// RAII for the cuBLASLt descriptors of one call.
struct MatmulDesc {
  cublasLtMatmulDesc_t desc = nullptr;
  MatmulDesc() { CHECK_CUBLAS(lt().MatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F)); }
  ~MatmulDesc() { lt().MatmulDescDestroy(desc); }
  template <typename T>
  void set(cublasLtMatmulDescAttributes_t attr, const T& value) {
    CHECK_CUBLAS(lt().MatmulDescSetAttribute(desc, attr, &value, sizeof(value)));
  }
};

struct Layout {
  cublasLtMatrixLayout_t layout = nullptr;
  // Column-major rows x cols with leading dimension ld.
  Layout(cudaDataType type, int64_t rows, int64_t cols, int64_t ld) {
    CHECK_CUBLAS(lt().MatrixLayoutCreate(&layout, type, rows, cols, ld));
  }
  ~Layout() { lt().MatrixLayoutDestroy(layout); }
};

struct Preference {
  cublasLtMatmulPreference_t pref = nullptr;
  Preference() { CHECK_CUBLAS(lt().MatmulPreferenceCreate(&pref)); }
  ~Preference() { lt().MatmulPreferenceDestroy(pref); }
  void set(cublasLtMatmulPreferenceAttributes_t attr, uint32_t value) {
    CHECK_CUBLAS(lt().MatmulPreferenceSetAttribute(pref, attr, &value, sizeof(value)));
  }
  void set64(cublasLtMatmulPreferenceAttributes_t attr, uint64_t value) {
    CHECK_CUBLAS(lt().MatmulPreferenceSetAttribute(pref, attr, &value, sizeof(value)));
  }
};

// The largest power of two (at most 256) that divides the address: the
// heuristic otherwise assumes 256-byte aligned buffers, which views into a
// larger buffer need not be.
uint32_t alignment_of(const void* p) {
  const auto addr = reinterpret_cast<uintptr_t>(p);
  uint32_t a = 256;
  while (a > 1 && addr % a != 0) a /= 2;
  return a;
}

// src (rows, cols) row-major with leading dimension src_ld -> dst with dst_ld,
// rounded to nearest even (as round_bf16 in the oracle).
__global__ void to_bf16_kernel(__nv_bfloat16* dst, const float* src, int64_t rows, int64_t cols, int64_t src_ld,
                               int64_t dst_ld) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols, c = i % cols;
    dst[r * dst_ld + c] = __float2bfloat16_rn(src[r * src_ld + c]);
  }
}

// d (m, n) column-major with ld m: d[col * m + row] += bias[row].
__global__ void add_bias_kernel(float* d, const float* bias, int64_t m, int64_t n) {
  const int64_t total = m * n;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    d[i] += bias[i % m];
}

// dbias[o] += sum over rows i of dout[i * OC + o]; block (32, kRows), fixed
// summation order, as layernorm's parameter gradients.
constexpr int kRows = 8;
__global__ void bias_backward_kernel(float* dbias, const float* dout, int N, int OC) {
  __shared__ float part[kRows][kWarpSize];
  const int o = blockIdx.x * kWarpSize + threadIdx.x;
  float acc = 0.0f;
  if (o < OC)
    for (int i = threadIdx.y; i < N; i += kRows) acc += dout[static_cast<int64_t>(i) * OC + o];
  part[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && o < OC) {
    for (int k = 1; k < kRows; k++) acc += part[k][threadIdx.x];
    dbias[o] += acc;
  }
}

// One gemm operand as cuBLASLt sees it: column-major rows x cols, leading
// dimension ld, fp32 or bf16.
struct Operand {
  const void* ptr;
  cudaDataType type;
  int64_t rows, cols, ld;
};

// The operand for an fp32 column-major (rows, cols) matrix with leading
// dimension rows, converted to bf16 (in scratch slot `slot`) when asked. The
// bf16 copy's leading dimension is padded to 8 elements (16 bytes), which
// tensor-core kernels want; the padding is never read.
Operand prepare(LtContext& ctx, int slot, const float* src, int64_t rows, int64_t cols, MatmulPrecision prec) {
  if (prec == MatmulPrecision::kF32) return {src, CUDA_R_32F, rows, cols, rows};
  const int64_t ld = (rows + 7) / 8 * 8;
  __nv_bfloat16* dst = ctx.bf16_scratch(slot, static_cast<size_t>(ld * cols));
  // Column-major (rows, cols) is row-major (cols, rows).
  to_bf16_kernel<<<grid_for(rows * cols, 256), 256>>>(dst, src, cols, rows, rows, ld);
  CHECK_CUDA_LAUNCH();
  return {dst, CUDA_R_16BF, rows, cols, ld};
}

// What cuBLASLt applies after the product (its epilogue).
enum class Epilogue { kNone, kBias, kGeluAux, kGeluAuxBias };

// One cuBLASLt call, d (m, n) column-major, ld m:
//   d = epilogue(op(a) * op(b) + beta * d),  op(a) (m, k), op(b) (k, n);
// kBias adds bias (m) to every column; kGeluAux[Bias] (beta = 0 only) also
// writes the GELU input, product [+ bias], to aux (m, n) with ld m, and d =
// gelu(aux). Returns false, having queued nothing, when the heuristic offers
// no algorithm for this combination.
bool try_lt_gemm(LtContext& ctx, float* d, const Operand& a, bool trans_a, const Operand& b, bool trans_b, int64_t m,
                 int64_t n, int64_t k, float beta, Epilogue epilogue, const float* bias, float* aux) {
  Layout la(a.type, a.rows, a.cols, a.ld);
  Layout lb(b.type, b.rows, b.cols, b.ld);
  Layout ld(CUDA_R_32F, m, n, m);
  Preference pref;
  pref.set64(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, kWorkspaceBytes);
  pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, alignment_of(a.ptr));
  pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, alignment_of(b.ptr));
  pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, alignment_of(d));
  pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, alignment_of(d));

  MatmulDesc desc;
  desc.set(CUBLASLT_MATMUL_DESC_TRANSA, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N);
  desc.set(CUBLASLT_MATMUL_DESC_TRANSB, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N);
  switch (epilogue) {
    case Epilogue::kNone: break;
    case Epilogue::kBias: desc.set(CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_BIAS); break;
    case Epilogue::kGeluAux: desc.set(CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_GELU_AUX); break;
    case Epilogue::kGeluAuxBias: desc.set(CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_GELU_AUX_BIAS); break;
  }
  if (epilogue == Epilogue::kBias || epilogue == Epilogue::kGeluAuxBias)
    desc.set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);
  if (epilogue == Epilogue::kGeluAux || epilogue == Epilogue::kGeluAuxBias) {
    // The aux matrix has D's type (fp32) unless EPILOGUE_AUX_DATA_TYPE says
    // otherwise; the heuristic reads the pointer for its alignment.
    desc.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, static_cast<void*>(aux));
    desc.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, m);
  }
  cublasLtMatmulHeuristicResult_t heuristic{};
  int found = 0;
  const cublasStatus_t st = lt().MatmulAlgoGetHeuristic(ctx.handle, desc.desc, la.layout, lb.layout, ld.layout,
                                                           ld.layout, pref.pref, 1, &heuristic, &found);
  if (st != CUBLAS_STATUS_SUCCESS || found == 0) {
    if (epilogue == Epilogue::kNone) {
      std::fprintf(stderr, "cuBLASLt: no algorithm for m=%lld n=%lld k=%lld (%s)\n", static_cast<long long>(m),
                   static_cast<long long>(n), static_cast<long long>(k),
                   st == CUBLAS_STATUS_SUCCESS ? "heuristic returned none" : cublas_status_name(st));
      std::abort();
    }
    return false;
  }
  const float alpha = 1.0f;
  CHECK_CUBLAS(lt().Matmul(ctx.handle, desc.desc, &alpha, a.ptr, la.layout, b.ptr, lb.layout, &beta, d, ld.layout,
                              d, ld.layout, &heuristic.algo, ctx.workspace, kWorkspaceBytes, 0));
  return true;
}

// d (m, n) column-major, ld m:  d = op(a) * op(b) + beta * d [+ bias (m)].
// The bias epilogue where cuBLASLt offers an algorithm for it (and the bias
// vector is 16-byte aligned); otherwise a separate add.
void lt_gemm(LtContext& ctx, float* d, const Operand& a, bool trans_a, const Operand& b, bool trans_b, int64_t m,
             int64_t n, int64_t k, float beta, const float* bias) {
  const bool fused_bias = bias != nullptr && alignment_of(bias) >= 16 &&
                          try_lt_gemm(ctx, d, a, trans_a, b, trans_b, m, n, k, beta, Epilogue::kBias, bias, nullptr);
  if (fused_bias) return;
  try_lt_gemm(ctx, d, a, trans_a, b, trans_b, m, n, k, beta, Epilogue::kNone, nullptr, nullptr);  // aborts if none
  if (bias != nullptr) {
    add_bias_kernel<<<grid_for(m * n, 256), 256>>>(d, bias, m, n);
    CHECK_CUDA_LAUNCH();
  }
}

}  // namespace

void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N, int C, int OC,
                    MatmulPrecision prec) {
  if (N == 0 || OC == 0) return;
  if (C == 0) {  // an empty sum: out = bias (or 0); cuBLASLt rejects k = 0
    CHECK_CUDA(cudaMemset(out, 0, sizeof(float) * N * static_cast<size_t>(OC)));
    if (bias) {
      add_bias_kernel<<<grid_for(static_cast<int64_t>(N) * OC, 256), 256>>>(out, bias, OC, N);
      CHECK_CUDA_LAUNCH();
    }
    return;
  }
  LtContext& ctx = context_for_current_device();
  std::lock_guard<std::mutex> lock(ctx.mu);
  const Operand w = prepare(ctx, 0, weight, C, OC, prec);  // W (OC,C) row-major = (C,OC) column-major
  const Operand x = prepare(ctx, 1, inp, C, N, prec);      // inp (N,C) = (C,N)
  lt_gemm(ctx, out, w, /*trans_a=*/true, x, /*trans_b=*/false, OC, N, C, 0.0f, bias);
}

// cuBLASLt's GELU is the tanh approximation, the same function as
// gelu_forward (elementwise.cu), evaluated by its own code: the fused result
// agrees with matmul_forward + gelu_forward to rounding, not bitwise. The
// epilogue wants the aux leading dimension (OC) divisible by 8; the aux and
// bias pointers 16-byte aligned are asked for too (as the bias epilogue
// does). Otherwise, or when the heuristic offers no algorithm, the two ops.
void matmul_gelu_forward(float* pre, float* out, const float* inp, const float* weight, const float* bias, int N,
                         int C, int OC, MatmulPrecision prec) {
  if (N == 0 || OC == 0) return;
  const int64_t n = static_cast<int64_t>(N) * OC;
  if (C == 0) {  // cuBLASLt rejects k = 0; matmul_forward writes the bias
    matmul_forward(pre, inp, weight, bias, N, C, OC, prec);
    gelu_forward(out, pre, n);
    return;
  }
  LtContext& ctx = context_for_current_device();
  std::lock_guard<std::mutex> lock(ctx.mu);
  const Operand w = prepare(ctx, 0, weight, C, OC, prec);
  const Operand x = prepare(ctx, 1, inp, C, N, prec);
  const bool can_fuse = OC % 8 == 0 && alignment_of(pre) >= 16 && (bias == nullptr || alignment_of(bias) >= 16);
  const Epilogue epilogue = bias != nullptr ? Epilogue::kGeluAuxBias : Epilogue::kGeluAux;
  if (can_fuse && try_lt_gemm(ctx, out, w, true, x, false, OC, N, C, 0.0f, epilogue, bias, pre)) return;
  lt_gemm(ctx, pre, w, /*trans_a=*/true, x, /*trans_b=*/false, OC, N, C, 0.0f, bias);
  gelu_forward(out, pre, n);
}

void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int N, int C, int OC, MatmulPrecision prec) {
  if (N == 0 || C == 0 || OC == 0) return;  // every gradient is an empty sum: += 0
  LtContext& ctx = context_for_current_device();
  std::lock_guard<std::mutex> lock(ctx.mu);
  const Operand dy = prepare(ctx, 0, dout, OC, N, prec);  // dout (N,OC) = (OC,N)
  if (dinp) {
    const Operand w = prepare(ctx, 1, weight, C, OC, prec);
    lt_gemm(ctx, dinp, w, false, dy, false, C, N, OC, 1.0f, nullptr);
  }
  // Slot 1 is reused: the gemm above was queued before this conversion, on
  // the same stream, so it has read the weights before they are overwritten.
  const Operand x = prepare(ctx, 1, inp, C, N, prec);
  lt_gemm(ctx, dweight, x, false, dy, true, C, OC, N, 1.0f, nullptr);
  if (dbias) {
    bias_backward_kernel<<<ceil_div(OC, kWarpSize), dim3(kWarpSize, kRows)>>>(dbias, dout, N, OC);
    CHECK_CUDA_LAUNCH();
  }
}

}  // namespace tessera::cuda
