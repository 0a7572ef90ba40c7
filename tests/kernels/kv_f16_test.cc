// The fp16 KV cache's kernels (ops.inc: kv_cache_write_gqa_f16,
// paged_attention_gqa_f16_forward). The write against the oracle bit for
// bit (round to nearest even, infinities past 65504, subnormal halves);
// the attention against the oracle, and bit for bit against the fp32
// kernel over the same values decoded to fp32 (the cpu kernels convert and
// then compute exactly as the fp32 ones do), and bit for bit across 1, 2,
// 5 and 32 threads: the thread count splits a row's query heads into
// items, and an item with 2 or more heads a key/value head goes through
// the group kernels, one with 1 through the per-head ones. In
// TESSERA_ISA_TESTS: natively, under DNNL_MAX_CPU_ISA=AVX2 and on an
// emulated Zen 3; DNNL_MAX_CPU_ISA=SSE41 runs the plain loops.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/cpu/ops.h"
#include "kernels/q4.h"
#include "kernels/ref/ops.h"
#include "test_util.h"

namespace tessera {
namespace {

using Vec = std::vector<float>;
using Halves = std::vector<uint16_t>;
using testing_util::uniform;

TEST(CpuKvF16, WriteRoundsAsTheOracle) {
  // Keys and values of 3 rows, 2 heads of 24 (vector lanes and a tail), with
  // values that test the rounding: ties, overflow, subnormal halves, zeros.
  const int N = 3, NH = 2, KV = 2, hs = 24;
  const int64_t W = (NH + 2 * KV) * hs, Ck = KV * hs;
  Vec qkv = uniform(static_cast<size_t>(N) * W, 7, -3.0f, 3.0f);
  const float special[] = {65504.0f, 65520.0f, 1e6f, -1e6f, 6.0e-8f, 3.0e-8f, -2.9e-8f, 1e-10f, 0.0f, -0.0f,
                           1.00048828125f, 1.00146484375f, 2049.0f, std::numeric_limits<float>::infinity(),
                           5.9604645e-8f, 6.1035156e-5f, 6.1e-5f};
  for (size_t i = 0; i < std::size(special); i++) qkv[NH * hs + 5 * i] = special[i];
  const std::vector<int> slots = {4, 0, 2};
  const size_t pool = 5 * Ck;
  Halves kr(pool, 0x1234), vr(pool, 0x1234), kc(pool, 0x1234), vc(pool, 0x1234);
  ref::kv_cache_write_gqa_f16(kr.data(), vr.data(), qkv.data(), slots.data(), N, NH, KV, hs);
  cpu::kv_cache_write_gqa_f16(kc.data(), vc.data(), qkv.data(), slots.data(), N, NH, KV, hs);
  EXPECT_EQ(kr, kc);
  EXPECT_EQ(vr, vc);
  // The oracle's halves decode back to the nearest representable value.
  EXPECT_EQ(q4::fp16_to_f32(kr[4 * Ck + 0]), 65504.0f);
  EXPECT_TRUE(std::isinf(q4::fp16_to_f32(kr[4 * Ck + 5])));  // 65520 rounds up, past the largest half
  EXPECT_EQ(kr[1 * Ck + 0], 0x1234);                          // slot 1: never written
}

struct Shape {
  int T, NH, KV, hs, bs, fed;
};

// The op table's paged GQA shapes (op_table.h): prefills and decode rows,
// head sizes off the vector widths.
const Shape kShapes[] = {{21, 4, 2, 8, 4, 21}, {21, 4, 2, 16, 4, 21}, {40, 6, 1, 8, 16, 40},
                         {37, 8, 4, 16, 16, 1}, {37, 6, 1, 24, 8, 1},   {50, 4, 4, 20, 16, 2},
                         {19, 12, 12, 64, 16, 1}, {300, 32, 4, 64, 16, 1}, {37, 32, 2, 32, 16, 1},
                         {70, 16, 2, 128, 16, 3}, {45, 6, 2, 40, 16, 1}};

TEST(CpuKvF16, AttentionMatchesTheOracleAndTheFp32KernelOnTheSameValues) {
  const int saved = omp_get_max_threads();
  for (const Shape& s : kShapes) {
    const int blocks = (s.T + s.bs - 1) / s.bs;
    std::vector<int> table(blocks), pos(s.T), seq(s.T, 0), slots(s.T);
    for (int b = 0; b < blocks; b++) table[b] = blocks - 1 - b;  // the pool in reverse
    for (int t = 0; t < s.T; t++) {
      pos[t] = t;
      slots[t] = table[t / s.bs] * s.bs + t % s.bs;
    }
    const int64_t W = static_cast<int64_t>(s.NH + 2 * s.KV) * s.hs, Co = static_cast<int64_t>(s.NH) * s.hs;
    const size_t pool = static_cast<size_t>(blocks) * s.bs * s.KV * s.hs;
    const Vec qkv = uniform(static_cast<size_t>(s.T) * W, 60, -2.0f, 2.0f);
    Halves kh(pool, 0), vh(pool, 0);
    ref::kv_cache_write_gqa_f16(kh.data(), vh.data(), qkv.data(), slots.data(), s.T, s.NH, s.KV, s.hs);
    Vec kf(pool), vf(pool);  // the same values in fp32
    for (size_t i = 0; i < pool; i++) kf[i] = q4::fp16_to_f32(kh[i]), vf[i] = q4::fp16_to_f32(vh[i]);
    const int first = s.T - s.fed;
    const float* q = qkv.data() + first * W;
    const size_t n_out = static_cast<size_t>(s.fed) * Co;
    Vec want(n_out);
    ref::paged_attention_gqa_f16_forward(want.data(), q, kh.data(), vh.data(), table.data(), seq.data(),
                                         pos.data() + first, s.fed, s.NH, s.KV, s.hs, s.bs, blocks);
    float scale = 0.0f;
    for (float x : want) scale = std::max(scale, std::fabs(x));
    Vec first_f32;  // the threads = 1 result
    for (int threads : {1, 2, 5, 32}) {
      omp_set_num_threads(threads);
      const std::string where = "T=" + std::to_string(s.T) + " NH=" + std::to_string(s.NH) +
                                " KV=" + std::to_string(s.KV) + " hs=" + std::to_string(s.hs) +
                                " fed=" + std::to_string(s.fed) + " threads=" + std::to_string(threads);
      Vec got(n_out, -1.0f), f32(n_out, -2.0f);
      cpu::paged_attention_gqa_f16_forward(got.data(), q, kh.data(), vh.data(), table.data(), seq.data(),
                                           pos.data() + first, s.fed, s.NH, s.KV, s.hs, s.bs, blocks);
      cpu::paged_attention_gqa_forward(f32.data(), q, kf.data(), vf.data(), table.data(), seq.data(),
                                       pos.data() + first, s.fed, s.NH, s.KV, s.hs, s.bs, blocks);
      for (size_t i = 0; i < n_out; i++) {
        ASSERT_LE(std::fabs(got[i] - want[i]), 1e-5f * scale + 1e-6f) << where << " at " << i;
        ASSERT_EQ(got[i], f32[i]) << where << " at " << i << ": the fp16 kernel against the fp32 one";
      }
      if (threads == 1) first_f32 = f32;
      for (size_t i = 0; i < n_out; i++) ASSERT_EQ(f32[i], first_f32[i]) << where << " at " << i << ": against 1 thread";
    }
  }
  omp_set_num_threads(saved);
}

}  // namespace
}  // namespace tessera
