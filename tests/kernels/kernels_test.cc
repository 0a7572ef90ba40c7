// Every operator of the fast CPU backend against the reference oracle, in
// the style of ggml's test-backend-ops: one table of (op, shape) cases, each
// run on both backends from the same seeded inputs, outputs compared by
// normalised error
//
//   err = max_i |cpu_i - ref_i| / max(1, max_i |ref_i|).
//
// Shapes are deliberately odd (C = 1, 3, 17, 100; T = 1, 7, 33, 130; V = 1,
// 5, 99) and some are large enough to take the threaded paths. Backward
// kernels get gradient buffers pre-filled with random values, so a kernel
// that overwrites instead of accumulating fails. A future backend (cuda/)
// adds one more Backend row and runs the same table.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "core/cpu_features.h"
#include "kernels/cpu/ops.h"
#include "kernels/ref/ops.h"

namespace tessera {
namespace {

// fp32 ops: the backends differ only in summation order (vectorised and
// per-thread partial sums, gemm blocking), a vectorised exp within 1.5 ulp
// and a Newton sqrt within 3 ulp; measured errors are below 1e-6.
constexpr double kF32Tolerance = 1e-5;
// bf16 matmuls on a CPU with native bf16 (AVX512-BF16 or AMX): both
// backends multiply the same bf16-rounded inputs (ops.inc) and accumulate in
// fp32 (oneDNN) or double (ref), so this is as tight as fp32; measured 3e-7.
constexpr double kBF16Tolerance = 1e-5;
// Without native bf16 the cpu backend runs bf16 matmuls in fp32 (matmul.cc
// says so once), so it differs from the bf16 oracle by the input rounding,
// up to 2^-9 relative per input; measured up to 3e-3 on these shapes.
constexpr double kBF16FallbackTolerance = 1e-2;

// One backend's operator set. Every backend namespace declares the same
// functions (ops.inc), so TESSERA_BACKEND fills a row from a namespace name.
struct Backend {
  const char* name;
  decltype(&ref::encoder_forward) encoder_forward;
  decltype(&ref::encoder_backward) encoder_backward;
  decltype(&ref::layernorm_forward) layernorm_forward;
  decltype(&ref::layernorm_backward) layernorm_backward;
  decltype(&ref::matmul_forward) matmul_forward;
  decltype(&ref::matmul_backward) matmul_backward;
  decltype(&ref::attention_forward) attention_forward;
  decltype(&ref::attention_backward) attention_backward;
  decltype(&ref::gelu_forward) gelu_forward;
  decltype(&ref::gelu_backward) gelu_backward;
  decltype(&ref::matmul_gelu_forward) matmul_gelu_forward;
  decltype(&ref::residual_forward) residual_forward;
  decltype(&ref::residual_backward) residual_backward;
  decltype(&ref::crossentropy_softmax_forward) crossentropy_softmax_forward;
  decltype(&ref::crossentropy_softmax_backward) crossentropy_softmax_backward;
  decltype(&ref::adamw_update) adamw_update;
  decltype(&ref::encoder_forward_positions) encoder_forward_positions;
  decltype(&ref::kv_cache_write) kv_cache_write;
  decltype(&ref::paged_attention_forward) paged_attention_forward;
};

#define TESSERA_BACKEND(ns)                                                                                      \
  Backend {                                                                                                      \
    #ns, ns::encoder_forward, ns::encoder_backward, ns::layernorm_forward, ns::layernorm_backward,               \
        ns::matmul_forward, ns::matmul_backward, ns::attention_forward, ns::attention_backward, ns::gelu_forward, \
        ns::gelu_backward, ns::matmul_gelu_forward, ns::residual_forward, ns::residual_backward,                  \
        ns::crossentropy_softmax_forward, ns::crossentropy_softmax_backward, ns::adamw_update,                    \
        ns::encoder_forward_positions, ns::kv_cache_write, ns::paged_attention_forward                            \
  }

const Backend kRef = TESSERA_BACKEND(ref);
const Backend kCpu = TESSERA_BACKEND(cpu);

using Vec = std::vector<float>;

struct Output {
  std::string name;
  Vec values;
};

// One row of the table. run() builds its inputs from a fixed seed on every
// call, so each backend sees exactly the same numbers.
struct OpCase {
  std::string op;     // "layernorm_backward"
  std::string shape;  // "N=13 C=17"
  double tolerance;
  std::function<std::vector<Output>(const Backend&)> run;
};

// gtest prints a failing parameter with this instead of its bytes.
void PrintTo(const OpCase& c, std::ostream* os) { *os << c.op << " " << c.shape; }

Vec uniform(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  Vec v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

std::vector<int> token_ids(size_t n, int V, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> dist(0, V - 1);
  std::vector<int> ids(n);
  for (int& id : ids) id = dist(rng);
  return ids;
}

// max |got - want| / max(1, max |want|); infinite if either holds a NaN
// where the other does not.
double normalised_error(const Vec& want, const Vec& got) {
  double max_diff = 0.0, max_ref = 0.0;
  for (size_t i = 0; i < want.size(); i++) {
    if (std::isnan(want[i]) && std::isnan(got[i])) continue;
    const double diff = std::fabs(static_cast<double>(got[i]) - want[i]);
    if (std::isnan(diff)) return std::numeric_limits<double>::infinity();
    max_diff = std::max(max_diff, diff);
    max_ref = std::max(max_ref, std::fabs(static_cast<double>(want[i])));
  }
  return max_diff / std::max(1.0, max_ref);
}

// ---- the cases, one function per op family --------------------------------

void add_encoder_cases(std::vector<OpCase>& cases) {
  struct Shape { int B, T, C, V; };
  // V = 1: every position has the same token, the worst case for dwte races.
  for (const Shape s : {Shape{1, 1, 1, 1}, Shape{2, 7, 3, 5}, Shape{3, 33, 17, 99}, Shape{2, 7, 64, 1},
                        Shape{4, 33, 100, 99}, Shape{4, 64, 160, 5}}) {
    const std::string shape = "B=" + std::to_string(s.B) + " T=" + std::to_string(s.T) +
                              " C=" + std::to_string(s.C) + " V=" + std::to_string(s.V);
    const size_t n = static_cast<size_t>(s.B) * s.T;
    const size_t pos_rows = s.T + 3;  // wpe may have more rows than T
    cases.push_back({"encoder_forward", shape, kF32Tolerance, [=](const Backend& be) {
                       const std::vector<int> ids = token_ids(n, s.V, 1);
                       const Vec wte = uniform(static_cast<size_t>(s.V) * s.C, 2);
                       const Vec wpe = uniform(pos_rows * s.C, 3);
                       Vec out = uniform(n * s.C, 4);  // garbage: forward must overwrite
                       be.encoder_forward(out.data(), ids.data(), wte.data(), wpe.data(), s.B, s.T, s.C);
                       return std::vector<Output>{{"out", out}};
                     }});
    cases.push_back({"encoder_backward", shape, kF32Tolerance, [=](const Backend& be) {
                       const std::vector<int> ids = token_ids(n, s.V, 5);
                       const Vec dout = uniform(n * s.C, 6);
                       Vec dwte = uniform(static_cast<size_t>(s.V) * s.C, 7);
                       Vec dwpe = uniform(pos_rows * s.C, 8);
                       be.encoder_backward(dwte.data(), dwpe.data(), dout.data(), ids.data(), s.B, s.T, s.C);
                       return std::vector<Output>{{"dwte", dwte}, {"dwpe", dwpe}};
                     }});
  }
}

void add_layernorm_cases(std::vector<OpCase>& cases) {
  struct Shape { int N, C; };
  for (const Shape s : {Shape{1, 1}, Shape{13, 3}, Shape{7, 17}, Shape{33, 64}, Shape{64, 100}, Shape{256, 768}}) {
    const std::string shape = "N=" + std::to_string(s.N) + " C=" + std::to_string(s.C);
    const size_t n = static_cast<size_t>(s.N) * s.C;
    cases.push_back({"layernorm_forward", shape, kF32Tolerance, [=](const Backend& be) {
                       const Vec inp = uniform(n, 11, -2.0f, 3.0f);  // non-zero mean
                       const Vec weight = uniform(s.C, 12);
                       const Vec bias = uniform(s.C, 13);
                       Vec out = uniform(n, 14), mean = uniform(s.N, 15), rstd = uniform(s.N, 16);
                       be.layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), weight.data(),
                                            bias.data(), s.N, s.C);
                       return std::vector<Output>{{"out", out}, {"mean", mean}, {"rstd", rstd}};
                     }});
    cases.push_back({"layernorm_backward", shape, kF32Tolerance, [=](const Backend& be) {
                       const Vec inp = uniform(n, 17, -2.0f, 3.0f);
                       const Vec weight = uniform(s.C, 18);
                       const Vec bias = uniform(s.C, 19);
                       Vec out(n), mean(s.N), rstd(s.N);
                       ref::layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), weight.data(),
                                              bias.data(), s.N, s.C);
                       const Vec dout = uniform(n, 20);
                       Vec dinp = uniform(n, 21), dweight = uniform(s.C, 22), dbias = uniform(s.C, 23);
                       be.layernorm_backward(dinp.data(), dweight.data(), dbias.data(), dout.data(), inp.data(),
                                             weight.data(), mean.data(), rstd.data(), s.N, s.C);
                       return std::vector<Output>{{"dinp", dinp}, {"dweight", dweight}, {"dbias", dbias}};
                     }});
  }
}

