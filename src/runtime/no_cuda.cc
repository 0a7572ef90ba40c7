// The device runtime (cuda_device.h) when the CUDA backend is not compiled in
// (TESSERA_CUDA=OFF, or AUTO without a CUDA compiler): no devices, and every
// call that needs one says why. Built into tessera_runtime only in that case.
#include "runtime/cuda_device.h"

namespace tessera::cuda {

namespace {
Status not_compiled() { return Status::Unavailable("CUDA support not compiled in (TESSERA_CUDA=OFF or no nvcc)"); }
}  // namespace

bool compiled() { return false; }
std::string runtime_version() { return ""; }
std::string compiled_architectures() { return ""; }
int device_count() { return 0; }
Result<int> query_device_count() { return not_compiled(); }
Status set_device(int) { return not_compiled(); }
std::string device_summary(int device) { return "device " + std::to_string(device) + ": " + not_compiled().message(); }
Result<std::string> pci_bus_id(int) { return not_compiled(); }
Result<MemoryInfo> memory_info() { return not_compiled(); }
Result<int> select_device(int, size_t) {
  return Status::Unavailable("no CUDA device: " + not_compiled().message());
}
Result<void*> device_malloc(size_t) { return not_compiled(); }
Status device_free(void* ptr) { return ptr == nullptr ? Status::OK() : not_compiled(); }
Status memcpy_h2d(void*, const void*, size_t) { return not_compiled(); }
Status memcpy_d2h(void*, const void*, size_t) { return not_compiled(); }
Status memcpy_d2d(void*, const void*, size_t) { return not_compiled(); }
Status memset_zero(void*, size_t) { return not_compiled(); }
Status synchronize() { return not_compiled(); }

}  // namespace tessera::cuda
