// What `tessera plan` does around the cost models, for GPT and DLRM jobs
// alike (plan/compare.h): counts, --layout, a whole layout priced as given,
// durations, and the comparison of clusters. The command's tables and
// verdicts are in tests/cli/plan.sh and plan_dlrm.sh.
#include "plan/compare.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "plan/model.h"

namespace tessera::plan {
namespace {

std::string write(const std::string& name, const std::string& text) {
  auto p = std::filesystem::temp_directory_path() / ("tessera_compare_test_" + std::to_string(::getpid()) + "_" + name);
  std::ofstream(p) << text;
  return p.string();
}

// One node of 8 A100s.
Cluster a100s() {
  auto c = load_cluster(write("c.toml",
                              "name = \"a100\"\n[node]\ntype = \"A100-80GB\"\ncount = 1\ndevices = 8\n"
                              "price_per_hour = 16\n[network]\nintra = \"nvlink3\"\n"),
                        0, 0);
  EXPECT_TRUE(c.ok()) << c.status().message();
  return *c;
}

ModelSpec small() {
  ModelSpec m = *model_preset("gpt2-124m");
  m.layers = 4, m.heads = 4, m.dim = 256, m.vocab = 50257, m.seq = 128, m.context = 256, m.global_batch = 64;
  return m;
}

TEST(PlanCompare, Counts) {
  EXPECT_EQ(*parse_count("--tokens", "", "10B"), 0);
  EXPECT_EQ(*parse_count("--tokens", "300M", "10B"), 300e6);
  EXPECT_EQ(*parse_count("--tokens", "2.5e9", "10B"), 2.5e9);
  EXPECT_EQ(*parse_count("--samples", "4.4B", "4.4B"), 4.4e9);
  EXPECT_EQ(*parse_count("--tokens", "4k", "10B"), 4e3);
  EXPECT_EQ(*parse_count("--tokens", "1T", "10B"), 1e12);
  EXPECT_EQ(*parse_count("--tokens", "3G", "10B"), 3e9);
  EXPECT_EQ(parse_count("--tokens", "ten", "10B, 300M").status().message(),
            "--tokens 'ten' is not a number (e.g. 10B, 300M)");
  EXPECT_EQ(parse_count("--samples", "5X", "4.4B").status().message(), "--samples '5X' is not a count (e.g. 4.4B)");
  EXPECT_EQ(parse_count("--samples", "-5", "4.4B").status().code(), StatusCode::kInvalidArgument);
}

TEST(PlanCompare, LayoutFlag) {
  auto l = parse_layout("dp=2,tp=1,pp=2,mb=4,ga=4,zero=1,nodes=1");
  ASSERT_TRUE(l.ok()) << l.status().message();
  EXPECT_EQ(l->dp, 2);
  EXPECT_EQ(l->pp, 2);
  EXPECT_EQ(l->micro_batch, 4);
  EXPECT_EQ(l->grad_accum, 4);
  EXPECT_EQ(l->zero, 1);
  EXPECT_EQ(l->nodes, 1);
  auto partial = parse_layout("dp=2");
  ASSERT_TRUE(partial.ok());
  EXPECT_EQ(partial->tp, 0);
  EXPECT_EQ(partial->nodes, 0);
  EXPECT_EQ(partial->zero, -1);
  EXPECT_EQ(parse_layout("dp").status().message(), "--layout: 'dp' is not KEY=N (keys dp, tp, pp, mb, ga, zero, nodes)");
  EXPECT_EQ(parse_layout("dp=2x").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(parse_layout("ep=2").status().message(), "--layout: unknown key 'ep' (dp, tp, pp, mb, ga, zero, nodes)");
  EXPECT_EQ(parse_layout("zero=2").status().message(), "--layout: zero must be 0 or 1, got 2");
  EXPECT_EQ(parse_layout("tp=0").status().message(), "--layout: tp must be at least 1, got 0");
}

TEST(PlanCompare, WholeLayoutIsPricedAsGiven) {
  const Cluster c = a100s();
  const Job job{small()};
  auto e = price_layout(job, c, *parse_layout("dp=4,tp=2,pp=1,mb=4"));
  ASSERT_TRUE(e.ok()) << e.status().message();
  EXPECT_EQ(e->layout.nodes, 1);
  EXPECT_EQ(e->layout.zero, 0);
  EXPECT_EQ(e->layout.grad_accum, 4);  // 64 / (4 x 4)
  Layout same = e->layout;
  EXPECT_EQ(e->step, estimate(job, c, same).step);
  // Given ga overrides the global batch: 4 x 4 x 2.
  auto ga = price_layout(job, c, *parse_layout("dp=4,tp=2,pp=1,mb=4,ga=2"));
  ASSERT_TRUE(ga.ok());
  EXPECT_EQ(ga->tokens_per_step, 32.0 * 128);
}

TEST(PlanCompare, WholeLayoutRefusals) {
  const Cluster c = a100s();
  const Job job{small()};
  EXPECT_EQ(price_layout(job, c, *parse_layout("dp=2,tp=1,pp=1,mb=4")).status().message(),
            "--layout dp=2 tp=1 pp=1 mb=4 ga=0 uses 2 ranks, but 1 nodes of a100 have 8");
  const Status tp = price_layout(job, c, *parse_layout("dp=1,tp=8,pp=1,mb=4")).status();
  EXPECT_EQ(tp.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(tp.message().rfind("--layout: ", 0), 0u) << tp.message();
  EXPECT_EQ(price_layout(job, c, *parse_layout("dp=1,tp=1,pp=8,mb=4")).status().message(),
            "--layout: pp=8 exceeds the 4 layers");
  EXPECT_EQ(price_layout(job, c, *parse_layout("dp=8,tp=1,pp=1,mb=3")).status().message(),
            "--layout: dp x mb = 24 does not divide the global batch 64");
}

TEST(PlanCompare, ClusterOverrides) {
  const std::string f = write("o.toml",
                              "[node]\ntype = \"A100-80GB\"\ncount = 1\ndevices = 8\nprice_per_hour = 16\n"
                              "[network]\nintra = \"nvlink3\"\n");
  auto c = load_cluster(f, 4, 6);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->ranks_per_node, 4);
  EXPECT_EQ(c->threads_per_rank, 6);
  EXPECT_EQ(load_cluster(f, 0, 0)->ranks_per_node, 8);
  EXPECT_FALSE(load_cluster("/nonexistent/c.toml", 0, 0).ok());
}

TEST(PlanCompare, Durations) {
  EXPECT_EQ(duration_text(0), "-");
  EXPECT_EQ(duration_text(-1), "-");
  EXPECT_EQ(duration_text(0.0123), "12.3 ms");
  EXPECT_EQ(duration_text(4.561), "4.56 s");
  EXPECT_EQ(duration_text(468), "7.8 min");
  EXPECT_EQ(duration_text(3.1 * 3600), "3.1 h");
  EXPECT_EQ(duration_text(4.4 * 86400), "4.4 days");
}

TEST(PlanCompare, FastestCheaperAndNowhere) {
  const std::vector<ClusterOutcome> c = {{"a", true, 2.0, 100, ""},
                                         {"b", false, 0, 0, "needs 90 GB of 80"},
                                         {"c", true, 1.0, 300, ""},
                                         {"d", true, 1.0, 50, ""}};
  EXPECT_EQ(fastest_cluster(c), 2);  // ties: the first
  EXPECT_EQ(fastest_cluster({c[1]}), -1);
  EXPECT_EQ(fastest_cluster({}), -1);
  EXPECT_EQ(cost_comparison(100, 130), " and 1.3x cheaper");
  EXPECT_EQ(cost_comparison(100, 50), " but 2.0x dearer");
  EXPECT_EQ(cost_comparison(100, 104), " at about the same cost");
  EXPECT_EQ(cost_comparison(0, 104), "");
  EXPECT_EQ(cost_comparison(100, 0), "");
  const Status none = fits_nowhere({{"a", false, 0, 0, "too big"}, {"b", false, 0, 0, "no layout"}});
  EXPECT_EQ(none.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(none.message(), "the model fits on no cluster given (a: too big; b: no layout)");
}

}  // namespace
}  // namespace tessera::plan
