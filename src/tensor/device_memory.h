// Host <-> arena memory for either device: the few places where host code
// moves bytes into or out of tensors (token ids in, losses and logits out,
// zeroing scratch) call these instead of memcpy/memset. On Device::kCPU they
// ARE memcpy/memset (inline, no extra copy); on Device::kCUDA they are
// blocking CUDA runtime calls on the current device, queued after the
// kernels already launched. A CUDA failure (a dead device, no CUDA in this
// build, a host pointer passed as a device one) is returned as a Status.
#pragma once

#include <cstddef>
#include <cstring>

#include "core/status.h"
#include "tensor/dtype.h"

namespace tessera {

namespace device_memory_detail {
Status copy_h2d(void* dst, const void* src, size_t bytes);
Status copy_d2h(void* dst, const void* src, size_t bytes);
Status copy_d2d(void* dst, const void* src, size_t bytes);
Status zero(void* p, size_t bytes);
}  // namespace device_memory_detail

// dst on `d`, src on the host.
inline Status try_copy_to_device(Device d, void* dst, const void* src, size_t bytes) {
  if (d == Device::kCPU) {
    std::memcpy(dst, src, bytes);
    return Status::OK();
  }
  return device_memory_detail::copy_h2d(dst, src, bytes);
}

// dst on the host, src on `d`.
inline Status try_copy_to_host(Device d, void* dst, const void* src, size_t bytes) {
  if (d == Device::kCPU) {
    std::memcpy(dst, src, bytes);
    return Status::OK();
  }
  return device_memory_detail::copy_d2h(dst, src, bytes);
}

// Both on `d`.
inline Status try_copy_on_device(Device d, void* dst, const void* src, size_t bytes) {
  if (d == Device::kCPU) {
    std::memcpy(dst, src, bytes);
    return Status::OK();
  }
  return device_memory_detail::copy_d2d(dst, src, bytes);
}

inline Status try_zero_on_device(Device d, void* p, size_t bytes) {
  if (d == Device::kCPU) {
    std::memset(p, 0, bytes);
    return Status::OK();
  }
  return device_memory_detail::zero(p, bytes);
}

// Waits for the work queued on `d` (nothing to wait for on the CPU); the
// first asynchronous kernel error, if any.
Status synchronize(Device d);

}  // namespace tessera
