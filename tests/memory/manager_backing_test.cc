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
#include "internal/status_macros.h"

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

// Gemma 3 4B on an H100 (80 GiB × 0.9 − weights), the host backing's 4 KiB pages: the
// 34 layers' null blocks (64 KiB each) are charged up front, and what the backing maps is
// exactly the budget's charge at every step.
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
  // Create's max_model_len probe gave back every chunk it mapped.
  EXPECT_EQ(scheduler->kv_cache().Usage().mapped_bytes, 0);
  EXPECT_EQ(backing.mapped_bytes(), kGemmaNullBlocks);
  // Twice the budget of address space: each of the two pools may take all of it.
  EXPECT_EQ(backing.reserved_bytes(), 138412752896);
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
  // 3.3 MB short of the budget: both pools full (every chunk taken), null blocks included.
  EXPECT_EQ(backing.peak_mapped_bytes(), 69205295104);
}

// Forwards to a HostMemoryBacking and checks, after every chunk it maps, that the backing
// holds no more than the budget.
class BudgetChecked final : public MemoryBacking {
 public:
  BudgetChecked(HostMemoryBacking* inner, int64_t budget) : inner_(inner), budget_(budget) {}
  absl::Status Reserve(const MemoryLayout& layout) override { return inner_->Reserve(layout); }
  absl::Status MapChunk(int32_t pool, int32_t chunk) override {
    KVPAGE_RETURN_IF_ERROR(inner_->MapChunk(pool, chunk));
    ++maps_;
    if (inner_->mapped_bytes() > budget_) ++over_budget_;
    return absl::OkStatus();
  }
  absl::Status UnmapChunk(int32_t pool, int32_t chunk) override {
    ++unmaps_;
    return inner_->UnmapChunk(pool, chunk);
  }
  int64_t map_unit_bytes() const override { return inner_->map_unit_bytes(); }
  int64_t maps() const { return maps_; }
  int64_t unmaps() const { return unmaps_; }
  int64_t over_budget() const { return over_budget_; }

 private:
  HostMemoryBacking* inner_;
  int64_t budget_;
  int64_t maps_ = 0, unmaps_ = 0, over_budget_ = 0;
};

