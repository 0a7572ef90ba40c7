// Matmul through oneDNN matmul primitives, cached by shape.
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
// No allocation in the steady state: primitives and their memory objects are
// built once per shape and re-pointed with set_data_handle; execution goes
// through the C API with a stack argument array; scratch only grows.
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

#include <oneapi/dnnl/dnnl.hpp>

#include "core/check.h"
#include "core/cpu_features.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/convert.h"

namespace tessera::cpu {

namespace {

using dnnl::memory;
using tag = memory::format_tag;
using dt = memory::data_type;

enum class Product { kForward, kBackwardData, kBackwardWeights };

struct Key {
  Product product;
  MatmulPrecision prec;
  bool bias;
  int64_t M, K, N;  // dst (M,N) = src (M,K) @ wei (K,N)
  auto tie() const { return std::tie(product, prec, bias, M, K, N); }
  bool operator<(const Key& o) const { return tie() < o.tie(); }
};

struct Entry {
  dnnl::matmul prim;
  memory src, wei, bias, dst;
};

struct Context {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  std::mutex mu;
  std::map<Key, std::unique_ptr<Entry>> cache;
};

Context& context() {
  static Context* ctx = new Context();  // never destroyed: used until exit
  return *ctx;
}

// The layout of one operand as seen by oneDNN: logical (rows, cols),
// row-major ("ab") or stored transposed ("ba").
memory::desc md(int64_t rows, int64_t cols, dt type, bool transposed) {
  return memory::desc({rows, cols}, type, transposed ? tag::ba : tag::ab);
}

Entry* get_entry(const Key& k) {
  Context& ctx = context();
  std::lock_guard<std::mutex> lock(ctx.mu);
  auto it = ctx.cache.find(k);
  if (it != ctx.cache.end()) return it->second.get();

  const dt in_type = k.prec == MatmulPrecision::kBF16 ? dt::bf16 : dt::f32;
  memory::desc src_md, wei_md;
  switch (k.product) {
    case Product::kForward:  // inp (N,C) @ W^T: W stored (OC,C) -> (C,OC) "ba"
      src_md = md(k.M, k.K, in_type, false);
      wei_md = md(k.K, k.N, in_type, true);
      break;
    case Product::kBackwardData:  // dout (N,OC) @ W (OC,C)
      src_md = md(k.M, k.K, in_type, false);
      wei_md = md(k.K, k.N, in_type, false);
      break;
    case Product::kBackwardWeights:  // dout^T (OC,N) @ inp (N,C)
      // fp32 reads dout (N,OC) as transposed in place; bf16 gets dout^T
      // written plainly into scratch by the caller.
      src_md = md(k.M, k.K, in_type, k.prec == MatmulPrecision::kF32);
      wei_md = md(k.K, k.N, in_type, false);
      break;
  }
  memory::desc dst_md = md(k.M, k.N, dt::f32, false);
  memory::desc bias_md = k.bias ? md(1, k.N, dt::f32, false) : memory::desc();

  dnnl::primitive_attr attr;
  if (k.product != Product::kForward) {
    dnnl::post_ops po;
    po.append_sum(1.0f);
    attr.set_post_ops(po);
  }
  dnnl::matmul::desc desc = k.bias ? dnnl::matmul::desc(src_md, wei_md, bias_md, dst_md)
                                   : dnnl::matmul::desc(src_md, wei_md, dst_md);
  dnnl::matmul::primitive_desc pd(desc, attr, ctx.engine);

  auto e = std::make_unique<Entry>();
  e->prim = dnnl::matmul(pd);
  e->src = memory(src_md, ctx.engine, DNNL_MEMORY_NONE);
  e->wei = memory(wei_md, ctx.engine, DNNL_MEMORY_NONE);
  e->dst = memory(dst_md, ctx.engine, DNNL_MEMORY_NONE);
  if (k.bias) e->bias = memory(bias_md, ctx.engine, DNNL_MEMORY_NONE);
  if (std::getenv("TESSERA_VERBOSE_MATMUL"))
    std::fprintf(stderr, "matmul %d prec=%d M=%ld K=%ld N=%ld: %s\n", static_cast<int>(k.product),
                 static_cast<int>(k.prec), static_cast<long>(k.M), static_cast<long>(k.K), static_cast<long>(k.N),
                 pd.impl_info_str());
  Entry* raw = e.get();
  ctx.cache.emplace(k, std::move(e));
  return raw;
}

void run(Entry* e, const void* src, const void* wei, const float* bias, float* dst) {
  e->src.set_data_handle(const_cast<void*>(src));
  e->wei.set_data_handle(const_cast<void*>(wei));
  e->dst.set_data_handle(dst);
  dnnl_exec_arg_t args[4] = {
      {DNNL_ARG_SRC, e->src.get()}, {DNNL_ARG_WEIGHTS, e->wei.get()}, {DNNL_ARG_DST, e->dst.get()}, {0, nullptr}};
  int nargs = 3;
  if (bias) {
    e->bias.set_data_handle(const_cast<float*>(bias));
    args[nargs++] = {DNNL_ARG_BIAS, e->bias.get()};
  }
  dnnl_status_t st = dnnl_primitive_execute(e->prim.get(), context().stream.get(), nargs, args);
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

// Per-thread bf16 scratch for the two inputs; grows to the largest layer.
struct Scratch {
  std::vector<bf16> a, b;
};
Scratch& scratch() {
  thread_local Scratch s;
  return s;
}

}  // namespace

void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N, int C, int OC,
                    MatmulPrecision prec) {
  if (N == 0 || OC == 0) return;
  prec = effective(prec);
  Entry* e = get_entry({Product::kForward, prec, bias != nullptr, N, C, OC});
  if (prec == MatmulPrecision::kF32) {
    run(e, inp, weight, bias, out);
    return;
  }
  Scratch& s = scratch();
  const bf16* a = to_bf16(inp, static_cast<int64_t>(N) * C, s.a);
  const bf16* b = to_bf16(weight, static_cast<int64_t>(OC) * C, s.b);
  run(e, a, b, bias, out);
}

void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int N, int C, int OC, MatmulPrecision prec) {
  if (N == 0) return;
  prec = effective(prec);
  if (dbias) bias_backward(dbias, dout, N, OC);
  if (C == 0 || OC == 0) return;
  Scratch& s = scratch();
  if (dinp) {
    Entry* e = get_entry({Product::kBackwardData, prec, false, N, OC, C});
    if (prec == MatmulPrecision::kF32) {
      run(e, dout, weight, nullptr, dinp);
    } else {
      const bf16* a = to_bf16(dout, static_cast<int64_t>(N) * OC, s.a);
      const bf16* b = to_bf16(weight, static_cast<int64_t>(OC) * C, s.b);
      run(e, a, b, nullptr, dinp);
    }
  }
  Entry* e = get_entry({Product::kBackwardWeights, prec, false, OC, N, C});
  if (prec == MatmulPrecision::kF32) {
    run(e, dout, inp, nullptr, dweight);
  } else {
    const bf16* a = to_bf16_transposed(dout, N, OC, s.a);
    const bf16* b = to_bf16(inp, static_cast<int64_t>(N) * C, s.b);
    run(e, a, b, nullptr, dweight);
  }
}

// Exactly the two ops the model used to call, so the CPU model is unchanged.
void matmul_gelu_forward(float* pre, float* out, const float* inp, const float* weight, const float* bias, int N,
                         int C, int OC, MatmulPrecision prec) {
  matmul_forward(pre, inp, weight, bias, N, C, OC, prec);
  gelu_forward(out, pre, static_cast<int64_t>(N) * OC);
}

}  // namespace tessera::cpu
