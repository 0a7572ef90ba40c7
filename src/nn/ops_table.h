// A backend's operator set as a table of function pointers, so the model code
// is written once and runs on the reference kernels (the oracle, in tests) or
// the fast CPU kernels, or the CUDA kernels (device pointers throughout).
#pragma once

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "core/status.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/device.h"
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
#ifdef TESSERA_HAVE_CUDA
  static const OpsTable kCuda = TESSERA_OPS_TABLE(cuda);
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