// The gate of CudaVmmBacking on an H100 with Gemma 3 4B, on the host with the GPU's 2 MiB
// units. A 64 KiB block of one layer is 1/32 of a unit, so chunks grow to 32 blocks (whole
// units in each of their layers' tensors): the sliding-window pool's to 32 × 29 × 64 KiB =
// 58 MiB, the full-attention pool's to 32 × 5 × 64 KiB = 10 MiB, and the 34 null blocks take
// a unit each (68 MiB, charged up front). The budget is then charged exactly what the backing
// maps, through Create's probe and a run of 48 prompts of 100,000 tokens.
TEST(ManagerBacking, Gemma3OnH100With2MiBUnitsChargesWhatIsMapped) {
  const ModelSpec model = *LoadModel("gemma-3-4b-it");
  const int64_t budget = 69208550809;
  HostMemoryBacking host(2 * kMiB);
  BudgetChecked backing(&host, budget);
  SchedulerConfig config;
  config.kv.kv_budget_bytes = budget;
  config.kv.backing = &backing;
  config.max_num_batched_tokens = 32768;
  auto scheduler = *Scheduler::Create(model, config);
  constexpr int64_t kNullUnits = 34 * 2 * kMiB;
  const MemoryLayout& layout = host.layout();
  EXPECT_EQ(layout.pools[0].blocks_per_chunk, 32);
  EXPECT_EQ(layout.pools[0].chunk_bytes(), 58 * kMiB);
  EXPECT_EQ(layout.pools[0].max_chunks, 1136);  // (budget − 68 MiB) / 58 MiB
  EXPECT_EQ(layout.pools[1].blocks_per_chunk, 32);
  EXPECT_EQ(layout.pools[1].chunk_bytes(), 10 * kMiB);
  EXPECT_EQ(layout.pools[1].max_chunks, 6593);  // (budget − 68 MiB) / 10 MiB
  EXPECT_EQ(scheduler->max_model_len(), 131072);
  // The probe mapped the chunks of one 131,072-token request and gave every one back.
  EXPECT_EQ(backing.maps(), 322);  // 256 full-attention chunks, 66 sliding-window ones
  EXPECT_EQ(backing.unmaps(), 322);
  EXPECT_EQ(scheduler->kv_cache().Usage().mapped_bytes, 0);
  EXPECT_EQ(host.mapped_bytes(), kNullUnits);
  for (int i = 0; i < 48; ++i) {
    ASSERT_TRUE(scheduler->AddRequest({.id = RequestId(i), .prompt_token_ids = Prompt(i, 100000),
                                       .max_new_tokens = 4}).ok());
  }
  int64_t steps = 0;
  while (scheduler->HasUnfinishedRequests()) {
    const SchedulerOutput& out = scheduler->Schedule();
    ASSERT_TRUE(scheduler->Update(out, OneTokenEach(out)).ok());
    ++steps;
    ASSERT_EQ(host.mapped_bytes(), scheduler->kv_cache().Usage().mapped_bytes + kNullUnits)
        << "step " << steps;
    ASSERT_LE(host.mapped_bytes(), budget) << "step " << steps;
  }
  EXPECT_EQ(backing.over_budget(), 0);  // checked after every map, inside steps too
  EXPECT_EQ(steps, 150);
  EXPECT_EQ(host.peak_mapped_bytes(), 69132615680);  // null blocks included
  EXPECT_EQ(backing.maps(), 2257);
  EXPECT_EQ(backing.unmaps(), 322);  // the probe's
  EXPECT_THAT(ChunksPerPool(scheduler->kv_cache()), ElementsAre(969, 966));
  // 256 prompts of 8,000 tokens that the cache holds none of: the full-attention pool needs
  // more chunks, and idle sliding-window chunks go back to the budget for them.
  for (int i = 0; i < 256; ++i) {
    ASSERT_TRUE(scheduler->AddRequest({.id = RequestId(100 + i),
                                       .prompt_token_ids = Prompt(100 + i, 8000),
                                       .max_new_tokens = 64}).ok());
  }
  while (scheduler->HasUnfinishedRequests()) {
    const SchedulerOutput& out = scheduler->Schedule();
    ASSERT_TRUE(scheduler->Update(out, OneTokenEach(out)).ok());
    ++steps;
    ASSERT_EQ(host.mapped_bytes(), scheduler->kv_cache().Usage().mapped_bytes + kNullUnits)
        << "step " << steps;
    ASSERT_LE(host.mapped_bytes(), budget) << "step " << steps;
  }
  EXPECT_THAT(ChunksPerPool(scheduler->kv_cache()), ElementsAre(544, 3433));
  EXPECT_EQ(steps, 287);
  EXPECT_EQ(backing.maps(), 4724);
  EXPECT_EQ(backing.unmaps(), 747);  // 425 sliding-window chunks moved to the other pool
  EXPECT_EQ(backing.over_budget(), 0);
  // 437,657 bytes below the budget at the peak.
  EXPECT_EQ(host.peak_mapped_bytes(), 69208113152);
  // Every request finished: what is still mapped holds cached blocks only, and goes back.
  EXPECT_EQ(scheduler->ReleaseIdleChunks(), 544 * 58 * kMiB + 3433 * 10 * kMiB);
  EXPECT_EQ(host.mapped_bytes(), kNullUnits);
  EXPECT_EQ(backing.unmaps(), backing.maps());
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
  // 59 full-attention chunks went back to the budget and out of memory.
  EXPECT_THAT(ChunksPerPool(*m), ElementsAre(234, 66));
  EXPECT_EQ(backing.mapped_bytes(), 234 * 1900544 + 66 * 1310720 + kGemmaNullBlocks);
  EXPECT_EQ(full_resident(), 66 * 5 * 256 * kKiB);
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
  // 1 GiB less the null blocks' 2,228,224 bytes, charged up front.
  EXPECT_EQ(layout.pools[0].num_blocks(), 564);
  EXPECT_EQ(layout.pools[1].block_bytes, 5 * 64 * kKiB);  // full attention, 5 layers
  EXPECT_EQ(layout.pools[1].blocks_per_chunk, 4);
  EXPECT_EQ(layout.pools[1].chunk_bytes(), 1310720);
  EXPECT_EQ(layout.pools[1].num_blocks(), 3269);
  EXPECT_EQ(layout.tensors.size(), 34u);
  const TensorView k = *b.backing->View(GroupId(1), 5, TensorPart::kKey);
  const TensorView v = *b.backing->View(GroupId(1), 5, TensorPart::kValue);
  EXPECT_THAT(k.shape, ElementsAre(3269, 16, 4, 256));
  EXPECT_THAT(k.byte_strides, ElementsAre(64 * kKiB, 2048, 512, 2));
  EXPECT_THAT(v.shape, ElementsAre(3269, 16, 4, 256));
  EXPECT_EQ(Offset(k, v), 32 * kKiB);  // V rows follow the block's K rows
  EXPECT_EQ(k.dtype, DType::kBF16);
  EXPECT_TRUE(absl::IsNotFound(b.backing->View(GroupId(0), 5, TensorPart::kKey).status()));
  EXPECT_EQ(b.backing->mapped_bytes(), kGemmaNullBlocks);
  EXPECT_EQ(b.backing->reserved_bytes(), 564 * 29 * 64 * kKiB + 3269 * 5 * 64 * kKiB);
}

