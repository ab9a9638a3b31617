// The CUDA kernels against their CPU references (kernel_checks.h) with fixed seeds. Runs only
// where a GPU is visible; skips cleanly elsewhere (CUDA errors 100 and 35). Label: gpu.
#include <gtest/gtest.h>

#include "kernels/check/check_cases.h"
#include "kernels/check/kernel_checks.h"

namespace kvpage::cuda::check {
namespace {

class KernelsGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const absl::Status status = RequireDevice();
    if (absl::IsUnavailable(status)) GTEST_SKIP() << "no CUDA device: " << status.message();
    ASSERT_TRUE(status.ok()) << status;
  }
};

TEST_F(KernelsGpuTest, WriteKvMatchesReference) {
  uint32_t seed = 1;
  for (const WriteKvCase& c : WriteKvCases()) {
    EXPECT_EQ(CheckWriteKv(c, seed++), absl::OkStatus()) << c.Name();
  }
}

TEST_F(KernelsGpuTest, PagedDecodeMatchesReference) {
  uint32_t seed = 100;
  for (const DecodeCase& c : DecodeCases()) {
    EXPECT_EQ(CheckPagedDecode(c, seed++, nullptr), absl::OkStatus()) << c.Name();
  }
}

TEST_F(KernelsGpuTest, MergeMatchesReference) {
  EXPECT_EQ(CheckMerge(3, 4, 5, 128, DType::kBF16, 7), absl::OkStatus());
  EXPECT_EQ(CheckMerge(2, 3, 1, 64, DType::kF16, 8), absl::OkStatus());
}

TEST_F(KernelsGpuTest, CopiesMatchReference) {
  uint32_t seed = 200;
  for (const CopyCase& c : CopyCases()) {
    EXPECT_EQ(CheckCopies(c, seed++), absl::OkStatus()) << c.Name();
  }
}

TEST_F(KernelsGpuTest, LaunchersAreGraphCapturable) {
  EXPECT_EQ(CheckGraphCapture(400), absl::OkStatus());
}

}  // namespace
}  // namespace kvpage::cuda::check
