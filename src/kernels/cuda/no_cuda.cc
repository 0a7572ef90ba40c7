// The CUDA kernels' host entry points that every build declares (reduce.h),
// when the CUDA backend is not compiled in: each says why it cannot run.
// Built into tessera_kernels_cuda only in that case.
#include "kernels/cuda/libraries.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/reduce.h"

namespace tessera::cuda {

Result<double> sum_of_squares(const float*, int64_t) {
  return Status::Unavailable("CUDA support not compiled in (TESSERA_CUDA=OFF or no nvcc)");
}

Status cublaslt_available() {
  return Status::Unavailable("CUDA support not compiled in (TESSERA_CUDA=OFF or no nvcc)");
}

void set_attention_preference(AttentionImpl) {}  // no CUDA model to prefer for

}  // namespace tessera::cuda