void add_matmul_cases(std::vector<OpCase>& cases) {
  struct Shape { int N, C, OC; };
  for (const MatmulPrecision prec : {MatmulPrecision::kF32, MatmulPrecision::kBF16}) {
    const double bf16_tol = cpu_features().has_bf16_matmul() ? kBF16Tolerance : kBF16FallbackTolerance;
    const double tol = prec == MatmulPrecision::kF32 ? kF32Tolerance : bf16_tol;
    const std::string prec_name = prec == MatmulPrecision::kF32 ? "f32" : "bf16";
    for (const Shape s : {Shape{1, 1, 1}, Shape{13, 17, 5}, Shape{7, 64, 100}, Shape{33, 100, 3}, Shape{1, 3, 17},
                          Shape{64, 768, 96}}) {
      for (const bool with_bias : {true, false}) {
        // Without bias the backward also gets dinp = null: both optional
        // gradients absent.
        const std::string shape = prec_name + " N=" + std::to_string(s.N) + " C=" + std::to_string(s.C) +
                                  " OC=" + std::to_string(s.OC) + (with_bias ? " bias" : " nobias");
        const size_t n_in = static_cast<size_t>(s.N) * s.C, n_w = static_cast<size_t>(s.OC) * s.C;
        const size_t n_out = static_cast<size_t>(s.N) * s.OC;
        cases.push_back({"matmul_forward", shape, tol, [=](const Backend& be) {
                           const Vec inp = uniform(n_in, 31), weight = uniform(n_w, 32), bias = uniform(s.OC, 33);
                           Vec out = uniform(n_out, 34);
                           be.matmul_forward(out.data(), inp.data(), weight.data(), with_bias ? bias.data() : nullptr,
                                             s.N, s.C, s.OC, prec);
                           return std::vector<Output>{{"out", out}};
                         }});
        cases.push_back({"matmul_backward", shape, tol, [=](const Backend& be) {
                           const Vec inp = uniform(n_in, 35), weight = uniform(n_w, 36), dout = uniform(n_out, 37);
                           Vec dinp = uniform(n_in, 38), dweight = uniform(n_w, 39), dbias = uniform(s.OC, 40);
                           be.matmul_backward(with_bias ? dinp.data() : nullptr, dweight.data(),
                                              with_bias ? dbias.data() : nullptr, dout.data(), inp.data(),
                                              weight.data(), s.N, s.C, s.OC, prec);
                           return std::vector<Output>{{"dinp", dinp}, {"dweight", dweight}, {"dbias", dbias}};
                         }});
        cases.push_back({"matmul_gelu_forward", shape, tol, [=](const Backend& be) {
                           const Vec inp = uniform(n_in, 41), weight = uniform(n_w, 42), bias = uniform(s.OC, 43);
                           Vec pre = uniform(n_out, 44), out = uniform(n_out, 45);
                           be.matmul_gelu_forward(pre.data(), out.data(), inp.data(), weight.data(),
                                                  with_bias ? bias.data() : nullptr, s.N, s.C, s.OC, prec);
                           return std::vector<Output>{{"pre", pre}, {"out", out}};
                         }});
      }
    }
  }
}

