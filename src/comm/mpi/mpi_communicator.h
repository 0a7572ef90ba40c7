// The MPI backend of Communicator (CPU clusters), the single-process
// fallback, and how a Tessera process joins (or leaves) a job.
//
// Rendezvous is mpirun's (or srun's): every rank of the job calls
// mpi_world() once at start-up. Each communicator wraps its own MPI
// communicator (a duplicate of MPI_COMM_WORLD, or a split of one) with
// MPI_ERRORS_RETURN, so MPI failures come back as Status, never as an abort
// inside MPI. Operations are MPI's nonblocking calls; Work::wait() polls
// MPI_Test until done or the communicator's deadline, yielding the core
// (then sleeping 50-200 us) while it waits, so ranks oversubscribing cores
// don't starve each other. A wait that timed out leaves the Work valid (the
// operation is still posted): wait() may be called again, with a fresh
// deadline, e.g. after a late peer caught up.
//
// Counts: MPI counts are int. Longer all_reduce/broadcast/send/recv are
// issued as several operations of at most mpi_chunk_limit() elements (bytes
// for send/recv); all_gather uses a resized datatype per chunk;
// reduce_scatter over the limit is an InvalidArgument error; all_to_all_v
// (MPI_Ialltoallw) describes a block over the limit by a derived datatype.
//
// Lifetime: MPI is initialised by the first mpi_world() (MPI_THREAD_FUNNELED:
// only the thread that called it may use these communicators) and finalised
// by mpi_finalize() or, failing that, at exit. Communicators may be destroyed
// in any order, before or after finalisation.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "comm/communicator.h"

namespace tessera::comm {

// True when this process was started by mpirun/mpiexec (OpenMPI: the
// OMPI_COMM_WORLD_SIZE variable) or a PMI launcher such as srun (PMI_SIZE,
// PMIX_RANK), or MPI is already initialised.
bool launched_under_mpi();
// The MPI library's own name and version, first line ("Open MPI v4.1.4, ..."),
// callable before initialisation.
std::string mpi_library_version();

// Initialises MPI if needed and returns a communicator named "world" over
// all ranks of the job (a duplicate of MPI_COMM_WORLD; may be called again
// for another independent one, e.g. with a different timeout). Collective.
Result<std::unique_ptr<Communicator>> mpi_world(const CommOptions& options = {});

// mpi_world() when launched_under_mpi(), else self_communicator()
// (comm/local/self_communicator.h).
Result<std::unique_ptr<Communicator>> world_communicator(const CommOptions& options = {});

// MPI_Finalize if this process initialised MPI and has not finalised yet;
// idempotent. Operations still pending (Works destroyed before completing)
// get a few seconds to finish; if they don't, the job is aborted instead of
// hanging in MPI_Finalize.
void mpi_finalize();

// Prints "tessera: error: <message>" to stderr (once per process, whatever
// the number of callers) and ends the whole job: MPI_Abort(MPI_COMM_WORLD, 1)
// when MPI is initialised, else _exit(1).
[[noreturn]] void abort_job(const Status& status);

// The largest element count (bytes for send/recv) one MPI call carries;
// larger operations are split (see above). Default 2^30. Tests lower it to
// exercise the split paths with small buffers; not for production use.
int64_t mpi_chunk_limit();
void set_mpi_chunk_limit_for_testing(int64_t elements);

}  // namespace tessera::comm
