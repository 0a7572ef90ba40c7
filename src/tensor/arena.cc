#include "tensor/arena.h"

#include <cstdlib>
#include <cstring>

namespace tessera {

void Arena::FreeDeleter::operator()(char* p) const { std::free(p); }

int Arena::reserve(std::string name, DType dtype, Shape shape) {
  CHECK(!allocated());
  size_t offset = (bytes_ + kAlign - 1) / kAlign * kAlign;
  entries_.push_back({std::move(name), dtype, shape, offset});
  bytes_ = offset + static_cast<size_t>(shape.numel()) * dtype_size(dtype);
  return static_cast<int>(entries_.size()) - 1;
}

void Arena::allocate() {
  CHECK(!allocated());
  size_t total = (bytes_ + kAlign - 1) / kAlign * kAlign + kSlack;
  char* p = static_cast<char*>(std::aligned_alloc(kAlign, total));
  CHECK(p != nullptr);
  base_.reset(p);
  zero();
}

Tensor Arena::tensor(int i) const {
  CHECK(allocated() && i >= 0 && i < count());
  const Entry& e = entries_[i];
  return Tensor{base_.get() + e.offset, e.dtype, e.shape, Device::kCPU};
}

Arena Arena::clone_layout() const {
  Arena a;
  a.entries_ = entries_;
  a.bytes_ = bytes_;
  a.allocate();
  return a;
}

void Arena::zero() {
  // Parallel first touch would matter on multi-socket machines; one memset is
  // enough here and runs once per allocation or step.
  if (base_) std::memset(base_.get(), 0, bytes_ + kSlack);
}

}  // namespace tessera
