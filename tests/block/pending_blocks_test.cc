// Blocks join the prefix cache only once the step that writes them has completed
// (KvCacheManager::CompleteStep): a request freed before that caches nothing of the step.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>

#include "block/manager_test_util.h"
#include "kvpage/kv_cache_manager.h"

namespace kvpage {
namespace {

using ::testing::ElementsAre;
using testing::Concat;
using testing::H;
using testing::Ids;
using testing::TinyModel;
using testing::Tokens;

constexpr GroupId kG0{0};

// kTinyFull: 512 bytes per 16-token block, `blocks` blocks in one chunk, events on.
std::unique_ptr<KvCacheManager> Manager(int32_t blocks,
                                        AccountingMode mode = AccountingMode::kKvpage) {
  KvCacheConfig c;
  c.mode = mode;
  c.kv_budget_bytes = int64_t{blocks} * 512;
  c.chunk_bytes = c.kv_budget_bytes;
  c.hash_seed = 7;
  c.enable_kv_events = true;
  auto m = KvCacheManager::Create(TinyModel(testing::kTinyFull), c);
  EXPECT_TRUE(m.ok()) << m.status();
  return *std::move(m);
}

int64_t HitTokens(KvCacheManager& m, int64_t id, std::vector<int32_t> prompt) {
  EXPECT_TRUE(m.AddRequest({RequestId(id), std::move(prompt)}).ok());
  absl::StatusOr<CacheHit> hit = m.GetComputedBlocks(H(m, id));
  EXPECT_TRUE(hit.ok()) << hit.status();
  return hit.ok() ? hit->num_tokens : -1;
}

int CountEvents(const std::vector<KvEvent>& events, KvEvent::Type type) {
  int n = 0;
  for (const KvEvent& e : events) n += e.type == type ? 1 : 0;
  return n;
}

TEST(PendingBlocksTest, BlocksJoinTheCacheWhenTheStepCompletes) {
  auto m = Manager(40);
  ASSERT_TRUE(m->AddRequest({RequestId(1), Tokens(100)}).ok());
  ASSERT_TRUE(*m->AllocateSlots(H(*m, 1), {.num_new_tokens = 100}));  // 7 blocks, 6 full
  KVPAGE_EXPECT_INVARIANTS(*m);
  // Same step: the six full blocks are not written yet, so nothing hits and no event is out.
  EXPECT_EQ(HitTokens(*m, 2, Tokens(100)), 0);
  EXPECT_TRUE(m->DrainEvents().empty());
  EXPECT_EQ(*m->NextEvent(H(*m, 1)), 112);  // as before: a step ending at 112 fills block 7
  m->CompleteStep();
  KVPAGE_EXPECT_INVARIANTS(*m);
  std::vector<KvEvent> events = m->DrainEvents();
  EXPECT_EQ(events.size(), 6u);
  EXPECT_EQ(CountEvents(events, KvEvent::Type::kStored), 6);
  for (size_t i = 1; i < events.size(); ++i) EXPECT_EQ(events[i].parent, events[i - 1].hash);
  EXPECT_EQ(m->GetComputedBlocks(H(*m, 2))->num_tokens, 96);
  EXPECT_EQ(HitTokens(*m, 3, Tokens(100)), 96);
  m->CompleteStep();  // nothing pending: no change
  EXPECT_TRUE(m->DrainEvents().empty());
  EXPECT_EQ(m->Usage().pools[0].used_blocks, 7);
}

// The abort of a request between scheduling and its forward pass: its blocks go back clean.
TEST(PendingBlocksTest, FreeBeforeCompletionCachesNothing) {
  auto m = Manager(70);
  ASSERT_TRUE(m->AddRequest({RequestId(1), Tokens(1000)}).ok());
  ASSERT_TRUE(*m->AllocateSlots(H(*m, 1), {.num_new_tokens = 1000}));  // 63 blocks, 62 full
  EXPECT_EQ(m->Usage().pools[0].used_blocks, 63);
  ASSERT_TRUE(m->Free(H(*m, 1)).ok());
  KVPAGE_EXPECT_INVARIANTS(*m);
  const KvCacheUsage u = m->Usage();
  EXPECT_EQ(u.pools[0].used_blocks, 0);
  EXPECT_EQ(u.pools[0].cached_free_blocks, 0);
  EXPECT_EQ(u.pools[0].clean_blocks, 70);
  m->CompleteStep();
  EXPECT_TRUE(m->DrainEvents().empty());
  EXPECT_EQ(HitTokens(*m, 2, Tokens(1000)), 0);
  EXPECT_EQ(m->prefix_cache_stats().hit_tokens, 0);
  ASSERT_TRUE(m->Free(H(*m, 2)).ok());
  KVPAGE_EXPECT_INVARIANTS(*m);
}

// Earlier steps stay cached when a request leaves mid-step; only the unfinished step is lost.
TEST(PendingBlocksTest, FreeKeepsTheCompletedStepsBlocks) {
  auto m = Manager(40);
  ASSERT_TRUE(m->AddRequest({RequestId(1), Tokens(100)}).ok());
  ASSERT_TRUE(*m->AllocateSlots(H(*m, 1), {.num_new_tokens = 64}));  // chunk 1: 4 full blocks
  m->NewStep();                                                       // completes it
  EXPECT_EQ(m->DrainEvents().size(), 4u);
  ASSERT_TRUE(*m->AllocateSlots(H(*m, 1), {.num_computed_tokens = 64, .num_new_tokens = 36}));
  ASSERT_TRUE(m->Free(H(*m, 1)).ok());  // chunk 2 (blocks 5 and 6 full) never ran
  KVPAGE_EXPECT_INVARIANTS(*m);
  EXPECT_TRUE(m->DrainEvents().empty());
  const KvCacheUsage u = m->Usage();
  EXPECT_EQ(u.pools[0].cached_free_blocks, 4);
  EXPECT_EQ(u.pools[0].clean_blocks, 36);
  // Clean blocks are handed out first, then the cache, least recently freed first.
  const std::vector<int32_t> order = Ids(m->FreeBlockOrder(kG0));
  ASSERT_EQ(order.size(), 40u);
  EXPECT_THAT(std::vector<int32_t>(order.end() - 4, order.end()), ElementsAre(4, 3, 2, 1));
  EXPECT_EQ(HitTokens(*m, 2, Tokens(100)), 64);
}

// A decode step that fills a block: the block is a hit after the step, not during it.
TEST(PendingBlocksTest, DecodeBlockJoinsAfterItsStep) {
  auto m = Manager(10);
  ASSERT_TRUE(m->AddRequest({RequestId(1), Tokens(55)}).ok());
  ASSERT_TRUE(*m->AllocateSlots(H(*m, 1), {.num_new_tokens = 55}));
  m->CompleteStep();
  ASSERT_TRUE(m->AppendTokens(H(*m, 1), Tokens(9, 100)).ok());
  const DecodeStep step{.request = H(*m, 1), .num_computed_tokens = 55, .num_new_tokens = 9};
  ASSERT_EQ(*m->AllocateDecodeStep({&step, 1}), 1);
  const std::vector<int32_t> seq = Concat(Concat(Tokens(55), Tokens(9, 100)), {1});
  EXPECT_EQ(HitTokens(*m, 2, seq), 48);
  m->CompleteStep();
  KVPAGE_EXPECT_INVARIANTS(*m);
  EXPECT_EQ(HitTokens(*m, 3, seq), 64);
}

// A rollback of the tokens whose step is pending drops the pending block too.
TEST(PendingBlocksTest, RollbackDropsAPendingBlock) {
  auto m = Manager(10);
  ASSERT_TRUE(m->AddRequest({RequestId(1), Tokens(10)}).ok());
  ASSERT_TRUE(*m->AllocateSlots(H(*m, 1), {.num_new_tokens = 10}));
  m->CompleteStep();
  ASSERT_TRUE(m->AppendTokens(H(*m, 1), Tokens(6, 100)).ok());  // fills block 1
  ASSERT_TRUE(*m->AllocateSlots(H(*m, 1), {.num_computed_tokens = 10, .num_new_tokens = 6}));
  ASSERT_TRUE(m->RollbackTokens(H(*m, 1), 3).ok());
  m->CompleteStep();
  KVPAGE_EXPECT_INVARIANTS(*m);
  EXPECT_TRUE(m->DrainEvents().empty());
  EXPECT_EQ(HitTokens(*m, 2, Concat(Concat(Tokens(10), Tokens(6, 100)), {1})), 0);
}

// vllm accounting caches at allocation, as vLLM does: a request admitted later in the same
// step hits, and a request freed before its step ran leaves its blocks cached.
TEST(PendingBlocksTest, VllmAccountingCachesAtAllocation) {
  auto m = Manager(40, AccountingMode::kVllm);
  ASSERT_TRUE(m->AddRequest({RequestId(1), Tokens(100)}).ok());
  ASSERT_TRUE(*m->AllocateSlots(H(*m, 1), {.num_new_tokens = 100}));
  EXPECT_EQ(m->DrainEvents().size(), 6u);
  EXPECT_EQ(HitTokens(*m, 2, Tokens(100)), 96);
  ASSERT_TRUE(m->Free(H(*m, 1)).ok());
  KVPAGE_EXPECT_INVARIANTS(*m);
  EXPECT_EQ(m->Usage().pools[0].cached_free_blocks, 6);
}

// Recurrent state: the snapshot a step writes is registered when the step completes, and
// dropped when the request leaves first.
std::unique_ptr<KvCacheManager> GdnManager(AccountingMode mode = AccountingMode::kKvpage) {
  KvCacheConfig c;
  c.mode = mode;
  c.kv_budget_bytes = 1 << 20;
  c.chunk_bytes = 64 << 10;
  c.hash_seed = 3;
  c.decode_snapshot_interval_blocks = 0;
  auto m = KvCacheManager::Create(TinyModel(testing::kTinyGdn), c);
  EXPECT_TRUE(m.ok()) << m.status();
  return *std::move(m);
}

TEST(PendingBlocksTest, RecurrentSnapshotOfAnUnfinishedStepIsDropped) {
  auto m = GdnManager();
  ASSERT_TRUE(m->AddRequest({RequestId(1), Tokens(64)}).ok());
  ASSERT_TRUE(*m->AllocateSlots(H(*m, 1), {.num_new_tokens = 64}));
  EXPECT_EQ(HitTokens(*m, 2, Tokens(65)), 0);  // same step
  ASSERT_TRUE(m->Free(H(*m, 1)).ok());
  m->CompleteStep();
  KVPAGE_EXPECT_INVARIANTS(*m);
  EXPECT_EQ(m->GetComputedBlocks(H(*m, 2))->num_tokens, 0);
  for (const PoolUsage& p : m->Usage().pools) {
    EXPECT_EQ(p.used_blocks, 0);
    EXPECT_EQ(p.cached_free_blocks, 0);
  }
  // The same prompt run to completion of its step serves the next one.
  ASSERT_TRUE(*m->AllocateSlots(H(*m, 2), {.num_new_tokens = 64}));
  m->CompleteStep();
  ASSERT_TRUE(m->Free(H(*m, 2)).ok());
  KVPAGE_EXPECT_INVARIANTS(*m);
  EXPECT_EQ(HitTokens(*m, 3, Tokens(65)), 64);
}

// Async scheduling under vllm accounting. Step 2 computes the placeholder token that ends the
// first block, so its state snapshot's hash is unknown when it is allocated. vLLM caches that
// state only at its next cache_blocks on the request: the request's next allocation, or an
// output showing the tokens processed; a request preempted before either never caches it.
class DeferredSnapshotTest : public ::testing::Test {
 protected:
  void SetUp() override {
    m_ = GdnManager(AccountingMode::kVllm);
    for (int32_t g = 0; g < m_->num_groups(); ++g) {  // the attention group's
      bs_ = std::max(bs_, m_->group_block_size(GroupId(g)));
    }
    ASSERT_TRUE(m_->AddRequest({RequestId(1), Tokens(bs_ - 1)}).ok());
    ASSERT_TRUE(*m_->AllocateSlots(H(*m_, 1), {.num_new_tokens = bs_ - 1}));
    m_->NewStep();  // step 1 (the prompt) has run; its output is not applied yet
    ASSERT_TRUE(*m_->AllocateSlots(
        H(*m_, 1), {.num_computed_tokens = bs_ - 1, .num_new_tokens = 1,
                    .num_processed_tokens = bs_ - 1}));
    ASSERT_TRUE(m_->AppendTokens(H(*m_, 1), {900}).ok());  // step 1's output
    ASSERT_TRUE(m_->CacheComputedBlocks(H(*m_, 1), bs_ - 1).ok());
    m_->NewStep();  // step 2 has run as far as the manager knows; its output is not applied
    KVPAGE_EXPECT_INVARIANTS(*m_);
  }
  // Tokens a request with the first block and one more token would hit.
  int64_t Hit(int64_t id) { return HitTokens(*m_, id, Concat(Tokens(bs_ - 1), {900, 7})); }
  // Free blocks that stay in the prefix cache (vllm accounting: the four groups share one
  // pool, which every group's entry reports).
  int32_t CachedFree() const { return m_->Usage().pools[0].cached_free_blocks; }