void add_attention_cases(std::vector<OpCase>& cases) {
  struct Shape { int B, T, C, NH; };
  // T = 130 spans three row blocks of the cpu kernel, the last partial;
  // B * NH = 1 takes the serial path (oneDNN threads the gemms itself).
  for (const Shape s : {Shape{1, 1, 1, 1}, Shape{2, 7, 3, 3}, Shape{1, 33, 17, 1}, Shape{2, 33, 64, 4},
                        Shape{1, 7, 100, 5}, Shape{1, 100, 32, 1}, Shape{2, 130, 64, 2}}) {
    const std::string shape = "B=" + std::to_string(s.B) + " T=" + std::to_string(s.T) +
                              " C=" + std::to_string(s.C) + " NH=" + std::to_string(s.NH);
    const size_t n_inp = static_cast<size_t>(s.B) * s.T * 3 * s.C;
    const size_t n_out = static_cast<size_t>(s.B) * s.T * s.C;
    const size_t n_att = static_cast<size_t>(s.B) * s.NH * s.T * s.T;
    // preatt is not compared: the cpu backend may leave it unwritten.
    cases.push_back({"attention_forward", shape, kF32Tolerance, [=](const Backend& be) {
                       const Vec inp = uniform(n_inp, 51, -2.0f, 2.0f);
                       Vec out = uniform(n_out, 52), preatt(n_att), att = uniform(n_att, 53);
                       be.attention_forward(out.data(), preatt.data(), att.data(), inp.data(), s.B, s.T, s.C, s.NH);
                       return std::vector<Output>{{"out", out}, {"att", att}};
                     }});
    cases.push_back({"attention_backward", shape, kF32Tolerance, [=](const Backend& be) {
                       const Vec inp = uniform(n_inp, 54, -2.0f, 2.0f);
                       Vec out(n_out), preatt(n_att), att(n_att);
                       ref::attention_forward(out.data(), preatt.data(), att.data(), inp.data(), s.B, s.T, s.C,
                                              s.NH);
                       const Vec dout = uniform(n_out, 55);
                       Vec dinp = uniform(n_inp, 56);
                       // datt and dpreatt are scratch the caller zeroes; random values on
                       // and below the diagonal still check that they accumulate.
                       Vec datt = uniform(n_att, 57), dpreatt = uniform(n_att, 58);
                       for (size_t row = 0; row < n_att / s.T; row++) {
                         const size_t t = row % s.T;
                         std::fill(datt.begin() + row * s.T + t + 1, datt.begin() + (row + 1) * s.T, 0.0f);
                         std::fill(dpreatt.begin() + row * s.T + t + 1, dpreatt.begin() + (row + 1) * s.T, 0.0f);
                       }
                       be.attention_backward(dinp.data(), dpreatt.data(), datt.data(), dout.data(), inp.data(),
                                             att.data(), s.B, s.T, s.C, s.NH);
                       return std::vector<Output>{{"dinp", dinp}, {"datt", datt}, {"dpreatt", dpreatt}};
                     }});
  }
}

