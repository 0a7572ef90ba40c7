// The NCCL backend of Communicator (GPUs), as seen from code that must build
// with or without it: plain C++, no CUDA or NCCL headers. Without NCCL
// (TESSERA_HAVE_NCCL undefined: TESSERA_CUDA=OFF, no nvcc, or no libnccl)
// nccl_compiled() is false and make_nccl_communicator() returns
// Status::Unavailable("Tessera was built without NCCL ...")
// (comm/nccl/no_nccl.cc). The communicator itself, with its CUDA stream
// hooks, is comm/nccl/nccl_communicator.h (needs the CUDA headers).
#pragma once

#include <memory>
#include <string>

#include "comm/communicator.h"

namespace tessera::comm {

// True when the NCCL communicator is compiled into this binary.
bool nccl_compiled();
// "2.28.9": the NCCL library in use (ncclGetVersion); "" if not compiled.
std::string nccl_version();

// A communicator over the same ranks as `bootstrap`, in the same order
// (rank r here is rank r there, world_rank_of() agrees), on the calling
// thread's current CUDA device: select it first (comm/mpi/local_device.h),
// one device per rank. Rank 0 creates an NCCL unique id and broadcasts it
// over `bootstrap`, a host-memory communicator (MPI, or self for one rank)
// that is used only during this call. Collective over `bootstrap`; bounded
// by options.timeout (a rank that never joins is a Status::Unavailable, not
// a hang). Buffers passed to the result's operations are device pointers.
Result<std::unique_ptr<Communicator>> make_nccl_communicator(Communicator& bootstrap, const std::string& name,
                                                             const CommOptions& options = {});

}  // namespace tessera::comm
