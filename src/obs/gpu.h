// GPU figures through NVML, loaded at run time: dlopen("libnvidia-ml.so.1"),
// so a CPU build (and a machine without NVIDIA's driver) needs nothing and
// links nothing. A GpuMonitor samples one device from its own thread (NVML's
// PCIe counter blocks for about 20 ms per query, which the training thread
// must not pay) and sets these gauges of a Registry, with label gpu="<bus id>":
//
//   tessera_gpu_utilization_ratio                 share of the last sample period a kernel ran (0-1)
//   tessera_gpu_memory_used_bytes                 device memory in use (all processes)
//   tessera_gpu_memory_total_bytes                device memory
//   tessera_gpu_pcie_bytes_per_second{direction}  PCIe throughput, "tx" (device to host) and "rx"
//   tessera_gpu_power_watts                       board power draw
//   tessera_gpu_temperature_celsius               GPU core temperature
//
// A figure the device does not report (NVML_ERROR_NOT_SUPPORTED) is left
// out. Thread safety: a GpuMonitor is started and stopped by one thread;
// the gauges are the registry's (lock-free).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "core/status.h"
#include "obs/metrics.h"

namespace tessera::obs {

struct NvmlApi;  // the functions dlsym found (gpu.cc)

class GpuMonitor {
 public:
  // Loads NVML from `library`, initialises it and finds the device by its
  // PCI bus id ("0000:3b:00.0", as cudaDeviceGetPCIBusId gives it; empty:
  // NVML's device `index`). Unavailable, one line naming what is missing,
  // when the library cannot be loaded, lacks a function, or NVML or the
  // device cannot be initialised; nothing is left loaded then.
  static Result<std::unique_ptr<GpuMonitor>> open(const std::string& pci_bus_id, int index = 0,
                                                  const std::string& library = "libnvidia-ml.so.1");
  ~GpuMonitor();
  GpuMonitor(const GpuMonitor&) = delete;
  GpuMonitor& operator=(const GpuMonitor&) = delete;

  // Samples once into `registry` now, then every `period` until stop().
  void start(Registry& registry, std::chrono::milliseconds period = std::chrono::seconds(1));
  void stop();
  // One sample (what the thread does each period).
  void sample(Registry& registry);
  // The utilisation of the last sample (0-1), or -1 before the first.
  double last_utilization() const { return last_util_.load(std::memory_order_relaxed); }
  const std::string& bus_id() const { return bus_id_; }

 private:
  GpuMonitor() = default;
  std::unique_ptr<NvmlApi> api_;
  void* device_ = nullptr;  // nvmlDevice_t
  std::string bus_id_;
  std::atomic<double> last_util_{-1.0};
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
};

}  // namespace tessera::obs
