// llama-server's allocation (peers.md §A2–A4). Figures in MiB = 2^20 bytes.
#include <gtest/gtest.h>

#include "testing/plan_checks.h"

namespace kvpage {
namespace {

using testing::kGiB;
using testing::kKiB;
using testing::kMiB;
using testing::PlanBundled;

PlanOptions LlamaCpp() { return testing::WithPolicy(Policy::kLlamaCpp); }

TEST(LlamaCppPolicyTest, FullAttentionModelsMatchPublishedF16Figures) {
  const std::vector<int64_t> contexts = {4096, 32768, 131072};
  Plan qwen = PlanBundled("qwen3-8b", LlamaCpp(), contexts);
  EXPECT_EQ(qwen.kv_cache_dtype, DType::kF16);
  EXPECT_EQ(qwen.rows[0].reserved_bytes, 576 * kMiB);
  EXPECT_EQ(qwen.rows[1].reserved_bytes, 4608 * kMiB);
  EXPECT_EQ(qwen.rows[2].reserved_bytes, 18432 * kMiB);
  EXPECT_DOUBLE_EQ(qwen.rows[1].bytes_per_token, 147456.0);

  Plan mistral = PlanBundled("mistral-7b-v0.3", LlamaCpp(), contexts);
  EXPECT_EQ(mistral.rows[0].reserved_bytes, 512 * kMiB);
  EXPECT_EQ(mistral.rows[1].reserved_bytes, 4096 * kMiB);
  EXPECT_EQ(mistral.rows[2].reserved_bytes, 16384 * kMiB);
}

TEST(LlamaCppPolicyTest, MlaStoresTheLatentAsKOnly) {
  Plan plan = PlanBundled("deepseek-v2-lite", LlamaCpp(), {4096, 32768, 131072});
  // 27 layers × 576 values × 2 bytes = 31,104 bytes per token: 121.5 / 972 / 3,888 MiB.
  EXPECT_EQ(plan.rows[0].reserved_bytes, 243 * kMiB / 2);
  EXPECT_EQ(plan.rows[1].reserved_bytes, 972 * kMiB);
  EXPECT_EQ(plan.rows[2].reserved_bytes, 3888 * kMiB);
  EXPECT_EQ(plan.rows[0].state_bytes, 0);
}

// DeepSeek-V3.2: llama_kv_cache_dsa (llama.cpp PR #23346) keeps the indexer keys in a second
// cache of the same cells, one head of 128 values in type_k, K only. f16: 61 layers ×
// (576 + 128) × 2 = 85,888 bytes a token: 335.5 / 2,684 / 10,736 MiB.
TEST(LlamaCppPolicyTest, DeepSeekV32AddsTheIndexerKeyCache) {
  Plan plan = PlanBundled("deepseek-v3.2", LlamaCpp(), {4096, 32768, 131072});
  EXPECT_EQ(plan.rows[0].reserved_bytes, 671 * kMiB / 2);
  EXPECT_EQ(plan.rows[1].reserved_bytes, 2684 * kMiB);
  EXPECT_EQ(plan.rows[2].reserved_bytes, 10736 * kMiB);
  EXPECT_DOUBLE_EQ(plan.rows[1].bytes_per_token, 85888.0);
  // q8_0: 18 + 4 blocks of 32 values, 34 bytes each: 61 × 748 bytes a token at 4,096 cells.
  PlanOptions q8 = LlamaCpp();
  q8.kv_cache_dtype = DType::kQ8_0;
  EXPECT_EQ(PlanBundled("deepseek-v3.2", q8, {4096}).rows[0].reserved_bytes,
            int64_t{4096} * 61 * 748);
}

TEST(LlamaCppPolicyTest, HybridModelKeepsF32StatePerSequence) {
  Plan plan = PlanBundled("qwen3.5-9b", LlamaCpp(), {4096, 32768, 131072});
  // 24 GDN layers × (24,576 conv + 524,288 recurrent) values × 4 bytes = 50.25 MiB.
  const int64_t state = 201 * kMiB / 4;
  for (const PlanRow& row : plan.rows) EXPECT_EQ(row.state_bytes, state);
  EXPECT_EQ(plan.rows[0].kv_bytes, 128 * kMiB);
  EXPECT_EQ(plan.rows[1].kv_bytes, 1024 * kMiB);
  EXPECT_EQ(plan.rows[2].kv_bytes, 4096 * kMiB);

  PlanOptions four = LlamaCpp();
  four.parallel = 4;
  Plan parallel = PlanBundled("qwen3.5-9b", four, {32768});
  EXPECT_EQ(parallel.rows[0].state_bytes, 4 * state);
  EXPECT_EQ(parallel.rows[0].kv_bytes, 1024 * kMiB);  // 4 streams × 8,192 cells
}

TEST(LlamaCppPolicyTest, SlidingLayersHoldWindowPlusUbatchCells) {
  Plan gemma = PlanBundled("gemma-3-4b-it", LlamaCpp(), {32768});
  EXPECT_EQ(gemma.rows[0].reserved_bytes, 814 * kMiB);  // 640 full + 174 sliding
  ASSERT_EQ(gemma.rows[0].groups.size(), 2u);
  EXPECT_EQ(gemma.rows[0].groups[0].kind, LayerKind::kSlidingWindow);
  EXPECT_EQ(gemma.rows[0].groups[0].blocks, 1536);  // pad256(1024 + 512)
  EXPECT_EQ(gemma.rows[0].groups[1].blocks, 32768);

  Plan oss = PlanBundled("gpt-oss-20b", LlamaCpp(), {32768});
  EXPECT_EQ(oss.rows[0].reserved_bytes, 786 * kMiB);
  EXPECT_EQ(oss.rows[0].groups[0].blocks, 768);  // pad256(128 + 512)

  PlanOptions full = LlamaCpp();
  full.swa_full = true;
  EXPECT_EQ(PlanBundled("gemma-3-4b-it", full, {32768}).rows[0].reserved_bytes, 4352 * kMiB);
  EXPECT_EQ(PlanBundled("gpt-oss-20b", full, {32768}).rows[0].reserved_bytes, 1536 * kMiB);

  // A smaller ubatch only shrinks the sliding part: pad256(1024 + 256) = 1280 cells.
  PlanOptions small = LlamaCpp();
  small.ubatch = 256;
  EXPECT_EQ(PlanBundled("gemma-3-4b-it", small, {32768}).rows[0].reserved_bytes,
            640 * kMiB + 29 * 4 * kKiB * 1280);
}

// Llama 4's chunked layers live in llama.cpp's iSWA cache with n_swa = the 8,192-token chunk.
// Scout: 36 chunked + 12 global layers, 8 KV heads × 128 × 2 (K, V) × 2 bytes = 4 KiB per
// token and layer.
TEST(LlamaCppPolicyTest, ChunkedLayersHoldChunkPlusUbatchCells) {
  Plan scout = PlanBundled("llama-4-scout-17b-16e-instruct", LlamaCpp(), {4096, 32768});
  ASSERT_EQ(scout.rows[1].groups.size(), 2u);
  EXPECT_EQ(scout.rows[1].groups[0].kind, LayerKind::kChunkedLocal);
  EXPECT_EQ(scout.rows[1].groups[0].blocks, 8704);  // pad256(8192 + 512)
  EXPECT_EQ(scout.rows[1].groups[1].blocks, 32768);
  // (36 × 8,704 + 12 × 32,768) cells × 4 KiB = 2,760 MiB.
  EXPECT_EQ(scout.rows[1].reserved_bytes, 2760 * kMiB);
  // Below the chunk every layer holds the whole 4,096-token context: 48 × 16 MiB.
  EXPECT_EQ(scout.rows[0].reserved_bytes, 768 * kMiB);
}

TEST(LlamaCppPolicyTest, ParallelSequencesSplitOrShareTheCache) {
  // -c 32768 -np 4: four streams of 8,192 cells; sliding layers 1,536 cells per stream.
  PlanOptions split = LlamaCpp();
  split.parallel = 4;
  EXPECT_EQ(PlanBundled("gemma-3-4b-it", split, {32768}).rows[0].reserved_bytes, 1336 * kMiB);
  // --kv-unified: one stream; sliding layers pad256(4 × 1024 + 512) = 4,608 cells.
  PlanOptions unified = split;
  unified.kv_unified = true;
  EXPECT_EQ(PlanBundled("gemma-3-4b-it", unified, {32768}).rows[0].reserved_bytes, 1162 * kMiB);

  // -c 10000 -np 3: 10,240 cells → 3,413 per sequence → 3,584 → 10,752 cells in total.
  PlanOptions three = LlamaCpp();
  three.parallel = 3;
  Plan plan = PlanBundled("qwen3-8b", three, {10000});
  EXPECT_EQ(plan.rows[0].groups[0].blocks, 10752);
  EXPECT_EQ(plan.rows[0].reserved_bytes, int64_t{10752} * 147456);
}

TEST(LlamaCppPolicyTest, Q8_0CostsThirtyFourBytesPerThirtyTwoValues) {
  PlanOptions q8 = LlamaCpp();
  q8.kv_cache_dtype = DType::kQ8_0;
  // Qwen3-8B: 1,024-value rows → 1,088 bytes; K + V × 36 layers × 4,096 cells.
  EXPECT_EQ(PlanBundled("qwen3-8b", q8, {4096}).rows[0].reserved_bytes,
            int64_t{2} * 1088 * 36 * 4096);
  // The PR #26499 log (qwen35moe, -c 168192, q8_0): K cache 872.58 MiB = 10 layers ×
  // 168,192 cells × 544 bytes; the recurrent state per sequence is 62.8125 MiB.
  Plan moe = PlanBundled("qwen3.5-35b-a3b", q8, {168192});
  EXPECT_EQ(moe.rows[0].kv_bytes, int64_t{2} * 10 * 168192 * 544);
  EXPECT_EQ(moe.rows[0].state_bytes, 1005 * kMiB / 16);
}

TEST(LlamaCppPolicyTest, MaxConcurrencyCountsWholeSequences) {
  // k requests of 4K = -c 4096k -np k = k × 576 MiB; 10 GiB holds 17 of them.
  Plan plan = PlanBundled("qwen3-8b", LlamaCpp(), {4096}, 10 * kGiB);
  EXPECT_EQ(plan.rows[0].max_concurrency, 17);
  // Exactly one fits in exactly its own size; none in one byte less.
  EXPECT_EQ(PlanBundled("qwen3-8b", LlamaCpp(), {4096}, 576 * kMiB).rows[0].max_concurrency, 1);
  EXPECT_EQ(PlanBundled("qwen3-8b", LlamaCpp(), {4096}, 576 * kMiB - 1).rows[0].max_concurrency,
            0);
  // Gemma 3 at 32K: each sequence is 640 MiB + 174 MiB of sliding cells → 20 in 16 GiB.
  EXPECT_EQ(PlanBundled("gemma-3-4b-it", LlamaCpp(), {32768}, 16 * kGiB).rows[0].max_concurrency,
            20);
}

TEST(LlamaCppPolicyTest, RejectsFp8) {
  PlanOptions fp8 = LlamaCpp();
  fp8.kv_cache_dtype = DType::kFP8;
  auto model = LoadModel("qwen3-8b");
  ASSERT_TRUE(model.ok());
  auto plan = MakePlan(*model, fp8, std::vector<int64_t>{4096});
  EXPECT_TRUE(absl::IsInvalidArgument(plan.status()));
  EXPECT_NE(plan.status().message().find("fp8"), absl::string_view::npos);
}

}  // namespace
}  // namespace kvpage
