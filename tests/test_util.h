// Helpers shared by the C++ tests.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

namespace tessera::testing_util {

// max |ours - ref| / max(1, max |ref|): the error measure of every numeric
// comparison against an oracle (ggml's test-backend-ops uses the same idea).
// Infinite where one holds a NaN and the other does not (NaN in both agrees).
inline double normalised_error(const float* ours, const float* ref, int64_t n) {
  double max_diff = 0.0, max_ref = 1.0;
  for (int64_t i = 0; i < n; i++) {
    if (std::isnan(ours[i]) && std::isnan(ref[i])) continue;
    const double diff = std::fabs(static_cast<double>(ours[i]) - ref[i]);
    if (std::isnan(diff)) return std::numeric_limits<double>::infinity();
    max_diff = std::max(max_diff, diff);
    max_ref = std::max(max_ref, std::fabs(static_cast<double>(ref[i])));
  }
  return max_diff / max_ref;
}
inline double normalised_error(const std::vector<float>& ours, const std::vector<float>& ref) {
  return normalised_error(ours.data(), ref.data(), static_cast<int64_t>(std::min(ours.size(), ref.size())));
}

// n floats uniform in [lo, hi) from mt19937(seed): the kernels' test inputs.
inline std::vector<float> uniform(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

}  // namespace tessera::testing_util
