// Resharding: copying between two pieces of one global tensor that were cut
// by different parallel layouts. Both pieces are TensorSlices over the same
// view coordinates: the same view rank, each coordinate meaning the same
// thing; only the view's extents may differ (a padded vocabulary). A piece
// is a rectangular block of the view, optionally only a flat sub-range of
// the block's row-major order (ZeRO-1).
//
// Cost: one pass over the rows (last-dimension runs) of the two blocks'
// intersection; nothing is allocated. Pure functions, thread safe.
#pragma once

#include <cstdint>
#include <span>

#include "tensor/slice.h"

namespace tessera::ckpt {

// Copies every element that `have` (data: have.numel() floats) shares with
// `want` into out (want.numel() floats, indexed like want's stored data) and
// sets covered[k] = 1 for each element k written (covered may be empty).
// Returns the number of elements copied. Both slices must pass check_slice
// and have the same view rank.
int64_t copy_intersection(const TensorSlice& have, std::span<const float> have_data, const TensorSlice& want,
                          std::span<float> out, std::span<uint8_t> covered);

// Sets out[k] = 0 and covered[k] = 1 for each element k of `want` whose view
// coordinates lie outside `extent` in some dimension (extent has want's view
// rank). Returns the number of such elements.
int64_t zero_outside(const Shape& extent, const TensorSlice& want, std::span<float> out, std::span<uint8_t> covered);

// How many elements the stored parts of `have` and `want` share (flat ranges
// included): what copy_intersection would copy. 0 means `have` need not be read.
int64_t intersection_size(const TensorSlice& have, const TensorSlice& want);

}  // namespace tessera::ckpt
