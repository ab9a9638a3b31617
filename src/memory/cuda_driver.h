// The CUDA driver functions kvpage's VMM backing calls, loaded from libcuda at run time
// (internal). Binaries then start (and list their tests) on machines without a driver, and
// a missing driver is a Status, not a loader error.
#ifndef KVPAGE_MEMORY_CUDA_DRIVER_H_
#define KVPAGE_MEMORY_CUDA_DRIVER_H_

#include <cuda.h>

#include "absl/status/statusor.h"

namespace kvpage::internal {

struct CudaDriver {
  decltype(&::cuInit) Init = nullptr;
  decltype(&::cuGetErrorName) GetErrorName = nullptr;
  decltype(&::cuDeviceGet) DeviceGet = nullptr;
  decltype(&::cuDeviceGetAttribute) DeviceGetAttribute = nullptr;
  decltype(&::cuDevicePrimaryCtxRetain) DevicePrimaryCtxRetain = nullptr;
  decltype(&::cuDevicePrimaryCtxRelease) DevicePrimaryCtxRelease = nullptr;
  decltype(&::cuCtxSetCurrent) CtxSetCurrent = nullptr;
  decltype(&::cuMemGetAllocationGranularity) MemGetAllocationGranularity = nullptr;
  decltype(&::cuMemAddressReserve) MemAddressReserve = nullptr;
  decltype(&::cuMemAddressFree) MemAddressFree = nullptr;
  decltype(&::cuMemCreate) MemCreate = nullptr;
  decltype(&::cuMemRelease) MemRelease = nullptr;
  decltype(&::cuMemMap) MemMap = nullptr;
  decltype(&::cuMemUnmap) MemUnmap = nullptr;
  decltype(&::cuMemSetAccess) MemSetAccess = nullptr;
  decltype(&::cuMemsetD8) MemsetD8 = nullptr;      // for tests
  decltype(&::cuMemcpyDtoH) MemcpyDtoH = nullptr;  // for tests
};

// The process's driver table, loaded once. Unavailable (naming the library and dlerror) when
// libcuda.so.1 or one of the functions is missing.
absl::StatusOr<const CudaDriver*> LoadCudaDriver();

}  // namespace kvpage::internal

#endif  // KVPAGE_MEMORY_CUDA_DRIVER_H_
