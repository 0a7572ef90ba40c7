// Without the CUDA backend: no device, and the GPU checks (and the CUDA DLRM bench) say so.
#include "perf/dlrm_bench.h"
#include "perf/gpu_checks.h"

namespace tessera::perf {

std::optional<DeviceInfo> probe_gpu() { return std::nullopt; }

Status run_gpu_checks(bool, std::vector<Figure>*) {
  return Status::Unavailable("CUDA support not compiled in");
}

Result<DlrmCudaOpsResult> bench_dlrm_ops_cuda(const DlrmOpsOptions&) {
  return Status::Unavailable("the CUDA backend is not compiled into this binary (configure with TESSERA_CUDA=ON)");
}

}  // namespace tessera::perf
