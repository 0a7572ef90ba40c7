#include "kernels/cuda/cublaslt_api.h"
#include "kernels/cuda/libraries.h"

#include <dlfcn.h>

#include <mutex>
#include <string>
#include <type_traits>

#define TESSERA_STR2(x) #x
#define TESSERA_STR(x) TESSERA_STR2(x)

namespace tessera::cuda {

namespace {

constexpr const char* kSoname = "libcublasLt.so." TESSERA_STR(CUBLAS_VER_MAJOR);

Result<const CublasLtApi*> load() {
  void* lib = ::dlopen(kSoname, RTLD_NOW | RTLD_LOCAL);
  std::string why = lib == nullptr ? ::dlerror() : "";
#ifdef TESSERA_CUBLASLT_PATH
  if (lib == nullptr) lib = ::dlopen(TESSERA_CUBLASLT_PATH, RTLD_NOW | RTLD_LOCAL);
#endif
  if (lib == nullptr)
    return Status::Unavailable("cannot load cuBLASLt, which the CUDA backend's matmul needs: " + why +
                               " (install the CUDA toolkit's cuBLAS, or add its lib directory to LD_LIBRARY_PATH)");
  static CublasLtApi api;  // never unloaded: the driver tears down after static destructors
  const char* missing = nullptr;
  auto sym = [&](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(::dlsym(lib, name));
    if (fn == nullptr && missing == nullptr) missing = name;
  };
  sym(api.Create, "cublasLtCreate");
  sym(api.MatmulDescCreate, "cublasLtMatmulDescCreate");
  sym(api.MatmulDescDestroy, "cublasLtMatmulDescDestroy");
  sym(api.MatmulDescSetAttribute, "cublasLtMatmulDescSetAttribute");
  sym(api.MatrixLayoutCreate, "cublasLtMatrixLayoutCreate");
  sym(api.MatrixLayoutDestroy, "cublasLtMatrixLayoutDestroy");
  sym(api.MatmulPreferenceCreate, "cublasLtMatmulPreferenceCreate");
  sym(api.MatmulPreferenceDestroy, "cublasLtMatmulPreferenceDestroy");
  sym(api.MatmulPreferenceSetAttribute, "cublasLtMatmulPreferenceSetAttribute");
  sym(api.MatmulAlgoGetHeuristic, "cublasLtMatmulAlgoGetHeuristic");
  sym(api.Matmul, "cublasLtMatmul");
  if (missing != nullptr)
    return Status::Unavailable(std::string(kSoname) + " has no " + missing + " (a cuBLASLt older than the headers " +
                               "this binary was built with?)");
  return &api;
}

}  // namespace

Result<const CublasLtApi*> cublaslt() {
  static std::once_flag once;
  static Result<const CublasLtApi*> loaded = Status::Unavailable("not loaded");
  std::call_once(once, [] { loaded = load(); });
  return loaded;
}

Status cublaslt_available() { return cublaslt().status(); }

}  // namespace tessera::cuda