void add_elementwise_cases(std::vector<OpCase>& cases) {
  // 100003 spans several threaded blocks with a ragged last one.
  for (const int64_t n : {int64_t{1}, int64_t{7}, int64_t{100}, int64_t{4097}, int64_t{100003}}) {
    const std::string shape = "n=" + std::to_string(n);
    const size_t sz = static_cast<size_t>(n);
    // GELU inputs reach far into both tails (exp underflow and saturation).
    cases.push_back({"gelu_forward", shape, kF32Tolerance, [=](const Backend& be) {
                       const Vec inp = uniform(sz, 61, -12.0f, 12.0f);
                       Vec out = uniform(sz, 62);
                       be.gelu_forward(out.data(), inp.data(), n);
                       return std::vector<Output>{{"out", out}};
                     }});
    cases.push_back({"gelu_backward", shape, kF32Tolerance, [=](const Backend& be) {
                       const Vec inp = uniform(sz, 63, -12.0f, 12.0f), dout = uniform(sz, 64);
                       Vec dinp = uniform(sz, 65);
                       be.gelu_backward(dinp.data(), inp.data(), dout.data(), n);
                       return std::vector<Output>{{"dinp", dinp}};
                     }});
    cases.push_back({"residual_forward", shape, kF32Tolerance, [=](const Backend& be) {
                       const Vec a = uniform(sz, 66), b = uniform(sz, 67);
                       Vec out = uniform(sz, 68);
                       be.residual_forward(out.data(), a.data(), b.data(), n);
                       return std::vector<Output>{{"out", out}};
                     }});
    cases.push_back({"residual_backward", shape, kF32Tolerance, [=](const Backend& be) {
                       const Vec dout = uniform(sz, 69);
                       Vec dinp1 = uniform(sz, 70), dinp2 = uniform(sz, 71);
                       be.residual_backward(dinp1.data(), dinp2.data(), dout.data(), n);
                       return std::vector<Output>{{"dinp1", dinp1}, {"dinp2", dinp2}};
                     }});
  }
}

