// cudaError_t -> absl::Status.
#ifndef KVPAGE_KERNELS_CUDA_STATUS_H_
#define KVPAGE_KERNELS_CUDA_STATUS_H_

#include <cuda_runtime.h>

#include <string>

#include "absl/status/status.h"

namespace kvpage::cuda::internal {

// No device (100) or no usable driver (35) map to Unavailable so tests can skip cleanly.
inline absl::Status CudaStatus(cudaError_t err, const char* what) {
  const std::string msg =
      std::string(what) + ": " + cudaGetErrorName(err) + " (" + std::to_string(err) + ")";
  if (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver) {
    return absl::UnavailableError(msg);
  }
  return absl::InternalError(msg);
}

}  // namespace kvpage::cuda::internal

#endif  // KVPAGE_KERNELS_CUDA_STATUS_H_
