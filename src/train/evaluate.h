// Mean cross-entropy of a model over a token stream, batched as llm.c's
// loader does: batch k reads tokens [k*B*T, k*B*T + B*T + 1), inputs are the
// first B*T as (B,T), targets the same shifted by one.
#pragma once

#include <cstdint>
#include <span>

#include "core/status.h"
#include "nn/gpt.h"

namespace tessera {

struct EvalResult {
  double loss = 0.0;   // mean over batches of the batch's mean loss
  int64_t tokens = 0;  // tokens scored (batches * B * T)
  int batches = 0;
};

// max_batches <= 0: every full batch. Errors: the stream is shorter than one
// batch, or a token is outside the model's vocabulary.
Result<EvalResult> evaluate(GPT& model, std::span<const uint32_t> tokens, int B, int T, int max_batches);

}  // namespace tessera
