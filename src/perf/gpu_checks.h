// The GPU checks of `tessera doctor` (docs/doctor.md), on device 0 of this
// process (the local rank's under MPI: the caller selects it). Compiled with
// the CUDA backend (perf/cuda_checks.cc); without it (perf/no_cuda.cc)
// probe_gpu() finds nothing and run_gpu_checks() says why.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "perf/machine.h"

namespace tessera::perf {

struct Figure;

// The current device's name, memory, driver and CUDA versions; none when
// CUDA is not compiled in or no device is visible.
std::optional<DeviceInfo> probe_gpu();

// Appends gpu.launch_latency_us, gpu.h2d.{pinned,pageable},
// gpu.d2h.{pinned,pageable}, gpu.mem.bandwidth, gpu.gemm.bf16.peak and
// gpu.alloc_us. An error (no device, CUDA failure) names what failed.
Status run_gpu_checks(bool quick, std::vector<Figure>* out);

}  // namespace tessera::perf
