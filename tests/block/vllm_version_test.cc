// What differs between the vLLM releases that vllm accounting follows (VllmVersion), with the
// exact block counts each release gives; docs/capacity_planning.md §3.2 cites vLLM's source.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "block/manager_test_util.h"
#include "kvpage/catalog.h"
#include "kvpage/kv_cache_manager.h"
#include "kvpage/vllm_version.h"

namespace kvpage {
namespace {

using testing::Ids;
using testing::Tokens;

TEST(VllmVersionTest, ParsesReleasesAndPatchLevels) {
  EXPECT_EQ(*ParseVllmVersion("0.29"), VllmVersion::kV0_29);
  EXPECT_EQ(*ParseVllmVersion("0.33"), VllmVersion::kV0_33);
  EXPECT_EQ(*ParseVllmVersion("v0.33"), VllmVersion::kV0_33);
  EXPECT_EQ(*ParseVllmVersion("0.29.1"), VllmVersion::kV0_29);
  EXPECT_EQ(VllmVersionName(VllmVersion::kV0_29), "0.29");
  EXPECT_EQ(VllmVersionName(kCurrentVllmVersion), "0.33");
  for (const char* bad : {"", "0.30", "0.3", "0.330", "0.33.", "0.33.x", "latest"}) {
    auto v = ParseVllmVersion(bad);
    ASSERT_FALSE(v.ok()) << bad;
    EXPECT_NE(v.status().message().find(std::string("'") + bad + "'"), std::string::npos);
  }
}

TEST(VllmVersionTest, ConfigRefusesAVersionThatIsNotOne) {
  KvCacheConfig c;
  c.kv_budget_bytes = 1 << 20;
  c.vllm_version = static_cast<VllmVersion>(7);
  const absl::Status s = c.Validate();
  EXPECT_TRUE(absl::IsInvalidArgument(s));
  EXPECT_NE(s.message().find("vllm_version 7"), std::string::npos) << s;
}

std::unique_ptr<KvCacheManager> Manager(const char* model, VllmVersion version,
                                        int64_t budget) {
  KvCacheConfig c;
  c.mode = AccountingMode::kVllm;
  c.vllm_version = version;
  c.kv_budget_bytes = budget;
  c.hash_seed = 1;
  auto spec = LoadModel(model);
  EXPECT_TRUE(spec.ok()) << spec.status();
  auto m = KvCacheManager::Create(*spec, c);
  EXPECT_TRUE(m.ok()) << m.status();
  return *std::move(m);
}

int64_t FreeBlocks(const KvCacheManager& m) {
  return static_cast<int64_t>(m.FreeBlockOrder(GroupId(0)).size());
}

// llama-3.1-8b: one block id = 16 tokens × 32 layers × 8 heads × 128 × 2 (K, V) × 2 B = 2 MiB.
// Ten of them are vLLM's num_gpu_blocks = 10; block 0 is its null block (0.33, and 0.29
// too, though kvpage's 0.29 emulation keeps its historical ten).
TEST(VllmVersionTest, NullBlockLeavesOneFewerUsableBlock) {
  constexpr int64_t kBlockId = int64_t{2} << 20;
  auto v33 = Manager("llama-3.1-8b", VllmVersion::kV0_33, 10 * kBlockId);
  auto v29 = Manager("llama-3.1-8b", VllmVersion::kV0_29, 10 * kBlockId);
  for (auto* m : {v33.get(), v29.get()}) {
    ASSERT_TRUE(m->AddRequest({RequestId(1), Tokens(16)}).ok());
    ASSERT_TRUE(m->AddRequest({RequestId(2), Tokens(144)}).ok());
    ASSERT_TRUE(*m->AllocateSlots(*m->Find(RequestId(1)), {.num_new_tokens = 16}));
    // vLLM hands out ids 1, 2, … after its null block.
    EXPECT_EQ(Ids(*m->BlockTable(*m->Find(RequestId(1)), GroupId(0)))[0], 1);
  }
  EXPECT_EQ(FreeBlocks(*v33), 8);
  EXPECT_EQ(FreeBlocks(*v29), 9);
  // 144 tokens = 9 more blocks: only the 0.29 emulation has them.
  EXPECT_FALSE(*v33->AllocateSlots(*v33->Find(RequestId(2)), {.num_new_tokens = 144}));
  EXPECT_TRUE(*v29->AllocateSlots(*v29->Find(RequestId(2)), {.num_new_tokens = 144}));
  EXPECT_TRUE(*v33->AllocateSlots(*v33->Find(RequestId(2)), {.num_new_tokens = 128}));
  EXPECT_EQ(FreeBlocks(*v33), 0);
  EXPECT_EQ(FreeBlocks(*v29), 0);
  EXPECT_TRUE(v33->CheckInvariants().ok());
  // A budget of exactly one block id leaves vLLM nothing but its null block.
  KvCacheConfig c;
  c.mode = AccountingMode::kVllm;
  c.kv_budget_bytes = kBlockId;
  auto one = KvCacheManager::Create(*LoadModel("llama-3.1-8b"), c);
  ASSERT_FALSE(one.ok());
  EXPECT_TRUE(absl::IsResourceExhausted(one.status())) << one.status();
  EXPECT_NE(one.status().message().find("null block"), std::string::npos) << one.status();
}

// vLLM's free queue holds every block from the start (block 0 taken as its null block), so
// before anything is allocated it lists ids 1..num_gpu_blocks - 1 in order, and the first
// allocation takes from its front.
TEST(VllmVersionTest, FreeQueueListsEveryBlockBeforeTheFirstAllocation) {
  constexpr int64_t kBlockId = int64_t{2} << 20;  // llama-3.1-8b (see above)
  auto m = Manager("llama-3.1-8b", VllmVersion::kV0_33, 10 * kBlockId);
  EXPECT_THAT(Ids(m->FreeBlockOrder(GroupId(0))),
              ::testing::ElementsAre(1, 2, 3, 4, 5, 6, 7, 8, 9));
  ASSERT_TRUE(m->AddRequest({RequestId(1), Tokens(40)}).ok());
  ASSERT_TRUE(*m->AllocateSlots(*m->Find(RequestId(1)), {.num_new_tokens = 40}));
  EXPECT_THAT(Ids(*m->BlockTable(*m->Find(RequestId(1)), GroupId(0))),
              ::testing::ElementsAre(1, 2, 3));
  EXPECT_THAT(Ids(m->FreeBlockOrder(GroupId(0))), ::testing::ElementsAre(4, 5, 6, 7, 8, 9));
  EXPECT_TRUE(m->CheckInvariants().ok());
}

// qwen3.5-0.8b under vllm accounting: 6 full + 18 Gated DeltaNet layers → group size 6, one
// full-attention group and three linear-attention groups sharing 544-token block ids.
// A 512-token first chunk: vLLM 0.33's MambaManager takes one block per linear group
// (num_new_blocks = cdiv(512, 544) = 1, capped at 1); kvpage's 0.29 emulation takes the two
// of MambaSpec.max_memory_usage_bytes.
TEST(VllmVersionTest, FirstChunkTakesOneStateBlockPerLinearGroupIn033) {
  constexpr int64_t kBudget = int64_t{1} << 30;
  for (const auto& [version, blocks] :
       {std::pair{VllmVersion::kV0_33, 1 + 3 * 1}, std::pair{VllmVersion::kV0_29, 1 + 3 * 2}}) {
    SCOPED_TRACE(VllmVersionName(version));
    auto m = Manager("qwen3.5-0.8b", version, kBudget);
    ASSERT_EQ(m->num_groups(), 4);
    EXPECT_EQ(m->group_block_size(GroupId(3)), 544);  // groups 0-2 are linear attention
    ASSERT_TRUE(m->AddRequest({RequestId(1), Tokens(2000)}).ok());
    const RequestHandle h = *m->Find(RequestId(1));
    const AllocationRequest chunk{.num_new_tokens = 512};
    EXPECT_EQ(*m->BlocksNeeded(h, chunk), blocks);
    ASSERT_TRUE(*m->AllocateSlots(h, chunk));
    EXPECT_EQ(m->Usage().pools[0].used_blocks, blocks);
    ASSERT_TRUE(m->Free(h).ok());
    EXPECT_EQ(m->Usage().pools[0].used_blocks, 0);
    EXPECT_TRUE(m->CheckInvariants().ok());
  }
}


// vLLM 0.33's "align" bookkeeping, op by op, on qwen3.5-0.8b (groups 0-2 linear attention,
// group 3 full attention, 544-token blocks) with num_gpu_blocks = 20. Every number below is
// what vLLM 0.33.0's own KVCacheManager answered to the same calls (tools/vllm_diff).
TEST(VllmVersionTest, AlignModeStateBlocksMatchVllm033) {
  constexpr int64_t kBs = 544;
  auto m = Manager("qwen3.5-0.8b", VllmVersion::kV0_33, 20 * int64_t{6684672});
  const std::vector<int32_t> prompt = Tokens(2 * kBs + 100, 1);
  ASSERT_TRUE(m->AddRequest({RequestId(1), prompt}).ok());
  const RequestHandle a = *m->Find(RequestId(1));
  auto state = [&](RequestHandle h, int32_t g) {
    const StateSlots s = *m->GetStateSlots(h, GroupId(g));
    return std::pair{s.read_slot, s.write_slot};
  };
  const int64_t chunks[] = {kBs, kBs, 100};
  const int64_t free_after[] = {15, 11, 10};
  int64_t computed = 0;
  for (int i = 0; i < 3; ++i) {
    m->NewStep();
    ASSERT_TRUE(*m->AllocateSlots(a, {.num_computed_tokens = computed,
                                      .num_new_tokens = chunks[i]}));
    computed += chunks[i];
    EXPECT_EQ(FreeBlocks(*m), free_after[i]) << "chunk " << i;
  }
  // The second chunk entered block 1: new state blocks 5, 6, 7 beside 1, 2, 3, which the third
  // step's allocation freed (vLLM: [0, 5, 9] per linear group).
  EXPECT_EQ(state(a, 0), std::pair(5, 9));
  EXPECT_THAT(Ids(*m->BlockTable(a, GroupId(3))), ::testing::ElementsAre(4, 8, 12));
  ASSERT_TRUE(m->AppendTokens(a, {7}).ok());
  m->NewStep();
  // A second prompt sharing 1,088 tokens resumes from the states cached at that boundary.
  ASSERT_TRUE(m->AddRequest({RequestId(2), testing::Concat(std::vector<int32_t>(
                                               prompt.begin(), prompt.begin() + 2 * kBs),
                                           std::vector<int32_t>(50, 999))}).ok());
  const RequestHandle b = *m->Find(RequestId(2));
  const CacheHit hit = *m->GetComputedBlocks(b);
  EXPECT_EQ(hit.num_tokens, 2 * kBs);
  EXPECT_THAT(Ids(hit.blocks[0]), ::testing::ElementsAre(5));
  EXPECT_THAT(Ids(hit.blocks[3]), ::testing::ElementsAre(4, 8));
  ASSERT_TRUE(*m->AllocateSlots(b, {.num_computed_tokens = 2 * kBs, .num_new_tokens = 50,
                                    .hit = &hit}));
  EXPECT_EQ(FreeBlocks(*m), 6);
  EXPECT_EQ(state(b, 0), std::pair(5, 13));
  EXPECT_EQ(state(b, 2), std::pair(7, 15));
  EXPECT_THAT(Ids(*m->BlockTable(b, GroupId(3))), ::testing::ElementsAre(4, 8, 16));
  // Freeing the first request: its unhashed blocks first (last freed first), then the blocks
  // never used, then the cached states of the first chunk.
  ASSERT_TRUE(m->Free(a).ok());
  EXPECT_THAT(Ids(m->FreeBlockOrder(GroupId(0))),
              ::testing::ElementsAre(12, 11, 10, 9, 17, 18, 19, 1, 2, 3));
  EXPECT_TRUE(m->CheckInvariants().ok());
}

}  // namespace
}  // namespace kvpage
