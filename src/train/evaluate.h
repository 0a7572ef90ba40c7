// Mean cross-entropy of a model over a token stream, batched as llm.c's
// loader does: batch k reads tokens [k*B*T, k*B*T + B*T + 1), inputs are the
// first B*T as (B,T), targets the same shifted by one. One implementation
// for `tessera eval` (evaluate), the trainer and the elastic worker
// (val_loss: the batches dealt round-robin to the ranks, the sums
// all-reduced).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>

#include "comm/communicator.h"
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

// One batch: checks it (a token outside the vocabulary is the caller's
// InvalidArgument) and runs it forward, setting *loss to its mean loss.
using EvalBatchFn = std::function<Status(const int* inputs, const int* targets, float* loss)>;

struct ValLossOptions {
  int B = 1, T = 1;
  int64_t max_batches = 0;  // <= 0: every full batch
  int part = 0, parts = 1;  // this rank takes batches part, part + parts, ...
  bool counts = true;       // whether this rank's losses are summed (a pipeline's reporting rank)
  std::string source;       // names the stream in errors ("data/val.bin"); may be empty
};

// The batches of `tokens` this rank's part holds, run through `batch`; with
// `world`, the sums all-reduced over it (collective: every rank calls it
// with the same stream and options), so every rank gets the same mean.
// Errors: the stream is shorter than one batch (InvalidArgument naming the
// source), whatever `batch` returns, the all-reduce's error.
Result<EvalResult> val_loss(std::span<const uint32_t> tokens, const ValLossOptions& o, const EvalBatchFn& batch,
                            comm::Communicator* world);

}  // namespace tessera
