// tessera info: version, compiled backends, CPU features, oneDNN ISA.
#include <cstdio>

#include <omp.h>

#include "core/cpu_features.h"
#include "tools/commands.h"

namespace tessera::tools {

void add_info_command(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("info", "Print version, backends, CPU features and the oneDNN ISA in use");
  cmd->callback([] {
    const CpuFeatures& f = cpu_features();
    std::printf("tessera %s\n", TESSERA_VERSION);
    std::printf("backends: cpu (oneDNN %s)\n", onednn_version().c_str());
    std::printf("cuda: not compiled\n");
    std::printf("cpu: %s, %d logical cores, %d OpenMP threads\n", f.brand.c_str(), f.logical_cores,
                omp_get_max_threads());
    std::printf("cpu features: %s\n", f.summary().c_str());
    std::printf("onednn isa: %s\n", onednn_isa().c_str());
    std::printf("bf16 matmul: %s\n",
                f.has_bf16_matmul() ? (f.amx_bf16 ? "native (AMX)" : "native (AVX512-BF16)")
                                    : "emulated in fp32 (no AVX512-BF16 or AMX)");
    exit_code() = kExitOk;
  });
}

}  // namespace tessera::tools
