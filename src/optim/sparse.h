// Optimizers for embedding tables, applied only to the rows a batch touched
// (the sparse gradient of kernels' embedding_bag_backward: U distinct row ids
// and their (U,D) gradient rows). Untouched rows and their state are not read
// or written, so a step costs O(U*D), not O(E*D).
//
// Preconditions (the caller's, as with the kernels): rows distinct and in
// [0, E) of a table (E,D). Threaded over rows; no allocation.
#pragma once

#include <cstdint>

#include "kernels/precision.h"  // RowwiseAdagradParams

namespace tessera {

// Row-wise Adagrad, as FBGEMM's EXACT_ROWWISE_ADAGRAD and TorchRec use it:
// one accumulator per row (state (E)), not per element. For each touched
// row r with gradient g (D):
//   state[r] += mean_d(g[d]^2);   w[r] -= lr * g / (sqrt(state[r]) + eps).
// RowwiseAdagradParams (lr, eps) is in kernels/precision.h, shared with the
// CUDA kernels of these updates (kernels/cuda/ops.h).
void rowwise_adagrad_update(float* table, float* state, const int* rows, const float* grads, int U, int D,
                            const RowwiseAdagradParams& hp);

// Plain SGD on the touched rows: w[r] -= lr * g.
void sparse_sgd_update(float* table, const int* rows, const float* grads, int U, int D, float lr);

}  // namespace tessera