void add_crossentropy_cases(std::vector<OpCase>& cases) {
  struct Shape { int N, V; };
  for (const Shape s : {Shape{1, 1}, Shape{13, 5}, Shape{7, 99}, Shape{33, 1000}, Shape{4, 50257}}) {
    const int Vp = (s.V + 127) / 128 * 128;
    const std::string shape = "N=" + std::to_string(s.N) + " V=" + std::to_string(s.V) + " Vp=" + std::to_string(Vp);
    const size_t n = static_cast<size_t>(s.N) * Vp;
    cases.push_back({"crossentropy_softmax_forward", shape, kF32Tolerance, [=](const Backend& be) {
                       // Wide logits, so some probabilities underflow; padding holds garbage.
                       const Vec logits = uniform(n, 81, -40.0f, 40.0f);
                       const std::vector<int> targets = token_ids(s.N, s.V, 82);
                       Vec losses = uniform(s.N, 83), probs = uniform(n, 84);
                       be.crossentropy_softmax_forward(losses.data(), probs.data(), logits.data(), targets.data(), s.N,
                                                       s.V, Vp);
                       return std::vector<Output>{{"losses", losses}, {"probs", probs}};
                     }});
    cases.push_back({"crossentropy_softmax_backward", shape, kF32Tolerance, [=](const Backend& be) {
                       const Vec logits = uniform(n, 85, -5.0f, 5.0f);
                       const std::vector<int> targets = token_ids(s.N, s.V, 86);
                       Vec losses(s.N), probs(n);
                       ref::crossentropy_softmax_forward(losses.data(), probs.data(), logits.data(), targets.data(),
                                                         s.N, s.V, Vp);
                       // Padding columns of dlogits must come back untouched.
                       Vec dlogits = uniform(n, 87);
                       be.crossentropy_softmax_backward(dlogits.data(), probs.data(), targets.data(), 1.0f / s.N, s.N,
                                                        s.V, Vp);
                       return std::vector<Output>{{"dlogits", dlogits}};
                     }});
  }
}

void add_adamw_cases(std::vector<OpCase>& cases) {
  for (const int64_t n : {int64_t{1}, int64_t{13}, int64_t{1000}, int64_t{100003}}) {
    for (const int t : {1, 7}) {
      const std::string shape = "n=" + std::to_string(n) + " t=" + std::to_string(t);
      const size_t sz = static_cast<size_t>(n);
      cases.push_back({"adamw_update", shape, kF32Tolerance, [=](const Backend& be) {
                         Vec params = uniform(sz, 91), m = uniform(sz, 93, -0.01f, 0.01f);
                         Vec v = uniform(sz, 94, 0.0f, 1e-4f);
                         const Vec grads = uniform(sz, 92, -0.1f, 0.1f);
                         AdamWParams hp;
                         hp.lr = 1e-3f;
                         hp.weight_decay = 0.1f;
                         hp.t = t;
                         hp.grad_scale = 0.5f;
                         be.adamw_update(params.data(), grads.data(), m.data(), v.data(), n, hp);
                         return std::vector<Output>{{"params", params}, {"m", m}, {"v", v}};
                       }});
    }
  }
}

