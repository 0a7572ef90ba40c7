// The one-rank communicator: size 1, rank 0. Every collective is a local
// copy; send and recv to peer 0 match each other in posting order per tag
// (a recv with no matching send fails at wait(), naming it, rather than
// hanging). For runs without mpirun and for tests; needs no MPI.
// Thread safety: as every Communicator (one issuing thread).
#pragma once

#include <memory>
#include <string>

#include "comm/communicator.h"

namespace tessera::comm {

std::unique_ptr<Communicator> self_communicator(const std::string& name = "self");

}  // namespace tessera::comm
