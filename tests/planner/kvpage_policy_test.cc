// kvpage's own reservation, from a dry run of the block manager (docs/capacity_planning.md).
#include <gtest/gtest.h>

#include "testing/plan_checks.h"

namespace kvpage {
namespace {

using testing::kGiB;
using testing::kMiB;
using testing::PlanBundled;

PlanOptions Kvpage() { return testing::WithPolicy(Policy::kKvpage); }

TEST(KvpagePolicyTest, FullAttentionMatchesTheOthersExactly) {
  Plan plan = PlanBundled("qwen3-8b", Kvpage(), {4096, 32768, 131072});
  EXPECT_EQ(plan.rows[0].reserved_bytes, 576 * kMiB);
  EXPECT_EQ(plan.rows[1].reserved_bytes, 4608 * kMiB);
  EXPECT_EQ(plan.rows[2].reserved_bytes, 18432 * kMiB);
  EXPECT_EQ(plan.rows[1].shared_bytes, 0);
  Plan mla = PlanBundled("deepseek-v2-lite", Kvpage(), {32768});
  EXPECT_EQ(mla.rows[0].reserved_bytes, 972 * kMiB);
}

// DeepSeek-V3.2: each of the 61 MLA layers keeps its 576-value bf16 latent (1,152 bytes a
// token) and the indexer key (128 fp8 values + one fp32 scale = 132 bytes) in the same block:
// 61 × 1,284 = 78,324 bytes a token, in the one MLA pool, on the asked-for 16-token blocks.
TEST(KvpagePolicyTest, DeepSeekV32BlocksHoldTheIndexerKeys) {
  Plan plan = PlanBundled("deepseek-v3.2", Kvpage(), {1000, 32768});
  ASSERT_EQ(plan.rows[1].groups.size(), 1u);
  EXPECT_EQ(plan.rows[1].groups[0].kind, LayerKind::kMla);
  EXPECT_EQ(plan.rows[1].groups[0].block_size, 16);
  EXPECT_EQ(plan.rows[1].reserved_bytes, int64_t{32768} * 78'324);  // 2,447.625 MiB
  // 1,000 tokens: cdiv(1000, 16) = 63 blocks of 16 × 78,324 bytes.
  EXPECT_EQ(plan.rows[0].reserved_bytes, int64_t{63} * 16 * 78'324);
}

TEST(KvpagePolicyTest, Gemma3HoldsOnlyTheWindowAndSharesTheInFlightAllowance) {
  Plan plan = PlanBundled("gemma-3-4b-it", Kvpage(), {32768});
  const PlanRow& row = plan.rows[0];
  ASSERT_EQ(row.groups.size(), 2u);
  EXPECT_EQ(row.groups[0].kind, LayerKind::kSlidingWindow);
  EXPECT_EQ(row.groups[0].num_layers, 29);
  EXPECT_EQ(row.groups[0].padding_layers, 0);
  // Decoding token 32,768: it attends to tokens 31,745–32,767, which sit in blocks
  // 1,984–2,047: 64 blocks. Everything before was freed as the window moved.
  EXPECT_EQ(row.groups[0].blocks, 64);
  EXPECT_EQ(row.groups[1].blocks, 2048);
  // Exactly the window-exact bound: 5 layers × 32K tokens + 29 layers × 1,024 tokens, 4 KiB each.
  EXPECT_EQ(row.groups[1].reserved_bytes, 640 * kMiB);
  EXPECT_EQ(row.groups[0].reserved_bytes, 116 * kMiB);
  EXPECT_EQ(row.reserved_bytes, 756 * kMiB);
  // At the peak of the prefill an 8,192-token chunk was in flight beyond the window:
  // 512 blocks in each of the 29 sliding layers = 928 MiB, kept once per pool.
  EXPECT_EQ(row.shared_bytes, 928 * kMiB);
  // 16 GiB: (16,384 − 928) MiB / 756 MiB = 20.4 → 20.
  EXPECT_EQ(PlanBundled("gemma-3-4b-it", Kvpage(), {32768}, 16 * kGiB).rows[0].max_concurrency,
            20);
  // A budget smaller than the shared allowance admits nothing.
  EXPECT_EQ(PlanBundled("gemma-3-4b-it", Kvpage(), {32768}, 900 * kMiB).rows[0].max_concurrency,
            0);
}

TEST(KvpagePolicyTest, ShortContextsHoldTheirWholePromptWhileItIsInFlight) {
  // 4,095 prompt tokens go in one step: 256 blocks per sliding layer at the peak, 64 once
  // decoding, so the allowance is 192 blocks × 29 layers × 64 KiB = 348 MiB.
  Plan plan = PlanBundled("gemma-3-4b-it", Kvpage(), {4096});
  EXPECT_EQ(plan.rows[0].groups[0].blocks, 64);
  EXPECT_EQ(plan.rows[0].shared_bytes, 348 * kMiB);
  // A context inside the window keeps all of it: 100 tokens → 7 blocks in every layer.
  Plan tiny = PlanBundled("gemma-3-4b-it", Kvpage(), {100});
  EXPECT_EQ(tiny.rows[0].groups[0].blocks, 7);
  EXPECT_EQ(tiny.rows[0].shared_bytes, 0);
  EXPECT_EQ(tiny.rows[0].reserved_bytes, int64_t{34} * 7 * 64 * 1024);
  // gpt-oss-20b, window 128: 8 blocks per sliding layer while decoding at 32K.
  Plan oss = PlanBundled("gpt-oss-20b", Kvpage(), {32768});
  EXPECT_EQ(oss.rows[0].groups[0].blocks, 8);
  EXPECT_EQ(oss.rows[0].reserved_bytes, 771 * kMiB);
}

TEST(KvpagePolicyTest, HybridStateIsUnpaddedAndSnapshotsAreNotReserved) {
  Plan plan = PlanBundled("qwen3.5-9b", Kvpage(), {32768});
  const PlanRow& row = plan.rows[0];
  // 24 GDN layers × 2,146,304 bytes (bf16 conv + f32 recurrent) = 49.125 MiB: one live
  // state, unpadded — half of vLLM's 99 MiB fixed part.
  EXPECT_EQ(row.state_bytes, 24 * 2146304);
  EXPECT_LT(row.state_bytes, 99 * kMiB / 2);
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
      if (!vllm.rows[0].refusal.empty()) continue;  // not served (MiniMax-M1): nothing reserved
      EXPECT_LE(ours.rows[0].reserved_bytes, vllm.rows[0].reserved_bytes)
          << name << " at " << context;
    }
  }
}

}  // namespace
}  // namespace kvpage
