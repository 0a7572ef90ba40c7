// A backend's operator set as a table of function pointers, so the model code
// is written once and runs on the reference kernels (the oracle, in tests) or
// the fast CPU kernels, or the CUDA kernels (device pointers throughout).
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "core/status.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/libraries.h"
#include "runtime/cuda_device.h"
#include "kernels/ref/ops.h"
#include "obs/op_timer.h"
#include "tensor/dtype.h"
#ifdef TESSERA_HAVE_CUDA
#include "kernels/cuda/ops.h"
#endif

namespace tessera {

// kCPUProfiled: the fast kernels, each call timed into op_times().
// kCUDA: the CUDA kernels; only in binaries built with the CUDA backend
// (TESSERA_HAVE_CUDA), and only with a device (backend_available()).
enum class Backend { kRef, kCPU, kCPUProfiled, kCUDA };

// Where a backend's tensors live.
inline Device device_of(Backend b) { return b == Backend::kCUDA ? Device::kCUDA : Device::kCPU; }

// Whether backend b can run in this process, as one line: always for the
// CPU backends; kCUDA needs the CUDA backend compiled in and a usable device
// and cuBLASLt to open ("CUDA support not compiled in ...", "cudaGetDeviceCount:
// ...", "cannot load cuBLASLt ...").
inline Status backend_available(Backend b) {
  if (b != Backend::kCUDA) return Status::OK();
  if (!cuda::compiled())
    return Status::Unavailable("the CUDA backend is not compiled into this binary (configure with TESSERA_CUDA=ON)");
  Result<int> n = cuda::query_device_count();
  if (!n.ok()) return Status::Unavailable("no CUDA device: " + n.status().message());
  if (*n == 0) return Status::Unavailable("no CUDA device: the driver reports 0 devices");
  return cuda::cublaslt_available();
}

// Attention backward as the model calls it: ops.inc's arguments plus the
// forward's output out (B,T,C), which flash attention needs.
using AttentionBackwardFn = void (*)(float* dinp, float* dpreatt, float* datt, const float* dout, const float* inp,
                                     const float* out, const float* att, int B, int T, int C, int NH);
// Floats per (b, h, t) row of an attention buffer, for T and head size hs.
using AttentionRowFloatsFn = int64_t (*)(int T, int hs);
// The CUDA head's cross-entropy (kernels/cuda/ops.h: crossentropy_lse_*).
using CrossEntropyLseForwardFn = void (*)(float* losses, float* lse, const float* logits, const int* targets, int N,
                                          int V, int Vp);
using CrossEntropyLseBackwardFn = void (*)(float* logits, const float* lse, const int* targets, float dloss, int N,
                                           int V, int Vp);

// Every field is named where a table is made (designated initialisers), so
// a field out of order does not compile; a null entry is an op the backend
// does not have (the model refuses the configurations that need it).
struct OpsTable {
  decltype(&cpu::encoder_forward) encoder_forward = nullptr;
  decltype(&cpu::encoder_backward) encoder_backward = nullptr;
  decltype(&cpu::layernorm_forward) layernorm_forward = nullptr;
  decltype(&cpu::layernorm_backward) layernorm_backward = nullptr;
  decltype(&cpu::matmul_forward) matmul_forward = nullptr;
  decltype(&cpu::matmul_backward) matmul_backward = nullptr;
  decltype(&cpu::attention_forward) attention_forward = nullptr;
  AttentionBackwardFn attention_backward = nullptr;
  decltype(&cpu::gelu_forward) gelu_forward = nullptr;
  decltype(&cpu::gelu_backward) gelu_backward = nullptr;
  // The MLP's fc and GELU in one call (ops.inc): fused on CUDA.
  decltype(&cpu::matmul_gelu_forward) matmul_gelu_forward = nullptr;
  decltype(&cpu::residual_forward) residual_forward = nullptr;
  decltype(&cpu::residual_backward) residual_backward = nullptr;
  decltype(&cpu::crossentropy_softmax_forward) crossentropy_softmax_forward = nullptr;
  decltype(&cpu::crossentropy_softmax_backward) crossentropy_softmax_backward = nullptr;
  decltype(&cpu::adamw_update) adamw_update = nullptr;
  // Sizes of the attention buffers the model allocates, per (b, h, t) row:
  // att, kept from forward to backward, and the scratch preatt, dpreatt,
  // datt. T for the backends that keep the (T,T) matrices.
  AttentionRowFloatsFn attention_saved_floats = nullptr;
  AttentionRowFloatsFn attention_scratch_floats = nullptr;
  // The chunked classifier (nn/gpt.cc): set on CUDA, where the output layer
  // never holds logits for all B*T rows; null on the CPU backends, which
  // keep the full logits and probabilities.
  CrossEntropyLseForwardFn crossentropy_lse_forward = nullptr;
  CrossEntropyLseBackwardFn crossentropy_lse_backward = nullptr;
  // The ragged-batch forward with a paged KV cache (ops.inc; nn/kv_cache.h).
  decltype(&cpu::encoder_forward_positions) encoder_forward_positions = nullptr;
  decltype(&cpu::kv_cache_write) kv_cache_write = nullptr;
  decltype(&cpu::paged_attention_forward) paged_attention_forward = nullptr;
  // The Llama family (ops.inc): grouped-query attention in training and
  // over the paged cache, RMSNorm, rotary embedding, SwiGLU. Every backend
  // (CUDA's GQA attention is the plain kernel set, which keeps the (T,T)
  // matrices: the model sizes its buffers for it). A backend without them
  // leaves them null and GPT::create refuses such models in one line.
  decltype(&cpu::attention_gqa_forward) attention_gqa_forward = nullptr;
  decltype(&cpu::attention_gqa_backward) attention_gqa_backward = nullptr;
  decltype(&cpu::kv_cache_write_gqa) kv_cache_write_gqa = nullptr;
  decltype(&cpu::paged_attention_gqa_forward) paged_attention_gqa_forward = nullptr;
  // The fp16 KV cache (ops.inc; PagedKVCache's KvDtype::kF16): ref and cpu;
  // null on CUDA (PagedKVCache::create refuses it there).
  decltype(&cpu::kv_cache_write_gqa_f16) kv_cache_write_gqa_f16 = nullptr;
  decltype(&cpu::paged_attention_gqa_f16_forward) paged_attention_gqa_f16_forward = nullptr;
  decltype(&cpu::rmsnorm_forward) rmsnorm_forward = nullptr;
  decltype(&cpu::rmsnorm_backward) rmsnorm_backward = nullptr;
  decltype(&cpu::rope_forward) rope_forward = nullptr;
  decltype(&cpu::rope_backward) rope_backward = nullptr;
  decltype(&cpu::swiglu_forward) swiglu_forward = nullptr;
  decltype(&cpu::swiglu_backward) swiglu_backward = nullptr;
  // The INT8 tier (ops.inc; docs/formats/int8.md): ref and cpu, which agree
  // bit for bit; null on CUDA (GPT::load_int8 refuses off the CPU).
  decltype(&cpu::quantize_weights_int8) quantize_weights_int8 = nullptr;
  decltype(&cpu::matmul_int8_forward) matmul_int8_forward = nullptr;
  // The int4 tiers (ops.inc; kernels/q4.h): ref and cpu; null on CUDA.
  decltype(&cpu::matmul_q4_forward) matmul_q4_forward = nullptr;
};

// ops.inc's attention_backward, which needs no `out`, as an AttentionBackwardFn.
template <auto Fn>
void attention_backward_without_out(float* dinp, float* dpreatt, float* datt, const float* dout, const float* inp,
                                    const float* /*out*/, const float* att, int B, int T, int C, int NH) {
  Fn(dinp, dpreatt, datt, dout, inp, att, B, T, C, NH);
}

inline int64_t full_attention_row_floats(int T, int /*hs*/) { return T; }

// The CPU backends (ns = ref or cpu).
#define TESSERA_OPS_TABLE(ns)                                                      \
  OpsTable {                                                                       \
    .encoder_forward = ns::encoder_forward, .encoder_backward = ns::encoder_backward, \
    .layernorm_forward = ns::layernorm_forward, .layernorm_backward = ns::layernorm_backward, \
    .matmul_forward = ns::matmul_forward, .matmul_backward = ns::matmul_backward,  \
    .attention_forward = ns::attention_forward,                                    \
    .attention_backward = attention_backward_without_out<ns::attention_backward>,  \
    .gelu_forward = ns::gelu_forward, .gelu_backward = ns::gelu_backward,          \
    .matmul_gelu_forward = ns::matmul_gelu_forward, .residual_forward = ns::residual_forward, \
    .residual_backward = ns::residual_backward,                                    \
    .crossentropy_softmax_forward = ns::crossentropy_softmax_forward,              \
    .crossentropy_softmax_backward = ns::crossentropy_softmax_backward,            \
    .adamw_update = ns::adamw_update, .attention_saved_floats = full_attention_row_floats, \
    .attention_scratch_floats = full_attention_row_floats,                         \
    .encoder_forward_positions = ns::encoder_forward_positions,                    \
    .kv_cache_write = ns::kv_cache_write, .paged_attention_forward = ns::paged_attention_forward, \
    .attention_gqa_forward = ns::attention_gqa_forward,                            \
    .attention_gqa_backward = ns::attention_gqa_backward,                          \
    .kv_cache_write_gqa = ns::kv_cache_write_gqa,                                  \
    .paged_attention_gqa_forward = ns::paged_attention_gqa_forward,                \
    .kv_cache_write_gqa_f16 = ns::kv_cache_write_gqa_f16,                          \
    .paged_attention_gqa_f16_forward = ns::paged_attention_gqa_f16_forward,        \
    .rmsnorm_forward = ns::rmsnorm_forward, .rmsnorm_backward = ns::rmsnorm_backward, \
    .rope_forward = ns::rope_forward, .rope_backward = ns::rope_backward,          \
    .swiglu_forward = ns::swiglu_forward, .swiglu_backward = ns::swiglu_backward,  \
    .quantize_weights_int8 = ns::quantize_weights_int8,                            \
    .matmul_int8_forward = ns::matmul_int8_forward,                                \
    .matmul_q4_forward = ns::matmul_q4_forward,                                    \
  }

// A thunk with Fn's signature that adds the call's duration to op_times().
template <auto Fn, OpKind Kind>
struct Timed;
template <typename... Args, void (*Fn)(Args...), OpKind Kind>
struct Timed<Fn, Kind> {
  static void call(Args... args) {
    auto t0 = std::chrono::steady_clock::now();
    Fn(args...);
    op_times().seconds[static_cast<int>(Kind)] +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
};

// matmul_gelu_forward as its two halves (what cpu:: does), so the profiled
// backend times the matmul and the GELU under their own kinds.
template <auto Matmul, auto Gelu>
void matmul_then_gelu(float* pre, float* out, const float* inp, const float* weight, const float* bias, int N, int C,
                      int OC, MatmulPrecision prec) {
  Matmul(pre, inp, weight, bias, N, C, OC, prec);
  Gelu(out, pre, static_cast<int64_t>(N) * OC);
}

inline const OpsTable& ops_for(Backend b) {
  static const OpsTable kRef = TESSERA_OPS_TABLE(ref);
  static const OpsTable kCpu = TESSERA_OPS_TABLE(cpu);
  static const OpsTable kProfiled = {
      .encoder_forward = Timed<cpu::encoder_forward, OpKind::kEncoder>::call,
      .encoder_backward = Timed<cpu::encoder_backward, OpKind::kEncoder>::call,
      .layernorm_forward = Timed<cpu::layernorm_forward, OpKind::kLayernorm>::call,
      .layernorm_backward = Timed<cpu::layernorm_backward, OpKind::kLayernorm>::call,
      .matmul_forward = Timed<cpu::matmul_forward, OpKind::kMatmul>::call,
      .matmul_backward = Timed<cpu::matmul_backward, OpKind::kMatmul>::call,
      .attention_forward = Timed<cpu::attention_forward, OpKind::kAttention>::call,
      .attention_backward = attention_backward_without_out<Timed<cpu::attention_backward, OpKind::kAttention>::call>,
      .gelu_forward = Timed<cpu::gelu_forward, OpKind::kElementwise>::call,
      .gelu_backward = Timed<cpu::gelu_backward, OpKind::kElementwise>::call,
      .matmul_gelu_forward = matmul_then_gelu<Timed<cpu::matmul_forward, OpKind::kMatmul>::call,
                                              Timed<cpu::gelu_forward, OpKind::kElementwise>::call>,
      .residual_forward = Timed<cpu::residual_forward, OpKind::kElementwise>::call,
      .residual_backward = Timed<cpu::residual_backward, OpKind::kElementwise>::call,
      .crossentropy_softmax_forward = Timed<cpu::crossentropy_softmax_forward, OpKind::kCrossEntropy>::call,
      .crossentropy_softmax_backward = Timed<cpu::crossentropy_softmax_backward, OpKind::kCrossEntropy>::call,
      .adamw_update = Timed<cpu::adamw_update, OpKind::kAdamW>::call,
      .attention_saved_floats = full_attention_row_floats,
      .attention_scratch_floats = full_attention_row_floats,
      .encoder_forward_positions = Timed<cpu::encoder_forward_positions, OpKind::kEncoder>::call,
      .kv_cache_write = Timed<cpu::kv_cache_write, OpKind::kAttention>::call,
      .paged_attention_forward = Timed<cpu::paged_attention_forward, OpKind::kAttention>::call,
      .attention_gqa_forward = Timed<cpu::attention_gqa_forward, OpKind::kAttention>::call,
      .attention_gqa_backward = Timed<cpu::attention_gqa_backward, OpKind::kAttention>::call,
      .kv_cache_write_gqa = Timed<cpu::kv_cache_write_gqa, OpKind::kAttention>::call,
      .paged_attention_gqa_forward = Timed<cpu::paged_attention_gqa_forward, OpKind::kAttention>::call,
      .kv_cache_write_gqa_f16 = Timed<cpu::kv_cache_write_gqa_f16, OpKind::kAttention>::call,
      .paged_attention_gqa_f16_forward = Timed<cpu::paged_attention_gqa_f16_forward, OpKind::kAttention>::call,
      .rmsnorm_forward = Timed<cpu::rmsnorm_forward, OpKind::kLayernorm>::call,
      .rmsnorm_backward = Timed<cpu::rmsnorm_backward, OpKind::kLayernorm>::call,
      .rope_forward = Timed<cpu::rope_forward, OpKind::kElementwise>::call,
      .rope_backward = Timed<cpu::rope_backward, OpKind::kElementwise>::call,
      .swiglu_forward = Timed<cpu::swiglu_forward, OpKind::kElementwise>::call,
      .swiglu_backward = Timed<cpu::swiglu_backward, OpKind::kElementwise>::call,
      .quantize_weights_int8 = cpu::quantize_weights_int8,
      .matmul_int8_forward = Timed<cpu::matmul_int8_forward, OpKind::kMatmul>::call,
      .matmul_q4_forward = Timed<cpu::matmul_q4_forward, OpKind::kMatmul>::call,
  };
#ifdef TESSERA_HAVE_CUDA
  // Attention through cuda::attention_impl() (flash unless
  // TESSERA_CUDA_ATTENTION=plain); the chunked classifier's cross-entropy.
  static const OpsTable kCuda = {
      .encoder_forward = cuda::encoder_forward,
      .encoder_backward = cuda::encoder_backward,
      .layernorm_forward = cuda::layernorm_forward,
      .layernorm_backward = cuda::layernorm_backward,
      .matmul_forward = cuda::matmul_forward,
      .matmul_backward = cuda::matmul_backward,
      .attention_forward = cuda::model_attention_forward,
      .attention_backward = cuda::model_attention_backward,
      .gelu_forward = cuda::gelu_forward,
      .gelu_backward = cuda::gelu_backward,
      .matmul_gelu_forward = cuda::matmul_gelu_forward,
      .residual_forward = cuda::residual_forward,
      .residual_backward = cuda::residual_backward,
      .crossentropy_softmax_forward = cuda::crossentropy_softmax_forward,
      .crossentropy_softmax_backward = cuda::crossentropy_softmax_backward,
      .adamw_update = cuda::adamw_update,
      .attention_saved_floats = cuda::attention_saved_floats,
      .attention_scratch_floats = cuda::attention_scratch_floats,
      .crossentropy_lse_forward = cuda::crossentropy_lse_forward,
      .crossentropy_lse_backward = cuda::crossentropy_lse_backward,
      .encoder_forward_positions = cuda::encoder_forward_positions,
      .kv_cache_write = cuda::kv_cache_write,
      .paged_attention_forward = cuda::paged_attention_forward,
      .attention_gqa_forward = cuda::attention_gqa_forward,
      .attention_gqa_backward = cuda::attention_gqa_backward,
      .kv_cache_write_gqa = cuda::kv_cache_write_gqa,
      .paged_attention_gqa_forward = cuda::paged_attention_gqa_forward,
      .rmsnorm_forward = cuda::rmsnorm_forward,
      .rmsnorm_backward = cuda::rmsnorm_backward,
      .rope_forward = cuda::rope_forward,
      .rope_backward = cuda::rope_backward,
      .swiglu_forward = cuda::swiglu_forward,
      .swiglu_backward = cuda::swiglu_backward,
  };
#endif
  switch (b) {
    case Backend::kRef: return kRef;
    case Backend::kCPU: return kCpu;
    case Backend::kCPUProfiled: return kProfiled;
    case Backend::kCUDA:
#ifdef TESSERA_HAVE_CUDA
      return kCuda;
#else
      // Callers check backend_available() first; reaching this is a bug.
      std::fprintf(stderr, "tessera: Backend::kCUDA asked for, but %s\n",
                   backend_available(Backend::kCUDA).message().c_str());
      std::abort();
#endif
  }
  return kCpu;
}

inline std::string_view backend_name(Backend b) {
  switch (b) {
    case Backend::kRef: return "ref";
    case Backend::kCUDA: return "cuda";
    default: return "cpu";
  }
}

}  // namespace tessera