  std::unique_ptr<KvCacheManager> m_;
  int32_t bs_ = 0;
};

TEST_F(DeferredSnapshotTest, BlockSize) {
  // vLLM sizes the attention block so its page holds a linear layer's state: 32 bytes of K/V
  // per token against 288 (conv, bf16) + 512 (recurrent, f32) = 800 bytes, so 25 tokens,
  // rounded up to a multiple of 16 tokens.
  EXPECT_EQ(bs_, 32);
}

TEST_F(DeferredSnapshotTest, PreemptedBeforeItsNextAllocationCachesNothing) {
  EXPECT_EQ(Hit(2), 0);
  ASSERT_TRUE(m_->Free(H(*m_, 1)).ok());
  KVPAGE_EXPECT_INVARIANTS(*m_);
  EXPECT_EQ(CachedFree(), 0);  // neither the attention block nor the three layers' states
  ASSERT_TRUE(m_->Free(H(*m_, 2)).ok());
  EXPECT_EQ(Hit(3), 0);
}

TEST_F(DeferredSnapshotTest, NextAllocationCachesIt) {
  ASSERT_TRUE(*m_->AllocateSlots(H(*m_, 1), {.num_computed_tokens = bs_, .num_new_tokens = 1,
                                            .num_processed_tokens = bs_ - 1}));
  KVPAGE_EXPECT_INVARIANTS(*m_);
  EXPECT_EQ(Hit(2), bs_);
  ASSERT_TRUE(m_->Free(H(*m_, 2)).ok());
  ASSERT_TRUE(m_->Free(H(*m_, 1)).ok());
  KVPAGE_EXPECT_INVARIANTS(*m_);
  EXPECT_EQ(CachedFree(), 4);  // block 0 of the attention group and of each state group
  EXPECT_EQ(Hit(3), bs_);
}

TEST_F(DeferredSnapshotTest, OutputShowingItProcessedCachesIt) {
  ASSERT_TRUE(m_->AppendTokens(H(*m_, 1), {901}).ok());  // step 2's output
  ASSERT_TRUE(m_->CacheComputedBlocks(H(*m_, 1), bs_ - 1).ok());
  EXPECT_EQ(Hit(2), 0);  // the output still counts step 2's token in flight
  ASSERT_TRUE(m_->Free(H(*m_, 2)).ok());
  ASSERT_TRUE(m_->CacheComputedBlocks(H(*m_, 1), bs_).ok());
  EXPECT_EQ(Hit(3), bs_);
  ASSERT_TRUE(m_->Free(H(*m_, 3)).ok());
  ASSERT_TRUE(m_->Free(H(*m_, 1)).ok());
  KVPAGE_EXPECT_INVARIANTS(*m_);
  EXPECT_EQ(CachedFree(), 4);
  EXPECT_EQ(Hit(4), bs_);
}

}  // namespace
}  // namespace kvpage
