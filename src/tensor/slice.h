// TensorSlice: where a rank's local tensor sits inside the global tensor of
// the whole model, so parallel layouts, checkpoints and exports speak of the
// same thing.
//
// The global tensor (canonical shape `global`, row-major) is viewed in a
// shape `view` with the same element count in which the local block is
// rectangular; e.g. a tensor-parallel rank's QKV weight (L, 3C, C) is the
// block [l0, l1) x [0, 3) x [r*C/tp, (r+1)*C/tp) x [0, C) of the view
// (L, 3, C, C). The local tensor stores the block contiguously, row-major.
// A view is chosen per tensor kind, independent of the layout, so blocks of
// two layouts can be intersected in the same coordinates.
//
// A piece may cover only a flat sub-range [flat_begin, flat_end) of its
// block's row-major order (ZeRO-1 shards the optimizer state by flat ranges
// of the rank's arena); flat_end < 0 means the whole block.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace tessera {

struct TensorSlice {
  Shape global;                // canonical shape of the whole tensor
  Shape view;                  // same numel; the block is rectangular in it
  std::vector<int64_t> begin;  // per view dimension
  std::vector<int64_t> size;   // per view dimension
  int64_t flat_begin = 0;
  int64_t flat_end = -1;  // < 0: the whole block

  int64_t block_numel() const {
    int64_t n = 1;
    for (int64_t s : size) n *= s;
    return n;
  }
  int64_t numel() const { return (flat_end < 0 ? block_numel() : flat_end) - flat_begin; }
  // The whole of a tensor of shape s (view == global, one block).
  static TensorSlice whole(const Shape& s) {
    TensorSlice t;
    t.global = s;
    t.view = s;
    for (int i = 0; i < s.rank; i++) {
      t.begin.push_back(0);
      t.size.push_back(s[i]);
    }
    return t;
  }
};

// Copies the block (all of it; flat ranges are ignored) between a full
// global tensor and a contiguous local buffer.
void gather_block(const float* global, const TensorSlice& s, float* local);   // local = global[block]
void scatter_block(const float* local, const TensorSlice& s, float* global);  // global[block] = local

}  // namespace tessera
