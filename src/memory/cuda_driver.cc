#include "memory/cuda_driver.h"

#include <dlfcn.h>

#include <type_traits>

#include "absl/strings/str_cat.h"

namespace kvpage::internal {
namespace {

// cuda.h maps several names to versioned symbols (cuMemsetD8 -> cuMemsetD8_v2): look up what
// the macro expands to.
#define KVPAGE_CU_NAME_(x) #x
#define KVPAGE_CU_NAME(x) KVPAGE_CU_NAME_(x)

absl::StatusOr<CudaDriver> Load() {
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    return absl::UnavailableError(absl::StrCat("cannot load libcuda.so.1: ", dlerror()));
  }
  CudaDriver d;
  absl::Status status;
  auto bind = [&](auto& fn, const char* name) {
    void* sym = dlsym(lib, name);
    if (sym == nullptr && status.ok()) {
      status = absl::UnavailableError(absl::StrCat("libcuda.so.1 has no ", name));
    }
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(sym);
  };
  bind(d.Init, KVPAGE_CU_NAME(cuInit));
  bind(d.GetErrorName, KVPAGE_CU_NAME(cuGetErrorName));
  bind(d.DeviceGet, KVPAGE_CU_NAME(cuDeviceGet));
  bind(d.DeviceGetAttribute, KVPAGE_CU_NAME(cuDeviceGetAttribute));
  bind(d.DevicePrimaryCtxRetain, KVPAGE_CU_NAME(cuDevicePrimaryCtxRetain));
  bind(d.DevicePrimaryCtxRelease, KVPAGE_CU_NAME(cuDevicePrimaryCtxRelease));
  bind(d.CtxSetCurrent, KVPAGE_CU_NAME(cuCtxSetCurrent));
  bind(d.MemGetAllocationGranularity, KVPAGE_CU_NAME(cuMemGetAllocationGranularity));
  bind(d.MemAddressReserve, KVPAGE_CU_NAME(cuMemAddressReserve));
  bind(d.MemAddressFree, KVPAGE_CU_NAME(cuMemAddressFree));
  bind(d.MemCreate, KVPAGE_CU_NAME(cuMemCreate));
  bind(d.MemRelease, KVPAGE_CU_NAME(cuMemRelease));
  bind(d.MemMap, KVPAGE_CU_NAME(cuMemMap));
  bind(d.MemUnmap, KVPAGE_CU_NAME(cuMemUnmap));
  bind(d.MemSetAccess, KVPAGE_CU_NAME(cuMemSetAccess));
  bind(d.MemsetD8, KVPAGE_CU_NAME(cuMemsetD8));
  bind(d.MemcpyDtoH, KVPAGE_CU_NAME(cuMemcpyDtoH));
  if (!status.ok()) return status;
  return d;  // the library stays loaded for the process's lifetime
}

}  // namespace

absl::StatusOr<const CudaDriver*> LoadCudaDriver() {
  static const absl::StatusOr<CudaDriver>* driver = new absl::StatusOr<CudaDriver>(Load());
  if (!driver->ok()) return driver->status();
  return &**driver;
}

}  // namespace kvpage::internal
