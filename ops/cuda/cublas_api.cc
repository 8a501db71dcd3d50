#include "ops/cuda/cublas_api.h"

#include <dlfcn.h>

#include "ops/error.h"

namespace cnnflow::detail {

namespace {

template <typename F>
void Resolve(void* lib, const char* name, const std::string& file, F& fn) {
  fn = reinterpret_cast<F>(dlsym(lib, name));
  if (fn == nullptr) throw Error(StrCat(file, " has no ", name, ": not a usable cuBLAS"));
}

CublasApi Load() {
  std::string tried;
  for (const char* file : {"libcublas.so.13", "libcublas.so.12", "libcublas.so"}) {
    void* lib = dlopen(file, RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      const char* why = dlerror();
      tried += StrCat("\n  ", file, ": ", why ? why : "not found");
      continue;
    }
    CublasApi api;
    api.library = file;
    Resolve(lib, "cublasCreate_v2", api.library, api.Create);
    Resolve(lib, "cublasDestroy_v2", api.library, api.Destroy);
    Resolve(lib, "cublasSetStream_v2", api.library, api.SetStream);
    Resolve(lib, "cublasSetMathMode", api.library, api.SetMathMode);
    Resolve(lib, "cublasSgemm_v2", api.library, api.Sgemm);
    Resolve(lib, "cublasSgemmStridedBatched", api.library, api.SgemmStridedBatched);
    Resolve(lib, "cublasGemmEx", api.library, api.GemmEx);
    Resolve(lib, "cublasGetProperty", api.library, api.GetProperty);
    return api;  // the library stays loaded for the process
  }
  throw Error(StrCat("cannot load cuBLAS (needed by the linear layer on a GPU); tried:", tried,
                     "\nput the directory of libcublas.so.13 or .12 on LD_LIBRARY_PATH"));
}

}  // namespace

const CublasApi& Cublas() {
  static const CublasApi api = Load();  // a failed load throws, and is retried next call
  return api;
}

}  // namespace cnnflow::detail
