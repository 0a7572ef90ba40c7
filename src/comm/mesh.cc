#include "comm/mesh.h"

#include <fmt/format.h>

namespace tessera::comm {

MeshCoord mesh_coord(const MeshShape& s, int world_rank) {
  MeshCoord c;
  c.tp = world_rank % s.tp;
  c.dp = (world_rank / s.tp) % s.dp;
  c.pp = world_rank / (s.tp * s.dp);
  return c;
}

int mesh_rank(const MeshShape& s, const MeshCoord& c) { return c.pp * (s.dp * s.tp) + c.dp * s.tp + c.tp; }

Result<std::unique_ptr<Mesh>> Mesh::create(Communicator& world, const MeshShape& shape) {
  if (shape.dp < 1 || shape.tp < 1 || shape.pp < 1)
    return Status::InvalidArgument(
        fmt::format("mesh dp={} tp={} pp={}: every axis must be at least 1", shape.dp, shape.tp, shape.pp));
  if (shape.size() != world.size())
    return Status::InvalidArgument(fmt::format("mesh dp={} x tp={} x pp={} = {} ranks, but communicator '{}' has {}",
                                               shape.dp, shape.tp, shape.pp, shape.size(), world.name(),
                                               world.size()));
  std::unique_ptr<Mesh> mesh(new Mesh());
  mesh->shape_ = shape;
  mesh->coord_ = mesh_coord(shape, world.rank());
  mesh->world_ = &world;
  // One split per axis: the color is this rank's mesh rank with that axis's
  // coordinate zeroed (the same for exactly the ranks that differ only along
  // the axis), the key its coordinate along the axis, so axis rank == coord.
  const MeshCoord c = mesh->coord_;
  MeshCoord dp_color = c, tp_color = c, pp_color = c;
  dp_color.dp = 0;
  tp_color.tp = 0;
  pp_color.pp = 0;
  ASSIGN_OR_RETURN(mesh->dp_, world.split(mesh_rank(shape, dp_color), c.dp, "dp"));
  ASSIGN_OR_RETURN(mesh->tp_, world.split(mesh_rank(shape, tp_color), c.tp, "tp"));
  ASSIGN_OR_RETURN(mesh->pp_, world.split(mesh_rank(shape, pp_color), c.pp, "pp"));
  return mesh;
}

}  // namespace tessera::comm
