// A backend's operator set as a table of function pointers, so the model code
// is written once and runs on the reference kernels (the oracle, in tests) or
// the fast CPU kernels. The CUDA backend will add a third table.
#pragma once

#include <chrono>
#include <string_view>

#include "kernels/cpu/ops.h"
#include "kernels/ref/ops.h"
#include "obs/op_timer.h"

namespace tessera {

// kCPUProfiled: the fast kernels, each call timed into op_times().
enum class Backend { kRef, kCPU, kCPUProfiled };

struct OpsTable {
  decltype(&cpu::encoder_forward) encoder_forward;
  decltype(&cpu::encoder_backward) encoder_backward;
  decltype(&cpu::layernorm_forward) layernorm_forward;
  decltype(&cpu::layernorm_backward) layernorm_backward;
  decltype(&cpu::matmul_forward) matmul_forward;
  decltype(&cpu::matmul_backward) matmul_backward;
  decltype(&cpu::attention_forward) attention_forward;
  decltype(&cpu::attention_backward) attention_backward;
  decltype(&cpu::gelu_forward) gelu_forward;
  decltype(&cpu::gelu_backward) gelu_backward;
  decltype(&cpu::residual_forward) residual_forward;
  decltype(&cpu::residual_backward) residual_backward;
  decltype(&cpu::crossentropy_softmax_forward) crossentropy_softmax_forward;
  decltype(&cpu::crossentropy_softmax_backward) crossentropy_softmax_backward;
  decltype(&cpu::adamw_update) adamw_update;
};

#define TESSERA_OPS_TABLE(ns)                                                                     \
  OpsTable {                                                                                      \
    ns::encoder_forward, ns::encoder_backward, ns::layernorm_forward, ns::layernorm_backward,     \
        ns::matmul_forward, ns::matmul_backward, ns::attention_forward, ns::attention_backward,   \
        ns::gelu_forward, ns::gelu_backward, ns::residual_forward, ns::residual_backward,         \
        ns::crossentropy_softmax_forward, ns::crossentropy_softmax_backward, ns::adamw_update     \
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
      Timed<cpu::attention_backward, OpKind::kAttention>::call,
      Timed<cpu::gelu_forward, OpKind::kElementwise>::call,
      Timed<cpu::gelu_backward, OpKind::kElementwise>::call,
      Timed<cpu::residual_forward, OpKind::kElementwise>::call,
      Timed<cpu::residual_backward, OpKind::kElementwise>::call,
      Timed<cpu::crossentropy_softmax_forward, OpKind::kCrossEntropy>::call,
      Timed<cpu::crossentropy_softmax_backward, OpKind::kCrossEntropy>::call,
      Timed<cpu::adamw_update, OpKind::kAdamW>::call,
  };
  switch (b) {
    case Backend::kRef: return kRef;
    case Backend::kCPU: return kCpu;
    case Backend::kCPUProfiled: return kProfiled;
  }
  return kCpu;
}

inline std::string_view backend_name(Backend b) { return b == Backend::kRef ? "ref" : "cpu"; }

}  // namespace tessera
