#include "train/evaluate.h"

#include <algorithm>
#include <vector>

#include <fmt/format.h>

namespace tessera {

Result<EvalResult> val_loss(std::span<const uint32_t> tokens, const ValLossOptions& o, const EvalBatchFn& batch,
                            comm::Communicator* world) {
  if (o.B <= 0 || o.T <= 0)
    return Status::InvalidArgument(fmt::format("batch {} and seq {} must be positive", o.B, o.T));
  const int64_t BT = int64_t{o.B} * o.T;
  const int64_t n = static_cast<int64_t>(tokens.size());
  const int64_t available = n > 0 ? (n - 1) / BT : 0;
  if (available == 0)
    return Status::InvalidArgument(fmt::format("{}{} tokens are fewer than one batch needs ({} = B*T+1)",
                                               o.source.empty() ? "" : o.source + ": ", n, BT + 1));
  const int64_t batches = o.max_batches > 0 ? std::min<int64_t>(available, o.max_batches) : available;
  std::vector<int> inputs(BT), targets(BT);
  double sums[2] = {0.0, 0.0};  // loss sum, batches
  for (int64_t k = o.part; k < batches; k += o.parts) {
    const uint32_t* base = tokens.data() + k * BT;
    for (int64_t i = 0; i < BT; i++) {
      inputs[i] = static_cast<int>(base[i]);
      targets[i] = static_cast<int>(base[i + 1]);
    }
    float loss = 0.0f;
    RETURN_IF_ERROR(batch(inputs.data(), targets.data(), &loss));
    if (o.counts) {
      sums[0] += loss;
      sums[1] += 1;
    }
  }
  if (world != nullptr) RETURN_IF_ERROR(world->all_reduce(sums, sums, 2, comm::ElemType::kF64));
  EvalResult r;
  r.batches = static_cast<int>(batches);
  r.tokens = batches * BT;
  r.loss = sums[1] > 0 ? sums[0] / sums[1] : 0.0;
  return r;
}

Result<EvalResult> evaluate(GPT& model, std::span<const uint32_t> tokens, int B, int T, int max_batches) {
  if (B > 0 && T > model.config().context)
    return Status::InvalidArgument(fmt::format("--seq {} exceeds the model's context {}", T, model.config().context));
  ValLossOptions o;
  o.B = B;
  o.T = T;
  o.max_batches = max_batches;
  return val_loss(
      tokens, o,
      [&](const int* inputs, const int* targets, float* loss) -> Status {
        RETURN_IF_ERROR(model.check_batch(inputs, targets, B, T));
        ASSIGN_OR_RETURN(*loss, model.try_forward(inputs, targets, B, T));
        return Status::OK();
      },
      nullptr);
}

}  // namespace tessera
