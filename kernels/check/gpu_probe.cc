// CheckUsableGpu: the reasons a GPU check cannot run, most basic first.
#include "kernels/check/gpu_probe.h"

#include "absl/strings/str_cat.h"

namespace kvpage::cuda::check {

std::string CudaVersionName(int version) {
  return absl::StrCat(version / 1000, ".", version % 1000 / 10);
}

absl::Status CheckUsableGpu(const GpuProbe& probe) {
  if (probe.driver_version <= 0) {
    return absl::FailedPreconditionError("no usable GPU: no NVIDIA driver (libcuda) found");
  }
  // Checked before the device count: with a driver that is too old, cudaGetDeviceCount
  // fails with cudaErrorInsufficientDriver, which says less.
  if (probe.driver_version < probe.runtime_version) {
    return absl::FailedPreconditionError(
        absl::StrCat("no usable GPU: the driver supports CUDA ",
                     CudaVersionName(probe.driver_version), ", older than the CUDA ",
                     CudaVersionName(probe.runtime_version), " runtime of this check"));
  }
  if (probe.count_error != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("no usable GPU: cudaGetDeviceCount failed with ", probe.count_error_name,
                     " (", probe.count_error, ")"));
  }
  if (probe.device_count <= 0) {
    return absl::FailedPreconditionError("no usable GPU: the driver sees no CUDA device");
  }
  return absl::OkStatus();
}

}  // namespace kvpage::cuda::check
