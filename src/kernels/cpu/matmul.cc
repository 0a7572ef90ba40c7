// Matmul through oneDNN matmul primitives.
//
// Three products per linear layer, weight W (OC,C) row-major as in llm.c:
//   forward       out (N,OC)   = inp (N,C) @ W^T + bias
//   backward data dinp (N,C)  += dout (N,OC) @ W
//   backward wts  dW (OC,C)   += dout^T (OC,N) @ inp (N,C)
// Transposes are expressed as memory layouts (format tag "ba"), never copied
// in fp32. '+=' is oneDNN's sum post-op. In bf16 mode the inputs are first
// rounded into bf16 scratch (dout^T is written transposed there, since the
// bf16 kernels want a plain A), and accumulation stays fp32.
//
// The row count N (B*T tokens) is the only dimension that changes between
// calls on one weight: it is the primitive's M in the first two products and
// its K in the third. Which primitive a call runs is a pure function of its
// shape (never of what ran before), so results are reproducible across
// processes (bit-exact resume):
//   - N a multiple of kExactRowQuantum, or 2 <= N <= kExactRowQuantum: a
//     primitive compiled for exactly that shape (oneDNN 2.6 picks its brgemm
//     kernels, "brg:avx512_core*"). The small counts are the serving
//     engine's decode steps (one row per running sequence): at 32 rows the
//     exact primitives make a GPT-2 124M decode step 1.7x faster than the
//     run-time one (docs/performance.md); one row stays run-time (gemv-like,
//     faster than brgemm at M=1);
//   - any other N: one primitive per weight shape compiled with a run-time
//     row count (DNNL_RUNTIME_DIM_VAL), which oneDNN 2.6 serves only with its
//     gemm kernels ("gemm:jit"), measured up to ~30% slower on the LM head's
//     shapes (docs/performance.md), so training keeps exact shapes.
// Training's B*T is a multiple of the quantum in every config we run; a
// serving loop compiles at most 63 small row counts per weight shape (decode
// steps) and shares the run-time primitive (at most 3 per weight shape and
// precision) for prefill steps of other sizes. The cache's LRU bound holds
// every small count of a model's five forward shapes.
//
// Thread safety and bounds. Compiled primitives live in one process-wide
// LRU cache (a mutex around lookup and compile) of at most kMaxPrimitives.
// A oneDNN primitive may be executed from several threads at once only with
// a scratchpad per execution: Debian's oneDNN is built without
// DNNL_ENABLE_CONCURRENT_EXEC, so its library-managed scratchpad is shared
// and a primitive run from two threads at once computes garbage (seen in
// matmul_threads_test). So primitives use scratchpad_mode::user, and each
// thread owns its scratchpad buffer, its stream and a bounded LRU of
// bindings (a shared_ptr to the primitive plus memory objects for exactly
// one shape) that it re-points with set_data_handle. The hot path touches
// only thread-local state: no lock, and no allocation once a thread has seen
// its shapes (the per-call argument array lives on the stack and execution
// goes through the C API). OpenMP: each calling thread runs the primitive on
// its own OpenMP team, so N threads use N x OMP_NUM_THREADS cores.
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

#include <oneapi/dnnl/dnnl.hpp>

#include "core/check.h"
#include "core/cpu_features.h"
#include "kernels/cpu/convert.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/ops.h"

