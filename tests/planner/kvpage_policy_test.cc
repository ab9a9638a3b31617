// kvpage's own reservation: per-group pools, nothing padded (docs/capacity_planning.md).
#include <gtest/gtest.h>

#include "planner/policies.h"
#include "testing/plan_checks.h"

namespace kvpage {
namespace {

using testing::kGiB;
using testing::kMiB;
using testing::PlanBundled;

PlanOptions Kvpage() { return testing::WithPolicy(Policy::kKvpage); }

TEST(KvpagePolicyTest, SlidingWindowBlocksCoverTheNewestTokensWindow) {
  using internal::SlidingWindowBlocks;
  EXPECT_EQ(SlidingWindowBlocks(1, 1024, 16), 1);
  EXPECT_EQ(SlidingWindowBlocks(100, 1024, 16), 7);      // shorter than the window: all of it
  EXPECT_EQ(SlidingWindowBlocks(1024, 1024, 16), 64);    // exactly the window, aligned
  EXPECT_EQ(SlidingWindowBlocks(1025, 1024, 16), 65);    // 1,024 tokens from offset 1 span 65
  EXPECT_EQ(SlidingWindowBlocks(32768, 1024, 16), 65);   // cdiv(1023, 16) + 1
  EXPECT_EQ(SlidingWindowBlocks(32768, 128, 16), 9);     // cdiv(127, 16) + 1
  EXPECT_EQ(SlidingWindowBlocks(32768, 17, 16), 2);
  EXPECT_EQ(SlidingWindowBlocks(32768, 18, 16), 3);
  EXPECT_EQ(SlidingWindowBlocks(32768, 1024, 64), 17);   // cdiv(1023, 64) + 1
}

TEST(KvpagePolicyTest, FullAttentionMatchesTheOthersExactly) {
  Plan plan = PlanBundled("qwen3-8b", Kvpage(), {4096, 32768, 131072});
  EXPECT_EQ(plan.rows[0].reserved_bytes, 576 * kMiB);
  EXPECT_EQ(plan.rows[1].reserved_bytes, 4608 * kMiB);
  EXPECT_EQ(plan.rows[2].reserved_bytes, 18432 * kMiB);
  EXPECT_EQ(plan.rows[1].shared_bytes, 0);
  Plan mla = PlanBundled("deepseek-v2-lite", Kvpage(), {32768});
  EXPECT_EQ(mla.rows[0].reserved_bytes, 972 * kMiB);
}

TEST(KvpagePolicyTest, Gemma3HoldsOnlyTheWindowAndSharesTheInFlightAllowance) {
  Plan plan = PlanBundled("gemma-3-4b-it", Kvpage(), {32768});
  const PlanRow& row = plan.rows[0];
  ASSERT_EQ(row.groups.size(), 2u);
  EXPECT_EQ(row.groups[0].kind, LayerKind::kSlidingWindow);
  EXPECT_EQ(row.groups[0].num_layers, 29);
  EXPECT_EQ(row.groups[0].padding_layers, 0);
  EXPECT_EQ(row.groups[0].blocks, 65);
  // Full: 5 layers × 32,768 tokens × 4 KiB = 640 MiB. Sliding: 29 × 65 blocks × 64 KiB.
  EXPECT_EQ(row.groups[1].reserved_bytes, 640 * kMiB);
  EXPECT_EQ(row.groups[0].reserved_bytes, int64_t{29} * 65 * 64 * 1024);
  EXPECT_EQ(row.reserved_bytes * 16, 12125 * kMiB);  // 757.8125 MiB
  // Once per pool: cdiv(8192, 16) = 512 blocks in each of the 29 sliding layers = 928 MiB.
  EXPECT_EQ(row.shared_bytes, 928 * kMiB);
  // 16 GiB: (16,384 − 928) MiB / 757.8125 MiB = 20.4 → 20.
  EXPECT_EQ(PlanBundled("gemma-3-4b-it", Kvpage(), {32768}, 16 * kGiB).rows[0].max_concurrency,
            20);
  // A budget smaller than the shared allowance admits nothing.
  EXPECT_EQ(PlanBundled("gemma-3-4b-it", Kvpage(), {32768}, 900 * kMiB).rows[0].max_concurrency,
            0);
}

TEST(KvpagePolicyTest, HybridStateIsUnpaddedAndSnapshotsAreNotReserved) {
  Plan plan = PlanBundled("qwen3.5-9b", Kvpage(), {32768});
  const PlanRow& row = plan.rows[0];
  // 24 GDN layers × 2,146,304 bytes (bf16 conv + f32 recurrent) = 49.125 MiB.
  EXPECT_EQ(row.state_bytes, 24 * 2146304);
  EXPECT_EQ(row.state_bytes * 8, 393 * kMiB);
  EXPECT_EQ(row.kv_bytes, 1024 * kMiB);
  EXPECT_EQ(row.snapshot_bytes, row.state_bytes);
  PlanOptions no_cache = Kvpage();
  no_cache.enable_prefix_caching = false;
  EXPECT_EQ(PlanBundled("qwen3.5-9b", no_cache, {32768}).rows[0].snapshot_bytes, 0);
}

TEST(KvpagePolicyTest, BlockSizeAndDtypeChangeOnlyWhatTheyShould) {
  PlanOptions bs64 = Kvpage();
  bs64.block_size = 64;
  // cdiv(1000, 64) = 16 blocks = 1,024 tokens of 144 KiB.
  EXPECT_EQ(PlanBundled("qwen3-8b", bs64, {1000}).rows[0].reserved_bytes, int64_t{1024} * 147456);
  PlanOptions fp8 = Kvpage();
  fp8.kv_cache_dtype = DType::kFP8;
  Plan plan = PlanBundled("qwen3.5-9b", fp8, {32768});
  EXPECT_EQ(plan.rows[0].kv_bytes, 512 * kMiB);
  EXPECT_EQ(plan.rows[0].state_bytes, 24 * 2146304);  // state keeps its own dtypes
}

TEST(KvpagePolicyTest, NeverReservesMoreThanVllm) {
  for (const std::string& name : BundledModelNames()) {
    for (int64_t context : {1024, 4096, 32768, 131072}) {
      Plan ours = PlanBundled(name.c_str(), Kvpage(), {context});
      Plan vllm = PlanBundled(name.c_str(), testing::WithPolicy(Policy::kVllm), {context});
      EXPECT_LE(ours.rows[0].reserved_bytes, vllm.rows[0].reserved_bytes)
          << name << " at " << context;
    }
  }
}

}  // namespace
}  // namespace kvpage
