// The check both trainers make before they build a model: can this host
// hold its ranks? A rank that needs more than the host has would be killed
// part-way through building (or swap), so the job stops first with one line
// on every rank naming the host and the figures.
#pragma once

#include <string>

#include "comm/communicator.h"
#include "core/status.h"

namespace tessera {

// Collective over `world`. `least_bytes`: what the smallest rank needs at
// least; the host's ranks (comm::local_rank) need as many times that. More
// than the host's memory (physical, or the cgroup's limit) is every rank's
// InvalidArgument: "the job needs at least X GB (N ranks on host H, each at
// least Y GB: <parts>) but H has Z GB (<where the limit comes from>);
// <advice>".
Status check_host_memory(comm::Communicator& world, double least_bytes, const std::string& parts,
                         const std::string& advice);

}  // namespace tessera
