// Per-op wall time, for `tessera bench train`'s breakdown. A GPT built with
// profiling on calls its kernels through timed thunks (nn/ops_table.h) that
// add each call's duration here. Off by default; not thread-safe (the model
// calls kernels from one thread).
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

namespace tessera {

enum class OpKind { kMatmul, kAttention, kLayernorm, kElementwise, kCrossEntropy, kEncoder, kAdamW, kCount };

std::string_view op_kind_name(OpKind k);

struct OpTimes {
  std::array<double, static_cast<int>(OpKind::kCount)> seconds{};
  void reset() { seconds.fill(0.0); }
  double total() const {
    double s = 0;
    for (double x : seconds) s += x;
    return s;
  }
};

OpTimes& op_times();

}  // namespace tessera
