// Device mesh dp x tp x pp over the world communicator, with one
// sub-communicator per axis. Rank placement (docs/parallel.md): tp is the
// innermost axis, then dp, then pp, so tensor-parallel peers are adjacent
// ranks (same host, fastest links) and pipeline stages are farthest apart:
//   world_rank = pp_rank * (dp * tp) + dp_rank * tp + tp_rank
#pragma once

#include <memory>

#include "comm/communicator.h"

namespace tessera::comm {

struct MeshShape {
  int dp = 1, tp = 1, pp = 1;
  int size() const { return dp * tp * pp; }
};

struct MeshCoord {
  int dp = 0, tp = 0, pp = 0;
};

MeshCoord mesh_coord(const MeshShape& s, int world_rank);
int mesh_rank(const MeshShape& s, const MeshCoord& c);

class Mesh {
 public:
  // Splits world into the three axes. Error if shape.size() != world size.
  static Result<std::unique_ptr<Mesh>> create(Communicator& world, const MeshShape& shape);

  const MeshShape& shape() const { return shape_; }
  const MeshCoord& coord() const { return coord_; }
  Communicator& world() { return *world_; }
  Communicator& dp() { return *dp_; }
  Communicator& tp() { return *tp_; }
  Communicator& pp() { return *pp_; }

 private:
  Mesh() = default;
  MeshShape shape_;
  MeshCoord coord_;
  Communicator* world_ = nullptr;  // not owned
  std::unique_ptr<Communicator> dp_, tp_, pp_;
};

}  // namespace tessera::comm
