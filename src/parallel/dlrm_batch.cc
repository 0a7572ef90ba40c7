#include "parallel/dlrm_batch.h"

#include <cmath>
#include <random>

namespace tessera {

DlrmBatch DlrmBatchData::view() const {
  DlrmBatch b;
  b.B = B;
  b.dense = dense.data();
  b.labels = labels.data();
  for (size_t t = 0; t < ids.size(); t++) {
    b.ids.push_back(ids[t].data());
    b.offsets.push_back(offsets[t].data());
  }
  return b;
}

DlrmBatchData synthetic_dlrm_batch(const DlrmConfig& config, int B, int bag, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  std::uniform_int_distribution<int> bag_size(0, 2 * bag);
  DlrmBatchData d;
  d.B = B;
  d.dense.resize(static_cast<size_t>(B) * config.num_dense);
  for (float& x : d.dense) x = normal(rng);
  d.labels.resize(B);
  for (int b = 0; b < B; b++) {
    const double p = 1.0 / (1.0 + std::exp(-2.0 * d.dense[static_cast<size_t>(b) * config.num_dense]));
    d.labels[b] = unit(rng) < p ? 1.0f : 0.0f;
  }
  for (int E : config.table_rows) {
    std::vector<int> ids, offsets = {0};
    for (int b = 0; b < B; b++) {
      const int n = bag_size(rng);
      for (int i = 0; i < n; i++) {
        const double u = unit(rng);
        ids.push_back(std::min(E - 1, static_cast<int>(E * u * u * u)));
      }
      offsets.push_back(static_cast<int>(ids.size()));
    }
    d.ids.push_back(std::move(ids));
    d.offsets.push_back(std::move(offsets));
  }
  return d;
}

}  // namespace tessera
