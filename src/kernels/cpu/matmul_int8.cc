// The INT8 matmul (ops.inc) through oneDNN: s8 activations x s8 weights ->
// s32, the kernels oneDNN picks for the CPU at run time (AVX512-VNNI or
// AMX-INT8 where present, plain AVX2/AVX-512 otherwise: `tessera info`
// prints the ISA), then dequantized here. Activations are quantized per row
// exactly as kernels/ref does it, so the int32 products are the oracle's.
//
// Primitives are compiled per exact shape and kept per thread (with the
// thread's scratchpad), so concurrent calls share no oneDNN state; each
// thread keeps at most kMaxPerThread shapes.
#include <algorithm>
#include <cmath>
#include <map>
#include <tuple>
#include <vector>

#include <oneapi/dnnl/dnnl.hpp>

#include "kernels/cpu/ops.h"

namespace tessera::cpu {

namespace {

using dnnl::memory;

constexpr size_t kMaxPerThread = 128;

dnnl::engine& int8_engine() {
  static dnnl::engine* e = new dnnl::engine(dnnl::engine::kind::cpu, 0);  // never destroyed
  return *e;
}

struct Int8Matmul {
  dnnl::matmul prim;
  memory::desc src, wei, dst, scratchpad;
};

Int8Matmul compile_int8(int64_t N, int64_t C, int64_t OC) {
  Int8Matmul m;
  m.src = memory::desc({N, C}, memory::data_type::s8, memory::format_tag::ab);
  m.wei = memory::desc({C, OC}, memory::data_type::s8, memory::format_tag::ba);  // wq stored (OC,C)
  m.dst = memory::desc({N, OC}, memory::data_type::s32, memory::format_tag::ab);
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(m.src, m.wei, m.dst), attr, int8_engine());
  m.prim = dnnl::matmul(pd);
  m.scratchpad = pd.scratchpad_desc();
  return m;
}

struct ThreadState {
  std::map<std::tuple<int, int, int>, Int8Matmul> prims;
  std::vector<int8_t> xq;
  std::vector<float> xs;
  std::vector<int32_t> acc;
  std::vector<uint8_t> scratch;
  dnnl::stream stream{int8_engine()};
};

ThreadState& state() {
  thread_local ThreadState s;
  return s;
}

// As kernels/ref: scale max|x|/127 (1 for zeros), codes round(x/scale).
float quantize_row(int8_t* q, const float* x, int n) {
  float amax = 0.0f;
  for (int i = 0; i < n; i++) amax = std::max(amax, std::fabs(x[i]));
  const float scale = amax > 0.0f ? amax / 127.0f : 1.0f;
  for (int i = 0; i < n; i++) q[i] = static_cast<int8_t>(std::clamp(std::round(x[i] / scale), -127.0f, 127.0f));
  return scale;
}

}  // namespace

void quantize_weights_int8(int8_t* wq, float* wscale, const float* weight, int OC, int C) {
#pragma omp parallel for schedule(static)
  for (int o = 0; o < OC; o++)
    wscale[o] = quantize_row(wq + static_cast<int64_t>(o) * C, weight + static_cast<int64_t>(o) * C, C);
}

void matmul_int8_forward(float* out, const float* inp, const int8_t* wq, const float* wscale, const float* bias,
                         int N, int C, int OC) {
  ThreadState& st = state();
  st.xq.resize(static_cast<size_t>(N) * C);
  st.xs.resize(N);
  st.acc.resize(static_cast<size_t>(N) * OC);
  int8_t* xq = st.xq.data();
  float* xs = st.xs.data();
#pragma omp parallel for schedule(static) if (N > 1)
  for (int i = 0; i < N; i++) xs[i] = quantize_row(xq + static_cast<int64_t>(i) * C, inp + static_cast<int64_t>(i) * C, C);

  const auto key = std::make_tuple(N, C, OC);
  auto it = st.prims.find(key);
  if (it == st.prims.end()) {
    if (st.prims.size() >= kMaxPerThread) st.prims.clear();
    it = st.prims.emplace(key, compile_int8(N, C, OC)).first;
  }
  const Int8Matmul& m = it->second;
  st.scratch.resize(std::max<size_t>(1, m.scratchpad.get_size()));
  memory src(m.src, int8_engine(), xq);
  memory wei(m.wei, int8_engine(), const_cast<int8_t*>(wq));
  memory dst(m.dst, int8_engine(), st.acc.data());
  memory scratch(m.scratchpad, int8_engine(), st.scratch.data());
  m.prim.execute(st.stream, {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wei}, {DNNL_ARG_DST, dst},
                             {DNNL_ARG_SCRATCHPAD, scratch}});
  st.stream.wait();

  // Dequantize, threaded over every output (a decode step has one row).
  const int32_t* acc = st.acc.data();
  const int64_t total = int64_t{N} * OC;
#pragma omp parallel for schedule(static) if (total > 4096)
  for (int64_t k = 0; k < total; k++) {
    const int64_t i = k / OC, o = k % OC;
    out[k] = static_cast<float>(acc[k]) * xs[i] * wscale[o] + (bias ? bias[o] : 0.0f);
  }
}

}  // namespace tessera::cpu
