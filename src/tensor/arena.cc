#include "tensor/arena.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "runtime/cuda_device.h"
#include "tensor/device_memory.h"

namespace tessera {

void Arena::FreeDeleter::operator()(char* p) const {
  if (device == Device::kCPU) {
    std::free(p);
    return;
  }
  // Freeing after the device died has nothing left to release; say so and go on.
  Status st = cuda::device_free(p);
  if (!st.ok()) std::fprintf(stderr, "tessera: warning: freeing a device arena: %s\n", st.message().c_str());
}

int Arena::reserve(std::string name, DType dtype, Shape shape) {
  CHECK(!allocated());
  size_t offset = (bytes_ + kAlign - 1) / kAlign * kAlign;
  entries_.push_back({std::move(name), dtype, shape, offset});
  bytes_ = offset + static_cast<size_t>(shape.numel()) * dtype_size(dtype);
  return static_cast<int>(entries_.size()) - 1;
}

void Arena::set_device(Device d) {
  CHECK(!allocated());
  device_ = d;
}

size_t Arena::allocated_bytes() const { return (bytes_ + kAlign - 1) / kAlign * kAlign + kSlack; }

void Arena::allocate() {
  CHECK(!allocated());
  const size_t total = allocated_bytes();
  char* p = nullptr;
  if (device_ == Device::kCPU) {
    p = static_cast<char*>(std::aligned_alloc(kAlign, total));
  } else {
    // cudaMalloc aligns to at least 256 bytes.
    Result<void*> d = cuda::device_malloc(total);
    if (!d.ok()) {
      std::fprintf(stderr, "tessera: cannot allocate a %.1f MB device arena: %s\n", total / 1e6,
                   d.status().message().c_str());
      std::abort();
    }
    p = static_cast<char*>(*d);
  }
  CHECK(p != nullptr);
  base_ = std::unique_ptr<char, FreeDeleter>(p, FreeDeleter{device_});
  zero();
}

Tensor Arena::tensor(int i) const {
  CHECK(allocated() && i >= 0 && i < count());
  const Entry& e = entries_[i];
  return Tensor{base_.get() + e.offset, e.dtype, e.shape, device_};
}

Arena Arena::clone_layout(Device d) const {
  Arena a;
  a.entries_ = entries_;
  a.bytes_ = bytes_;
  a.device_ = d;
  a.allocate();
  return a;
}

void Arena::copy_from(const Arena& src) {
  CHECK(allocated() && src.allocated() && src.bytes_ == bytes_);
  const size_t n = allocated_bytes();
  if (device_ == Device::kCPU) {
    copy_to_host(src.device_, base_.get(), src.base_.get(), n);
  } else if (src.device_ == Device::kCPU) {
    copy_to_device(device_, base_.get(), src.base_.get(), n);
  } else {
    copy_on_device(device_, base_.get(), src.base_.get(), n);
  }
}

void Arena::zero() {
  // Parallel first touch would matter on multi-socket machines; one memset is
  // enough here and runs once per allocation or step.
  if (base_) zero_on_device(device_, base_.get(), bytes_ + kSlack);
}

}  // namespace tessera
