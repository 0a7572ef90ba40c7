// The vocabulary-parallel pieces of tensor parallelism (Megatron-LM): each of
// tp ranks holds rows [v0, v0 + Vl) of the (padded) token embedding, which is
// also the output layer. The embedding's output and the cross-entropy's
// statistics are combined across ranks by the caller's all-reduces (GPT);
// these are the local loops around them. valid = the rank's columns that are
// real tokens (the rest is vocabulary padding). Plain loops over rows,
// threaded with OpenMP; outputs first, '=' writes, '+=' accumulates.
#pragma once

#include <cstdint>

namespace tessera {

// out (B,T,C) = this rank's wte row of each token (0 if another rank holds
// it) + wpe[t] when wpe is given (one rank passes it). The sum over ranks is
// the embedding, bit for bit.
void vocab_parallel_encoder_forward(float* out, const int* inp, const float* wte, int v0, int Vl, const float* wpe,
                                    int B, int T, int C);
// dwte (Vl,C) += dout rows of the tokens this rank holds; dwpe (T,C) += dout
// summed over the batch.
void vocab_parallel_encoder_backward(float* dwte, float* dwpe, const float* dout, const int* inp, int v0, int Vl,
                                     int B, int T, int C);

// row_max (N) = max of logits (N,Vl) over the first `valid` columns
// (-inf if none).
void vocab_parallel_ce_max(float* row_max, const float* logits, int N, int Vl, int valid);
// With the global row_max: sums (2,N) = [sum of exp(logit - max) over this
// rank's valid columns; target's logit - max if this rank holds it, else 0],
// probs (N,Vl) = exp(logit - max) (0 in padding columns), local_targets (N) =
// target - v0 or -1.
void vocab_parallel_ce_exp(float* sums, float* probs, int* local_targets, const float* logits, const int* targets,
                           const float* row_max, int N, int Vl, int valid, int v0);
// With the global sums: losses (N) = log(sum) - (target logit - max),
// probs /= sum.
void vocab_parallel_ce_finish(float* losses, float* probs, const float* row_max, const float* sums, int N, int Vl,
                              int valid);

}  // namespace tessera
