// One table of operator cases for every kernel backend, in the style of
// ggml's test-backend-ops: each case builds seeded inputs on the host, runs
// the reference oracle (tessera::ref) and a backend on them, and compares
// every output by normalised error (test_util.h)
//
//   err = max_i |got_i - ref_i| / max(1, max_i |ref_i|).
//
// kernels_test.cc runs it on the cpu backend, cuda_kernels_test.cc on the
// cuda one (host adapters that copy in, call, synchronize and copy out). A
// new op is one Backend field, one line in TESSERA_OP_BACKEND and its cases
// here; every backend then runs them.
//
// Shapes are deliberately odd (C = 1, 3, 17, 100; T = 1, 7, 33, 130; V = 1,
// 5, 99) and some are large enough to take the threaded paths. Backward
// kernels get gradient buffers pre-filled with random values, so a kernel
// that overwrites instead of accumulating fails; forward outputs start as
// garbage, so one that leaves a value unwritten fails.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <ostream>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "kernels/ref/ops.h"
#include "test_util.h"

namespace tessera::op_table {

using Vec = std::vector<float>;
using testing_util::normalised_error;
using testing_util::uniform;

// A case's tolerance class; each backend says what it allows for each.
enum class Tol {
  kF32,        // elementwise and row ops: summation order, vectorised exp and sqrt
  kMatmul,     // fp32 matmuls: long sums blocked differently
  kAttention,  // softmax attention: sums over T and the head size
  kBF16,       // bf16 matmuls
  kReduction,  // a weight gradient summed over many rows in another order
  kExact,      // no arithmetic reordered (ReLU, the embedding bag): bit for bit
  kTight,      // one transcendental per element (BCE with logits)
  kCount
};

// One backend's operator set. Every backend namespace declares the same
// functions (ops.inc), so TESSERA_OP_BACKEND fills the operators of a row
// from a namespace name.
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
  decltype(&ref::rmsnorm_forward) rmsnorm_forward;
  decltype(&ref::rmsnorm_backward) rmsnorm_backward;
  decltype(&ref::rope_forward) rope_forward;
  decltype(&ref::rope_backward) rope_backward;
  decltype(&ref::swiglu_forward) swiglu_forward;
  decltype(&ref::swiglu_backward) swiglu_backward;
  decltype(&ref::attention_gqa_forward) attention_gqa_forward;
  decltype(&ref::attention_gqa_backward) attention_gqa_backward;
  decltype(&ref::kv_cache_write_gqa) kv_cache_write_gqa;
  decltype(&ref::paged_attention_gqa_forward) paged_attention_gqa_forward;
  decltype(&ref::interaction_forward) interaction_forward;
  decltype(&ref::interaction_backward) interaction_backward;
  decltype(&ref::relu_forward) relu_forward;
  decltype(&ref::relu_backward) relu_backward;
  decltype(&ref::bce_logits_forward) bce_logits_forward;
  decltype(&ref::bce_logits_backward) bce_logits_backward;
  decltype(&ref::embedding_bag_forward) embedding_bag_forward;
  decltype(&ref::embedding_bag_backward) embedding_bag_backward;
  // Set after the operators.
  double tolerance[static_cast<int>(Tol::kCount)] = {};
  bool writes_preatt = true;  // attention's preatt output (the cpu backend may leave it unwritten)
};

#define TESSERA_OP_BACKEND(ns)                                                                                     \
  ::tessera::op_table::Backend {                                                                                  \
    #ns, ns::encoder_forward, ns::encoder_backward, ns::layernorm_forward, ns::layernorm_backward,               \
        ns::matmul_forward, ns::matmul_backward, ns::attention_forward, ns::attention_backward, ns::gelu_forward, \
        ns::gelu_backward, ns::matmul_gelu_forward, ns::residual_forward, ns::residual_backward,                  \
        ns::crossentropy_softmax_forward, ns::crossentropy_softmax_backward, ns::adamw_update,                    \
        ns::encoder_forward_positions, ns::kv_cache_write, ns::paged_attention_forward, ns::rmsnorm_forward,      \
        ns::rmsnorm_backward, ns::rope_forward, ns::rope_backward, ns::swiglu_forward, ns::swiglu_backward,       \
        ns::attention_gqa_forward, ns::attention_gqa_backward, ns::kv_cache_write_gqa,                           \
        ns::paged_attention_gqa_forward, ns::interaction_forward, ns::interaction_backward, ns::relu_forward,     \
        ns::relu_backward, ns::bce_logits_forward, ns::bce_logits_backward, ns::embedding_bag_forward,            \
        ns::embedding_bag_backward                                                                                \
  }

