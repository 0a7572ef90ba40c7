// Helpers shared by the C++ tests.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace tessera::testing_util {

// max |ours - ref| / max(1, max |ref|): the error measure of every numeric
// comparison against an oracle (ggml's test-backend-ops uses the same idea).
inline double normalised_error(const float* ours, const float* ref, int64_t n) {
  double max_diff = 0.0, max_ref = 1.0;
  for (int64_t i = 0; i < n; i++) {
    max_diff = std::max(max_diff, std::fabs(static_cast<double>(ours[i]) - ref[i]));
    max_ref = std::max(max_ref, std::fabs(static_cast<double>(ref[i])));
  }
  return max_diff / max_ref;
}

}  // namespace tessera::testing_util
