#include "kernels/cpu/matmul_peak.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <random>
#include <vector>

#include "kernels/cpu/ops.h"

namespace tessera::cpu {

double measure_matmul_gflops(int n, MatmulPrecision prec, int iters) {
  std::vector<float> a(int64_t{n} * n), b(int64_t{n} * n), c(int64_t{n} * n);
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (float& x : a) x = u(rng);
  for (float& x : b) x = u(rng);
  matmul_forward(c.data(), a.data(), b.data(), nullptr, n, n, n, prec);
  double best = 0.0;
  for (int i = 0; i < iters; i++) {
    auto t0 = std::chrono::steady_clock::now();
    matmul_forward(c.data(), a.data(), b.data(), nullptr, n, n, n, prec);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, 2.0 * n * n * n / s / 1e9);
  }
  return best;
}

}  // namespace tessera::cpu