void add_paged_cases(std::vector<OpCase>& cases) {
  // A pool of blocks dealt to S sequences in a shuffled order; rows are the
  // last n positions of each sequence (a prefill chunk or one decode token).
  struct Shape { int S, C, NH, bs; std::vector<int> lengths, fed; };
  for (const Shape& s : {Shape{1, 8, 1, 1, {1}, {1}}, Shape{2, 12, 3, 4, {9, 2}, {9, 1}},
                         Shape{3, 64, 4, 16, {100, 17, 1}, {1, 17, 1}}, Shape{4, 36, 6, 5, {33, 7, 64, 12}, {3, 1, 20, 12}}}) {
    std::string shape = "S=" + std::to_string(s.S) + " C=" + std::to_string(s.C) + " NH=" + std::to_string(s.NH) +
                        " bs=" + std::to_string(s.bs);
    int W = 0, blocks = 0, N = 0;
    for (int k = 0; k < s.S; k++) {
      W = std::max(W, (s.lengths[k] + s.bs - 1) / s.bs);
      blocks += (s.lengths[k] + s.bs - 1) / s.bs;
      N += s.fed[k];
    }
    blocks += 3;  // unused blocks in the pool
    std::vector<int> perm(blocks);
    for (int i = 0; i < blocks; i++) perm[i] = i;
    std::shuffle(perm.begin(), perm.end(), std::mt19937(7));
    std::vector<int> table(static_cast<size_t>(s.S) * W, -1), seq, pos, slots;
    int next = 0;
    for (int k = 0; k < s.S; k++) {
      for (int b = 0; b < (s.lengths[k] + s.bs - 1) / s.bs; b++) table[k * W + b] = perm[next++];
      for (int p = s.lengths[k] - s.fed[k]; p < s.lengths[k]; p++) {
        seq.push_back(k);
        pos.push_back(p);
        slots.push_back(table[k * W + p / s.bs] * s.bs + p % s.bs);
      }
    }
    const size_t pool = static_cast<size_t>(blocks) * s.bs * s.C;
    cases.push_back({"kv_cache_write_then_paged_attention", shape, kF32Tolerance, [=](const Backend& be) {
                       Vec k = uniform(pool, 121), v = uniform(pool, 122);
                       const Vec qkv = uniform(static_cast<size_t>(N) * 3 * s.C, 123, -2.0f, 2.0f);
                       Vec out = uniform(static_cast<size_t>(N) * s.C, 124);
                       be.kv_cache_write(k.data(), v.data(), qkv.data(), slots.data(), N, s.C);
                       be.paged_attention_forward(out.data(), qkv.data(), k.data(), v.data(), table.data(), seq.data(),
                                                  pos.data(), N, s.C, s.NH, s.bs, W);
                       return std::vector<Output>{{"kcache", k}, {"vcache", v}, {"out", out}};
                     }});
    cases.push_back({"encoder_forward_positions", shape, kF32Tolerance, [=](const Backend& be) {
                       const int V = 50, maxT = 128;
                       const Vec wte = uniform(static_cast<size_t>(V) * s.C, 125), wpe = uniform(static_cast<size_t>(maxT) * s.C, 126);
                       const std::vector<int> ids = token_ids(N, V, 127);
                       Vec out = uniform(static_cast<size_t>(N) * s.C, 128);
                       be.encoder_forward_positions(out.data(), ids.data(), pos.data(), wte.data(), wpe.data(), N, s.C);
                       return std::vector<Output>{{"out", out}};
                     }});
  }
}

std::vector<OpCase> all_cases() {
  std::vector<OpCase> cases;
  add_encoder_cases(cases);
  add_layernorm_cases(cases);
  add_matmul_cases(cases);
  add_attention_cases(cases);
  add_elementwise_cases(cases);
  add_crossentropy_cases(cases);
  add_adamw_cases(cases);
  add_paged_cases(cases);
  return cases;
}

// "layernorm_backward" + "N=13 C=17" -> "layernorm_backward_N13_C17".
std::string case_name(const ::testing::TestParamInfo<OpCase>& info) {
  std::string name = info.param.op + "_";
  for (const char ch : info.param.shape) {
    if (ch == ' ') name += '_';
    else if (std::isalnum(static_cast<unsigned char>(ch))) name += ch;
  }
  return name;
}

class CpuMatchesRef : public ::testing::TestWithParam<OpCase> {};

