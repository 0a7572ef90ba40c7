// Local rank (launcher environment, else MPI's shared-memory split) and the
// CUDA device it selects.
#include "comm/mpi/local_device.h"

#include <mpi.h>

#include <cstdlib>

#include <fmt/format.h>

#include "runtime/cuda_device.h"

namespace tessera::comm {

namespace {

// The variable as a non-negative int, or -1 (unset or not a number).
int env_int(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return -1;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  return *end == '\0' && n >= 0 && n < (1 << 30) ? static_cast<int>(n) : -1;
}

}  // namespace

Result<LocalRank> local_rank() {
  struct Source {
    const char* rank_var;
    const char* size_var;
  };
  for (const Source& s : {Source{"OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"},
                          Source{"MPI_LOCALRANKID", "MPI_LOCALNRANKS"},
                          Source{"SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"}}) {
    const int r = env_int(s.rank_var);
    if (r < 0) continue;
    const int n = env_int(s.size_var);
    return LocalRank{r, n > r ? n : -1, s.rank_var};
  }
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (!init || fin) return LocalRank{0, 1, "not launched by MPI"};
  MPI_Comm node;
  if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node) != MPI_SUCCESS)
    return Status::Unavailable("local rank: MPI_Comm_split_type(MPI_COMM_TYPE_SHARED) failed");
  LocalRank out{0, 1, "MPI_Comm_split_type"};
  MPI_Comm_rank(node, &out.rank);
  MPI_Comm_size(node, &out.size);
  MPI_Comm_free(&node);
  return out;
}

Result<int> select_local_device(size_t min_free_bytes, bool exclusive) {
  ASSIGN_OR_RETURN(LocalRank local, local_rank());
  if (exclusive && local.size > 0) {
    const int devices = cuda::device_count();
    if (devices > 0 && local.size > devices)
      return Status::Unavailable(fmt::format("{} ranks on this host (local rank {}, {}) but {} CUDA device(s); "
                                             "run one rank per GPU",
                                             local.size, local.rank, local.source, devices));
  }
  Result<int> device = cuda::select_device(local.rank, min_free_bytes);
  if (!device.ok()) return device.status().With(fmt::format("local rank {} ({})", local.rank, local.source));
  return device;
}

}  // namespace tessera::comm
