// CheckUsableGpu: kvpage_gpu_check's verdict on the driver and devices, on every machine.
#include "kernels/check/gpu_probe.h"

#include <gtest/gtest.h>

namespace kvpage::cuda::check {
namespace {

// A CUDA 13.0 runtime on a driver for CUDA 13.1 with one device.
GpuProbe Usable() {
  return GpuProbe{.driver_version = 13010, .runtime_version = 13000, .device_count = 1};
}

void ExpectUnusable(const GpuProbe& probe, const std::string& message) {
  const absl::Status s = CheckUsableGpu(probe);
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_EQ(s.message(), message);
}

TEST(GpuProbeTest, AcceptsADeviceWithADriverAtLeastAsNewAsTheRuntime) {
  EXPECT_TRUE(CheckUsableGpu(Usable()).ok());
  GpuProbe same = Usable();
  same.driver_version = 13000;
  same.device_count = 8;
  EXPECT_TRUE(CheckUsableGpu(same).ok());
}

TEST(GpuProbeTest, NoDriver) {
  // A machine without libcuda: cudaDriverGetVersion gives 0 and the count fails with 35.
  ExpectUnusable(GpuProbe{.runtime_version = 13000,
                          .count_error = 35,
                          .count_error_name = "cudaErrorInsufficientDriver"},
                 "no usable GPU: no NVIDIA driver (libcuda) found");
}

TEST(GpuProbeTest, DriverOlderThanTheRuntime) {
  GpuProbe old = Usable();
  old.driver_version = 12040;
  old.count_error = 35;
  old.count_error_name = "cudaErrorInsufficientDriver";
  old.device_count = 0;
  ExpectUnusable(old,
                 "no usable GPU: the driver supports CUDA 12.4, older than the CUDA 13.0 "
                 "runtime of this check");
  EXPECT_EQ(CudaVersionName(12090), "12.9");
  EXPECT_EQ(CudaVersionName(13000), "13.0");
}

TEST(GpuProbeTest, DeviceCountFailsOrIsZero) {
  GpuProbe failed = Usable();
  failed.count_error = 100;
  failed.count_error_name = "cudaErrorNoDevice";
  failed.device_count = 0;
  ExpectUnusable(failed, "no usable GPU: cudaGetDeviceCount failed with cudaErrorNoDevice (100)");
  GpuProbe none = Usable();
  none.device_count = 0;
  ExpectUnusable(none, "no usable GPU: the driver sees no CUDA device");
}

}  // namespace
}  // namespace kvpage::cuda::check
