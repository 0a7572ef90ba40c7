// tessera info: version, compiled backends (CUDA devices, NCCL), CPU features, oneDNN ISA.
#include <cstdio>

#include <omp.h>

#include "core/cpu_features.h"
#include "kernels/cpu/int8_kernel.h"
#include "kernels/cpu/onednn_info.h"
#include "comm/nccl/nccl_factory.h"
#include "runtime/cuda_device.h"
#include "tools/commands.h"

namespace tessera::tools {

namespace {

// "cuda: compiled (CUDA runtime 13.0, sm_80 sm_90 compute_90), 2 device(s)"
// and a line per device; or why there is none; or "cuda: not compiled".
void print_cuda() {
  if (!cuda::compiled()) {
    std::printf("cuda: not compiled\n");
    return;
  }
  const Result<int> count = cuda::query_device_count();
  if (!count.ok() || count.value() == 0) {
    std::printf("cuda: compiled (CUDA runtime %s, %s), no device (%s)\n", cuda::runtime_version().c_str(),
                cuda::compiled_architectures().c_str(),
                count.ok() ? "the driver reports 0 devices" : count.status().message().c_str());
    return;
  }
  std::printf("cuda: compiled (CUDA runtime %s, %s), %d device(s)\n", cuda::runtime_version().c_str(),
              cuda::compiled_architectures().c_str(), count.value());
  for (int d = 0; d < count.value(); d++) std::printf("  cuda:%d: %s\n", d, cuda::device_summary(d).c_str());
}

// "nccl: 2.28.9" or "nccl: not compiled".
void print_nccl() {
  if (!comm::nccl_compiled()) {
    std::printf("nccl: not compiled%s\n", cuda::compiled() ? " (nccl.h/libnccl not found at configure time)" : "");
    return;
  }
  std::printf("nccl: %s\n", comm::nccl_version().c_str());
}

}  // namespace

void add_info_command(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("info", "Print version, backends, CPU features and the oneDNN ISA in use");
  cmd->callback([] {
    const CpuFeatures& f = cpu_features();
    std::printf("tessera %s\n", TESSERA_VERSION);
    std::printf("backends: cpu (oneDNN %s)\n", onednn_version().c_str());
    print_cuda();
    print_nccl();
    std::printf("cpu: %s, %d logical cores, %d OpenMP threads\n", f.brand.c_str(), f.logical_cores,
                omp_get_max_threads());
    std::printf("cpu features: %s%s\n", f.summary().c_str(), f.cap.empty() ? "" : (" (capped: " + f.cap + ")").c_str());
    std::printf("onednn isa: %s\n", onednn_isa().c_str());
    std::printf("bf16 matmul: %s\n",
                f.has_bf16_matmul() ? (f.amx_bf16 ? "native (AMX)" : "native (AVX512-BF16)")
                                    : "emulated in fp32 (no AVX512-BF16 or AMX)");
    const cpu::Int8KernelInfo k = cpu::int8_kernel_info();
    std::printf("int8 matmul: %s%s\n", k.summary.c_str(),
                k.exact ? "" : "; WRONG results on this CPU: the INT8 tier refuses to start");
    exit_code() = kExitOk;
  });
}

}  // namespace tessera::tools
