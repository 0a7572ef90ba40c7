#include "obs/gpu.h"

#include <dlfcn.h>

#include <type_traits>

#include <fmt/format.h>

namespace tessera::obs {

// NVML's C interface, declared here (no nvml.h needed): the types are as
// NVML documents them; nvmlReturn_t is an int enum, 0 success, 3 not supported.
namespace {
using nvmlReturn_t = int;
using nvmlDevice_t = void*;
struct nvmlUtilization_t {
  unsigned int gpu, memory;  // percent
};
struct nvmlMemory_t {
  unsigned long long total, free, used;  // bytes
};
constexpr nvmlReturn_t kNvmlSuccess = 0;
constexpr int kPcieTxBytes = 0, kPcieRxBytes = 1;  // nvmlPcieUtilCounter_t
constexpr int kTemperatureGpu = 0;                 // nvmlTemperatureSensors_t
}  // namespace

struct NvmlApi {
  void* lib = nullptr;
  nvmlReturn_t (*init)() = nullptr;
  nvmlReturn_t (*shutdown)() = nullptr;
  const char* (*error_string)(nvmlReturn_t) = nullptr;
  nvmlReturn_t (*by_index)(unsigned int, nvmlDevice_t*) = nullptr;
  nvmlReturn_t (*by_bus_id)(const char*, nvmlDevice_t*) = nullptr;
  nvmlReturn_t (*utilization)(nvmlDevice_t, nvmlUtilization_t*) = nullptr;
  nvmlReturn_t (*memory)(nvmlDevice_t, nvmlMemory_t*) = nullptr;
  nvmlReturn_t (*pcie)(nvmlDevice_t, int, unsigned int*) = nullptr;  // KB/s
  nvmlReturn_t (*power)(nvmlDevice_t, unsigned int*) = nullptr;     // milliwatts
  nvmlReturn_t (*temperature)(nvmlDevice_t, int, unsigned int*) = nullptr;
  bool initialised = false;

  ~NvmlApi() {
    if (initialised && shutdown) shutdown();
    if (lib) dlclose(lib);
  }
  std::string error(nvmlReturn_t rc) const {
    const char* s = error_string ? error_string(rc) : nullptr;
    return s ? s : fmt::format("NVML error {}", rc);
  }
};

Result<std::unique_ptr<GpuMonitor>> GpuMonitor::open(const std::string& pci_bus_id, int index,
                                                      const std::string& library) {
  auto api = std::make_unique<NvmlApi>();
  api->lib = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!api->lib) {
    const char* why = dlerror();
    return Status::Unavailable(fmt::format("NVML is not available ({})", why ? why : library));
  }
  auto find = [&](auto& fn, const char* name) -> Status {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(api->lib, name));
    if (!fn) return Status::Unavailable(fmt::format("NVML ({}) lacks {}", library, name));
    return Status::OK();
  };
  RETURN_IF_ERROR(find(api->init, "nvmlInit_v2"));
  RETURN_IF_ERROR(find(api->shutdown, "nvmlShutdown"));
  RETURN_IF_ERROR(find(api->error_string, "nvmlErrorString"));
  RETURN_IF_ERROR(find(api->by_index, "nvmlDeviceGetHandleByIndex_v2"));
  RETURN_IF_ERROR(find(api->by_bus_id, "nvmlDeviceGetHandleByPciBusId_v2"));
  RETURN_IF_ERROR(find(api->utilization, "nvmlDeviceGetUtilizationRates"));
  RETURN_IF_ERROR(find(api->memory, "nvmlDeviceGetMemoryInfo"));
  RETURN_IF_ERROR(find(api->pcie, "nvmlDeviceGetPcieThroughput"));
  RETURN_IF_ERROR(find(api->power, "nvmlDeviceGetPowerUsage"));
  RETURN_IF_ERROR(find(api->temperature, "nvmlDeviceGetTemperature"));
  if (nvmlReturn_t rc = api->init(); rc != kNvmlSuccess)
    return Status::Unavailable(fmt::format("nvmlInit: {}", api->error(rc)));
  api->initialised = true;
  nvmlDevice_t dev = nullptr;
  nvmlReturn_t rc = pci_bus_id.empty() ? api->by_index(static_cast<unsigned>(index), &dev)
                                       : api->by_bus_id(pci_bus_id.c_str(), &dev);
  if (rc != kNvmlSuccess)
    return Status::Unavailable(fmt::format("NVML has no device {}: {}",
                                           pci_bus_id.empty() ? std::to_string(index) : pci_bus_id, api->error(rc)));
  std::unique_ptr<GpuMonitor> m(new GpuMonitor());
  m->api_ = std::move(api);
  m->device_ = dev;
  m->bus_id_ = pci_bus_id.empty() ? std::to_string(index) : pci_bus_id;
  return m;
}

GpuMonitor::~GpuMonitor() { stop(); }

void GpuMonitor::sample(Registry& r) {
  const NvmlApi& a = *api_;
  const Labels gpu{{"gpu", bus_id_}};
  nvmlUtilization_t u{};
  if (a.utilization(device_, &u) == kNvmlSuccess) {
    r.gauge("tessera_gpu_utilization_ratio", "Share of the last sample period a kernel ran on the GPU (NVML)", gpu)
        .set(u.gpu / 100.0);
    last_util_.store(u.gpu / 100.0, std::memory_order_relaxed);
  }
  nvmlMemory_t m{};
  if (a.memory(device_, &m) == kNvmlSuccess) {
    r.gauge("tessera_gpu_memory_used_bytes", "GPU memory in use, all processes (NVML)", gpu).set(double(m.used));
    r.gauge("tessera_gpu_memory_total_bytes", "GPU memory (NVML)", gpu).set(double(m.total));
  }
  for (int dir : {kPcieTxBytes, kPcieRxBytes}) {
    unsigned int kb_s = 0;
    if (a.pcie(device_, dir, &kb_s) == kNvmlSuccess)
      r.gauge("tessera_gpu_pcie_bytes_per_second", "PCIe throughput of the GPU, tx: device to host (NVML)",
              Labels::merge(gpu, {{"direction", dir == kPcieTxBytes ? "tx" : "rx"}}))
          .set(kb_s * 1024.0);
  }
  unsigned int mw = 0;
  if (a.power(device_, &mw) == kNvmlSuccess)
    r.gauge("tessera_gpu_power_watts", "Board power draw of the GPU (NVML)", gpu).set(mw / 1000.0);
  unsigned int celsius = 0;
  if (a.temperature(device_, kTemperatureGpu, &celsius) == kNvmlSuccess)
    r.gauge("tessera_gpu_temperature_celsius", "GPU core temperature (NVML)", gpu).set(celsius);
}

void GpuMonitor::start(Registry& registry, std::chrono::milliseconds period) {
  sample(registry);
  thread_ = std::thread([this, &registry, period] {
    std::unique_lock<std::mutex> lock(mu_);
    while (!cv_.wait_for(lock, period, [this] { return stop_; })) {
      lock.unlock();
      sample(registry);
      lock.lock();
    }
  });
}

void GpuMonitor::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

}  // namespace tessera::obs
