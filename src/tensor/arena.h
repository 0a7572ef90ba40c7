// Arena: one 64-byte-aligned allocation carved into tensors. Parameters,
// gradients, optimizer state and activations each live in one arena, so that
// a whole group can be zeroed, copied, checksummed or reduced as one flat
// buffer. Not thread-safe while being laid out; read-only use afterwards is.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

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
  // Allocates and zero-fills the memory; views are valid from now on.
  void allocate();

  bool allocated() const { return base_ != nullptr; }
  size_t bytes() const { return bytes_; }
  char* base() const { return base_.get(); }
  int count() const { return static_cast<int>(entries_.size()); }
  Tensor tensor(int i) const;
  const std::string& name(int i) const { return entries_[i].name; }
  size_t offset(int i) const { return entries_[i].offset; }
  // Sets every byte to zero.
  void zero();
  // A new, allocated, zeroed arena with the same tensors at the same offsets
  // (gradients and optimizer moments mirror the parameters this way).
  Arena clone_layout() const;

 private:
  struct Entry {
    std::string name;
    DType dtype;
    Shape shape;
    size_t offset;
  };
  struct FreeDeleter {
    void operator()(char* p) const;
  };
  std::vector<Entry> entries_;
  size_t bytes_ = 0;
  std::unique_ptr<char, FreeDeleter> base_;
};

}  // namespace tessera
