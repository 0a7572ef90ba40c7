// Incremental (inference-only) decoding of a GPT with a key/value cache.
// Dimension letters as in gpt.h: L layers, B batch, n new positions, C
// channels, NH heads (head size hs = C/NH), Vp padded vocabulary, maxT the
// cache's capacity in positions (at most the model's context).
//
// GPT::forward recomputes every position of a sequence; sampling one token
// at a time with it costs O(T) forward passes of growing length. Here each
// layer's keys and values of the positions already processed are kept, so a
// new token costs one row through every matmul plus attention against the
// cached keys. The result equals GPT::forward on the whole sequence up to
// fp32 summation order (matmul row blocking, attention loop vs gemms).
#pragma once

#include "core/status.h"
#include "nn/gpt.h"
#include "tensor/arena.h"

namespace tessera {

// Ownership: a KVCache owns its keys and values, (L, B, maxT, C) each in one
// Arena, and the scratch forward_incremental needs (activations for the new
// rows, per-thread attention scores), which grows with the largest n seen
// and is otherwise reused: one-token steps allocate nothing. It refers to no
// model; it remembers the shape of the one it was made for and
// forward_incremental refuses any other. Not thread-safe: one call at a time.
class KVCache {
 public:
  // B sequences of up to max_T positions each; 1 <= max_T <= model's context
  // (a CHECK: callers size the cache from the model).
  KVCache(const GPT& model, int B, int max_T);
  KVCache(const KVCache&) = delete;
  KVCache& operator=(const KVCache&) = delete;

  // Forgets every cached position (the memory stays allocated).
  void reset() { length_ = 0; }
  int length() const { return length_; }  // positions cached so far, all B sequences alike
  int batch() const { return B_; }
  int max_length() const { return max_T_; }

 private:
  friend Status forward_incremental(const GPT& model, KVCache& cache, const int* tokens, int B, int n,
                                    float* logits);
  // Makes the scratch hold activations for `rows` = B*n rows.
  void reserve_rows(int rows);
  float* keys(int layer) const;    // (B, maxT, C) of that layer
  float* values(int layer) const;  // (B, maxT, C)

  GPTConfig config_;
  int B_ = 0, max_T_ = 0;
  int length_ = 0;
  int threads_ = 1;  // OpenMP threads the attention loop may use; one scores row each
  Arena kv_;         // [0] keys, [1] values: (L, B, maxT, C)
  Arena scratch_;    // see kv_cache.cc
  int scratch_rows_ = 0;
};

// Runs positions [cache.length(), cache.length() + n) of B sequences:
// tokens (B, n) in [0, V); writes logits (B, n, Vp) for those positions
// (columns >= V are padding, 0) and appends their keys and values, so
// cache.length() grows by n. n > 1 prefills a prompt; n == 1 feeds one new
// token. Matmuls run at model.precision() on the fast CPU kernels whatever
// model.backend() is.
// Errors (nothing is cached then): B different from the cache's, n < 1, more
// positions than the cache holds, a token outside the vocabulary, a model of
// another shape than the cache's.
Status forward_incremental(const GPT& model, KVCache& cache, const int* tokens, int B, int n, float* logits);

}  // namespace tessera
