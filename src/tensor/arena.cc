#include "tensor/arena.h"

#include <cstdio>
#include <cerrno>
#include <cstring>

#include <sys/mman.h>

#include <fmt/format.h>

#include "core/huge_pages.h"
#include "runtime/cuda_device.h"
#include "tensor/device_memory.h"

namespace tessera {

namespace {
// Arenas from this size up are advised into huge pages.
constexpr size_t kHugeArenaBytes = size_t{8} << 20;
}  // namespace

void Arena::FreeDeleter::operator()(char* p) const {
  if (device == Device::kCPU) {
    if (munmap(p, bytes) != 0)
      std::fprintf(stderr, "tessera: warning: unmapping a host arena: %s\n", std::strerror(errno));
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

Status Arena::try_allocate() {
  CHECK(!allocated());
  const size_t total = allocated_bytes();
  if (device_ == Device::kCPU) {
    // Anonymous pages: zero, page-aligned, and resident only once written,
    // so a loader that leaves a tensor unwritten (the INT8 tier's fp32
    // embeddings, kept quantized) never holds its pages.
    void* m = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED)
      return Status::ResourceExhausted(fmt::format("cannot allocate a {:.1f} MB host arena: {}", total / 1e6,
                                                   errno == ENOMEM ? "out of memory" : std::strerror(errno)));
    // Large arenas in 2 MiB pages as they are first written (core/huge_pages.h:
    // the weights, the KV cache, activations are streamed whole). A page
    // never written stays unbacked, as with 4 KiB pages; advice only, so a
    // kernel that refuses it leaves them as they were.
    if (total >= kHugeArenaBytes && huge_pages_wanted()) madvise(m, total, MADV_HUGEPAGE);
    base_ = std::unique_ptr<char, FreeDeleter>(static_cast<char*>(m), FreeDeleter{device_, total});
    return Status::OK();
  }
  // cudaMalloc aligns to at least 256 bytes.
  Result<void*> d = cuda::device_malloc(total);
  if (!d.ok()) return d.status().With(fmt::format("cannot allocate a {:.1f} MB device arena", total / 1e6));
  base_ = std::unique_ptr<char, FreeDeleter>(static_cast<char*>(*d), FreeDeleter{device_, total});
  Status st = try_zero();
  if (!st.ok()) base_.reset();
  return st;
}

Tensor Arena::tensor(int i) const {
  CHECK(allocated() && i >= 0 && i < count());
  const Entry& e = entries_[i];
  return Tensor{base_.get() + e.offset, e.dtype, e.shape, device_};
}

Result<Arena> Arena::try_clone_layout(Device d) const {
  Arena a;
  a.entries_ = entries_;
  a.bytes_ = bytes_;
  a.device_ = d;
  RETURN_IF_ERROR(a.try_allocate());
  return a;
}

Status Arena::try_copy_from(const Arena& src) {
  CHECK(allocated() && src.allocated() && src.bytes_ == bytes_);
  const size_t n = allocated_bytes();
  if (device_ == Device::kCPU) return try_copy_to_host(src.device_, base_.get(), src.base_.get(), n);
  if (src.device_ == Device::kCPU) return try_copy_to_device(device_, base_.get(), src.base_.get(), n);
  return try_copy_on_device(device_, base_.get(), src.base_.get(), n);
}

Status Arena::try_zero() {
  // Parallel first touch would matter on multi-socket machines; one memset is
  // enough here and runs once per allocation or step.
  return base_ ? try_zero_on_device(device_, base_.get(), bytes_ + kSlack) : Status::OK();
}

}  // namespace tessera
