// Synthetic DLRM batches for tests and benchmarks (`tessera bench
// dlrm-parallel`): a batch that owns its storage, drawn from a seed, with
// multi-hot bags (empty ones included), duplicate ids and a skew towards
// low row ids (hot rows), as click logs have.
#pragma once

#include <cstdint>
#include <vector>

#include "nn/dlrm.h"

namespace tessera {

struct DlrmBatchData {
  int B = 0;
  std::vector<float> dense;                 // (B, Nd)
  std::vector<float> labels;                // (B), 0 or 1
  std::vector<std::vector<int>> ids;        // per table (L_t)
  std::vector<std::vector<int>> offsets;    // per table (B+1)
  // A view into this object (valid while it lives and is not resized).
  DlrmBatch view() const;
};

// B samples for `config`: dense N(0,1); each bag's size uniform in
// [0, 2*bag] (mean `bag`); ids floor(E u^3), u ~ U(0,1); labels Bernoulli of
// a fixed logistic function of the first dense feature, so there is
// something to learn. Same seed, same batch.
DlrmBatchData synthetic_dlrm_batch(const DlrmConfig& config, int B, int bag, uint64_t seed);

}  // namespace tessera
