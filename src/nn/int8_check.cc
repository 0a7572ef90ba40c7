#include "nn/int8_check.h"

#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/cpu/int8_kernel.h"
#include "kernels/cpu/ops.h"
#include "kernels/ref/ops.h"

namespace tessera {

Status check_int8_matmul() {
  // C 100: 32-byte steps and a scalar tail; OC 37: every column tile.
  const int C = 100, OC = 37;
  // Rows 1 and 3: the decode kernels; 20: the prefill kernel (oneDNN's,
  // where exact).
  for (int N : {1, 3, 20}) {
    std::vector<float> x(static_cast<size_t>(N) * C), w(static_cast<size_t>(OC) * C), bias(OC);
    uint32_t state = 12345u + static_cast<uint32_t>(N);
    auto next = [&] {  // a small LCG: the check must not depend on a library's generator
      state = state * 1664525u + 1013904223u;
      return static_cast<float>(state >> 8) / static_cast<float>(1u << 24) - 0.5f;
    };
    for (int i = 0; i < N; i++)
      for (int c = 0; c < C; c++) {
        // Even rows: all codes +-127 (the saturating case); odd rows: random.
        const float v = i % 2 == 0 ? (c % 5 == 3 ? -1.0f : 1.0f) : next();
        x[static_cast<size_t>(i) * C + c] = v;
      }
    for (int o = 0; o < OC; o++)
      for (int c = 0; c < C; c++) w[static_cast<size_t>(o) * C + c] = o % 3 == 0 ? (c % 7 == 1 ? -0.5f : 0.5f) : next();
    for (float& b : bias) b = next();
    std::vector<int8_t> wq(w.size());
    std::vector<float> ws(OC), got(static_cast<size_t>(N) * OC), want(got.size());
    ref::quantize_weights_int8(wq.data(), ws.data(), w.data(), OC, C);
    cpu::matmul_int8_forward(got.data(), x.data(), wq.data(), ws.data(), bias.data(), N, C, OC);
    ref::matmul_int8_forward(want.data(), x.data(), wq.data(), ws.data(), bias.data(), N, C, OC);
    int bad = 0;
    double worst = 0.0;
    for (size_t k = 0; k < got.size(); k++) {
      if (got[k] == want[k]) continue;
      bad++;
      const double rel = std::fabs(got[k] - want[k]) / std::max(1e-30, static_cast<double>(std::fabs(want[k])));
      worst = std::isnan(rel) ? INFINITY : std::max(worst, rel);
    }
    if (bad > 0)
      return Status::Internal(fmt::format(
          "the INT8 matmul kernel {} is wrong on this CPU: {} of {} outputs of a {}x{}x{} check differ from the "
          "reference (worst by {:.3g} relative); refusing to run in int8 (use fp32, or the automatic kernel)",
          cpu::int8_kernel_info().summary, bad, got.size(), N, C, OC, worst));
  }
  return Status::OK();
}

}  // namespace tessera
