// Tensor: a non-owning view (pointer, dtype, shape, device) of row-major data.
// Memory is owned by an Arena (arena.h); a view never frees anything and must
// not outlive its arena.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "core/check.h"
#include "tensor/dtype.h"

namespace tessera {

struct Shape {
  static constexpr int kMaxDims = 6;
  std::array<int64_t, kMaxDims> dims{};
  int rank = 0;

  Shape() = default;
  Shape(std::initializer_list<int64_t> d) {
    CHECK(d.size() <= kMaxDims);
    for (int64_t x : d) dims[rank++] = x;
  }
  int64_t operator[](int i) const { return dims[i]; }
  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < rank; ++i) n *= dims[i];
    return n;
  }
  bool operator==(const Shape& o) const {
    if (rank != o.rank) return false;
    for (int i = 0; i < rank; ++i)
      if (dims[i] != o.dims[i]) return false;
    return true;
  }
  std::string str() const;  // "(3, 4)"
};

struct Tensor {
  void* data = nullptr;
  DType dtype = DType::kF32;
  Shape shape;
  Device device = Device::kCPU;

  int64_t numel() const { return shape.numel(); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
  float* f32() const {
    CHECK(dtype == DType::kF32);
    return static_cast<float*>(data);
  }
};

inline std::string Shape::str() const {
  std::string s = "(";
  for (int i = 0; i < rank; ++i) {
    if (i) s += ", ";
    s += std::to_string(dims[i]);
  }
  return s + ")";
}

}  // namespace tessera
