// Runs only where a GPU is visible; skips cleanly elsewhere (CUDA errors 100 and 35).
#include <gtest/gtest.h>

#include "kvpage/cuda/device.h"

namespace {

TEST(CudaDeviceTest, KernelLaunchesAndWrites) {
  auto count = kvpage::cuda::DeviceCount();
  if (!count.ok() && absl::IsUnavailable(count.status())) {
    GTEST_SKIP() << "no CUDA device: " << count.status().message();
  }
  ASSERT_TRUE(count.ok()) << count.status();
  if (*count == 0) GTEST_SKIP() << "no CUDA device";
  EXPECT_TRUE(kvpage::cuda::SmokeTest(256, 42).ok());
  EXPECT_TRUE(absl::IsInvalidArgument(kvpage::cuda::SmokeTest(0, 1)));
}

}  // namespace
