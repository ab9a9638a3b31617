// The host backing behind a real KvCacheManager and Scheduler: the layout and views of bundled
// models, and mapped memory following the pools' chunks.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <vector>

#include "kvpage/catalog.h"
#include "kvpage/host_memory_backing.h"
#include "kvpage/kv_cache_manager.h"
#include "kvpage/planner.h"
#include "kvpage/scheduler.h"
#include "memory/resident_bytes.h"

namespace kvpage {
namespace {

using ::testing::ElementsAre;

constexpr int64_t kKiB = 1024, kMiB = 1024 * kKiB, kGiB = 1024 * kMiB;

ModelOutput OneTokenEach(const SchedulerOutput& out) {
  ModelOutput result;
  result.sampled_offsets.push_back(0);
  for (const ScheduledRequest& r : out.requests) {
    if (r.samples) result.sampled_token_ids.push_back(1);
    result.sampled_offsets.push_back(static_cast<int32_t>(result.sampled_token_ids.size()));
  }
  return result;
}

std::vector<int32_t> Prompt(int32_t seed, int32_t length) {
  std::vector<int32_t> prompt(length);
  for (int32_t j = 0; j < length; ++j) prompt[j] = (seed * 100003 + j) % 200000;
  return prompt;
}

constexpr int64_t kGemmaNullBlocks = 34 * 64 * kKiB;  // one 64 KiB block per layer

std::vector<int32_t> ChunksPerPool(const KvCacheManager& m) {
  std::vector<int32_t> chunks;
  for (const PoolUsage& p : m.Usage().pools) chunks.push_back(p.mapped_chunks);
  return chunks;
}

// Gemma 3 4B on an H100 (80 GiB × 0.9 − weights): the pools fill the budget, and what the
// backing maps is exactly the pools' chunks plus the 34 layers' null blocks (64 KiB each).
TEST(ManagerBacking, Gemma3OnH100NeverMapsMoreThanTheBudget) {
  const ModelSpec model = *LoadModel("gemma-3-4b-it");
  const int64_t budget = *KvBudgetFromGpu(model, (*LoadGpu("h100")).memory_bytes, 0.9);
  EXPECT_EQ(budget, 69208550809);
  HostMemoryBacking backing;
  SchedulerConfig config;
  config.kv.kv_budget_bytes = budget;
  config.kv.backing = &backing;
  config.max_num_batched_tokens = 32768;
  auto scheduler = *Scheduler::Create(model, config);
  // Create sizes max_model_len by allocating for the longest request, so chunks stay mapped.
  EXPECT_EQ(backing.mapped_bytes(), scheduler->kv_cache().Usage().mapped_bytes + kGemmaNullBlocks);
  // Twice the budget of address space: each of the two pools may take all of it.
  EXPECT_EQ(backing.reserved_bytes(), 138417864704);
  for (int i = 0; i < 48; ++i) {
    ASSERT_TRUE(scheduler->AddRequest({.id = RequestId(i), .prompt_token_ids = Prompt(i, 100000),
                                       .max_new_tokens = 4}).ok());
  }
  int64_t steps = 0;
  while (scheduler->HasUnfinishedRequests()) {
    const SchedulerOutput& out = scheduler->Schedule();
    ASSERT_TRUE(scheduler->Update(out, OneTokenEach(out)).ok());
    ++steps;
    ASSERT_EQ(backing.mapped_bytes(), scheduler->kv_cache().Usage().mapped_bytes + kGemmaNullBlocks);
    ASSERT_LE(backing.mapped_bytes(), budget) << "step " << steps;
  }
  EXPECT_EQ(steps, 150);
  // 1.3 MB short of the budget: both pools full (every chunk taken), null blocks included.
  EXPECT_EQ(backing.peak_mapped_bytes(), 69207195648);
}
// Full-attention chunks that a long request touched go back (their pages leave the resident
// set) when the sliding-window pool needs the memory for many short requests.
TEST(ManagerBacking, IdleChunksGoBackToThePoolThatNeedsThem) {
  const ModelSpec model = *LoadModel("gemma-3-4b-it");
  HostMemoryBacking backing;
  KvCacheConfig config;
  config.kv_budget_bytes = 512 * kMiB;
  config.enable_prefix_caching = false;
  config.backing = &backing;
  auto m = *KvCacheManager::Create(model, config);
  // Group 1 is Gemma 3's 5 full-attention layers (every sixth): chunks of 4 blocks × 5 layers
  // × 64 KiB = 1.25 MiB. Group 0, 29 sliding-window layers, has 1-block chunks of 1.8125 MiB.
  auto full_resident = [&] {
    int64_t bytes = 0;
    for (int32_t layer : model.groups[1].layers) {
      const TensorView k = *backing.View(GroupId(1), layer, TensorPart::kKey);
      bytes += ResidentBytes(k.base, k.shape[0] * k.byte_strides[0]);
    }
    return bytes;
  };
  RequestHandle a = *m->AddRequest({RequestId(1), Prompt(1, 8000), {}});
  for (int64_t c = 0; c < 8000; c += 500) {
    m->NewStep();
    ASSERT_TRUE(*m->AllocateSlots(a, {.num_computed_tokens = c, .num_new_tokens = 500}));
  }
  // Write every full-attention block of the request, as the forward pass would.
  absl::StatusOr<absl::Span<const BlockId>> table = m->BlockTable(a, GroupId(1));
  ASSERT_TRUE(table.ok());
  const std::vector<BlockId> blocks(table->begin(), table->end());
  for (int32_t layer : model.groups[1].layers) {
    const TensorView k = *backing.View(GroupId(1), layer, TensorPart::kKey);
    for (BlockId b : blocks) {
      std::memset(static_cast<char*>(k.base) + b.value * k.byte_strides[0], 1, 64 * kKiB);
    }
  }
  EXPECT_THAT(ChunksPerPool(*m), ElementsAre(96, 125));
  EXPECT_EQ(full_resident(), 125 * 5 * 256 * kKiB);  // 500 blocks in 5 layers
  EXPECT_EQ(backing.mapped_bytes(), 96 * 1900544 + 125 * 1310720 + kGemmaNullBlocks);
  ASSERT_TRUE(m->Free(a).ok());
  int admitted = 0;
  for (int i = 0; i < 100; ++i) {
    RequestHandle h = *m->AddRequest({RequestId(10 + i), Prompt(10 + i, 200), {}});
    m->NewStep();
    if (!*m->AllocateSlots(h, {.num_computed_tokens = 0, .num_new_tokens = 200})) break;
    ++admitted;
  }
  EXPECT_EQ(admitted, 18);
  // 58 full-attention chunks went back to the budget and out of memory.
  EXPECT_THAT(ChunksPerPool(*m), ElementsAre(234, 67));
  EXPECT_EQ(backing.mapped_bytes(), 234 * 1900544 + 67 * 1310720 + kGemmaNullBlocks);
  EXPECT_EQ(full_resident(), 67 * 5 * 256 * kKiB);
  ASSERT_TRUE(m->CheckInvariants().ok());
}

struct Built {
  std::unique_ptr<HostMemoryBacking> backing = std::make_unique<HostMemoryBacking>();
  std::unique_ptr<KvCacheManager> manager;
};

Built Build(const char* name, int64_t budget) {
  Built b;
  KvCacheConfig config;
  config.kv_budget_bytes = budget;
  config.backing = b.backing.get();
  b.manager = *KvCacheManager::Create(*LoadModel(name), config);
  return b;
}

int64_t Offset(const TensorView& a, const TensorView& b) {
  return static_cast<char*>(b.base) - static_cast<char*>(a.base);
}

// Gemma 3 4B under 1 GiB: per layer one blocks-first K/V tensor, bf16, 4 KV heads of 256.
TEST(ManagerBacking, Gemma3Views) {
  Built b = Build("gemma-3-4b-it", kGiB);
  const MemoryLayout& layout = b.backing->layout();
  ASSERT_EQ(layout.pools.size(), 2u);
  EXPECT_EQ(layout.pools[0].block_bytes, 29 * 64 * kKiB);  // sliding window, 29 layers
  EXPECT_EQ(layout.pools[0].blocks_per_chunk, 1);
  EXPECT_EQ(layout.pools[0].num_blocks(), 565);
  EXPECT_EQ(layout.pools[1].block_bytes, 5 * 64 * kKiB);  // full attention, 5 layers
  EXPECT_EQ(layout.pools[1].blocks_per_chunk, 4);
  EXPECT_EQ(layout.pools[1].chunk_bytes(), 1310720);
  EXPECT_EQ(layout.pools[1].num_blocks(), 3277);
  EXPECT_EQ(layout.tensors.size(), 34u);
  const TensorView k = *b.backing->View(GroupId(1), 5, TensorPart::kKey);
  const TensorView v = *b.backing->View(GroupId(1), 5, TensorPart::kValue);
  EXPECT_THAT(k.shape, ElementsAre(3277, 16, 4, 256));
  EXPECT_THAT(k.byte_strides, ElementsAre(64 * kKiB, 2048, 512, 2));
  EXPECT_THAT(v.shape, ElementsAre(3277, 16, 4, 256));
  EXPECT_EQ(Offset(k, v), 32 * kKiB);  // V rows follow the block's K rows
  EXPECT_EQ(k.dtype, DType::kBF16);
  EXPECT_TRUE(absl::IsNotFound(b.backing->View(GroupId(0), 5, TensorPart::kKey).status()));
  EXPECT_EQ(b.backing->mapped_bytes(), kGemmaNullBlocks);
  EXPECT_EQ(b.backing->reserved_bytes(), 565 * 29 * 64 * kKiB + 3277 * 5 * 64 * kKiB);
}

// Qwen3.5 0.8B: Gated DeltaNet state slots (bf16 conv, f32 recurrent) and full attention.
TEST(ManagerBacking, Qwen35StateViews) {
  Built b = Build("qwen3.5-0.8b", kGiB);
  const MemoryLayout& layout = b.backing->layout();
  EXPECT_EQ(layout.pools[0].block_bytes, 19537920);  // 18 layers × (36 KiB + 1 MiB)
  EXPECT_EQ(layout.pools[0].num_blocks(), 55);
  EXPECT_EQ(layout.pools[1].block_bytes, 6 * 32 * kKiB);
  const TensorView conv = *b.backing->View(GroupId(0), 0, TensorPart::kConvState);
  EXPECT_THAT(conv.shape, ElementsAre(55, 3, 6144));
  EXPECT_THAT(conv.byte_strides, ElementsAre(36 * kKiB, 12288, 2));
  const TensorView state = *b.backing->View(GroupId(0), 0, TensorPart::kRecurrentState);
  EXPECT_THAT(state.shape, ElementsAre(55, 16, 128, 128));
  EXPECT_THAT(state.byte_strides, ElementsAre(kMiB, 64 * kKiB, 512, 4));
  EXPECT_EQ(state.dtype, DType::kF32);
  const TensorView k = *b.backing->View(GroupId(1), 3, TensorPart::kKey);
  EXPECT_THAT(k.shape, ElementsAre(5457, 16, 2, 256));
  EXPECT_EQ(Offset(k, *b.backing->View(GroupId(1), 3, TensorPart::kValue)), 16 * kKiB);
}

// DeepSeek-V2-Lite: one MLA latent row (512 + 64) per token, K and V in one.
TEST(ManagerBacking, DeepSeekLatentView) {
  Built b = Build("deepseek-v2-lite", kGiB);
  EXPECT_EQ(b.backing->layout().tensors.size(), 27u);
  const TensorView latent = *b.backing->View(GroupId(0), 0, TensorPart::kLatent);
  EXPECT_THAT(latent.shape, ElementsAre(2157, 16, 1, 576));
  EXPECT_THAT(latent.byte_strides, ElementsAre(18432, 1152, 1152, 2));
  EXPECT_TRUE(absl::IsNotFound(b.backing->View(GroupId(0), 0, TensorPart::kKey).status()));
}

// vllm accounting has no per-layer layout: the host backing refuses it at Create.
TEST(ManagerBacking, VllmModeIsRefused) {
  HostMemoryBacking backing;
  KvCacheConfig config;
  config.mode = AccountingMode::kVllm;
  config.kv_budget_bytes = kGiB;
  config.backing = &backing;
  EXPECT_TRUE(absl::IsUnimplemented(
      KvCacheManager::Create(*LoadModel("qwen3-8b"), config).status()));
}

}  // namespace
}  // namespace kvpage