TEST_P(CpuMatchesRef, WithinTolerance) {
  const OpCase& c = GetParam();
  SCOPED_TRACE(c.op + " " + c.shape);
  const std::vector<Output> want = c.run(kRef);
  const std::vector<Output> got = c.run(kCpu);
  ASSERT_EQ(want.size(), got.size());
  for (size_t i = 0; i < want.size(); i++) {
    SCOPED_TRACE(want[i].name);
    ASSERT_EQ(want[i].values.size(), got[i].values.size());
    const double err = normalised_error(want[i].values, got[i].values);
    EXPECT_LE(err, c.tolerance) << kCpu.name << " vs " << kRef.name << ", " << c.op << " " << c.shape << ": "
                                << want[i].name;
  }
}

INSTANTIATE_TEST_SUITE_P(AllOps, CpuMatchesRef, ::testing::ValuesIn(all_cases()), case_name);

// matmul_gelu_forward on the CPU backends is exactly matmul_forward then
// gelu_forward (the CPU model relies on it being bitwise unchanged).
TEST(CpuMatmulGelu, EqualsMatmulThenGeluBitwise) {
  const int N = 33, C = 100, OC = 96;
  const Vec inp = uniform(static_cast<size_t>(N) * C, 111), weight = uniform(static_cast<size_t>(OC) * C, 112);
  const Vec bias = uniform(OC, 113);
  const size_t n_out = static_cast<size_t>(N) * OC;
  for (const Backend& be : {kRef, kCpu}) {
    for (const MatmulPrecision prec : {MatmulPrecision::kF32, MatmulPrecision::kBF16}) {
      for (const bool with_bias : {true, false}) {
        SCOPED_TRACE(std::string(be.name) + (prec == MatmulPrecision::kF32 ? " f32" : " bf16") +
                     (with_bias ? " bias" : " nobias"));
        const float* b = with_bias ? bias.data() : nullptr;
        Vec want_pre(n_out), want_out(n_out), pre(n_out), out(n_out);
        be.matmul_forward(want_pre.data(), inp.data(), weight.data(), b, N, C, OC, prec);
        be.gelu_forward(want_out.data(), want_pre.data(), static_cast<int64_t>(n_out));
        be.matmul_gelu_forward(pre.data(), out.data(), inp.data(), weight.data(), b, N, C, OC, prec);
        EXPECT_EQ(0, std::memcmp(pre.data(), want_pre.data(), n_out * sizeof(float)));
        EXPECT_EQ(0, std::memcmp(out.data(), want_out.data(), n_out * sizeof(float)));
      }
    }
  }
}

// Many positions with one token id: each contribution must land in the same
// dwte row exactly once (no lost updates between threads). Large enough to
// take the threaded path.
TEST(CpuEncoder, BackwardSumsRepeatedTokenIds) {
  const int B = 4, T = 64, C = 160, V = 6;
  std::vector<int> ids(static_cast<size_t>(B) * T);
  for (size_t i = 0; i < ids.size(); i++) ids[i] = i % 5 == 0 ? 2 : 4;  // only rows 2 and 4 are hit
  const Vec dout = uniform(ids.size() * C, 101);
  const Vec dwte0 = uniform(static_cast<size_t>(V) * C, 102), dwpe0 = uniform(static_cast<size_t>(T) * C, 103);
  Vec dwte = dwte0, dwpe = dwpe0;
  cpu::encoder_backward(dwte.data(), dwpe.data(), dout.data(), ids.data(), B, T, C);

  for (int row = 0; row < V; row++) {
    for (int c = 0; c < C; c++) {
      double want = dwte0[static_cast<size_t>(row) * C + c];
      for (size_t i = 0; i < ids.size(); i++)
        if (ids[i] == row) want += dout[i * C + c];
      EXPECT_NEAR(dwte[static_cast<size_t>(row) * C + c], want, 1e-4) << "row " << row << " c " << c;
    }
  }
  for (int t = 0; t < T; t++) {
    for (int c = 0; c < C; c++) {
      double want = dwpe0[static_cast<size_t>(t) * C + c];
      for (int b = 0; b < B; b++) want += dout[(static_cast<size_t>(b) * T + t) * C + c];
      EXPECT_NEAR(dwpe[static_cast<size_t>(t) * C + c], want, 1e-5) << "t " << t << " c " << c;
    }
  }
}

}  // namespace
}  // namespace tessera
