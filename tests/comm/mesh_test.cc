// Mesh rank placement (tp innermost, then dp, then pp) and Mesh::create on a
// single process; the multi-rank mesh is tested under mpirun
// (mpi_topology.cc).
#include <gtest/gtest.h>

#include "comm/mesh.h"
#include "comm/local/self_communicator.h"

namespace tessera::comm {
namespace {

TEST(MeshCoord, RoundTripsAndPutsTensorParallelPeersAdjacent) {
  const MeshShape s{3, 2, 4};  // dp, tp, pp
  for (int r = 0; r < s.size(); r++) {
    MeshCoord c = mesh_coord(s, r);
    EXPECT_EQ(mesh_rank(s, c), r);
    EXPECT_EQ(r, c.pp * 6 + c.dp * 2 + c.tp);
  }
  MeshCoord c = mesh_coord(s, 17);  // 17 = 2*6 + 2*2 + 1
  EXPECT_EQ(c.pp, 2);
  EXPECT_EQ(c.dp, 2);
  EXPECT_EQ(c.tp, 1);
}

TEST(Mesh, SingleProcess) {
  auto world = self_communicator();
  auto mesh = Mesh::create(*world, MeshShape{});
  ASSERT_TRUE(mesh.ok()) << mesh.status().message();
  EXPECT_EQ((*mesh)->dp().size(), 1);
  EXPECT_EQ((*mesh)->tp().name(), "tp");
  EXPECT_EQ((*mesh)->pp().rank(), 0);
}

TEST(Mesh, ShapeMismatchAndZeroAxesAreErrors) {
  auto world = self_communicator();
  auto two = Mesh::create(*world, MeshShape{2, 1, 1});
  EXPECT_EQ(two.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(two.status().message().find("dp=2 x tp=1 x pp=1 = 2 ranks"), std::string::npos)
      << two.status().message();
  EXPECT_EQ(Mesh::create(*world, MeshShape{1, 0, 1}).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tessera::comm
