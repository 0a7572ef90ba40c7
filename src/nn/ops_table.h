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
// ("CUDA support not compiled in ...", "cudaGetDeviceCount: ...").
inline Status backend_available(Backend b) {
  if (b != Backend::kCUDA) return Status::OK();
  if (!cuda::compiled())
    return Status::Unavailable("the CUDA backend is not compiled into this binary (configure with TESSERA_CUDA=ON)");
  Result<int> n = cuda::query_device_count();
  if (!n.ok()) return Status::Unavailable("no CUDA device: " + n.status().message());
  if (*n == 0) return Status::Unavailable("no CUDA device: the driver reports 0 devices");
  return Status::OK();
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

struct OpsTable {
  decltype(&cpu::encoder_forward) encoder_forward;
  decltype(&cpu::encoder_backward) encoder_backward;
  decltype(&cpu::layernorm_forward) layernorm_forward;
  decltype(&cpu::layernorm_backward) layernorm_backward;
  decltype(&cpu::matmul_forward) matmul_forward;
  decltype(&cpu::matmul_backward) matmul_backward;
  decltype(&cpu::attention_forward) attention_forward;
  AttentionBackwardFn attention_backward;
  decltype(&cpu::gelu_forward) gelu_forward;
  decltype(&cpu::gelu_backward) gelu_backward;
  // The MLP's fc and GELU in one call (ops.inc): fused on CUDA.
  decltype(&cpu::matmul_gelu_forward) matmul_gelu_forward;
  decltype(&cpu::residual_forward) residual_forward;
  decltype(&cpu::residual_backward) residual_backward;
  decltype(&cpu::crossentropy_softmax_forward) crossentropy_softmax_forward;
  decltype(&cpu::crossentropy_softmax_backward) crossentropy_softmax_backward;
  decltype(&cpu::adamw_update) adamw_update;
  // Sizes of the attention buffers the model allocates, per (b, h, t) row:
  // att, kept from forward to backward, and the scratch preatt, dpreatt,
  // datt. T for the backends that keep the (T,T) matrices.
  AttentionRowFloatsFn attention_saved_floats;
  AttentionRowFloatsFn attention_scratch_floats;
  // The chunked classifier (nn/gpt.cc): set on CUDA, where the output layer
  // never holds logits for all B*T rows; null on the CPU backends, which
  // keep the full logits and probabilities.
  CrossEntropyLseForwardFn crossentropy_lse_forward;
  CrossEntropyLseBackwardFn crossentropy_lse_backward;
  // The ragged-batch forward with a paged KV cache (ops.inc; nn/kv_cache.h).
  decltype(&cpu::encoder_forward_positions) encoder_forward_positions;
  decltype(&cpu::kv_cache_write) kv_cache_write;
  decltype(&cpu::paged_attention_forward) paged_attention_forward;
};

// ops.inc's attention_backward, which needs no `out`, as an AttentionBackwardFn.
template <auto Fn>
void attention_backward_without_out(float* dinp, float* dpreatt, float* datt, const float* dout, const float* inp,
                                    const float* /*out*/, const float* att, int B, int T, int C, int NH) {
  Fn(dinp, dpreatt, datt, dout, inp, att, B, T, C, NH);
}

inline int64_t full_attention_row_floats(int T, int /*hs*/) { return T; }

// The CPU backends (ns = ref or cpu).
#define TESSERA_OPS_TABLE(ns)                                                                              \
  OpsTable {                                                                                               \
    ns::encoder_forward, ns::encoder_backward, ns::layernorm_forward, ns::layernorm_backward,              \
        ns::matmul_forward, ns::matmul_backward, ns::attention_forward,                                    \
        attention_backward_without_out<ns::attention_backward>, ns::gelu_forward, ns::gelu_backward,       \
        ns::matmul_gelu_forward, ns::residual_forward, ns::residual_backward,                              \
        ns::crossentropy_softmax_forward, ns::crossentropy_softmax_backward, ns::adamw_update,             \
        full_attention_row_floats, full_attention_row_floats, nullptr, nullptr,                            \
        ns::encoder_forward_positions, ns::kv_cache_write, ns::paged_attention_forward                     \
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
      Timed<cpu::encoder_forward, OpKind::kEncoder>::call,
      Timed<cpu::encoder_backward, OpKind::kEncoder>::call,
      Timed<cpu::layernorm_forward, OpKind::kLayernorm>::call,
      Timed<cpu::layernorm_backward, OpKind::kLayernorm>::call,
      Timed<cpu::matmul_forward, OpKind::kMatmul>::call,
      Timed<cpu::matmul_backward, OpKind::kMatmul>::call,
      Timed<cpu::attention_forward, OpKind::kAttention>::call,
      attention_backward_without_out<Timed<cpu::attention_backward, OpKind::kAttention>::call>,
      Timed<cpu::gelu_forward, OpKind::kElementwise>::call,
      Timed<cpu::gelu_backward, OpKind::kElementwise>::call,
      matmul_then_gelu<Timed<cpu::matmul_forward, OpKind::kMatmul>::call,
                       Timed<cpu::gelu_forward, OpKind::kElementwise>::call>,
      Timed<cpu::residual_forward, OpKind::kElementwise>::call,
      Timed<cpu::residual_backward, OpKind::kElementwise>::call,
      Timed<cpu::crossentropy_softmax_forward, OpKind::kCrossEntropy>::call,
      Timed<cpu::crossentropy_softmax_backward, OpKind::kCrossEntropy>::call,
      Timed<cpu::adamw_update, OpKind::kAdamW>::call,
      full_attention_row_floats,
      full_attention_row_floats,
      nullptr,
      nullptr,
      Timed<cpu::encoder_forward_positions, OpKind::kEncoder>::call,
      Timed<cpu::kv_cache_write, OpKind::kAttention>::call,
      Timed<cpu::paged_attention_forward, OpKind::kAttention>::call,
  };
#ifdef TESSERA_HAVE_CUDA
  // Attention through cuda::attention_impl() (flash unless
  // TESSERA_CUDA_ATTENTION=plain); the chunked classifier's cross-entropy.
  static const OpsTable kCuda = {
      cuda::encoder_forward,
      cuda::encoder_backward,
      cuda::layernorm_forward,
      cuda::layernorm_backward,
      cuda::matmul_forward,
      cuda::matmul_backward,
      cuda::model_attention_forward,
      cuda::model_attention_backward,
      cuda::gelu_forward,
      cuda::gelu_backward,
      cuda::matmul_gelu_forward,
      cuda::residual_forward,
      cuda::residual_backward,
      cuda::crossentropy_softmax_forward,
      cuda::crossentropy_softmax_backward,
      cuda::adamw_update,
      cuda::attention_saved_floats,
      cuda::attention_scratch_floats,
      cuda::crossentropy_lse_forward,
      cuda::crossentropy_lse_backward,
      cuda::encoder_forward_positions,
      cuda::kv_cache_write,
      cuda::paged_attention_forward,
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
