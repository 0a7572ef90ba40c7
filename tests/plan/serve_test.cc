// The serving estimate (plan/serve.h): a decode step is its reads at the
// roof or its arithmetic at the peak, whichever is longer; the memory is
// the weights and the batch's cache; the roof is a profile's cpu.mem.read
// where it has one; Tessera's GPU path serves fp32 and bf16 only.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <unistd.h>

#include "plan/hardware.h"
#include "plan/model.h"
#include "plan/serve.h"

namespace tessera::plan {
namespace {

ModelSpec gpt2() {
  auto m = model_preset("gpt2-124m");
  EXPECT_TRUE(m.ok());
  return *m;
}

NodeType cpu_node(double read_bw, double peak) {
  NodeType n;
  n.name = "cpu";
  n.kind = DeviceKind::kCpu;
  n.cores = 2;
  n.memory = 24e9;
  n.mem_bw = read_bw / 2;
  n.read_bw = read_bw;
  n.peak["fp32"] = peak;
  return n;
}

TEST(PlanServe, OneSequenceReadsEveryMatmulWeightAtTheRoof) {
  const ModelSpec m = gpt2();
  const DecoderConfig c = m.shape();
  const double matmul = c.flops_per_token(0) / 6.0;  // the blocks' matrices and the head
  EXPECT_NEAR(matmul, 124.4e6, 0.1e6);
  auto e = estimate_serving(m, cpu_node(50e9, 1e15), ServeJob{"int8", 1, 128, 64}, 0);
  ASSERT_TRUE(e.ok()) << e.status().message();
  EXPECT_DOUBLE_EQ(e->stream_bytes, matmul);
  EXPECT_DOUBLE_EQ(e->kv_bytes_per_token, 2.0 * 12 * 768 * 2);
  const double read = matmul + (128 + 32) * e->kv_bytes_per_token;  // the mean context: prompt + tokens / 2
  EXPECT_DOUBLE_EQ(e->cache_read_bytes, (128 + 32) * e->kv_bytes_per_token);
  EXPECT_DOUBLE_EQ(e->decode_step, read / 50e9);
  EXPECT_FALSE(e->compute_bound);
  EXPECT_DOUBLE_EQ(e->decode_tokens_per_s, 50e9 / read);
  EXPECT_EQ(e->roof_source, "the profile's cpu.mem.read");
  // int4: 18 bytes for 32 weights; fp32 4.
  auto i4 = estimate_serving(m, cpu_node(50e9, 1e15), ServeJob{"int4", 1, 128, 64}, 0);
  auto f32 = estimate_serving(m, cpu_node(50e9, 1e15), ServeJob{"fp32", 1, 128, 64}, 0);
  ASSERT_TRUE(i4.ok() && f32.ok());
  EXPECT_DOUBLE_EQ(i4->stream_bytes, matmul * 18 / 32);
  EXPECT_DOUBLE_EQ(f32->stream_bytes, matmul * 4);
  EXPECT_GT(i4->decode_tokens_per_s, e->decode_tokens_per_s);
  EXPECT_LT(f32->decode_tokens_per_s, e->decode_tokens_per_s);
}

TEST(PlanServe, ABatchSharesTheWeightsUntilTheArithmeticBinds) {
  const ModelSpec m = gpt2();
  auto one = estimate_serving(m, cpu_node(50e9, 2e12), ServeJob{"int8", 1, 128, 64}, 0);
  auto eight = estimate_serving(m, cpu_node(50e9, 2e12), ServeJob{"int8", 8, 128, 64}, 0);
  auto many = estimate_serving(m, cpu_node(50e9, 200e9), ServeJob{"int8", 64, 128, 64}, 0);
  ASSERT_TRUE(one.ok() && eight.ok() && many.ok());
  EXPECT_GT(eight->decode_tokens_per_s, 4 * one->decode_tokens_per_s);
  EXPECT_TRUE(many->compute_bound);
  const DecoderConfig c = m.shape();
  const double flops = 64 * (2.0 * c.flops_per_token(0) / 6.0 + 4.0 * 12 * 160 * 768);
  EXPECT_DOUBLE_EQ(many->decode_step, flops / 200e9);
}

TEST(PlanServe, MemoryIsTheWeightsAndTheBatchsCache) {
  const ModelSpec m = gpt2();
  NodeType small = cpu_node(50e9, 1e12);
  small.memory = 0.2e9;
  auto e = estimate_serving(m, small, ServeJob{"fp32", 4, 1000, 1000}, 0);
  ASSERT_TRUE(e.ok());
  EXPECT_DOUBLE_EQ(e->weight_bytes, 4.0 * m.parameters());
  EXPECT_DOUBLE_EQ(e->cache_bytes, 4.0 * 2000 * e->kv_bytes_per_token);
  EXPECT_DOUBLE_EQ(e->memory, e->weight_bytes + 4.0 * 2000 * e->kv_bytes_per_token);
  EXPECT_FALSE(e->fits);
  EXPECT_NE(e->refusal.find("GB of weights"), std::string::npos) << e->refusal;
  EXPECT_NE(e->refusal.find("of one node"), std::string::npos) << e->refusal;
}

TEST(PlanServe, TheRoofAndThePrice) {
  const ModelSpec m = gpt2();
  NodeType n = cpu_node(50e9, 1e15);
  n.read_bw = 0;  // no cpu.mem.read: the triad, named
  n.source = "profile p.json (x, y)";
  auto e = estimate_serving(m, n, ServeJob{"int8", 1, 16, 16}, 3.6);
  ASSERT_TRUE(e.ok());
  EXPECT_DOUBLE_EQ(e->roof, 25e9);
  EXPECT_NE(e->roof_source.find("triad"), std::string::npos) << e->roof_source;
  EXPECT_NEAR(e->usd_per_million, 3.6 / 3600 / e->decode_tokens_per_s * 1e6, 1e-12);
  auto h100 = catalogue_entry("H100-SXM");
  ASSERT_TRUE(h100.ok());
  auto g = estimate_serving(m, *h100, ServeJob{"bf16", 1, 16, 16}, 3);
  ASSERT_TRUE(g.ok()) << g.status().message();
  EXPECT_DOUBLE_EQ(g->roof, h100->mem_bw);
  EXPECT_EQ(g->roof_source, "the datasheet's memory bandwidth");
}

TEST(PlanServe, RefusalsNameWhatIsWrong) {
  const ModelSpec m = gpt2();
  auto h100 = catalogue_entry("H100-SXM");
  ASSERT_TRUE(h100.ok());
  auto g = estimate_serving(m, *h100, ServeJob{"int8", 1, 16, 16}, 0);
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.status().message().find("int8 is a CPU tier"), std::string::npos) << g.status().message();
  auto d = estimate_serving(m, cpu_node(1e9, 1e9), ServeJob{"fp8", 1, 16, 16}, 0);
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("serving dtype 'fp8'"), std::string::npos);
  auto b = estimate_serving(m, cpu_node(1e9, 1e9), ServeJob{"int8", 0, 16, 16}, 0);
  EXPECT_FALSE(b.ok());
}

TEST(PlanServe, AProfilesReadRoofIsRead) {
  auto p = std::filesystem::temp_directory_path() / ("tessera_serve_test_" + std::to_string(::getpid()) + ".json");
  std::ofstream(p) << R"({"schema": "tessera.profile", "version": 1,
    "machine": {"cores": 2, "threads": 2, "memory_bytes": 25e9},
    "figures": [{"name": "cpu.gemm.fp32.peak", "value": 200},
                {"name": "cpu.mem.triad", "value": 30},
                {"name": "cpu.mem.read", "value": 48}]})";
  auto n = node_from_profile(p.string());
  std::filesystem::remove(p);
  ASSERT_TRUE(n.ok()) << n.status().message();
  EXPECT_DOUBLE_EQ(n->read_bw, 48e9);
  EXPECT_DOUBLE_EQ(n->mem_bw, 30e9);
}

}  // namespace
}  // namespace tessera::plan