namespace tessera::cpu {

namespace {

std::atomic<bool> g_verbose_matmul{false};

using dnnl::memory;
using tag = memory::format_tag;
using dt = memory::data_type;

// Row counts that are a multiple of this, or from 2 to it, get an
// exact-shape primitive.
constexpr int64_t kExactRowQuantum = 64;
// Bound on the process-wide cache of compiled primitives: every small row
// count (63) of a GPT's 5 forward weight shapes, and training's shapes.
constexpr size_t kMaxPrimitives = 400;
// Bound on each thread's bindings (one per exact shape it ran recently).
constexpr size_t kMaxBindingsPerThread = 400;
constexpr int64_t kRuntime = DNNL_RUNTIME_DIM_VAL;

enum class Product { kForward, kBackwardData, kBackwardWeights };

struct Key {
  Product product;
  MatmulPrecision prec;
  bool bias;
  int64_t M, K, N;  // dst (M,N) = src (M,K) @ wei (K,N); the row dim may be kRuntime
  auto tie() const { return std::tie(product, prec, bias, M, K, N); }
  bool operator<(const Key& o) const { return tie() < o.tie(); }
  bool operator==(const Key& o) const { return tie() == o.tie(); }
};

bool exact_rows(int64_t rows) { return rows % kExactRowQuantum == 0 || (rows >= 2 && rows <= kExactRowQuantum); }

// The key of the primitive that serves an exact shape: the shape itself, or
// the shape with its row dimension made run-time.
Key primitive_key(Key k) {
  const int64_t rows = k.product == Product::kBackwardWeights ? k.K : k.M;
  if (exact_rows(rows)) return k;
  (k.product == Product::kBackwardWeights ? k.K : k.M) = kRuntime;
  return k;
}

dnnl::engine& engine() {
  static dnnl::engine* e = new dnnl::engine(dnnl::engine::kind::cpu, 0);  // never destroyed: used until exit
  return *e;
}

// The layout of one operand as seen by oneDNN: logical (rows, cols),
// row-major ("ab") or stored transposed ("ba"). Either may be kRuntime.
memory::desc md(int64_t rows, int64_t cols, dt type, bool transposed) {
  return memory::desc({rows, cols}, type, transposed ? tag::ba : tag::ab);
}

struct Descs {
  memory::desc src, wei, bias, dst;
};

Descs descs(const Key& k) {
  const dt in_type = k.prec == MatmulPrecision::kBF16 ? dt::bf16 : dt::f32;
  Descs d;
  switch (k.product) {
    case Product::kForward:  // inp (N,C) @ W^T: W stored (OC,C) -> (C,OC) "ba"
      d.src = md(k.M, k.K, in_type, false);
      d.wei = md(k.K, k.N, in_type, true);
      break;
    case Product::kBackwardData:  // dout (N,OC) @ W (OC,C)
      d.src = md(k.M, k.K, in_type, false);
      d.wei = md(k.K, k.N, in_type, false);
      break;
    case Product::kBackwardWeights:  // dout^T (OC,N) @ inp (N,C)
      // fp32 reads dout (N,OC) as transposed in place; bf16 gets dout^T
      // written plainly into scratch by the caller.
      d.src = md(k.M, k.K, in_type, k.prec == MatmulPrecision::kF32);
      d.wei = md(k.K, k.N, in_type, false);
      break;
  }
  d.dst = md(k.M, k.N, dt::f32, false);
  if (k.bias) d.bias = md(1, k.N, dt::f32, false);
  return d;
}

// A compiled primitive and the scratchpad one execution of it needs.
struct Compiled {
  dnnl::matmul prim;
  memory::desc scratchpad;
};

Compiled compile(const Key& k) {
  const Descs d = descs(k);
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (k.product != Product::kForward) {
    dnnl::post_ops po;
    po.append_sum(1.0f);
    attr.set_post_ops(po);
  }
  dnnl::matmul::desc desc = k.bias ? dnnl::matmul::desc(d.src, d.wei, d.bias, d.dst)
                                   : dnnl::matmul::desc(d.src, d.wei, d.dst);
  dnnl::matmul::primitive_desc pd(desc, attr, engine());
  if (g_verbose_matmul.load(std::memory_order_relaxed))
    std::fprintf(stderr, "matmul %d prec=%d M=%ld K=%ld N=%ld: %s\n", static_cast<int>(k.product),
                 static_cast<int>(k.prec), static_cast<long>(k.M), static_cast<long>(k.K), static_cast<long>(k.N),
                 pd.impl_info_str());
  return Compiled{dnnl::matmul(pd), pd.scratchpad_desc()};
}

// Process-wide cache of compiled primitives, least recently used dropped
// beyond kMaxPrimitives. Values are immutable once built; a shared_ptr keeps
// one alive for threads still bound to it after it is dropped here.
class PrimitiveCache {
 public:
  std::shared_ptr<const Compiled> get(const Key& k) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = map_.find(k);
    if (it == map_.end()) {
      if (map_.size() >= kMaxPrimitives) {
        auto victim = map_.begin();
        for (auto j = map_.begin(); j != map_.end(); ++j)
          if (j->second.last_use < victim->second.last_use) victim = j;
        map_.erase(victim);
      }
      // Compiled under the lock: compiles are rare (~0.3 ms) and a second
      // thread wanting the same shape waits instead of compiling it twice.
      it = map_.emplace(k, Slot{std::make_shared<const Compiled>(compile(k)), 0}).first;
      ++compiled_;
    }
    it->second.last_use = ++clock_;
    return it->second.prim;
  }
  size_t size() {
    std::lock_guard<std::mutex> lock(mu_);
    return map_.size();
  }
  uint64_t compiled() {
    std::lock_guard<std::mutex> lock(mu_);
    return compiled_;
  }