inline const Backend& ref_backend() {
  static const Backend b = TESSERA_OP_BACKEND(ref);
  return b;
}

struct Output {
  std::string name;
  Vec values;
};

// One row of the table. run() builds its inputs from a fixed seed on every
// call, so each backend sees exactly the same numbers.
struct OpCase {
  std::string op;     // "layernorm_backward"
  std::string shape;  // "N=13 C=17"
  Tol tol;
  std::function<std::vector<Output>(const Backend&)> run;
};

// gtest prints a failing parameter with this instead of its bytes.
inline void PrintTo(const OpCase& c, std::ostream* os) { *os << c.op << " " << c.shape; }

inline std::vector<int> token_ids(size_t n, int V, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> dist(0, V - 1);
  std::vector<int> ids(n);
  for (int& id : ids) id = dist(rng);
  return ids;
}

// ---- the cases, one function per op family --------------------------------

inline void add_encoder_cases(std::vector<OpCase>& cases) {
  struct Shape { int B, T, C, V; };
  // V = 1: every position has the same token, the worst case for dwte races.
  for (const Shape s : {Shape{1, 1, 1, 1}, Shape{2, 7, 3, 5}, Shape{3, 33, 17, 99}, Shape{2, 7, 64, 1},
                        Shape{4, 33, 100, 99}, Shape{4, 64, 160, 5}, Shape{4, 64, 160, 1}}) {
    const std::string shape = "B=" + std::to_string(s.B) + " T=" + std::to_string(s.T) +
                              " C=" + std::to_string(s.C) + " V=" + std::to_string(s.V);
    const size_t n = static_cast<size_t>(s.B) * s.T;
    const size_t pos_rows = s.T + 3;  // wpe may have more rows than T
    cases.push_back({"encoder_forward", shape, Tol::kF32, [=](const Backend& be) {
                       const std::vector<int> ids = token_ids(n, s.V, 1);
                       const Vec wte = uniform(static_cast<size_t>(s.V) * s.C, 2);
                       const Vec wpe = uniform(pos_rows * s.C, 3);
                       Vec out = uniform(n * s.C, 4);  // garbage: forward must overwrite
                       be.encoder_forward(out.data(), ids.data(), wte.data(), wpe.data(), s.B, s.T, s.C);
                       return std::vector<Output>{{"out", out}};
                     }});
    cases.push_back({"encoder_backward", shape, Tol::kF32, [=](const Backend& be) {
                       const std::vector<int> ids = token_ids(n, s.V, 5);
                       const Vec dout = uniform(n * s.C, 6);
                       Vec dwte = uniform(static_cast<size_t>(s.V) * s.C, 7);
                       Vec dwpe = uniform(pos_rows * s.C, 8);
                       be.encoder_backward(dwte.data(), dwpe.data(), dout.data(), ids.data(), s.B, s.T, s.C);
                       return std::vector<Output>{{"dwte", dwte}, {"dwpe", dwpe}};
                     }});
  }
}

