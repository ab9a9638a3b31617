// Whether the GPU check has a GPU to check: the CUDA driver, runtime and device count as
// kvpage_gpu_check reads them, judged without the CUDA headers (host-only, tested on any
// machine). A machine without a usable GPU must fail the check, not pass it with every case
// skipped (issue 35).
#ifndef KVPAGE_KERNELS_CHECK_GPU_PROBE_H_
#define KVPAGE_KERNELS_CHECK_GPU_PROBE_H_

#include <string>

#include "absl/status/status.h"

namespace kvpage::cuda::check {

struct GpuProbe {
  // cudaDriverGetVersion: the newest CUDA the driver supports, 1000 × major + 10 × minor
  // (12040 = 12.4); 0 when no driver is installed.
  int driver_version = 0;
  // cudaRuntimeGetVersion: the CUDA runtime the check was built with, same encoding.
  int runtime_version = 0;
  // cudaGetDeviceCount's error (0 = cudaSuccess) with its name, and the count it gave.
  int count_error = 0;
  std::string count_error_name;
  int device_count = 0;
};

// OK when the probe shows a device the check can run on. Otherwise FailedPrecondition with
// one line that says which: no driver, a driver older than the runtime, cudaGetDeviceCount
// failing, or no device.
absl::Status CheckUsableGpu(const GpuProbe& probe);

// "12.4" for 12040.
std::string CudaVersionName(int version);

}  // namespace kvpage::cuda::check

#endif  // KVPAGE_KERNELS_CHECK_GPU_PROBE_H_
