// The sparse table optimizers (optim/sparse.h) against dense plain loops over
// every row of the table, with zero gradients in the untouched rows (which
// the dense rules leave unchanged): several steps with different row sets.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "optim/sparse.h"

namespace tessera {
namespace {

struct Step {
  std::vector<int> rows;
  std::vector<float> grads;  // (U,D)
  std::vector<float> dense;  // (E,D), zeros off rows
};

Step make_step(int E, int D, int U, std::mt19937& rng) {
  Step s;
  std::vector<int> all(E);
  for (int i = 0; i < E; i++) all[i] = i;
  std::shuffle(all.begin(), all.end(), rng);
  s.rows.assign(all.begin(), all.begin() + U);
  std::normal_distribution<float> dist;
  s.grads.resize(static_cast<size_t>(U) * D);
  for (float& g : s.grads) g = dist(rng);
  s.dense.assign(static_cast<size_t>(E) * D, 0.0f);
  for (int u = 0; u < U; u++)
    for (int d = 0; d < D; d++) s.dense[static_cast<size_t>(s.rows[u]) * D + d] = s.grads[static_cast<size_t>(u) * D + d];
  return s;
}

TEST(SparseOptim, RowwiseAdagradMatchesDenseLoops) {
  std::mt19937 rng(1);
  const int E = 53, D = 7;
  std::normal_distribution<float> dist;
  std::vector<float> w(static_cast<size_t>(E) * D);
  for (float& x : w) x = dist(rng);
  std::vector<float> w_dense = w, state(E, 0.0f), state_dense(E, 0.0f);
  const RowwiseAdagradParams hp{0.05f, 1e-8f};
  for (int t = 0; t < 5; t++) {
    const Step s = make_step(E, D, 1 + t * 9, rng);
    rowwise_adagrad_update(w.data(), state.data(), s.rows.data(), s.grads.data(), static_cast<int>(s.rows.size()),
                           D, hp);
    for (int r = 0; r < E; r++) {  // dense, double accumulation
      double sq = 0;
      for (int d = 0; d < D; d++) sq += static_cast<double>(s.dense[r * D + d]) * s.dense[r * D + d];
      state_dense[r] += static_cast<float>(sq / D);
      const double mult = hp.lr / (std::sqrt(static_cast<double>(state_dense[r])) + hp.eps);
      for (int d = 0; d < D; d++) w_dense[r * D + d] -= static_cast<float>(mult * s.dense[r * D + d]);
    }
  }
  for (int r = 0; r < E; r++) {
    ASSERT_NEAR(state[r], state_dense[r], 1e-5f * std::max(1.0f, state_dense[r])) << "row " << r;
    for (int d = 0; d < D; d++) ASSERT_NEAR(w[r * D + d], w_dense[r * D + d], 1e-5f) << r << "," << d;
  }
}

TEST(SparseOptim, UntouchedRowsAndStateAreNotWritten) {
  const int E = 4, D = 3;
  std::vector<float> w(E * D, 1.0f), state(E, 0.5f);
  const std::vector<int> rows = {2};
  const std::vector<float> g = {1, 2, 3};
  rowwise_adagrad_update(w.data(), state.data(), rows.data(), g.data(), 1, D, {0.1f, 1e-8f});
  for (int r : {0, 1, 3}) {
    EXPECT_EQ(state[r], 0.5f);
    for (int d = 0; d < D; d++) EXPECT_EQ(w[r * D + d], 1.0f);
  }
  EXPECT_FLOAT_EQ(state[2], 0.5f + 14.0f / 3.0f);
  EXPECT_NEAR(w[2 * D + 0], 1.0f - 0.1f / std::sqrt(state[2]), 1e-6f);
}

TEST(SparseOptim, SgdMatchesDenseLoops) {
  std::mt19937 rng(2);
  const int E = 31, D = 5;
  std::vector<float> w(static_cast<size_t>(E) * D, 0.25f), w_dense = w;
  for (int t = 0; t < 3; t++) {
    const Step s = make_step(E, D, 3 + 4 * t, rng);
    sparse_sgd_update(w.data(), s.rows.data(), s.grads.data(), static_cast<int>(s.rows.size()), D, 0.1f);
    for (size_t i = 0; i < w_dense.size(); i++) w_dense[i] -= 0.1f * s.dense[i];
  }
  for (size_t i = 0; i < w.size(); i++) ASSERT_FLOAT_EQ(w[i], w_dense[i]) << i;
}

}  // namespace
}  // namespace tessera
