#include "train/evaluate.h"

#include <vector>

#include <fmt/format.h>

namespace tessera {

Result<EvalResult> evaluate(GPT& model, std::span<const uint32_t> tokens, int B, int T, int max_batches) {
  if (B <= 0 || T <= 0) return Status::InvalidArgument(fmt::format("batch {} and seq {} must be positive", B, T));
  if (T > model.config().context)
    return Status::InvalidArgument(
        fmt::format("--seq {} exceeds the model's context {}", T, model.config().context));
  const int64_t BT = int64_t{B} * T;
  const int64_t n = static_cast<int64_t>(tokens.size());
  int64_t available = n > 0 ? (n - 1) / BT : 0;
  if (available == 0)
    return Status::InvalidArgument(
        fmt::format("{} tokens are fewer than one batch needs ({} = B*T+1)", n, BT + 1));
  int batches = static_cast<int>(max_batches > 0 ? std::min<int64_t>(available, max_batches) : available);
  std::vector<int> inputs(BT), targets(BT);
  EvalResult r;
  double sum = 0.0;
  for (int k = 0; k < batches; k++) {
    const uint32_t* base = tokens.data() + k * BT;
    for (int64_t i = 0; i < BT; i++) {
      inputs[i] = base[i];
      targets[i] = base[i + 1];
    }
    RETURN_IF_ERROR(model.check_batch(inputs.data(), targets.data(), B, T));
    ASSIGN_OR_RETURN(float loss, model.try_forward(inputs.data(), targets.data(), B, T));
    sum += loss;
  }
  r.batches = batches;
  r.tokens = batches * BT;
  r.loss = sum / batches;
  return r;
}

}  // namespace tessera