 private:
  struct Slot {
    std::shared_ptr<const Compiled> prim;
    uint64_t last_use;
  };
  std::mutex mu_;
  uint64_t clock_ = 0;        // guarded by mu_
  uint64_t compiled_ = 0;     // guarded by mu_
  std::map<Key, Slot> map_;   // guarded by mu_
};

PrimitiveCache& primitive_cache() {
  static PrimitiveCache* cache = new PrimitiveCache();  // never destroyed: threads may outlive statics
  return *cache;
}

// One thread's view of one exact shape: the primitive serving it and memory
// objects of exactly that shape, re-pointed at each call's buffers.
struct Binding {
  Key key;
  std::shared_ptr<const Compiled> prim;
  memory src, wei, bias, dst, scratchpad;  // scratchpad: empty when the primitive needs none
  uint64_t last_use = 0;
};

// Everything a thread mutates: its stream, bindings and bf16 scratch.
struct ThreadState {
  dnnl::stream stream{engine()};
  std::vector<Binding> bindings;  // at most kMaxBindingsPerThread; searched linearly
  uint64_t clock = 0;
  std::vector<bf16> a, b;  // bf16 scratch for the two inputs; grows to the largest layer
  // oneDNN scratchpad of every primitive this thread runs, one at a time;
  // grown (64-byte aligned) only when a binding is made.
  std::unique_ptr<std::byte[], decltype(&std::free)> scratchpad{nullptr, &std::free};
  size_t scratchpad_bytes = 0;
};

ThreadState& thread_state() {
  thread_local ThreadState s;
  return s;
}

Binding& binding(ThreadState& ts, const Key& k) {
  ++ts.clock;
  for (Binding& b : ts.bindings)
    if (b.key == k) {
      b.last_use = ts.clock;
      return b;
    }
  // Compile (which may throw) before touching the bindings.
  std::shared_ptr<const Compiled> prim = primitive_cache().get(primitive_key(k));
  Binding* slot;
  if (ts.bindings.size() < kMaxBindingsPerThread) {
    slot = &ts.bindings.emplace_back();
  } else {
    slot = &ts.bindings.front();
    for (Binding& b : ts.bindings)
      if (b.last_use < slot->last_use) slot = &b;
  }
  const Descs d = descs(k);
  slot->key = k;
  slot->prim = std::move(prim);
  slot->src = memory(d.src, engine(), DNNL_MEMORY_NONE);
  slot->wei = memory(d.wei, engine(), DNNL_MEMORY_NONE);
  slot->dst = memory(d.dst, engine(), DNNL_MEMORY_NONE);
  slot->bias = k.bias ? memory(d.bias, engine(), DNNL_MEMORY_NONE) : memory();
  const size_t scratch_bytes = slot->prim->scratchpad.get_size();
  slot->scratchpad = scratch_bytes ? memory(slot->prim->scratchpad, engine(), DNNL_MEMORY_NONE) : memory();
  if (scratch_bytes > ts.scratchpad_bytes) {
    const size_t bytes = (scratch_bytes + 63) / 64 * 64;
    ts.scratchpad.reset(static_cast<std::byte*>(std::aligned_alloc(64, bytes)));
    CHECK(ts.scratchpad != nullptr);
    ts.scratchpad_bytes = bytes;
  }
  slot->last_use = ts.clock;
  return *slot;
}

void run(ThreadState& ts, const Key& k, const void* src, const void* wei, const float* bias, float* dst) {
  Binding& b = binding(ts, k);
  b.src.set_data_handle(const_cast<void*>(src));
  b.wei.set_data_handle(const_cast<void*>(wei));
  b.dst.set_data_handle(dst);
  dnnl_exec_arg_t args[5] = {{DNNL_ARG_SRC, b.src.get()},
                             {DNNL_ARG_WEIGHTS, b.wei.get()},
                             {DNNL_ARG_DST, b.dst.get()},
                             {0, nullptr},
                             {0, nullptr}};
  int nargs = 3;
  if (bias) {
    b.bias.set_data_handle(const_cast<float*>(bias));
    args[nargs++] = {DNNL_ARG_BIAS, b.bias.get()};
  }
  if (b.scratchpad) {
    b.scratchpad.set_data_handle(ts.scratchpad.get());  // the buffer may have grown since the binding was made
    args[nargs++] = {DNNL_ARG_SCRATCHPAD, b.scratchpad.get()};
  }
  dnnl_status_t st = dnnl_primitive_execute(b.prim->prim.get(), ts.stream.get(), nargs, args);
  CHECK(st == dnnl_success);
  // The CPU stream is in-order and the primitive runs on the calling thread's
  // OpenMP pool, so it has finished when execute returns.
}

// bf16 matmuls need AVX512-BF16 or AMX; elsewhere fall back to fp32, once loudly.
MatmulPrecision effective(MatmulPrecision prec) {
  if (prec == MatmulPrecision::kF32 || cpu_features().has_bf16_matmul()) return prec;
  static std::once_flag warned;
  std::call_once(warned, [] {
    std::fprintf(stderr, "tessera: this CPU has neither AVX512-BF16 nor AMX; bf16 matmuls run in fp32\n");
  });
  return MatmulPrecision::kF32;
}

}  // namespace

