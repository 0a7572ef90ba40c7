#include "tensor/device_memory.h"

#include <cstdio>
#include <cstdlib>

#include "runtime/cuda_device.h"

namespace tessera {

namespace device_memory_detail {

namespace {
void must(const Status& st) {
  if (st.ok()) return;
  std::fprintf(stderr, "tessera: CUDA error: %s\n", st.message().c_str());
  std::abort();
}
}  // namespace

void copy_h2d(void* dst, const void* src, size_t bytes) { must(cuda::memcpy_h2d(dst, src, bytes)); }
void copy_d2h(void* dst, const void* src, size_t bytes) { must(cuda::memcpy_d2h(dst, src, bytes)); }
void copy_d2d(void* dst, const void* src, size_t bytes) { must(cuda::memcpy_d2d(dst, src, bytes)); }
void zero(void* p, size_t bytes) { must(cuda::memset_zero(p, bytes)); }

}  // namespace device_memory_detail

Status synchronize(Device d) { return d == Device::kCPU ? Status::OK() : cuda::synchronize(); }

}  // namespace tessera
