// Arena: one 64-byte-aligned allocation carved into tensors. Parameters,
// gradients, optimizer state and activations each live in one arena, so that
// a whole group can be zeroed, copied, checksummed or reduced as one flat
// buffer. Not thread-safe while being laid out; read-only use afterwards is.
//
// An arena lives on one device (set_device() before try_allocate(); the CPU
// by default). A CUDA arena's memory comes from the device API
// (runtime/cuda_device.h) on the device current at try_allocate(); its
// tensors carry Device::kCUDA and their pointers must never be dereferenced
// on the host (move bytes with tensor/device_memory.h or try_copy_from()).
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "tensor/tensor.h"

namespace tessera {

class Arena {
 public:
  static constexpr size_t kAlign = 64;
  // Zeroed bytes past bytes(), so flat collectives over a whole arena (ZeRO's
  // reduce-scatter and all-gather) can pad its float count to a multiple of
  // the rank count, for up to 1024 ranks, without a copy.
  static constexpr size_t kSlack = 4096;

  Arena() = default;
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;
  Arena(Arena&&) = default;
  Arena& operator=(Arena&&) = default;

  // Two-phase use: reserve() every tensor, then allocate() once. Offsets are
  // rounded up to kAlign so each tensor starts on a cache line.
  // Returns the index of the reserved tensor.
  int reserve(std::string name, DType dtype, Shape shape);
  // Allocates zeroed memory (on the CPU, anonymous pages: resident once
  // written); views are valid from now on. Out of
  // memory (ResourceExhausted), a device that fails or a CUDA arena in a
  // build without CUDA (Unavailable) is an error naming the size and the
  // device; the arena stays unallocated.
  Status try_allocate();
  // Where try_allocate() puts the memory; only before it.
  void set_device(Device d);
  Device device() const { return device_; }

  bool allocated() const { return base_ != nullptr; }
  size_t bytes() const { return bytes_; }
  char* base() const { return base_.get(); }
  int count() const { return static_cast<int>(entries_.size()); }
  Tensor tensor(int i) const;
  const std::string& name(int i) const { return entries_[i].name; }
  size_t offset(int i) const { return entries_[i].offset; }
  // Sets every byte to zero; a device failure is returned.
  Status try_zero();
  // A new, allocated, zeroed arena with the same tensors at the same offsets,
  // on device d (a host staging copy of a CUDA arena, ...); try_allocate()'s
  // errors.
  Result<Arena> try_clone_layout(Device d) const;
  // Copies every byte (tensors, gaps and slack) of src, which has this
  // arena's layout, from whichever device it is on to this arena's; a
  // failed device copy is returned.
  Status try_copy_from(const Arena& src);

 private:
  struct Entry {
    std::string name;
    DType dtype;
    Shape shape;
    size_t offset;
  };
  struct FreeDeleter {
    FreeDeleter() : device(Device::kCPU), bytes(0) {}  // user-provided: no NSDMI inside the enclosing class
    FreeDeleter(Device d, size_t n) : device(d), bytes(n) {}
    Device device;
    size_t bytes;  // a host arena's mapping
    void operator()(char* p) const;
  };
  size_t allocated_bytes() const;  // bytes_ rounded up, plus kSlack
  std::vector<Entry> entries_;
  size_t bytes_ = 0;
  Device device_ = Device::kCPU;
  std::unique_ptr<char, FreeDeleter> base_;
};

}  // namespace tessera