size_t matmul_cache_size() { return primitive_cache().size(); }
size_t matmul_cache_capacity() { return kMaxPrimitives; }
uint64_t matmul_primitives_compiled() { return primitive_cache().compiled(); }
bool matmul_rows_get_exact_primitive(int64_t rows) { return exact_rows(rows); }

void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N, int C, int OC,
                    MatmulPrecision prec) {
  if (N == 0 || OC == 0) return;
  prec = effective(prec);
  ThreadState& ts = thread_state();
  const Key k{Product::kForward, prec, bias != nullptr, N, C, OC};
  if (prec == MatmulPrecision::kF32) {
    run(ts, k, inp, weight, bias, out);
    return;
  }
  const bf16* a = to_bf16(inp, static_cast<int64_t>(N) * C, ts.a);
  const bf16* b = to_bf16(weight, static_cast<int64_t>(OC) * C, ts.b);
  run(ts, k, a, b, bias, out);
}

void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int N, int C, int OC, MatmulPrecision prec) {
  if (N == 0) return;
  prec = effective(prec);
  if (dbias) bias_backward(dbias, dout, N, OC);
  if (C == 0 || OC == 0) return;
  ThreadState& ts = thread_state();
  if (dinp) {
    const Key k{Product::kBackwardData, prec, false, N, OC, C};
    if (prec == MatmulPrecision::kF32) {
      run(ts, k, dout, weight, nullptr, dinp);
    } else {
      const bf16* a = to_bf16(dout, static_cast<int64_t>(N) * OC, ts.a);
      const bf16* b = to_bf16(weight, static_cast<int64_t>(OC) * C, ts.b);
      run(ts, k, a, b, nullptr, dinp);
    }
  }
  const Key k{Product::kBackwardWeights, prec, false, OC, N, C};
  if (prec == MatmulPrecision::kF32) {
    run(ts, k, dout, inp, nullptr, dweight);
  } else {
    const bf16* a = to_bf16_transposed(dout, N, OC, ts.a);
    const bf16* b = to_bf16(inp, static_cast<int64_t>(N) * C, ts.b);
    run(ts, k, a, b, nullptr, dweight);
  }
}

// Exactly the two ops the model used to call, so the CPU model is unchanged.
void matmul_gelu_forward(float* pre, float* out, const float* inp, const float* weight, const float* bias, int N,
                         int C, int OC, MatmulPrecision prec) {
  matmul_forward(pre, inp, weight, bias, N, C, OC, prec);
  gelu_forward(out, pre, static_cast<int64_t>(N) * OC);
}

void set_verbose_matmul(bool on) { g_verbose_matmul.store(on, std::memory_order_relaxed); }

}  // namespace tessera::cpu