inline void add_layernorm_cases(std::vector<OpCase>& cases) {
  struct Shape { int N, C; };
  for (const Shape s : {Shape{1, 1}, Shape{13, 3}, Shape{7, 17}, Shape{33, 64}, Shape{64, 100}, Shape{256, 768}}) {
    const std::string shape = "N=" + std::to_string(s.N) + " C=" + std::to_string(s.C);
    const size_t n = static_cast<size_t>(s.N) * s.C;
    cases.push_back({"layernorm_forward", shape, Tol::kF32, [=](const Backend& be) {
                       const Vec inp = uniform(n, 11, -2.0f, 3.0f);  // non-zero mean
                       const Vec weight = uniform(s.C, 12);
                       const Vec bias = uniform(s.C, 13);
                       Vec out = uniform(n, 14), mean = uniform(s.N, 15), rstd = uniform(s.N, 16);
                       be.layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), weight.data(),
                                            bias.data(), s.N, s.C);
                       return std::vector<Output>{{"out", out}, {"mean", mean}, {"rstd", rstd}};
                     }});
    cases.push_back({"layernorm_backward", shape, Tol::kF32, [=](const Backend& be) {
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

inline void add_matmul_cases(std::vector<OpCase>& cases) {
  struct Shape { int N, C, OC; };
  for (const MatmulPrecision prec : {MatmulPrecision::kF32, MatmulPrecision::kBF16}) {
    const Tol tol = prec == MatmulPrecision::kF32 ? Tol::kMatmul : Tol::kBF16;
    const std::string prec_name = prec == MatmulPrecision::kF32 ? "f32" : "bf16";
    for (const Shape s : {Shape{1, 1, 1}, Shape{13, 17, 5}, Shape{7, 64, 100}, Shape{33, 100, 3}, Shape{1, 3, 17},
                          Shape{64, 768, 96}, Shape{256, 128, 384}}) {
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

inline void add_attention_cases(std::vector<OpCase>& cases) {
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
    // preatt is compared only where the backend writes it (Backend::writes_preatt).
    cases.push_back({"attention_forward", shape, Tol::kAttention, [=](const Backend& be) {
                       const Vec inp = uniform(n_inp, 51, -2.0f, 2.0f);
                       Vec out = uniform(n_out, 52), preatt = uniform(n_att, 59), att = uniform(n_att, 53);
                       be.attention_forward(out.data(), preatt.data(), att.data(), inp.data(), s.B, s.T, s.C, s.NH);
                       return std::vector<Output>{{"out", out}, {"preatt", preatt}, {"att", att}};
                     }});
    cases.push_back({"attention_backward", shape, Tol::kAttention, [=](const Backend& be) {
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

inline void add_elementwise_cases(std::vector<OpCase>& cases) {
  // 100003 spans several threaded blocks with a ragged last one.
  for (const int64_t n : {int64_t{1}, int64_t{7}, int64_t{100}, int64_t{4097}, int64_t{100003}}) {
    const std::string shape = "n=" + std::to_string(n);
    const size_t sz = static_cast<size_t>(n);
    // GELU inputs reach far into both tails (exp underflow and saturation).
    cases.push_back({"gelu_forward", shape, Tol::kF32, [=](const Backend& be) {
                       const Vec inp = uniform(sz, 61, -12.0f, 12.0f);
                       Vec out = uniform(sz, 62);
                       be.gelu_forward(out.data(), inp.data(), n);
                       return std::vector<Output>{{"out", out}};
                     }});
    cases.push_back({"gelu_backward", shape, Tol::kF32, [=](const Backend& be) {
                       const Vec inp = uniform(sz, 63, -12.0f, 12.0f), dout = uniform(sz, 64);
                       Vec dinp = uniform(sz, 65);
                       be.gelu_backward(dinp.data(), inp.data(), dout.data(), n);
                       return std::vector<Output>{{"dinp", dinp}};
                     }});
    cases.push_back({"residual_forward", shape, Tol::kF32, [=](const Backend& be) {
                       const Vec a = uniform(sz, 66), b = uniform(sz, 67);
                       Vec out = uniform(sz, 68);
                       be.residual_forward(out.data(), a.data(), b.data(), n);
                       return std::vector<Output>{{"out", out}};
                     }});
    cases.push_back({"residual_backward", shape, Tol::kF32, [=](const Backend& be) {
                       const Vec dout = uniform(sz, 69);
                       Vec dinp1 = uniform(sz, 70), dinp2 = uniform(sz, 71);
                       be.residual_backward(dinp1.data(), dinp2.data(), dout.data(), n);
                       return std::vector<Output>{{"dinp1", dinp1}, {"dinp2", dinp2}};
                     }});
  }
}

inline void add_crossentropy_cases(std::vector<OpCase>& cases) {
  struct Shape { int N, V; };
  for (const Shape s : {Shape{1, 1}, Shape{13, 5}, Shape{7, 99}, Shape{33, 1000}, Shape{4, 50257}}) {
    const int Vp = (s.V + 127) / 128 * 128;
    const std::string shape = "N=" + std::to_string(s.N) + " V=" + std::to_string(s.V) + " Vp=" + std::to_string(Vp);
    const size_t n = static_cast<size_t>(s.N) * Vp;
    cases.push_back({"crossentropy_softmax_forward", shape, Tol::kF32, [=](const Backend& be) {
                       // Wide logits, so some probabilities underflow; padding holds garbage.
                       const Vec logits = uniform(n, 81, -40.0f, 40.0f);
                       const std::vector<int> targets = token_ids(s.N, s.V, 82);
                       Vec losses = uniform(s.N, 83), probs = uniform(n, 84);
                       be.crossentropy_softmax_forward(losses.data(), probs.data(), logits.data(), targets.data(), s.N,
                                                       s.V, Vp);
                       return std::vector<Output>{{"losses", losses}, {"probs", probs}};
                     }});
    cases.push_back({"crossentropy_softmax_backward", shape, Tol::kF32, [=](const Backend& be) {
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

inline void add_adamw_cases(std::vector<OpCase>& cases) {
  for (const int64_t n : {int64_t{1}, int64_t{13}, int64_t{1000}, int64_t{100003}}) {
    for (const int t : {1, 7}) {
      const std::string shape = "n=" + std::to_string(n) + " t=" + std::to_string(t);
      const size_t sz = static_cast<size_t>(n);
      cases.push_back({"adamw_update", shape, Tol::kF32, [=](const Backend& be) {
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

inline void add_paged_cases(std::vector<OpCase>& cases) {
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
    cases.push_back({"kv_cache_write_then_paged_attention", shape, Tol::kAttention, [=](const Backend& be) {
                       Vec k = uniform(pool, 121), v = uniform(pool, 122);
                       const Vec qkv = uniform(static_cast<size_t>(N) * 3 * s.C, 123, -2.0f, 2.0f);
                       Vec out = uniform(static_cast<size_t>(N) * s.C, 124);
                       be.kv_cache_write(k.data(), v.data(), qkv.data(), slots.data(), N, s.C);
                       be.paged_attention_forward(out.data(), qkv.data(), k.data(), v.data(), table.data(), seq.data(),
                                                  pos.data(), N, s.C, s.NH, s.bs, W);
                       return std::vector<Output>{{"kcache", k}, {"vcache", v}, {"out", out}};
                     }});
    cases.push_back({"encoder_forward_positions", shape, Tol::kF32, [=](const Backend& be) {
                       const int V = 50, maxT = 128;
                       const Vec wte = uniform(static_cast<size_t>(V) * s.C, 125), wpe = uniform(static_cast<size_t>(maxT) * s.C, 126);
                       const std::vector<int> ids = token_ids(N, V, 127);
                       Vec out = uniform(static_cast<size_t>(N) * s.C, 128);
                       be.encoder_forward_positions(out.data(), ids.data(), pos.data(), wte.data(), wpe.data(), N, s.C);
                       return std::vector<Output>{{"out", out}};
                     }});
  }
}


// Llama 3's frequencies for head size hs (base 500000), any scaling aside.
inline Vec rope_inv_freq(int hs, double theta = 500000.0) {
  Vec f(hs / 2);
  for (int i = 0; i < hs / 2; i++) f[i] = static_cast<float>(1.0 / std::pow(theta, 2.0 * i / hs));
  return f;
}

inline void add_llama_cases(std::vector<OpCase>& cases) {
  for (auto [N, C] : {std::pair{1, 1}, std::pair{13, 17}, std::pair{64, 768}, std::pair{300, 64}}) {
    const std::string shape = "N=" + std::to_string(N) + " C=" + std::to_string(C);
    const size_t n = static_cast<size_t>(N) * C;
    cases.push_back({"rmsnorm_forward", shape, Tol::kF32, [=](const Backend& be) {
                       const Vec inp = uniform(n, 30, -2.0f, 2.0f), w = uniform(C, 31);
                       Vec out = uniform(n, 35), rstd = uniform(N, 36);
                       be.rmsnorm_forward(out.data(), rstd.data(), inp.data(), w.data(), N, C, 1e-6f);
                       return std::vector<Output>{{"out", out}, {"rstd", rstd}};
                     }});
    // dweight sums over N rows in another order: the reduction bound.
    cases.push_back({"rmsnorm_backward", shape, Tol::kReduction, [=](const Backend& be) {
                       const Vec inp = uniform(n, 30, -2.0f, 2.0f), w = uniform(C, 31), dout = uniform(n, 32);
                       Vec out(n), rstd(N);
                       ref::rmsnorm_forward(out.data(), rstd.data(), inp.data(), w.data(), N, C, 1e-6f);
                       Vec dinp = uniform(n, 33), dw = uniform(C, 34);
                       be.rmsnorm_backward(dinp.data(), dw.data(), dout.data(), inp.data(), w.data(), rstd.data(), N,
                                           C);
                       return std::vector<Output>{{"dinp", dinp}, {"dweight", dw}};
                     }});
  }
  for (auto [N, NH, KV, hs] :
       {std::tuple{1, 1, 1, 2}, std::tuple{7, 4, 2, 8}, std::tuple{37, 8, 2, 64}, std::tuple{300, 12, 4, 64}}) {
    const std::string shape = "N=" + std::to_string(N) + " NH=" + std::to_string(NH) + " KV=" + std::to_string(KV) +
                              " hs=" + std::to_string(hs);
    const size_t n = static_cast<size_t>(N) * (NH + 2 * KV) * hs;
    std::vector<int> pos(N);
    for (int i = 0; i < N; i++) pos[i] = (i * 37) % 8192;
    cases.push_back({"rope_forward", shape, Tol::kF32, [=](const Backend& be) {
                       Vec x = uniform(n, 40);
                       const Vec f = rope_inv_freq(hs);
                       be.rope_forward(x.data(), pos.data(), f.data(), N, NH, KV, hs);
                       return std::vector<Output>{{"qkv", x}};
                     }});
    cases.push_back({"rope_backward", shape, Tol::kF32, [=](const Backend& be) {
                       Vec x = uniform(n, 41);
                       const Vec f = rope_inv_freq(hs);
                       be.rope_backward(x.data(), pos.data(), f.data(), N, NH, KV, hs);
                       return std::vector<Output>{{"dqkv", x}};
                     }});
  }
  for (auto [N, F] : {std::pair{1, 1}, std::pair{13, 17}, std::pair{37, 300}, std::pair{64, 2048}}) {
    const std::string shape = "N=" + std::to_string(N) + " F=" + std::to_string(F);
    const size_t n = static_cast<size_t>(N) * F;
    cases.push_back({"swiglu_forward", shape, Tol::kF32, [=](const Backend& be) {
                       const Vec inp = uniform(2 * n, 50, -6.0f, 6.0f);
                       Vec out = uniform(n, 53);
                       be.swiglu_forward(out.data(), inp.data(), N, F);
                       return std::vector<Output>{{"out", out}};
                     }});
    cases.push_back({"swiglu_backward", shape, Tol::kF32, [=](const Backend& be) {
                       const Vec inp = uniform(2 * n, 50, -6.0f, 6.0f), dout = uniform(n, 51);
                       Vec dinp = uniform(2 * n, 52);
                       be.swiglu_backward(dinp.data(), inp.data(), dout.data(), N, F);
                       return std::vector<Output>{{"dinp", dinp}};
                     }});
  }
  // T = 130 crosses the cpu kernel's row blocks; KV = 1 is multi-query.
  struct Gqa { int B, T, NH, KV, hs; };
  for (const Gqa s : {Gqa{1, 1, 1, 1, 1}, Gqa{2, 7, 4, 2, 3}, Gqa{1, 33, 6, 1, 8}, Gqa{2, 70, 8, 2, 64},
                      Gqa{2, 130, 4, 2, 16}, Gqa{1, 9, 8, 8, 4}}) {
    const std::string shape = "B=" + std::to_string(s.B) + " T=" + std::to_string(s.T) + " NH=" +
                              std::to_string(s.NH) + " KV=" + std::to_string(s.KV) + " hs=" + std::to_string(s.hs);
    const size_t n_inp = static_cast<size_t>(s.B) * s.T * (s.NH + 2 * s.KV) * s.hs;
    const size_t n_out = static_cast<size_t>(s.B) * s.T * s.NH * s.hs;
    const size_t n_att = static_cast<size_t>(s.B) * s.NH * s.T * s.T;
    cases.push_back({"attention_gqa_forward", shape, Tol::kAttention, [=](const Backend& be) {
                       const Vec inp = uniform(n_inp, 20, -2.0f, 2.0f);
                       Vec out = uniform(n_out, 23), pre = uniform(n_att, 24), att = uniform(n_att, 25);
                       be.attention_gqa_forward(out.data(), pre.data(), att.data(), inp.data(), s.B, s.T, s.NH, s.KV,
                                                s.hs);
                       return std::vector<Output>{{"out", out}, {"preatt", pre}, {"att", att}};
                     }});
    cases.push_back({"attention_gqa_backward", shape, Tol::kAttention, [=](const Backend& be) {
                       const Vec inp = uniform(n_inp, 20, -2.0f, 2.0f), dout = uniform(n_out, 21);
                       Vec out(n_out), pre(n_att), att(n_att);
                       ref::attention_gqa_forward(out.data(), pre.data(), att.data(), inp.data(), s.B, s.T, s.NH, s.KV,
                                                  s.hs);
                       Vec dinp = uniform(n_inp, 22), dpre(n_att, 0.0f), datt(n_att, 0.0f);  // scratch, zeroed
                       be.attention_gqa_backward(dinp.data(), dpre.data(), datt.data(), dout.data(), inp.data(),
                                                 att.data(), s.B, s.T, s.NH, s.KV, s.hs);
                       return std::vector<Output>{{"dinp", dinp}};
                     }});
  }
  // The paged cache with fewer key/value heads: rows of KV*hs floats, a
  // reversed pool order. T positions written, the last `fed` attending: all
  // of them (a prefill), or one or two (decode steps, whose heads the CPU
  // splits between threads: by key/value head, then by the query heads of
  // one). Head sizes that are not a multiple of 16 or 8 take the vector
  // kernels' tails.
  for (auto [T, NH, KV, hs, bs, fed] :
       {std::tuple{21, 4, 2, 8, 4, 21}, std::tuple{21, 4, 2, 16, 4, 21}, std::tuple{40, 6, 1, 8, 16, 40},
        std::tuple{37, 8, 4, 16, 16, 1}, std::tuple{37, 6, 1, 24, 8, 1}, std::tuple{50, 4, 4, 20, 16, 2},
        std::tuple{19, 12, 12, 64, 16, 1}}) {
    const std::string shape = "T=" + std::to_string(T) + " NH=" + std::to_string(NH) + " KV=" + std::to_string(KV) +
                              " hs=" + std::to_string(hs) + " bs=" + std::to_string(bs) + " fed=" + std::to_string(fed);
    const int blocks = (T + bs - 1) / bs;
    std::vector<int> table(blocks), pos(T), seq(T, 0), slots(T);
    for (int b = 0; b < blocks; b++) table[b] = blocks - 1 - b;
    for (int t = 0; t < T; t++) {
      pos[t] = t;
      slots[t] = table[t / bs] * bs + t % bs;
    }
    const size_t pool = static_cast<size_t>(blocks) * bs * KV * hs;
    cases.push_back({"kv_cache_write_gqa_then_paged_attention_gqa", shape, Tol::kAttention, [=](const Backend& be) {
                       const Vec qkv = uniform(static_cast<size_t>(T) * (NH + 2 * KV) * hs, 60, -2.0f, 2.0f);
                       Vec kc = uniform(pool, 61), vc = uniform(pool, 62), out = uniform(static_cast<size_t>(T) * NH * hs, 63);
                       be.kv_cache_write_gqa(kc.data(), vc.data(), qkv.data(), slots.data(), T, NH, KV, hs);
                       const int first = T - fed;
                       be.paged_attention_gqa_forward(out.data() + static_cast<size_t>(first) * NH * hs,
                                                      qkv.data() + static_cast<size_t>(first) * (NH + 2 * KV) * hs,
                                                      kc.data(), vc.data(), table.data(), seq.data(),
                                                      pos.data() + first, fed, NH, KV, hs, bs, blocks);
                       return std::vector<Output>{{"kcache", kc}, {"vcache", vc}, {"out", out}};
                     }});
  }
}

// The DLRM's dense ops (ops.inc: the dot interaction, ReLU, BCE with
// logits). The embedding bag has its own tests (its sparse gradient's
// contract differs per backend: dlrm_kernels_test.cc, dlrm_cuda_test.cc).
inline void add_dlrm_cases(std::vector<OpCase>& cases) {
  // F*D*4 bytes of the last shapes exceed the 48 KiB the CUDA kernel stages
  // in shared memory.
  for (auto [B, F, D] : {std::tuple{1, 1, 1}, std::tuple{3, 2, 5}, std::tuple{17, 9, 13}, std::tuple{64, 27, 16},
                         std::tuple{2, 1, 16}, std::tuple{5, 27, 64}, std::tuple{3, 17, 96}, std::tuple{4, 33, 32},
                         std::tuple{300, 27, 64}, std::tuple{5, 27, 512}}) {
    const std::string shape = "B=" + std::to_string(B) + " F=" + std::to_string(F) + " D=" + std::to_string(D);
    const size_t n_feat = static_cast<size_t>(B) * F * D, n_out = static_cast<size_t>(B) * (D + F * (F - 1) / 2);
    cases.push_back({"interaction_forward", shape, Tol::kF32, [=](const Backend& be) {
                       const Vec feat = uniform(n_feat, 130, -2.0f, 2.0f);
                       Vec out = uniform(n_out, 131);
                       be.interaction_forward(out.data(), feat.data(), B, F, D);
                       return std::vector<Output>{{"out", out}};
                     }});
    cases.push_back({"interaction_backward", shape, Tol::kF32, [=](const Backend& be) {
                       const Vec feat = uniform(n_feat, 132, -2.0f, 2.0f), dout = uniform(n_out, 133);
                       Vec dfeat = uniform(n_feat, 134);  // accumulates
                       be.interaction_backward(dfeat.data(), dout.data(), feat.data(), B, F, D);
                       return std::vector<Output>{{"dfeat", dfeat}};
                     }});
  }
  for (const int64_t n : {int64_t{1}, int64_t{1001}, int64_t{1} << 20}) {
    const std::string shape = "n=" + std::to_string(n);
    const size_t sz = static_cast<size_t>(n);
    cases.push_back({"relu_forward", shape, Tol::kExact, [=](const Backend& be) {
                       Vec x = uniform(sz, 140);
                       x[0] = 0.0f;  // the kink
                       Vec out = uniform(sz, 141);
                       be.relu_forward(out.data(), x.data(), n);
                       return std::vector<Output>{{"out", out}};
                     }});
    cases.push_back({"relu_backward", shape, Tol::kExact, [=](const Backend& be) {
                       Vec x = uniform(sz, 142);
                       x[0] = 0.0f;  // the kink: no gradient, as the reference
                       const Vec dout = uniform(sz, 143);
                       Vec dinp = uniform(sz, 144);  // accumulates
                       be.relu_backward(dinp.data(), x.data(), dout.data(), n);
                       return std::vector<Output>{{"dinp", dinp}};
                     }});
  }
  for (const int N : {1, 257, 4099}) {
    const std::string shape = "N=" + std::to_string(N);
    // Large logits stay finite; soft labels are in the contract.
    auto inputs = [N](Vec* x, Vec* y) {
      *x = uniform(static_cast<size_t>(N), 150, -9.0f, 9.0f);
      y->assign(static_cast<size_t>(N), 0.0f);
      for (int i = 0; i < N; i++) (*y)[i] = static_cast<float>(i % 2);
      if (N > 3) {
        (*x)[0] = 80.0f, (*x)[1] = -80.0f, (*x)[2] = 0.0f;
        (*y)[3] = 0.25f;
      }
    };
    cases.push_back({"bce_logits_forward", shape, Tol::kTight, [=](const Backend& be) {
                       Vec x, y;
                       inputs(&x, &y);
                       Vec losses = uniform(static_cast<size_t>(N), 151);
                       be.bce_logits_forward(losses.data(), x.data(), y.data(), N);
                       return std::vector<Output>{{"losses", losses}};
                     }});
    cases.push_back({"bce_logits_backward", shape, Tol::kTight, [=](const Backend& be) {
                       Vec x, y;
                       inputs(&x, &y);
                       Vec dlogits = uniform(static_cast<size_t>(N), 152, -1e-3f, 1e-3f);  // accumulates
                       be.bce_logits_backward(dlogits.data(), x.data(), y.data(), 1.0f / N, N);
                       return std::vector<Output>{{"dlogits", dlogits}};
                     }});
  }
}

// Bags for B samples over E table rows (ops.inc): sizes 0..maxlen; sample 0
// repeats an id and holds the last row E-1, samples 1 and 2 are empty (two
// in a row) and so is the last; a `hot` share of ids comes from rows 0..3,
// so some ids run long across bags.
inline void embedding_bags(std::vector<int>* ids, std::vector<int>* offsets, int B, int E, int maxlen, double hot,
                           uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> len(0, maxlen), id(0, E - 1), hot_id(0, std::min(E, 4) - 1);
  std::bernoulli_distribution is_hot(hot);
  offsets->assign(1, 0);
  ids->clear();
  for (int b = 0; b < B; b++) {
    if (b == 0) {
      const int x = id(rng);
      ids->insert(ids->end(), {x, E - 1, x});
    }
    const bool empty = b == 1 || b == 2 || (b == B - 1 && B > 1);
    const int n = empty ? 0 : len(rng);
    for (int k = 0; k < n; k++) ids->push_back(is_hot(rng) ? hot_id(rng) : id(rng));
    offsets->push_back(static_cast<int>(ids->size()));
  }
}

// The embedding bag keeps the oracle's order of float operations on every
// backend (ops.inc), so its rows are exact. The forward writes rows with a
// stride (ld = D + 3, as the model's (B,F,D) buffer) into garbage: a backend
// that writes the gap, or leaves a value unwritten, fails. The backward's
// outputs are U, the U distinct ids and their U gradient rows.
inline void add_embedding_bag_cases(std::vector<OpCase>& cases) {
  struct Shape { int B, E, D, maxlen; double hot; };
  // D = 300 spans more than one block of the CUDA backward's threads; the
  // last shape has runs of hundreds of one id and takes the threaded paths.
  for (const Shape s : {Shape{1, 1, 1, 3, 0.0}, Shape{5, 3, 7, 4, 0.0}, Shape{37, 101, 13, 9, 0.2},
                        Shape{300, 997, 64, 9, 0.1}, Shape{9, 50, 300, 6, 0.3}, Shape{2048, 20000, 64, 20, 0.25}}) {
    for (const Pooling pooling : {Pooling::kSum, Pooling::kMean}) {
      const std::string shape = "B=" + std::to_string(s.B) + " E=" + std::to_string(s.E) + " D=" + std::to_string(s.D) +
                                (pooling == Pooling::kSum ? " sum" : " mean");
      const int64_t ld = s.D + 3;
      cases.push_back({"embedding_bag_forward", shape, Tol::kExact, [=](const Backend& be) {
                         std::vector<int> ids, offsets;
                         embedding_bags(&ids, &offsets, s.B, s.E, s.maxlen, s.hot, 160);
                         const Vec table = uniform(static_cast<size_t>(s.E) * s.D, 161);
                         Vec out = uniform(static_cast<size_t>(s.B) * ld, 162);  // garbage, the gap included
                         be.embedding_bag_forward(out.data(), ld, table.data(), ids.data(), offsets.data(), s.B, s.D,
                                                  pooling);
                         return std::vector<Output>{{"out", out}};
                       }});
      cases.push_back({"embedding_bag_backward", shape, Tol::kExact, [=](const Backend& be) {
                         std::vector<int> ids, offsets;
                         embedding_bags(&ids, &offsets, s.B, s.E, s.maxlen, s.hot, 163);
                         const Vec dout = uniform(static_cast<size_t>(s.B) * ld, 164);
                         const int L = offsets[s.B];
                         std::vector<int> rows(L, -1);
                         Vec drows = uniform(static_cast<size_t>(L) * s.D, 165);  // written, not accumulated
                         const int U = be.embedding_bag_backward(rows.data(), drows.data(), dout.data(), ld,
                                                                 ids.data(), offsets.data(), s.B, s.D, pooling);
                         // A U out of [0, L] fails on the first output; the rest stay whole.
                         if (U >= 0 && U <= L) {
                           rows.resize(U);
                           drows.resize(static_cast<size_t>(U) * s.D);
                         }
                         return std::vector<Output>{{"U", {static_cast<float>(U)}},
                                                    {"rows", Vec(rows.begin(), rows.end())},  // exact below 2^24
                                                    {"drows", drows}};
                       }});
    }
  }
}

inline std::vector<OpCase> all_cases() {
  std::vector<OpCase> cases;
  add_encoder_cases(cases);
  add_layernorm_cases(cases);
  add_matmul_cases(cases);
  add_attention_cases(cases);
  add_elementwise_cases(cases);
  add_crossentropy_cases(cases);
  add_adamw_cases(cases);
  add_paged_cases(cases);
  add_llama_cases(cases);
  add_dlrm_cases(cases);
  add_embedding_bag_cases(cases);
  return cases;
}

// "layernorm_backward" + "N=13 C=17" -> "layernorm_backward_N13_C17".
inline std::string case_name(const ::testing::TestParamInfo<OpCase>& info) {
  std::string name = info.param.op + "_";
  for (const char ch : info.param.shape) {
    if (ch == ' ') name += '_';
    else if (std::isalnum(static_cast<unsigned char>(ch))) name += ch;
  }
  return name;
}

// Runs c on the oracle and on `be`; every output within be's tolerance for
// the case's class.
inline void expect_matches_ref(const OpCase& c, const Backend& be) {
  SCOPED_TRACE(c.op + " " + c.shape);
  const std::vector<Output> want = c.run(ref_backend());
  const std::vector<Output> got = c.run(be);
  ASSERT_EQ(want.size(), got.size());
  const double tol = be.tolerance[static_cast<int>(c.tol)];
  for (size_t i = 0; i < want.size(); i++) {
    if (want[i].name == "preatt" && !be.writes_preatt) continue;
    SCOPED_TRACE(want[i].name);
    ASSERT_EQ(want[i].values.size(), got[i].values.size());
    const double err = normalised_error(got[i].values, want[i].values);
    EXPECT_LE(err, tol) << be.name << " vs ref, " << c.op << " " << c.shape << ": " << want[i].name;
    if (c.tol == Tol::kExact) {
      // Bit for bit (== takes -0 for 0).
      size_t differ = 0;
      for (size_t k = 0; k < want[i].values.size(); k++)
        differ += std::memcmp(&want[i].values[k], &got[i].values[k], sizeof(float)) != 0;
      EXPECT_EQ(differ, 0u) << be.name << " vs ref, " << c.op << " " << c.shape << ": " << want[i].name
                            << ", values whose bits differ";
    }
  }
}

}  // namespace tessera::op_table
