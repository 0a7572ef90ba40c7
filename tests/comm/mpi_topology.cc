// split() and the dp x tp x pp mesh: each sub-communicator has exactly the
// expected members, in the expected order, checked by all-gathering world
// ranks over it.
#include <algorithm>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "comm/mesh.h"
#include "comm/mpi/mpi_communicator.h"
#include "mpi_test_env.h"

namespace tessera::comm {
namespace {

using mpi_test::test_world;

// The world ranks of c's members in c's rank order, as c itself reports them
// (all_gather) and as world_rank_of says.
std::vector<int> gathered_world_ranks(Communicator& c) {
  const int32_t mine = test_world().rank();
  std::vector<int32_t> all(c.size(), -1);
  Status st = c.all_gather(&mine, all.data(), 1, ElemType::kI32);
  EXPECT_TRUE(st.ok()) << st.message();
  for (int r = 0; r < c.size(); r++) EXPECT_EQ(c.world_rank_of(r), all[r]) << "member " << r;
  return std::vector<int>(all.begin(), all.end());
}

TEST(MpiSplit, ByParityInReverseOrder) {
  Communicator& w = test_world();
  auto sub = w.split(w.rank() % 2, -w.rank(), "parity");
  ASSERT_TRUE(sub.ok()) << sub.status().message();
  Communicator& c = **sub;
  std::vector<int> want;
  for (int r = w.size() - 1; r >= 0; r--)
    if (r % 2 == w.rank() % 2) want.push_back(r);
  EXPECT_EQ(c.name(), "parity");
  EXPECT_EQ(c.size(), static_cast<int>(want.size()));
  EXPECT_EQ(want[c.rank()], w.rank());
  EXPECT_EQ(gathered_world_ranks(c), want);
  // A collective on the sub-communicator involves only its members.
  int32_t v = w.rank() + 1, sum = 0;
  for (int r : want) sum += r + 1;
  ASSERT_TRUE(c.all_reduce(&v, &v, 1, ElemType::kI32, ReduceOp::kSum).ok());
  EXPECT_EQ(v, sum);
}

TEST(MpiSplit, OneColorKeepsTheOrderAndSplitsNest) {
  Communicator& w = test_world();
  auto all = w.split(7, 0, "all");
  ASSERT_TRUE(all.ok()) << all.status().message();
  std::vector<int> want(w.size());
  for (int r = 0; r < w.size(); r++) want[r] = r;
  EXPECT_EQ(gathered_world_ranks(**all), want);
  auto single = (*all)->split(w.rank(), 0, "single");
  ASSERT_TRUE(single.ok()) << single.status().message();
  EXPECT_EQ((*single)->size(), 1);
  EXPECT_EQ(gathered_world_ranks(**single), std::vector<int>{w.rank()});
}

TEST(MpiSplit, NegativeColorIsInvalid) {
  auto sub = test_world().split(-1, 0, "bad");
  EXPECT_EQ(sub.status().code(), StatusCode::kInvalidArgument);
}

std::vector<MeshShape> shapes_of(int n) {
  std::vector<MeshShape> shapes;
  for (int dp = 1; dp <= n; dp++)
    for (int tp = 1; tp <= n; tp++)
      for (int pp = 1; pp <= n; pp++)
        if (dp * tp * pp == n) shapes.push_back({dp, tp, pp});
  return shapes;
}

// The world ranks along one axis through coord, in axis order.
std::vector<int> axis_members(const MeshShape& s, MeshCoord c, int MeshCoord::*axis, int axis_size) {
  std::vector<int> out;
  for (int i = 0; i < axis_size; i++) {
    c.*axis = i;
    out.push_back(mesh_rank(s, c));
  }
  return out;
}

TEST(MpiMesh, EveryShapeOfTheWorld) {
  Communicator& w = test_world();
  for (const MeshShape& s : shapes_of(w.size())) {
    SCOPED_TRACE(fmt::format("mesh dp={} tp={} pp={}", s.dp, s.tp, s.pp));
    auto mesh = Mesh::create(w, s);
    ASSERT_TRUE(mesh.ok()) << mesh.status().message();
    Mesh& m = **mesh;
    const MeshCoord c = mesh_coord(s, w.rank());
    EXPECT_EQ(m.coord().dp, c.dp);
    EXPECT_EQ(m.coord().tp, c.tp);
    EXPECT_EQ(m.coord().pp, c.pp);
    EXPECT_EQ(&m.world(), &w);
    EXPECT_EQ(m.dp().name(), "dp");
    EXPECT_EQ(m.tp().name(), "tp");
    EXPECT_EQ(m.pp().name(), "pp");
    EXPECT_EQ(m.dp().rank(), c.dp);
    EXPECT_EQ(m.tp().rank(), c.tp);
    EXPECT_EQ(m.pp().rank(), c.pp);
    EXPECT_EQ(gathered_world_ranks(m.dp()), axis_members(s, c, &MeshCoord::dp, s.dp));
    EXPECT_EQ(gathered_world_ranks(m.tp()), axis_members(s, c, &MeshCoord::tp, s.tp));
    EXPECT_EQ(gathered_world_ranks(m.pp()), axis_members(s, c, &MeshCoord::pp, s.pp));
  }
}

TEST(MpiMesh, ShapeMustCoverTheWorld) {
  Communicator& w = test_world();
  auto mesh = Mesh::create(w, MeshShape{w.size(), 2, 1});
  ASSERT_FALSE(mesh.ok());
  EXPECT_EQ(mesh.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(mesh.status().message().find("'world' has"), std::string::npos) << mesh.status().message();
}

}  // namespace
}  // namespace tessera::comm
