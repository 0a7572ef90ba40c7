// CUDA kernels: the same operator set as kernels/ref and kernels/cpu with the
// same signatures (ops.inc). Every pointer is a DEVICE pointer to fp32 (or
// int) storage on the current device (device.h: set_device). Kernels run on
// the legacy default stream, in call order; a call returns once its work is
// queued, so read results after synchronize() or a blocking memcpy_d2h.
// The exception: embedding_bag_backward returns U to the host, so it waits
// for its own work (and what was queued before it) before returning.
// MatmulPrecision::kBF16 rounds the matmul inputs to bf16 and accumulates in
// fp32 (cuBLASLt, CUBLAS_COMPUTE_32F); kF32 is plain fp32 (no TF32).
// Errors inside a kernel call (launch failure, cuBLASLt error) are bugs or a
// dead device: they abort with file:line and the CUDA error string.
// Thread safety: as kernels/cpu; the per-device cuBLASLt context is locked.
#pragma once

#include <cstdint>

#include "kernels/precision.h"
#include "kernels/q4_type.h"

namespace tessera::cuda {
#include "kernels/ops.inc"

// attention_forward/attention_backward above are the plain kernels
// (attention.cu): ops.inc's contract, the full (B,NH,T,T) preatt and att.
// They stay as the fallback and as the oracle for the flash kernels below.

// ---- Flash-style causal attention (flash_attention.cu). Same letters;
// head size hs = C/NH at most kFlashMaxHeadSize (aborts otherwise).
constexpr int kFlashMaxHeadSize = 128;
// out (B,T,C) as attention_forward's; lse (B,NH,T) = log of each row's
// softmax denominator over the scaled scores (all that backward needs).
void flash_attention_forward(float* out, float* lse, const float* inp, int B, int T, int C, int NH);
// dinp (B,T,3C) += d(loss)/d(inp), recomputing the probabilities from inp and
// lse tile by tile; out is the forward's output; dsum (B,NH,T) is scratch
// (overwritten with rowsum(dout * out)).
void flash_attention_backward(float* dinp, float* dsum, const float* dout, const float* inp, const float* out,
                              const float* lse, int B, int T, int C, int NH);

// ---- The model's attention (attention.cu), as the OpsTable calls it.
enum class AttentionImpl { kPlain, kFlash };
// The kernels the model's attention prefers (kFlash by default; the CLI sets
// kPlain for TESSERA_CUDA_ATTENTION=plain). Set it before any model is made:
// a model sizes its buffers for the choice. Every build has it (a no-op
// without the CUDA backend).
void set_attention_preference(AttentionImpl impl);
// The preference; kPlain for head sizes above kFlashMaxHeadSize.
AttentionImpl attention_impl(int hs);
// Floats per (b, h, t) row of the state the model keeps between forward and
// backward (att) and of the scratch buffers (preatt, dpreatt, datt): T for
// the plain kernels (the (T,T) matrices), 1 for flash (lse; dsum in datt).
int64_t attention_saved_floats(int T, int hs);
int64_t attention_scratch_floats(int T, int hs);
// attention_forward/backward through attention_impl(C/NH): plain, or flash
// with att holding lse and datt holding dsum. Backward takes the forward's
// output `out` (B,T,C), which flash needs and plain ignores.
void model_attention_forward(float* out, float* preatt, float* att, const float* inp, int B, int T, int C, int NH);
void model_attention_backward(float* dinp, float* dpreatt, float* datt, const float* dout, const float* inp,
                              const float* out, const float* att, int B, int T, int C, int NH);

// ---- The chunked classifier's cross-entropy (crossentropy.cu). logits
// (N,Vp), only the first V columns real; no probabilities are stored.
// losses (N) = -log softmax(logits)[target]; lse (N) = log sum exp(logits).
void crossentropy_lse_forward(float* losses, float* lse, const float* logits, const int* targets, int N, int V,
                              int Vp);
// In place: logits (N,Vp) become dlogits = (softmax - onehot(target)) * dloss
// in the first V columns and 0 in the padding columns (written, not
// accumulated: the buffer held logits).
void crossentropy_lse_backward(float* logits, const float* lse, const int* targets, float dloss, int N, int V,
                               int Vp);

// ---- Sparse optimizers of embedding tables (dlrm.cu): optim/sparse.h's
// updates on device tables, same arguments and preconditions (rows distinct
// and in [0, E); U and D on the host). SGD equals the CPU's bitwise; row-wise
// Adagrad sums each row's squares in another order (a warp reduction).
void rowwise_adagrad_update(float* table, float* state, const int* rows, const float* grads, int U, int D,
                            const RowwiseAdagradParams& hp);
void sparse_sgd_update(float* table, const int* rows, const float* grads, int U, int D, float lr);
}  // namespace tessera::cuda
