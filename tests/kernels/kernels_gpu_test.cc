// The CUDA kernels against their CPU references (kernel_checks.h) with fixed seeds. The
// KernelsGpuTest cases run only where a GPU is visible and skip cleanly elsewhere (CUDA errors
// 100 and 35); the launcher argument checks run everywhere. Label: gpu.
#include <gtest/gtest.h>

#include <string>

#include "kernels/check/check_cases.h"
#include "kernels/check/kernel_checks.h"
#include "kernels/paged_decode_launch.h"
#include "kvpage/cuda/paged_decode.h"
#include "kvpage/cuda/paged_prefill.h"
#include "kvpage/cuda/write_kv.h"

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

// The launchers reject bad arguments before touching the device, so these run without a GPU.
// A v for an MLA view (no V half) is refused, as ref::WriteKv refuses it.
TEST(KernelLaunchersTest, WriteKvRejectsVForAnMlaView) {
  alignas(16) static uint16_t cache[2 * 64 * 576], k[576], v[576];
  alignas(16) static int64_t slots[1] = {0};
  const KvCacheView mla = MlaKvCache(cache, 2, 64, 576, DType::kBF16);
  absl::Status s = WriteKv(k, v, 576, 576, slots, 1, mla, nullptr);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_NE(s.message().find("WriteKv: v is given but the view has no V half"),
            absl::string_view::npos)
      << s;
  s = WriteKvFp8(k, v, 576, 576, slots, 1, DType::kBF16, 1.0f, 1.0f,
                 MlaKvCache(cache, 2, 64, 576, DType::kFP8), nullptr);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
}

// The tensor-core decode needs 16-token steps inside one block.
TEST(KernelLaunchersTest, TensorCoreDecodeNeedsBlocksOf16) {
  alignas(16) static uint16_t cache[4 * 2 * 8 * 128], q[128], out[128];
  alignas(16) static int32_t table[4] = {0, 1, 2, 3}, lens[1] = {20};
  const KvCacheView view = BlocksFirstKvCache(cache, 4, 8, 1, 128, DType::kBF16);
  DecodePlan plan;
  plan.use_tensor_cores = true;
  const absl::Status s = PagedDecode(out, q, 128, view, BlockTableView{table, 4, lens, 1},
                                     DecodeParams{1, 0.1f, -1}, plan, nullptr, 0, nullptr);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_NE(s.message().find("block_size multiple of 16, not 8"), absl::string_view::npos) << s;
}

// Which decode kernels exist: fp8 caches and head_dim 80/96/192 only on CUDA cores, scales
// only with an fp8 cache; each refusal names the value.
TEST(KernelLaunchersTest, DecodeRejectsKernelsThatDoNotExist) {
  alignas(16) static uint16_t cache[4 * 2 * 16 * 96], q[96], out[96];
  alignas(16) static int32_t table[4] = {0, 1, 2, 3}, lens[1] = {20};
  const BlockTableView t{table, 4, lens, 1};
  DecodePlan mma;
  mma.use_tensor_cores = true;
  auto message = [&](const KvCacheView& view, const DecodeParams& params,
                     const DecodePlan& plan) {
    return std::string(PagedDecode(out, q, 96, view, t, params, plan, nullptr, 0, nullptr)
                           .message());
  };
  const KvCacheView d96 = BlocksFirstKvCache(cache, 4, 16, 1, 96, DType::kBF16);
  EXPECT_EQ(message(d96, {1, 0.1f, -1}, mma),
            "PagedDecode: the tensor-core kernel needs head_dim 64, 128 or 256, not 96");
  const KvCacheView d72 = BlocksFirstKvCache(cache, 4, 16, 1, 72, DType::kBF16);
  EXPECT_EQ(message(d72, {1, 0.1f, -1}, DecodePlan{}),
            "PagedDecode: head_dim 72 is not 64, 80, 96, 128, 192 or 256");
  const KvCacheView fp8 = BlocksFirstKvCache(cache, 4, 16, 1, 64, DType::kFP8);
  DecodeParams scaled{1, 0.1f, -1};
  scaled.k_scale = 0.5f;
  EXPECT_EQ(message(fp8, scaled, mma), "PagedDecode: the tensor-core kernel reads no fp8 cache");
  EXPECT_NE(message(d96, scaled, DecodePlan{}).find("k_scale 0.5 / v_scale 1 for a bf16 cache"),
            std::string::npos);
  scaled.v_scale = -1.0f;
  EXPECT_EQ(message(fp8, scaled, DecodePlan{}),
            "PagedDecode: scale -1 is not a positive finite number");
  DecodePlan both = mma;
  both.force_cuda_cores = true;
  EXPECT_EQ(message(BlocksFirstKvCache(cache, 4, 16, 1, 64, DType::kBF16), {1, 0.1f, -1}, both),
            "PagedDecode: plan sets both use_tensor_cores and force_cuda_cores");
}

