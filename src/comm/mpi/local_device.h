// One rank per GPU: which rank of its host this process is, and the CUDA
// device that follows from it. Plain C++ (the device API is
// runtime/cuda_device.h), usable with or without the CUDA backend.
#pragma once

#include <cstddef>
#include <string>

#include "core/status.h"

namespace tessera::comm {

struct LocalRank {
  int rank = 0;  // among the job's processes on this host
  int size = 1;  // the job's processes on this host; -1 when the source does not say
  std::string source;  // where it came from, for messages: "OMPI_COMM_WORLD_LOCAL_RANK", ...
};

// From the launcher's environment, in this order: OMPI_COMM_WORLD_LOCAL_RANK
// (+ _LOCAL_SIZE; OpenMPI's mpirun), MPI_LOCALRANKID (+ MPI_LOCALNRANKS;
// MPICH, Intel MPI), SLURM_LOCALID (+ SLURM_NTASKS_PER_NODE; srun); else,
// when MPI is initialised, MPI_Comm_split_type(MPI_COMM_TYPE_SHARED) over
// MPI_COMM_WORLD (collective: every rank must call it); else rank 0 of 1
// (not launched by MPI).
Result<LocalRank> local_rank();

// local_rank(), then cuda::select_device(local.rank, min_free_bytes). With
// exclusive (what NCCL needs), more ranks on this host than devices is an
// error naming both counts. Returns the device, now current on this thread.
Result<int> select_local_device(size_t min_free_bytes = 0, bool exclusive = true);

}  // namespace tessera::comm
