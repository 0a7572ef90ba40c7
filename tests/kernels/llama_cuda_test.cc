// The Llama family's ops on CUDA (kernels/cuda/llama.cu, the GQA paths of
// paged_attention.cu) against the reference oracle on odd shapes: RMSNorm,
// rotary embedding, SwiGLU, grouped-query attention (forward and backward,
// multi-query included) and the paged GQA cache. Backward cases pre-fill the
// gradients, so a kernel that overwrites instead of accumulating fails.
//
// Compiled into every build; without TESSERA_HAVE_CUDA, or with it and no
// device, every test is skipped with the reason (scripts/gpu-check.sh runs
// them on a GPU: its cuda-tests step).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "runtime/cuda_device.h"
#include "test_util.h"
#ifdef TESSERA_HAVE_CUDA
#include "kernels/cuda/ops.h"
#include "kernels/ref/ops.h"
#endif

namespace tessera {
namespace {

#ifndef TESSERA_HAVE_CUDA

TEST(CudaLlama, SkippedWithoutTheCudaBackend) { GTEST_SKIP() << "the CUDA backend is not compiled into this binary"; }

#else

std::string no_device_reason() {
  const Result<int> n = cuda::query_device_count();
  if (!n.ok()) return n.status().message();
  if (n.value() == 0) return "the driver reports 0 devices";
  const Status st = cuda::set_device(0);
  return st.ok() ? "" : st.message();
}

#define SKIP_WITHOUT_DEVICE()                                          \
  do {                                                                 \
    const std::string reason = no_device_reason();                     \
    if (!reason.empty()) GTEST_SKIP() << "no CUDA device: " << reason; \
  } while (0)

void must(const Status& st) {
  if (!st.ok()) throw std::runtime_error(st.message());
}

template <typename T>
class Dev {
 public:
  explicit Dev(const std::vector<T>& host) : n_(host.size()) {
    Result<void*> p = cuda::device_malloc(std::max<size_t>(n_, 1) * sizeof(T));
    must(p.status());
    ptr_ = static_cast<T*>(*p);
    if (n_ > 0) must(cuda::memcpy_h2d(ptr_, host.data(), n_ * sizeof(T)));
  }
  ~Dev() { (void)cuda::device_free(ptr_); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  T* get() const { return ptr_; }
  std::vector<T> host() const {
    std::vector<T> h(n_);
    must(cuda::synchronize());
    if (n_ > 0) must(cuda::memcpy_d2h(h.data(), ptr_, n_ * sizeof(T)));
    return h;
  }

 private:
  T* ptr_ = nullptr;
  size_t n_;
};

using Vec = std::vector<float>;
using testing_util::uniform;
double err(const Vec& want, const Vec& got) {
  return testing_util::normalised_error(got.data(), want.data(), static_cast<int64_t>(want.size()));
}
constexpr double kTol = 1e-5;

TEST(CudaLlama, RmsNormMatchesRef) {
  SKIP_WITHOUT_DEVICE();
  for (auto [N, C] : {std::pair{1, 1}, std::pair{13, 17}, std::pair{300, 768}}) {
    const Vec x = uniform(N * C, 1, -2, 2), w = uniform(C, 2), dy = uniform(N * C, 3);
    Vec out(N * C), rstd(N), dx = uniform(N * C, 4), dw = uniform(C, 5);
    Dev<float> d_out(out), d_rstd(rstd), d_x(x), d_w(w), d_dy(dy), d_dx(dx), d_dw(dw);
    ref::rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C, 1e-6f);
    ref::rmsnorm_backward(dx.data(), dw.data(), dy.data(), x.data(), w.data(), rstd.data(), N, C);
    cuda::rmsnorm_forward(d_out.get(), d_rstd.get(), d_x.get(), d_w.get(), N, C, 1e-6f);
    cuda::rmsnorm_backward(d_dx.get(), d_dw.get(), d_dy.get(), d_x.get(), d_w.get(), d_rstd.get(), N, C);
    EXPECT_LE(err(out, d_out.host()), kTol);
    EXPECT_LE(err(rstd, d_rstd.host()), kTol);
    EXPECT_LE(err(dx, d_dx.host()), kTol);
    EXPECT_LE(err(dw, d_dw.host()), 1e-4);
  }
}

TEST(CudaLlama, RopeAndSwiGluMatchRef) {
  SKIP_WITHOUT_DEVICE();
  const int N = 37, NH = 8, KV = 2, hs = 64, F = 300;
  const size_t n = static_cast<size_t>(N) * (NH + 2 * KV) * hs;
  Vec x = uniform(n, 6), f(hs / 2);
  for (int i = 0; i < hs / 2; i++) f[i] = static_cast<float>(1.0 / std::pow(500000.0, 2.0 * i / hs));
  std::vector<int> pos(N);
  for (int i = 0; i < N; i++) pos[i] = (i * 211) % 8192;
  Dev<float> d_x(x), d_f(f);
  Dev<int> d_pos(pos);
  Vec want = x;
  ref::rope_forward(want.data(), pos.data(), f.data(), N, NH, KV, hs);
  cuda::rope_forward(d_x.get(), d_pos.get(), d_f.get(), N, NH, KV, hs);
  EXPECT_LE(err(want, d_x.host()), kTol);
  ref::rope_backward(want.data(), pos.data(), f.data(), N, NH, KV, hs);
  cuda::rope_backward(d_x.get(), d_pos.get(), d_f.get(), N, NH, KV, hs);
  EXPECT_LE(err(want, d_x.host()), kTol);

  const Vec g = uniform(static_cast<size_t>(N) * 2 * F, 7, -6, 6), dy = uniform(static_cast<size_t>(N) * F, 8);
  Vec out(static_cast<size_t>(N) * F), dg = uniform(g.size(), 9);
  Dev<float> d_g(g), d_out(out), d_dy(dy), d_dg(dg);
  ref::swiglu_forward(out.data(), g.data(), N, F);
  ref::swiglu_backward(dg.data(), g.data(), dy.data(), N, F);
  cuda::swiglu_forward(d_out.get(), d_g.get(), N, F);
  cuda::swiglu_backward(d_dg.get(), d_g.get(), d_dy.get(), N, F);
  EXPECT_LE(err(out, d_out.host()), kTol);
  EXPECT_LE(err(dg, d_dg.host()), kTol);
}

TEST(CudaLlama, GroupedQueryAttentionMatchesRef) {
  SKIP_WITHOUT_DEVICE();
  struct S { int B, T, NH, KV, hs; };
  for (const S s : {S{1, 1, 1, 1, 1}, S{2, 7, 4, 2, 3}, S{1, 33, 6, 1, 8}, S{2, 70, 8, 2, 64}}) {
    SCOPED_TRACE("T=" + std::to_string(s.T) + " NH=" + std::to_string(s.NH) + " KV=" + std::to_string(s.KV));
    const size_t n_inp = static_cast<size_t>(s.B) * s.T * (s.NH + 2 * s.KV) * s.hs;
    const size_t n_out = static_cast<size_t>(s.B) * s.T * s.NH * s.hs, n_att = static_cast<size_t>(s.B) * s.NH * s.T * s.T;
    const Vec inp = uniform(n_inp, 10, -2, 2), dout = uniform(n_out, 11);
    Vec out(n_out), pre(n_att), att(n_att), dinp = uniform(n_inp, 12), dpre(n_att, 0.0f), datt(n_att, 0.0f);
    Dev<float> d_inp(inp), d_dout(dout), d_out(out), d_pre(pre), d_att(att), d_dinp(dinp), d_dpre(dpre),
        d_datt(datt);
    ref::attention_gqa_forward(out.data(), pre.data(), att.data(), inp.data(), s.B, s.T, s.NH, s.KV, s.hs);
    ref::attention_gqa_backward(dinp.data(), dpre.data(), datt.data(), dout.data(), inp.data(), att.data(), s.B, s.T,
                                s.NH, s.KV, s.hs);
    cuda::attention_gqa_forward(d_out.get(), d_pre.get(), d_att.get(), d_inp.get(), s.B, s.T, s.NH, s.KV, s.hs);
    cuda::attention_gqa_backward(d_dinp.get(), d_dpre.get(), d_datt.get(), d_dout.get(), d_inp.get(), d_att.get(),
                                 s.B, s.T, s.NH, s.KV, s.hs);
    EXPECT_LE(err(out, d_out.host()), kTol);
    EXPECT_LE(err(att, d_att.host()), kTol);
    EXPECT_LE(err(dinp, d_dinp.host()), kTol);
  }
}

TEST(CudaLlama, PagedGqaMatchesRef) {
  SKIP_WITHOUT_DEVICE();
  const int T = 21, NH = 4, KV = 2, hs = 16, bs = 4, blocks = (T + bs - 1) / bs;
  const Vec qkv = uniform(static_cast<size_t>(T) * (NH + 2 * KV) * hs, 13, -2, 2);
  std::vector<int> table(blocks), pos(T), seq(T, 0), slots(T);
  for (int b = 0; b < blocks; b++) table[b] = blocks - 1 - b;
  for (int t = 0; t < T; t++) pos[t] = t, slots[t] = table[t / bs] * bs + t % bs;
  Vec kc(static_cast<size_t>(blocks) * bs * KV * hs), vc(kc.size()), out(static_cast<size_t>(T) * NH * hs);
  Dev<float> d_qkv(qkv), d_kc(kc), d_vc(vc), d_out(out);
  Dev<int> d_table(table), d_pos(pos), d_seq(seq), d_slots(slots);
  ref::kv_cache_write_gqa(kc.data(), vc.data(), qkv.data(), slots.data(), T, NH, KV, hs);
  ref::paged_attention_gqa_forward(out.data(), qkv.data(), kc.data(), vc.data(), table.data(), seq.data(), pos.data(),
                                   T, NH, KV, hs, bs, blocks);
  cuda::kv_cache_write_gqa(d_kc.get(), d_vc.get(), d_qkv.get(), d_slots.get(), T, NH, KV, hs);
  cuda::paged_attention_gqa_forward(d_out.get(), d_qkv.get(), d_kc.get(), d_vc.get(), d_table.get(), d_seq.get(),
                                    d_pos.get(), T, NH, KV, hs, bs, blocks);
  EXPECT_LE(err(kc, d_kc.host()), 0.0);
  EXPECT_LE(err(out, d_out.host()), kTol);
}

#endif

}  // namespace
}  // namespace tessera
