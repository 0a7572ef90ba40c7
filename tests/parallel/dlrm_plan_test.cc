// The DLRM table placement planner (parallel/dlrm_plan.h): coverage, balance,
// row splits over the budget, and one clear error for what cannot be placed.
#include "parallel/dlrm_plan.h"

#include <gtest/gtest.h>

#include <algorithm>

namespace tessera {
namespace {

DlrmConfig config_with(std::vector<int> rows, int dim = 16) {
  DlrmConfig c;
  c.num_dense = 4;
  c.dim = dim;
  c.bottom = {8, dim};
  c.top = {8};
  c.table_rows = std::move(rows);
  return c;
}

DlrmPlanOptions opts(int ranks, int64_t budget = 0, const char* placement = "auto", std::vector<double> lookups = {},
                     int state_floats_per_row = 1) {
  DlrmPlanOptions o;
  o.ranks = ranks;
  o.budget_bytes = budget;
  o.placement = placement;
  o.lookups = std::move(lookups);
  o.state_floats_per_row = state_floats_per_row;
  return o;
}

// Every table's rows covered exactly once, in order, no empty shard.
void expect_covers(const DlrmConfig& c, const DlrmPlan& p, int ranks) {
  for (int t = 0; t < static_cast<int>(c.table_rows.size()); t++) {
    int64_t next = 0;
    for (const DlrmShard& s : p.shards) {
      if (s.table != t) continue;
      EXPECT_EQ(s.row_begin, next) << "table " << t;
      EXPECT_LT(s.row_begin, s.row_end) << "table " << t;
      EXPECT_GE(s.rank, 0);
      EXPECT_LT(s.rank, ranks);
      next = s.row_end;
    }
    EXPECT_EQ(next, c.table_rows[t]) << "table " << t;
  }
}

TEST(DlrmPlan, OneRankHoldsEveryWholeTable) {
  const DlrmConfig c = config_with({10, 20, 30});
  auto p = plan_dlrm_tables(c, opts(1, 0, "auto"));
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  ASSERT_EQ(p->shards.size(), 3u);
  expect_covers(c, *p, 1);
  EXPECT_EQ(p->rank_bytes[0], (10 + 20 + 30) * (16 + 1) * 4);
}

TEST(DlrmPlan, TableWiseBalancesMemory) {
  // 8 tables of sizes 1..8 (x1000) over 2 ranks, lookups in proportion to
  // rows (so the two loads agree): 36k rows, 18k each is possible.
  std::vector<int> rows;
  std::vector<double> lookups;
  for (int i = 1; i <= 8; i++) {
    rows.push_back(i * 1000);
    lookups.push_back(i);
  }
  const DlrmConfig c = config_with(rows);
  auto p = plan_dlrm_tables(c, opts(2, 0, "table", lookups));
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  expect_covers(c, *p, 2);
  EXPECT_EQ(p->shards.size(), 8u);  // whole tables
  const int64_t hi = *std::max_element(p->rank_bytes.begin(), p->rank_bytes.end());
  const int64_t lo = *std::min_element(p->rank_bytes.begin(), p->rank_bytes.end());
  EXPECT_LE(static_cast<double>(hi - lo) / hi, 0.1);
  EXPECT_NEAR(p->rank_lookups[0] + p->rank_lookups[1], 36.0, 1e-9);
}

TEST(DlrmPlan, TableWiseBalancesLookupsWhenMemoryIsEqual) {
  // Four equal tables; two are looked up 10x as often: each rank gets one hot one.
  const DlrmConfig c = config_with({1000, 1000, 1000, 1000});
  auto p = plan_dlrm_tables(c, opts(2, 0, "table", {10, 10, 1, 1}));
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_DOUBLE_EQ(p->rank_lookups[0], 11.0);
  EXPECT_DOUBLE_EQ(p->rank_lookups[1], 11.0);
  EXPECT_NE(p->shards[0].rank, p->shards[1].rank);
}

TEST(DlrmPlan, RowWiseSplitsEveryTableOverAllRanks) {
  const DlrmConfig c = config_with({10, 7, 3});
  auto p = plan_dlrm_tables(c, opts(4, 0, "row"));
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  expect_covers(c, *p, 4);
  EXPECT_EQ(p->pieces(0), 4);
  EXPECT_EQ(p->pieces(1), 4);
  EXPECT_EQ(p->pieces(2), 3);  // 3 rows on 4 ranks: no empty shard
  for (const DlrmShard& s : p->shards) EXPECT_LE(s.row_end - s.row_begin, 3);
}

TEST(DlrmPlan, AutoSplitsOnlyTheTableOverTheBudget) {
  // Row = (16 + 1) * 4 = 68 bytes. Budget 1000 rows; table 0 has 2500 rows
  // (3 pieces on 3 distinct ranks), the small tables stay whole.
  const DlrmConfig c = config_with({2500, 100, 200, 300});
  auto p = plan_dlrm_tables(c, opts(4, 1000 * 68, "auto"));
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  expect_covers(c, *p, 4);
  EXPECT_EQ(p->placement, "auto");
  EXPECT_EQ(p->pieces(0), 3);
  EXPECT_EQ(p->pieces(1), 1);
  EXPECT_EQ(p->pieces(2), 1);
  EXPECT_EQ(p->pieces(3), 1);
  std::vector<int> ranks_of_0;
  for (const DlrmShard& s : p->shards)
    if (s.table == 0) ranks_of_0.push_back(s.rank);
  std::sort(ranks_of_0.begin(), ranks_of_0.end());
  EXPECT_EQ(std::unique(ranks_of_0.begin(), ranks_of_0.end()) - ranks_of_0.begin(), 3);
  for (int64_t b : p->rank_bytes) EXPECT_LE(b, 1000 * 68);
}

TEST(DlrmPlan, AutoFallsBackToRowWiseWhenWholeTablesDoNotPack) {
  // Three tables of 600 rows, budget 900 rows on 2 ranks: whole tables need
  // 1200 rows on one rank; row-wise gives each rank 900.
  const DlrmConfig c = config_with({600, 600, 600});
  auto p = plan_dlrm_tables(c, opts(2, 900 * 68, "auto"));
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  expect_covers(c, *p, 2);
  EXPECT_EQ(p->placement, "row");
  EXPECT_EQ(p->rank_bytes[0], 900 * 68);
  EXPECT_EQ(p->rank_bytes[1], 900 * 68);
}

TEST(DlrmPlan, SgdStateTakesNoMemory) {
  const DlrmConfig c = config_with({100});
  auto p = plan_dlrm_tables(c, opts(1, 0, "auto", {}, 0));
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->rank_bytes[0], 100 * 16 * 4);
}

TEST(DlrmPlan, MoreRanksThanTablesLeavesRanksEmptyTableWise) {
  const DlrmConfig c = config_with({100, 100});
  auto p = plan_dlrm_tables(c, opts(4, 0, "table"));
  ASSERT_TRUE(p.ok());
  expect_covers(c, *p, 4);
  EXPECT_EQ(std::count(p->rank_bytes.begin(), p->rank_bytes.end(), 0), 2);
}

void expect_error(const DlrmConfig& c, const DlrmPlanOptions& o, const std::string& needle) {
  auto p = plan_dlrm_tables(c, o);
  ASSERT_FALSE(p.ok()) << "want an error containing '" << needle << "'";
  EXPECT_NE(p.status().message().find(needle), std::string::npos) << p.status().message();
  EXPECT_EQ(p.status().message().find('\n'), std::string::npos) << "one line";
}

TEST(DlrmPlan, ZeroRanksIsAnError) { expect_error(config_with({10}), opts(0, 0, "auto"), "ranks must be >= 1"); }

TEST(DlrmPlan, UnknownPlacementIsAnError) {
  expect_error(config_with({10}), opts(2, 0, "column"), "'column' is not table, row or auto");
}

TEST(DlrmPlan, LookupsOfTheWrongLengthAreAnError) {
  expect_error(config_with({10, 10}), opts(2, 0, "auto", {1}), "1 lookups per sample given for 2 tables");
  expect_error(config_with({10, 10}), opts(2, 0, "auto", {1, -1}), "table 1's lookups");
}

TEST(DlrmPlan, BudgetTooSmallForAllTablesIsAnError) {
  expect_error(config_with({1000, 1000}), opts(2, 900 * 68, "auto"), "more than 2 rank(s)");
}

TEST(DlrmPlan, BudgetSmallerThanOneRowIsAnError) {
  expect_error(config_with({1}), opts(2, 10, "auto"), "smaller than one row");
}

TEST(DlrmPlan, TableOverTheBudgetIsAnErrorTableWise) {
  expect_error(config_with({2000, 10}), opts(4, 1000 * 68, "table"),
               "table 0 (132.81 KiB) does not fit one rank's budget");
}

TEST(DlrmPlan, TableNeedingMorePiecesThanRanksIsAnError) {
  // 3 rows of 68 bytes, a budget of 1.5 rows on 2 ranks: the total (204
  // bytes) fits 2 x 102, but whole rows do not: 3 pieces of one row each.
  expect_error(config_with({3}), opts(2, 102, "auto"), "table 0 (204 bytes) needs 3 ranks");
  expect_error(config_with({3}), opts(2, 102, "row"), "rank 1 would hold 136 bytes");
}

TEST(DlrmPlan, DescribeNamesEveryRank) {
  auto p = plan_dlrm_tables(config_with({10, 20}), opts(2, 0, "row"));
  ASSERT_TRUE(p.ok());
  const std::string d = describe_plan(*p);
  EXPECT_NE(d.find("rank 0:"), std::string::npos);
  EXPECT_NE(d.find("rank 1:"), std::string::npos);
  EXPECT_NE(d.find("t1[10,20)"), std::string::npos);
}

}  // namespace
}  // namespace tessera
