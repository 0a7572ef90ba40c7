#include "train/memory_check.h"

#include <fmt/format.h>

#include "comm/agree.h"
#include "comm/mpi/local_device.h"
#include "core/host.h"
#include "obs/process.h"

namespace tessera {

Status check_host_memory(comm::Communicator& world, double least_bytes, const std::string& parts,
                         const std::string& advice) {
  Result<comm::LocalRank> local = comm::local_rank();
  const int ranks_here = local.ok() && local->size > 0 ? local->size : 1;
  const obs::MemoryLimit limit = obs::host_memory_limit();
  Status mine;
  if (limit.bytes > 0 && least_bytes * ranks_here > limit.bytes) {
    const std::string who =
        ranks_here > 1 ? fmt::format("{} ranks on host {}, each", ranks_here, host_name()) : "this rank";
    mine = Status::InvalidArgument(fmt::format("the job needs at least {:.1f} GB ({} at least {:.1f} GB: {}) but {} "
                                               "has {:.1f} GB ({}); {}",
                                               least_bytes * ranks_here / 1e9, who, least_bytes / 1e9, parts,
                                               host_name(), limit.bytes / 1e9, limit.source, advice));
  }
  return comm::agree(world, mine);
}

}  // namespace tessera