// PagedDecodeMla takes only an MLA view of row 576, and a plan that forces at most one path.
TEST(KernelLaunchersTest, MlaDecodeNeedsTheDeepSeekRow) {
  alignas(16) static uint16_t cache[2 * 16 * 576], q[576], out[512];
  alignas(16) static int32_t table[2] = {0, 1}, lens[1] = {20};
  const BlockTableView t{table, 2, lens, 1};
  auto message = [&](const KvCacheView& view, const DecodePlan& plan) {
    return std::string(
        PagedDecodeMla(out, q, 576, view, t, {1, 0.1f, -1}, plan, nullptr, 0, nullptr)
            .message());
  };
  EXPECT_EQ(message(MlaKvCache(cache, 2, 16, 512, DType::kBF16), DecodePlan{}),
            "PagedDecodeMla: needs an MLA view (kv_stride 0) of row 576, not kv_stride 0 "
            "head_dim 512");
  DecodePlan both;
  both.use_tensor_cores = true;
  both.force_cuda_cores = true;
  EXPECT_EQ(message(MlaKvCache(cache, 2, 16, 576, DType::kBF16), both),
            "PagedDecodeMla: plan sets both use_tensor_cores and force_cuda_cores");
}

// PagedPrefill checks its own arguments before the decode's, touching nothing on the device.
TEST(KernelLaunchersTest, PagedPrefillRejectsBadArguments) {
  alignas(16) static uint16_t cache[4 * 2 * 16 * 128], q[2 * 128], out[2 * 128];
  alignas(16) static int32_t table[4] = {0, 1, 2, 3}, lens[1] = {20}, qsl[2] = {0, 2};
  alignas(16) static int32_t ws[16];
  const KvCacheView view = BlocksFirstKvCache(cache, 4, 16, 1, 128, DType::kBF16);
  const BlockTableView tables{table, 4, lens, 1};
  const DecodeParams params{1, 0.1f, -1};
  absl::Status s = PagedPrefill(out, q, 128, nullptr, 2, view, tables, params, DecodePlan{},
                                ws, sizeof(ws), nullptr);
  EXPECT_NE(s.message().find("PagedPrefill: null query_start_loc"), absl::string_view::npos)
      << s;
  s = PagedPrefill(out, q, 128, qsl, 70000, view, tables, params, DecodePlan{}, ws, sizeof(ws),
                   nullptr);
  EXPECT_NE(s.message().find("total_tokens 70000 is outside [0, 65535]"),
            absl::string_view::npos)
      << s;
  s = PagedPrefill(out, q, 128, qsl, 2, view, tables, params, DecodePlan{}, ws, 8, nullptr);
  EXPECT_NE(s.message().find("PagedPrefill: workspace of 8 bytes (16-byte aligned) needed 16"),
            absl::string_view::npos)
      << s;
  s = PagedPrefill(out, q, 128, qsl, 2, view, tables, DecodeParams{0, 0.1f, -1}, DecodePlan{},
                   ws, sizeof(ws), nullptr);
  EXPECT_NE(s.message().find("PagedPrefill: num_q_heads 0 is not a positive multiple"),
            absl::string_view::npos)
      << s;
}

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

TEST_F(KernelsGpuTest, PagedPrefillMatchesReference) {
  uint32_t seed = 150;
  for (const PrefillCase& c : PrefillCases()) {
    EXPECT_EQ(CheckPagedPrefill(c, seed++), absl::OkStatus()) << c.Name();
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

// On sm_90 the merge is launched with programmatic dependent launch (merge_launch.h); the
// captured graph then holds exactly one programmatic edge, split kernel -> merge.
TEST_F(KernelsGpuTest, LaunchersAreGraphCapturable) {
  int edges = -1;
  EXPECT_EQ(CheckGraphCapture(400, &edges), absl::OkStatus());
  EXPECT_EQ(edges, internal::CurrentDeviceCcMajor() >= 9 ? 1 : 0);
}

// The tensor-core MLA launch (cudaFuncSetAttribute, kernel, merge) is graph-capturable.
TEST_F(KernelsGpuTest, MlaTensorCoreDecodeIsGraphCapturable) {
  EXPECT_EQ(CheckMlaGraphCapture(420), absl::OkStatus());
}

TEST_F(KernelsGpuTest, SplitMergeWaitsForTheSplitKernel) {
  std::string path;
  EXPECT_EQ(CheckProgrammaticMerge(450, &path), absl::OkStatus()) << path;
  EXPECT_EQ(path, internal::CurrentDeviceCcMajor() >= 9 ? "programmatic" : "plain");
}

}  // namespace
}  // namespace kvpage::cuda::check
