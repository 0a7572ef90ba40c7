// The aborting conveniences of the tests: src/ has one error form, the
// returning one (create() returning Result, try_ forms and Status;
// docs/architecture.md, "Errors across the layers"). A test that cannot go
// on without a model, a cache or an optimizer calls these instead: the
// value, or "tessera: <message>" on stderr and abort. Never for library or
// tool code, which carries the error up (tools/ reports it in one line).
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <utility>
#include <vector>

#include "core/status.h"
#include "core/try.h"
#include "nn/gpt.h"
#include "nn/kv_cache.h"
#include "optim/host_reduce.h"
#include "optim/optimizer.h"
#include "parallel/gradient_reducer.h"
#include "tensor/arena.h"
#include "tensor/device_memory.h"

namespace tessera::testing_util {

// Nothing, or "tessera: <message>" and abort (value_or_abort's line).
inline void ok_or_die(const Status& st) {
  if (st.ok()) return;
  std::fprintf(stderr, "tessera: %s\n", st.ToString().c_str());
  std::abort();
}

// ---- nn/gpt.h

inline std::unique_ptr<GPT> make_gpt(const GPTConfig& config, Backend backend = Backend::kCPU,
                                     const ModelShard& shard = {}, comm::Communicator* tp_comm = nullptr,
                                     ModelUse use = ModelUse::kTraining) {
  return value_or_abort(GPT::create(config, backend, shard, tp_comm, use));
}
inline float forward_or_die(GPT& m, const int* inputs, const int* targets, int B, int T) {
  return value_or_abort(m.try_forward(inputs, targets, B, T));
}
inline void backward_or_die(GPT& m, float loss_scale = 1.0f) { ok_or_die(m.try_backward(loss_scale)); }
inline const float* logits_or_die(const GPT& m) { return value_or_abort(m.try_logits()); }
inline const float* losses_or_die(const GPT& m) { return value_or_abort(m.try_losses()); }
inline void reserve_activations_or_die(GPT& m, int B, int T, int slots) {
  ok_or_die(m.try_reserve_activations(B, T, slots));
}

// ---- nn/kv_cache.h

inline std::unique_ptr<PagedKVCache> make_kv_cache(const GPT& model, int num_blocks,
                                                   int block_size = PagedKVCache::kDefaultBlockSize,
                                                   int max_seqs = 256) {
  return value_or_abort(PagedKVCache::create(model, num_blocks, block_size, max_seqs));
}

// ---- optim/

inline AdamW make_adamw(ParamSpace space, AdamWKernel kernel) {
  return value_or_abort(AdamW::create(std::move(space), kernel));
}
inline AdamW make_adamw(ParamSpace space, AdamWKernel kernel, int64_t lo, int64_t hi, int64_t capacity) {
  return value_or_abort(AdamW::create(std::move(space), kernel, lo, hi, capacity));
}
inline float step_or_die(AdamW& opt, const OptimizerConfig& c, float lr) { return value_or_abort(opt.try_step(c, lr)); }
inline float global_norm_or_die(Device d, const float* x, int64_t n) { return value_or_abort(try_global_norm(d, x, n)); }
inline HostReduce make_host_reduce(comm::Communicator& comm) { return value_or_abort(HostReduce::create(comm)); }

// ---- parallel/gradient_reducer.h

inline std::unique_ptr<GradientReducer> make_gradient_reducer(comm::Communicator& comm,
                                                              std::vector<std::vector<GradSpan>> ready_groups,
                                                              const GradientReducerOptions& o) {
  return value_or_abort(GradientReducer::create(comm, std::move(ready_groups), o));
}

// ---- tensor/arena.h, tensor/device_memory.h

inline void allocate_or_die(Arena& a) { ok_or_die(a.try_allocate()); }
inline Arena clone_layout_or_die(const Arena& a, Device d) { return value_or_abort(a.try_clone_layout(d)); }
inline void copy_from_or_die(Arena& dst, const Arena& src) { ok_or_die(dst.try_copy_from(src)); }
inline void copy_to_device_or_die(Device d, void* dst, const void* src, size_t bytes) {
  ok_or_die(try_copy_to_device(d, dst, src, bytes));
}
inline void copy_to_host_or_die(Device d, void* dst, const void* src, size_t bytes) {
  ok_or_die(try_copy_to_host(d, dst, src, bytes));
}

}  // namespace tessera::testing_util