// Qwen3.5 0.8B: Gated DeltaNet state slots (bf16 conv, f32 recurrent) and full attention.
TEST(ManagerBacking, Qwen35StateViews) {
  Built b = Build("qwen3.5-0.8b", kGiB);
  const MemoryLayout& layout = b.backing->layout();
  EXPECT_EQ(layout.pools[0].block_bytes, 19537920);  // 18 layers × (36 KiB + 1 MiB)
  EXPECT_EQ(layout.pools[0].num_blocks(), 54);
  EXPECT_EQ(layout.pools[1].block_bytes, 6 * 32 * kKiB);
  const TensorView conv = *b.backing->View(GroupId(0), 0, TensorPart::kConvState);
  EXPECT_THAT(conv.shape, ElementsAre(54, 3, 6144));
  EXPECT_THAT(conv.byte_strides, ElementsAre(36 * kKiB, 12288, 2));
  const TensorView state = *b.backing->View(GroupId(0), 0, TensorPart::kRecurrentState);
  EXPECT_THAT(state.shape, ElementsAre(54, 16, 128, 128));
  EXPECT_THAT(state.byte_strides, ElementsAre(kMiB, 64 * kKiB, 512, 4));
  EXPECT_EQ(state.dtype, DType::kF32);
  const TensorView k = *b.backing->View(GroupId(1), 3, TensorPart::kKey);
  EXPECT_THAT(k.shape, ElementsAre(5361, 16, 2, 256));
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

// DeepSeek-V3.2: per layer the latent tensor (576 bf16 values a token) and the indexer-key
// tensor (132 bytes a token: 128 fp8 values, then one fp32 scale), sharing the MLA pool's block
// ids. A 16-token block is 61 × 16 × (1,152 + 132) = 1,253,184 bytes.
TEST(ManagerBacking, DeepSeekV32IndexKeyView) {
  Built b = Build("deepseek-v3.2", kGiB);
  const MemoryLayout& layout = b.backing->layout();
  ASSERT_EQ(layout.pools.size(), 1u);
  EXPECT_EQ(layout.pools[0].block_bytes, 1'253'184);
  EXPECT_EQ(layout.tensors.size(), 122u);  // latent and index key of each of 61 layers
  const int64_t blocks = layout.pools[0].num_blocks();
  const TensorView latent = *b.backing->View(GroupId(0), 60, TensorPart::kLatent);
  EXPECT_THAT(latent.shape, ElementsAre(blocks, 16, 1, 576));
  EXPECT_THAT(latent.byte_strides, ElementsAre(18432, 1152, 1152, 2));
  const TensorView keys = *b.backing->View(GroupId(0), 60, TensorPart::kIndexKey);
  EXPECT_THAT(keys.shape, ElementsAre(blocks, 16 * 132));
  EXPECT_THAT(keys.byte_strides, ElementsAre(2112, 1));
  EXPECT_EQ(keys.dtype, DType::kFP8);
  // DeepSeek-V2-Lite has no indexer, so no such tensor.
  Built v2 = Build("deepseek-v2-lite", kGiB);
  EXPECT_TRUE(absl::IsNotFound(v2.backing->View(GroupId(0), 0, TensorPart::kIndexKey).status()));
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
