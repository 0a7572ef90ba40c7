// Without the CUDA backend: no device, and the GPU checks say so.
#include "perf/gpu_checks.h"

namespace tessera::perf {

std::optional<DeviceInfo> probe_gpu() { return std::nullopt; }

Status run_gpu_checks(bool, std::vector<Figure>*) {
  return Status::Unavailable("CUDA support not compiled in");
}

}  // namespace tessera::perf
