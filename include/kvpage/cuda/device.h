// CUDA device queries for kvpage. Built only with KVPAGE_BUILD_CUDA; no core header includes it.
//
// The kernels (write_kv.h, paged_decode.h, copy_slots.h next to this header) follow the same
// rules: host launchers take a cudaStream_t and return absl::Status.
#ifndef KVPAGE_CUDA_DEVICE_H_
#define KVPAGE_CUDA_DEVICE_H_

#include "absl/status/statusor.h"

namespace kvpage::cuda {

// Number of visible CUDA devices. Unavailable when the driver reports no device
// (cudaErrorNoDevice = 100) or no usable driver (cudaErrorInsufficientDriver = 35); Internal
// for any other CUDA error. The message carries the CUDA error name.
absl::StatusOr<int> DeviceCount();

// Runs a one-block kernel that writes `value` to n ints and reads them back: proves a kernel
// built for this GPU can launch. REQUIRES: 0 < n <= 1024.
absl::Status SmokeTest(int n, int value);

}  // namespace kvpage::cuda

#endif  // KVPAGE_CUDA_DEVICE_H_
