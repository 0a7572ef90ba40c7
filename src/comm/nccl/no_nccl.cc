// comm/nccl/nccl_factory.h when the NCCL communicator is not compiled in:
// every call says why. Built into tessera_core only in that case.
#include "comm/nccl/nccl_factory.h"

namespace tessera::comm {

bool nccl_compiled() { return false; }
std::string nccl_version() { return ""; }

Result<std::unique_ptr<Communicator>> make_nccl_communicator(Communicator&, const std::string& name,
                                                             const CommOptions&) {
#ifdef TESSERA_HAVE_CUDA
  const char* why = "the CUDA backend is, but nccl.h/libnccl were not found at configure time (set NCCL_ROOT, "
                    "or TESSERA_NCCL=ON to make it an error)";
#else
  const char* why = "it needs the CUDA backend (TESSERA_CUDA=OFF or no nvcc)";
#endif
  return Status::Unavailable("communicator '" + name + "': Tessera was built without NCCL; " + why);
}

}  // namespace tessera::comm
