#include "tensor/device_memory.h"

#include "runtime/cuda_device.h"

namespace tessera {

namespace device_memory_detail {

Status copy_h2d(void* dst, const void* src, size_t bytes) { return cuda::memcpy_h2d(dst, src, bytes); }
Status copy_d2h(void* dst, const void* src, size_t bytes) { return cuda::memcpy_d2h(dst, src, bytes); }
Status copy_d2d(void* dst, const void* src, size_t bytes) { return cuda::memcpy_d2d(dst, src, bytes); }
Status zero(void* p, size_t bytes) { return cuda::memset_zero(p, bytes); }

}  // namespace device_memory_detail

Status synchronize(Device d) { return d == Device::kCPU ? Status::OK() : cuda::synchronize(); }

}  // namespace tessera
