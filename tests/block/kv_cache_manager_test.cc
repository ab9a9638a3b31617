// The block manager against vLLM's acceptance scenarios (vllm.md §6.1–6.3), with exact block
// ids, plus kvpage's own pools (recurrent snapshots, chunks) and bad input.
#include "kvpage/kv_cache_manager.h"

#include <limits>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "block/manager_test_util.h"

namespace kvpage {
namespace {

using ::testing::ElementsAre;
using testing::H;
using testing::Concat;
using testing::Ids;
using testing::Tokens;
using testing::TinyModel;

constexpr GroupId kG0{0};
constexpr GroupId kG1{1};
constexpr GroupId kG2{2};

// kvpage mode over one chunk of `blocks` usable blocks (vLLM's pool of blocks + 1).
std::unique_ptr<KvCacheManager> FullManager(int32_t blocks, bool caching = true,
                                            int32_t block_size = 16) {
  KvCacheConfig c;
  c.block_size = block_size;
  c.kv_budget_bytes = int64_t{blocks} * block_size * 32;
  c.chunk_bytes = c.kv_budget_bytes;
  c.enable_prefix_caching = caching;
  c.hash_seed = 7;
  auto m = KvCacheManager::Create(TinyModel(testing::kTinyFull), c);
  EXPECT_TRUE(m.ok()) << m.status();
  return *std::move(m);
}

// Adds a request, looks up its hit, allocates its whole prompt and completes the step (its
// full blocks join the prefix cache); returns the hit length.
int64_t AddAndPrefill(KvCacheManager& m, int64_t id, const std::vector<int32_t>& prompt) {
  EXPECT_TRUE(m.AddRequest({RequestId(id), prompt}).ok());
  auto hit = m.GetComputedBlocks(H(m, RequestId(id)));
  EXPECT_TRUE(hit.ok()) << hit.status();
  AllocationRequest req;
  req.num_computed_tokens = hit->num_tokens;
  req.num_new_tokens = static_cast<int64_t>(prompt.size()) - hit->num_tokens;
  req.hit = &*hit;
  auto ok = m.AllocateSlots(H(m, RequestId(id)), req);
  EXPECT_TRUE(ok.ok()) << ok.status();
  EXPECT_TRUE(*ok);
  m.CompleteStep();
  KVPAGE_EXPECT_INVARIANTS(m);
  return hit->num_tokens;
}

std::vector<int32_t> Table(const KvCacheManager& m, int64_t id, GroupId g = kG0) {
  auto t = m.BlockTable(H(m, RequestId(id)), g);
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? Ids(*t) : std::vector<int32_t>{};
}

// T1: prefill, hit, free order, eviction order.
TEST(KvCacheManagerTest, PrefillHitAndFreeOrder) {
  auto m = FullManager(10);
  const std::vector<int32_t> common = Tokens(48);
  EXPECT_EQ(AddAndPrefill(*m, 1, Concat(common, Tokens(7, 1000))), 0);
  EXPECT_THAT(Table(*m, 1), ElementsAre(1, 2, 3, 4));
  EXPECT_EQ(AddAndPrefill(*m, 2, Concat(common, Tokens(5, 2000))), 48);
  EXPECT_THAT(Table(*m, 2), ElementsAre(1, 2, 3, 5));
  EXPECT_EQ(m->Usage().pools[0].used_blocks, 5);
  ASSERT_TRUE(m->Free(H(*m, RequestId(1))).ok());
  ASSERT_TRUE(m->Free(H(*m, RequestId(2))).ok());
  KVPAGE_EXPECT_INVARIANTS(*m);
  EXPECT_THAT(Ids(m->FreeBlockOrder(kG0)), ElementsAre(5, 4, 6, 7, 8, 9, 10, 3, 2, 1));

  EXPECT_EQ(AddAndPrefill(*m, 3, Concat(common, Tokens(6, 3000))), 48);
  EXPECT_THAT(Table(*m, 3), ElementsAre(1, 2, 3, 5));
  EXPECT_EQ(m->Usage().pools[0].used_blocks, 4);
  ASSERT_TRUE(m->Free(H(*m, RequestId(3))).ok());
  // 160 tokens with no hit take every block, in eviction order.
  EXPECT_EQ(AddAndPrefill(*m, 4, Tokens(160, 5000)), 0);
  EXPECT_THAT(Table(*m, 4), ElementsAre(5, 4, 6, 7, 8, 9, 10, 3, 2, 1));
  EXPECT_TRUE(m->FreeBlockOrder(kG0).empty());
}

// T2: decode growth caches blocks as they fill.
TEST(KvCacheManagerTest, DecodeGrowth) {
  auto m = FullManager(10);
  AddAndPrefill(*m, 1, Tokens(55));
  AllocationRequest step{.num_computed_tokens = 55, .num_new_tokens = 4};
  ASSERT_TRUE(m->AppendTokens(H(*m, RequestId(1)), Tokens(4, 100)).ok());
  ASSERT_TRUE(*m->AllocateSlots(H(*m, RequestId(1)), step));
  EXPECT_THAT(Table(*m, 1), ElementsAre(1, 2, 3, 4));  // 59 tokens fit in 4 blocks
  ASSERT_TRUE(m->AppendTokens(H(*m, RequestId(1)), Tokens(19, 200)).ok());
  step = {.num_computed_tokens = 59, .num_new_tokens = 19};
  ASSERT_TRUE(*m->AllocateSlots(H(*m, RequestId(1)), step));
  EXPECT_THAT(Table(*m, 1), ElementsAre(1, 2, 3, 4, 5));
  KVPAGE_EXPECT_INVARIANTS(*m);
  m->CompleteStep();
  // Block 4 (tokens 48–63) became full and, its step done, is a hit for the same 64 tokens.
  std::vector<int32_t> seq = Concat(Concat(Tokens(55), Tokens(4, 100)), Tokens(19, 200));
  seq.resize(65);
  ASSERT_TRUE(m->AddRequest({RequestId(2), seq}).ok());
  EXPECT_EQ(m->GetComputedBlocks(H(*m, RequestId(2)))->num_tokens, 64);
}

// T3: LRU eviction order after freeing two requests.
TEST(KvCacheManagerTest, LruEvictionOrder) {
  auto m = FullManager(10);
  const std::vector<int32_t> a = Tokens(87);
  AddAndPrefill(*m, 1, a);
  EXPECT_THAT(Table(*m, 1), ElementsAre(1, 2, 3, 4, 5, 6));
  AddAndPrefill(*m, 2, Tokens(48, 1000));
  EXPECT_THAT(Table(*m, 2), ElementsAre(7, 8, 9));
  ASSERT_TRUE(m->Free(H(*m, RequestId(1))).ok());
  EXPECT_THAT(Ids(m->FreeBlockOrder(kG0)), ElementsAre(6, 10, 5, 4, 3, 2, 1));
  ASSERT_TRUE(m->Free(H(*m, RequestId(2))).ok());
  EXPECT_THAT(Ids(m->FreeBlockOrder(kG0)), ElementsAre(6, 10, 5, 4, 3, 2, 1, 9, 8, 7));
  EXPECT_EQ(AddAndPrefill(*m, 3, std::vector<int32_t>(a.begin(), a.begin() + 35)), 32);
  EXPECT_THAT(Table(*m, 3), ElementsAre(1, 2, 6));
  EXPECT_EQ(m->Usage().pools[0].used_blocks, 3);
}

// T4: a reused page loses its old hash.
TEST(KvCacheManagerTest, ReusedBlockDropsItsHash) {
  auto m = FullManager(1);
  m->DrainEvents();
  AddAndPrefill(*m, 1, Tokens(16));  // one full block, cached at allocation
  ASSERT_TRUE(m->Free(H(*m, RequestId(1))).ok());
  AddAndPrefill(*m, 2, Tokens(15, 100));  // takes the same page
  EXPECT_THAT(Table(*m, 2), ElementsAre(1));
  ASSERT_TRUE(m->Free(H(*m, RequestId(2))).ok());
  ASSERT_TRUE(m->AddRequest({RequestId(3), Tokens(17)}).ok());
  EXPECT_EQ(m->GetComputedBlocks(H(*m, RequestId(3)))->num_tokens, 0);
  KVPAGE_EXPECT_INVARIANTS(*m);
}

// T5: a hit block is not the one evicted for the new block.
TEST(KvCacheManagerTest, HitBlocksAreNotEvictedForTheirOwnRequest) {
  auto m = FullManager(2);
  const std::vector<int32_t> a = Tokens(16);
  AddAndPrefill(*m, 1, Concat(a, {7}));  // needs 2 blocks: [1, 2]
  ASSERT_TRUE(m->Free(H(*m, RequestId(1))).ok());
  AddAndPrefill(*m, 2, Concat(Tokens(16, 500), {7}));  // evicts 2 (unhashed) then 1? no: [2, 1]
  EXPECT_THAT(Table(*m, 2), ElementsAre(2, 1));
  ASSERT_TRUE(m->Free(H(*m, RequestId(2))).ok());
  KVPAGE_EXPECT_INVARIANTS(*m);
}

// T6: caching disabled: no hits, and the pool runs out.
TEST(KvCacheManagerTest, CachingDisabled) {
  auto m = FullManager(4, /*caching=*/false, /*block_size=*/4);
  AddAndPrefill(*m, 1, Tokens(10));
  EXPECT_THAT(Table(*m, 1), ElementsAre(1, 2, 3));
  ASSERT_TRUE(m->Free(H(*m, RequestId(1))).ok());
  EXPECT_EQ(AddAndPrefill(*m, 2, Tokens(16)), 0);
  EXPECT_EQ(Table(*m, 2).size(), 4u);
  ASSERT_TRUE(m->AddRequest({RequestId(3), Tokens(4, 900)}).ok());
  auto ok = m->AllocateSlots(H(*m, RequestId(3)), {.num_new_tokens = 4});
  ASSERT_TRUE(ok.ok());
  EXPECT_FALSE(*ok);
  KVPAGE_EXPECT_INVARIANTS(*m);
}

// T7: a failed allocation touches nothing.
TEST(KvCacheManagerTest, FailedAllocationHasNoSideEffects) {
  auto m = FullManager(10);
  const std::vector<int32_t> prefix = Tokens(144);
  AddAndPrefill(*m, 1, std::vector<int32_t>(prefix.begin(), prefix.begin() + 48));  // [1,2,3]
  AddAndPrefill(*m, 2, std::vector<int32_t>(prefix.begin(), prefix.begin() + 96));  // +[4,5,6]
  ASSERT_TRUE(m->Free(H(*m, RequestId(2))).ok());
  AddAndPrefill(*m, 3, Tokens(32, 5000));  // 2 blocks → 5 free
  EXPECT_EQ(m->Usage().pools[0].clean_blocks + m->Usage().pools[0].cached_free_blocks, 5);
  ASSERT_TRUE(m->AddRequest({RequestId(4), prefix}).ok());
  auto hit = m->GetComputedBlocks(H(*m, RequestId(4)));
  ASSERT_TRUE(hit.ok());
  EXPECT_EQ(hit->num_tokens, 96);
  const std::vector<BlockId> before = m->FreeBlockOrder(kG0);
  AllocationRequest req{.num_computed_tokens = 96, .num_new_tokens = 48, .hit = &*hit};
  EXPECT_EQ(*m->BlocksNeeded(H(*m, RequestId(4)), req), 6);  // 3 new + 3 hit blocks now free
  auto ok = m->AllocateSlots(H(*m, RequestId(4)), req);
  ASSERT_TRUE(ok.ok());
  EXPECT_FALSE(*ok);
  EXPECT_EQ(m->FreeBlockOrder(kG0), before);
  EXPECT_THAT(Table(*m, 1), ElementsAre(1, 2, 3));
  EXPECT_TRUE(Table(*m, 4).empty());
  KVPAGE_EXPECT_INVARIANTS(*m);
}

// T8: cache salts separate otherwise identical prompts.
TEST(KvCacheManagerTest, CacheSaltSeparatesPrompts) {
  auto m = FullManager(20);
  const std::vector<int32_t> p = Tokens(55);
  KvRequestSpec a{RequestId(1), p};
  a.extras.cache_salt = "salt1";
  ASSERT_TRUE(m->AddRequest(a).ok());
  ASSERT_TRUE(*m->AllocateSlots(H(*m, RequestId(1)), {.num_new_tokens = 55}));
  m->CompleteStep();
  KvRequestSpec same = a;
  same.id = RequestId(2);
  ASSERT_TRUE(m->AddRequest(same).ok());
  EXPECT_EQ(m->GetComputedBlocks(H(*m, RequestId(2)))->num_tokens, 48);
  KvRequestSpec other = a;
  other.id = RequestId(3);
  other.extras.cache_salt = "salt2";
  ASSERT_TRUE(m->AddRequest(other).ok());
  EXPECT_EQ(m->GetComputedBlocks(H(*m, RequestId(3)))->num_tokens, 0);
  ASSERT_TRUE(m->AddRequest({RequestId(4), p}).ok());
  EXPECT_EQ(m->GetComputedBlocks(H(*m, RequestId(4)))->num_tokens, 0);
}

// T10: a request that skips reading still writes; no de-duplication of equal hashes.
TEST(KvCacheManagerTest, SkipReadStillWritesWithoutDedup) {
  auto m = FullManager(20);
  AddAndPrefill(*m, 1, Tokens(40));
  KvRequestSpec plp{RequestId(2), Tokens(40)};
  plp.skip_prefix_cache_read = true;
  ASSERT_TRUE(m->AddRequest(plp).ok());
  EXPECT_EQ(m->GetComputedBlocks(H(*m, RequestId(2)))->num_tokens, 0);
  ASSERT_TRUE(*m->AllocateSlots(H(*m, RequestId(2)), {.num_new_tokens = 40}));
  m->CompleteStep();
  EXPECT_THAT(Table(*m, 1), ElementsAre(1, 2, 3));
  EXPECT_THAT(Table(*m, 2), ElementsAre(4, 5, 6));
  ASSERT_TRUE(m->Free(H(*m, RequestId(1))).ok());
  KVPAGE_EXPECT_INVARIANTS(*m);
  // Blocks 1 and 2 were evictable, but 4 and 5 still serve the same hashes.
  ASSERT_TRUE(m->AddRequest({RequestId(3), Tokens(40)}).ok());
  auto hit = m->GetComputedBlocks(H(*m, RequestId(3)));
  EXPECT_EQ(hit->num_tokens, 32);
}

// T16: two identical prompts in one step. vllm accounting (as vLLM) lets the second reuse
// what the first just allocated; kvpage waits for the step to complete
// (tests/block/pending_blocks_test.cc).
TEST(KvCacheManagerTest, SameStepDedup) {
  KvCacheConfig c;
  c.mode = AccountingMode::kVllm;
  c.kv_budget_bytes = 40 * 512;
  c.chunk_bytes = c.kv_budget_bytes;
  c.hash_seed = 7;
  auto m = *KvCacheManager::Create(TinyModel(testing::kTinyFull), c);
  ASSERT_TRUE(m->AddRequest({RequestId(1), Tokens(100)}).ok());
  ASSERT_TRUE(*m->AllocateSlots(H(*m, RequestId(1)), {.num_new_tokens = 100}));
  // Same step: no CompleteStep in between.
  ASSERT_TRUE(m->AddRequest({RequestId(2), Tokens(100)}).ok());
  EXPECT_EQ(m->GetComputedBlocks(H(*m, RequestId(2)))->num_tokens, 96);  // 100 mod 16 = 4 left
  m->CompleteStep();
  // Multi-turn: the next turn is the prompt plus 200 generated tokens: 300 % 16 = 12 new.
  std::vector<int32_t> turn2 = Concat(Tokens(100), Tokens(200, 7000));
  ASSERT_TRUE(m->AppendTokens(H(*m, RequestId(1)), Tokens(200, 7000)).ok());
  ASSERT_TRUE(*m->AllocateSlots(H(*m, RequestId(1)), {.num_computed_tokens = 100, .num_new_tokens = 200}));
  EXPECT_EQ(AddAndPrefill(*m, 3, turn2), 288);
}

// T14: lookahead slots for draft tokens.
TEST(KvCacheManagerTest, LookaheadSlots) {
  auto m = FullManager(10, true, 4);
  ASSERT_TRUE(m->AddRequest({RequestId(1), Tokens(3)}).ok());
  AllocationRequest req{.num_new_tokens = 3, .num_lookahead_tokens = 2};
  EXPECT_EQ(*m->BlocksNeeded(H(*m, RequestId(1)), req), 2);
  req.num_lookahead_tokens = 4;
  EXPECT_EQ(*m->BlocksNeeded(H(*m, RequestId(1)), req), 2);
  ASSERT_TRUE(*m->AllocateSlots(H(*m, RequestId(1)), req));
  EXPECT_EQ(Table(*m, 1).size(), 2u);
}

// ---- Hybrid full + sliding window -----------------------------------------------------

std::unique_ptr<KvCacheManager> HybridManager(AccountingMode mode, int32_t blocks) {
  KvCacheConfig c;
  c.mode = mode;
  c.kv_budget_bytes = int64_t{blocks} * 512 * (mode == AccountingMode::kVllm ? 1 : 3);
  // kvpage: 8 KiB chunks = 16 full-attention blocks or 8 sliding-window blocks (2 layers).
  c.chunk_bytes = mode == AccountingMode::kVllm ? c.kv_budget_bytes : 8192;
  c.hash_seed = 1;
  auto m = KvCacheManager::Create(TinyModel(testing::kTinyHybridSwa), c);
  EXPECT_TRUE(m.ok()) << m.status();
  return *std::move(m);
}

// H1 under vllm accounting: three groups share one block-id space.
TEST(KvCacheManagerTest, VllmHybridSlidingWindowHitsWithNullBlocks) {
  auto m = HybridManager(AccountingMode::kVllm, 20);
  ASSERT_EQ(m->num_groups(), 3);
  const std::vector<int32_t> common = Tokens(48);
  AddAndPrefill(*m, 1, Concat(common, Tokens(7, 900)));
  EXPECT_THAT(Table(*m, 1, kG0), ElementsAre(1, 2, 3, 4));
  EXPECT_THAT(Table(*m, 1, kG1), ElementsAre(5, 6, 7, 8));
  EXPECT_THAT(Table(*m, 1, kG2), ElementsAre(9, 10, 11, 12));
  ASSERT_TRUE(m->AddRequest({RequestId(2), Concat(common, Tokens(5, 800))}).ok());
  auto hit = m->GetComputedBlocks(H(*m, RequestId(2)));
  ASSERT_TRUE(hit.ok());
  EXPECT_EQ(hit->num_tokens, 48);
  EXPECT_THAT(Ids(hit->blocks[0]), ElementsAre(1, 2, 3));
  EXPECT_THAT(Ids(hit->blocks[1]), ElementsAre(0, 6, 7));
  EXPECT_THAT(Ids(hit->blocks[2]), ElementsAre(0, 10, 11));
  ASSERT_TRUE(*m->AllocateSlots(H(*m, RequestId(2)), {.num_computed_tokens = 48, .num_new_tokens = 5,
                                               .hit = &*hit}));
  EXPECT_THAT(Table(*m, 2, kG0), ElementsAre(1, 2, 3, 13));
  EXPECT_THAT(Table(*m, 2, kG1), ElementsAre(0, 6, 7, 14));
  EXPECT_THAT(Table(*m, 2, kG2), ElementsAre(0, 10, 11, 15));
  KVPAGE_EXPECT_INVARIANTS(*m);
}

// The same scenario in kvpage mode: one pool per layer group, ids per pool.
TEST(KvCacheManagerTest, KvpageHybridSlidingWindowHits) {
  auto m = HybridManager(AccountingMode::kKvpage, 20);
  ASSERT_EQ(m->num_groups(), 2);
  const std::vector<int32_t> common = Tokens(48);
  AddAndPrefill(*m, 1, Concat(common, Tokens(7, 900)));
  EXPECT_THAT(Table(*m, 1, kG0), ElementsAre(1, 2, 3, 4));
  EXPECT_THAT(Table(*m, 1, kG1), ElementsAre(1, 2, 3, 4));
  EXPECT_EQ(AddAndPrefill(*m, 2, Concat(common, Tokens(5, 800))), 48);
  EXPECT_THAT(Table(*m, 2, kG0), ElementsAre(1, 2, 3, 5));
  EXPECT_THAT(Table(*m, 2, kG1), ElementsAre(0, 2, 3, 5));
}

// S3-style removal: blocks wholly before the window of the first unprocessed token go.
TEST(KvCacheManagerTest, SlidingWindowFreesOutOfWindowBlocks) {
  auto m = HybridManager(AccountingMode::kKvpage, 40);
  AddAndPrefill(*m, 1, Tokens(100));  // 7 blocks in each group
  EXPECT_THAT(Table(*m, 1, kG1), ElementsAre(1, 2, 3, 4, 5, 6, 7));
  // Processed 100: the next token (100) reaches back to 69 → blocks 0–3 (tokens 0–63) are dead.
  // An unknown request is NotFound.
  EXPECT_TRUE(absl::IsNotFound(m->RemoveSkippedBlocks(H(*m, RequestId(9)), 100)));
  // Block 0 dies once the first unprocessed token is 1·16 + 32 − 1 = 47: a step ending at 48.
  EXPECT_EQ(*m->NextEvent(H(*m, 1)), 48);
  ASSERT_TRUE(m->RemoveSkippedBlocks(H(*m, RequestId(1)), 100).ok());
  // Then block 4 dies at 5·16 + 31 = 111, and block 6 fills (is cached) at 112.
  EXPECT_EQ(*m->NextEvent(H(*m, 1)), 112);
  EXPECT_THAT(Table(*m, 1, kG1), ElementsAre(0, 0, 0, 0, 5, 6, 7));
  EXPECT_THAT(Table(*m, 1, kG0), ElementsAre(1, 2, 3, 4, 5, 6, 7));
  // Freed last-to-first: block 4 is evicted before 3, 2, 1.
  std::vector<int32_t> freed;
  for (int32_t id : Ids(m->FreeBlockOrder(kG1))) {
    if (id <= 4) freed.push_back(id);
  }
  EXPECT_THAT(freed, ElementsAre(4, 3, 2, 1));
  KVPAGE_EXPECT_INVARIANTS(*m);
  // A decode step frees on the processed basis too.
  ASSERT_TRUE(m->AppendTokens(H(*m, RequestId(1)), {5}).ok());
  ASSERT_TRUE(*m->AllocateSlots(H(*m, RequestId(1)), {.num_computed_tokens = 100, .num_new_tokens = 1}));
  EXPECT_THAT(Table(*m, 1, kG1), ElementsAre(0, 0, 0, 0, 5, 6, 7));
  ASSERT_TRUE(m->Free(H(*m, RequestId(1))).ok());
  KVPAGE_EXPECT_INVARIANTS(*m);
}

// ---- Linear attention: live slots and snapshots ----------------------------------------

std::unique_ptr<KvCacheManager> GdnManager(int64_t budget = 1 << 20) {
  KvCacheConfig c;
  c.kv_budget_bytes = budget;
  c.chunk_bytes = 64 << 10;
  c.hash_seed = 3;
  c.decode_snapshot_interval_blocks = 0;
  auto m = KvCacheManager::Create(TinyModel(testing::kTinyGdn), c);
  EXPECT_TRUE(m.ok()) << m.status();
  return *std::move(m);
}

TEST(KvCacheManagerTest, RecurrentStateSnapshotsServeHits) {
  auto m = GdnManager();
  ASSERT_EQ(m->num_groups(), 2);
  const GroupId state_group = m->group_kind(kG0) == LayerKind::kLinearAttention ? kG0 : kG1;
  const GroupId attn_group = state_group == kG0 ? kG1 : kG0;
  // 3 × (144·2 + 128·4) = 2,400 bytes per state slot.
  EXPECT_EQ(m->Usage().pools[state_group.value].block_bytes, 2400);

  // A 40-token prompt in chunks of 32 + 8: the first chunk ends on a block boundary (32) and
  // is snapshotted.
  ASSERT_TRUE(m->AddRequest({RequestId(1), Tokens(40)}).ok());
  ASSERT_TRUE(*m->AllocateSlots(H(*m, RequestId(1)), {.num_new_tokens = 32}));
  // A state group has no block table.
  EXPECT_TRUE(absl::IsInvalidArgument(m->BlockTable(H(*m, RequestId(1)), state_group).status()));
  EXPECT_EQ(m->BlockTable(H(*m, 1), attn_group)->size(), 2u);
  EXPECT_EQ(*m->NextEvent(H(*m, 1)), 0);  // a state step every time
  StateSlots s = *m->GetStateSlots(H(*m, RequestId(1)), state_group);
  EXPECT_EQ(s.read_slot, s.write_slot);  // fresh state, zeroed
  ASSERT_EQ(m->TakeSlotsToZero().size(), 1u);
  const int32_t snapshot = s.write_slot;
  m->NewStep();
  ASSERT_TRUE(*m->AllocateSlots(H(*m, RequestId(1)), {.num_computed_tokens = 32, .num_new_tokens = 8}));
  s = *m->GetStateSlots(H(*m, RequestId(1)), state_group);
  EXPECT_EQ(s.read_slot, snapshot);      // continue from the snapshot …
  EXPECT_NE(s.write_slot, snapshot);     // … without writing over it
  KVPAGE_EXPECT_INVARIANTS(*m);
  m->NewStep();

  // Same first 32 tokens: the hit stops at the snapshot (2 blocks), not at 2 blocks of KV.
  ASSERT_TRUE(m->AddRequest({RequestId(2), Concat(Tokens(32), Tokens(20, 500))}).ok());
  auto hit = m->GetComputedBlocks(H(*m, RequestId(2)));
  ASSERT_TRUE(hit.ok());
  EXPECT_EQ(hit->num_tokens, 32);
  EXPECT_THAT(Ids(hit->blocks[state_group.value]), ElementsAre(snapshot));
  EXPECT_EQ(hit->blocks[attn_group.value].size(), 2u);
  ASSERT_TRUE(*m->AllocateSlots(H(*m, RequestId(2)), {.num_computed_tokens = 32, .num_new_tokens = 20,
                                               .hit = &*hit}));
  s = *m->GetStateSlots(H(*m, RequestId(2)), state_group);
  EXPECT_EQ(s.read_slot, snapshot);
  EXPECT_NE(s.write_slot, snapshot);
  EXPECT_TRUE(m->TakeSlotsToZero().empty());  // a hit starts from the snapshot, not zeros
  KVPAGE_EXPECT_INVARIANTS(*m);
  ASSERT_TRUE(m->Free(H(*m, RequestId(1))).ok());
  ASSERT_TRUE(m->Free(H(*m, RequestId(2))).ok());
  KVPAGE_EXPECT_INVARIANTS(*m);
  EXPECT_EQ(m->Usage().used_bytes, 0);
}

TEST(KvCacheManagerTest, RecurrentMatchTokensCountCachedAndInFlightBlocks) {
  auto m = GdnManager();
  // Request 1 computes a 64-token prompt (4 blocks) in one step that has not completed.
  ASSERT_TRUE(m->AddRequest({RequestId(1), Tokens(64)}).ok());
  ASSERT_TRUE(*m->AllocateSlots(H(*m, 1), {.num_new_tokens = 64}));
  // Request 2 shares 48 tokens: nothing is cached yet, but the cache knows 3 blocks of it.
  ASSERT_TRUE(m->AddRequest({RequestId(2), Concat(Tokens(48), Tokens(30, 500))}).ok());
  CacheHit hit = *m->GetComputedBlocks(H(*m, 2));
  EXPECT_EQ(hit.num_tokens, 0);
  EXPECT_EQ(hit.match_tokens, 48);
  // Once the step has run, the blocks are cached; the state is snapshotted only at 64, so
  // request 2 still has no hit and still diverges at 48.
  m->NewStep();
  hit = *m->GetComputedBlocks(H(*m, 2));
  EXPECT_EQ(hit.num_tokens, 0);
  EXPECT_EQ(hit.match_tokens, 48);
  // A request sharing all 64 resumes from the snapshot.
  ASSERT_TRUE(m->AddRequest({RequestId(3), Concat(Tokens(64), Tokens(20, 900))}).ok());
  hit = *m->GetComputedBlocks(H(*m, 3));
  EXPECT_EQ(hit.num_tokens, 64);
  EXPECT_EQ(hit.match_tokens, 64);
  for (int64_t id : {1, 2, 3}) ASSERT_TRUE(m->Free(H(*m, id)).ok());
  KVPAGE_EXPECT_INVARIANTS(*m);
}

TEST(KvCacheManagerTest, RecurrentRequestHoldsOneSlotBetweenSnapshots) {
  auto m = GdnManager();
  const GroupId state_group = m->group_kind(kG0) == LayerKind::kLinearAttention ? kG0 : kG1;
  ASSERT_TRUE(m->AddRequest({RequestId(1), Tokens(20)}).ok());
  ASSERT_TRUE(*m->AllocateSlots(H(*m, RequestId(1)), {.num_new_tokens = 20}));
  m->NewStep();
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(m->AppendTokens(H(*m, RequestId(1)), {1}).ok());
    ASSERT_TRUE(*m->AllocateSlots(H(*m, RequestId(1)), {.num_computed_tokens = 20 + i, .num_new_tokens = 1}));
    const StateSlots s = *m->GetStateSlots(H(*m, RequestId(1)), state_group);
    EXPECT_EQ(s.read_slot, s.write_slot);  // decode updates the request's own slot in place
    EXPECT_EQ(m->Usage().pools[state_group.value].used_blocks, 1);
    m->NewStep();
    KVPAGE_EXPECT_INVARIANTS(*m);
  }
}

TEST(KvCacheManagerTest, Mamba2StateAllocatesSnapshotsAndFrees) {
  KvCacheConfig c;
  c.kv_budget_bytes = 1 << 20;
  c.chunk_bytes = 64 << 10;
  c.hash_seed = 3;
  c.decode_snapshot_interval_blocks = 0;
  auto created = KvCacheManager::Create(TinyModel(testing::kTinyNemotronH), c);
  ASSERT_TRUE(created.ok()) << created.status();
  auto m = *std::move(created);
  ASSERT_EQ(m->num_groups(), 2);
  const GroupId state_group = m->group_kind(kG0) == LayerKind::kLinearAttention ? kG0 : kG1;
  // 2 Mamba layers × 704 bytes.
  EXPECT_EQ(m->Usage().pools[state_group.value].block_bytes, 1408);
  // A 40-token prompt in chunks of 32 + 8: the state after 32 tokens is snapshotted.
  ASSERT_TRUE(m->AddRequest({RequestId(1), Tokens(40)}).ok());
  ASSERT_TRUE(*m->AllocateSlots(H(*m, 1), {.num_new_tokens = 32}));
  const int32_t snapshot = m->GetStateSlots(H(*m, 1), state_group)->write_slot;
  m->NewStep();
  ASSERT_TRUE(*m->AllocateSlots(H(*m, 1), {.num_computed_tokens = 32, .num_new_tokens = 8}));
  EXPECT_EQ(m->GetStateSlots(H(*m, 1), state_group)->read_slot, snapshot);
  KVPAGE_EXPECT_INVARIANTS(*m);
  m->NewStep();
  // A request with the same first 32 tokens resumes from that snapshot.
  ASSERT_TRUE(m->AddRequest({RequestId(2), Concat(Tokens(32), Tokens(10, 500))}).ok());
  CacheHit hit = *m->GetComputedBlocks(H(*m, 2));
  EXPECT_EQ(hit.num_tokens, 32);
  EXPECT_THAT(Ids(hit.blocks[state_group.value]), ElementsAre(snapshot));
  ASSERT_TRUE(*m->AllocateSlots(H(*m, 2), {.num_computed_tokens = 32, .num_new_tokens = 10,
                                           .hit = &hit}));
  KVPAGE_EXPECT_INVARIANTS(*m);
  ASSERT_TRUE(m->Free(H(*m, 1)).ok());
  ASSERT_TRUE(m->Free(H(*m, 2)).ok());
  KVPAGE_EXPECT_INVARIANTS(*m);
  EXPECT_EQ(m->Usage().used_bytes, 0);
}

// Jamba's Mamba-1, MiniMax's lightning attention and Kimi's KDA states live in the same
// recurrent group as Gated DeltaNet: one state block per request holds every layer's state.
TEST(KvCacheManagerTest, LinearHybridStatesTakeOneBlockPerRequest) {
  struct Case {
    const char* json;
    int64_t state_block_bytes;
  };
  // 3 recurrent layers each: Jamba 3 × 896, MiniMax 3 × 1,024 (no conv state), Kimi 3 × 800
  // (manager_test_util.h gives each layer's bytes).
  for (const Case& c : {Case{testing::kTinyJamba, 2688}, Case{testing::kTinyMiniMax, 3072},
                        Case{testing::kTinyKimi, 2400}}) {
    KvCacheConfig config;
    config.kv_budget_bytes = 1 << 20;
    config.chunk_bytes = 64 << 10;
    config.decode_snapshot_interval_blocks = 0;
    auto created = KvCacheManager::Create(TinyModel(c.json), config);
    ASSERT_TRUE(created.ok()) << created.status();
    auto m = *std::move(created);
    ASSERT_EQ(m->num_groups(), 2);
    const GroupId state = m->group_kind(kG0) == LayerKind::kLinearAttention ? kG0 : kG1;
    EXPECT_EQ(m->Usage().pools[state.value].block_bytes, c.state_block_bytes);
    ASSERT_TRUE(m->AddRequest({RequestId(1), Tokens(20)}).ok());
    ASSERT_TRUE(*m->AllocateSlots(H(*m, 1), {.num_new_tokens = 20}));
    EXPECT_EQ(m->Usage().pools[state.value].used_blocks, 1);
    KVPAGE_EXPECT_INVARIANTS(*m);
    ASSERT_TRUE(m->Free(H(*m, 1)).ok());
    EXPECT_EQ(m->Usage().used_bytes, 0);
  }
}

// ---- Bad input ----------------------------------------------------------------------------

TEST(KvCacheManagerTest, MisuseReturnsErrorsAndChangesNothing) {
  auto m = FullManager(10);
  EXPECT_TRUE(absl::IsNotFound(m->Free(H(*m, RequestId(9)))));
  EXPECT_TRUE(absl::IsNotFound(m->AllocateSlots(H(*m, RequestId(9)), {.num_new_tokens = 1}).status()));
  // Group ids outside the model, and enums cast from integers no value has.
  EXPECT_EQ(m->group_block_size(GroupId(7)), 0);
  EXPECT_EQ(m->group_window(GroupId(-1)), 0);
  EXPECT_TRUE(m->FreeBlockOrder(GroupId(3)).empty());
  for (int bad = 0; bad < 3; ++bad) {
    KvCacheConfig c = m->config();
    if (bad == 0) c.mode = static_cast<AccountingMode>(7);
    if (bad == 1) c.hash_algorithm = static_cast<HashAlgorithm>(99);
    if (bad == 2) c.kv_cache_dtype = static_cast<DType>(200);
    EXPECT_TRUE(absl::IsInvalidArgument(c.Validate())) << bad;
  }
  EXPECT_TRUE(absl::IsInvalidArgument(m->AddRequest({RequestId(1), {}}).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(m->AddRequest({RequestId(1), {1, -2}}).status()));
  EXPECT_TRUE(absl::IsOutOfRange(m->AddRequest({RequestId(1), Tokens(4097)}).status()));
  ASSERT_TRUE(m->AddRequest({RequestId(1), Tokens(10)}).ok());
  EXPECT_TRUE(absl::IsAlreadyExists(m->AddRequest({RequestId(1), Tokens(10)}).status()));
  // Computed tokens without blocks, zero new tokens, past max_model_len.
  EXPECT_TRUE(absl::IsFailedPrecondition(
      m->AllocateSlots(H(*m, RequestId(1)), {.num_computed_tokens = 5, .num_new_tokens = 5}).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(m->AllocateSlots(H(*m, RequestId(1)), {.num_new_tokens = 0}).status()));
  EXPECT_TRUE(absl::IsOutOfRange(
      m->AllocateSlots(H(*m, RequestId(1)), {.num_new_tokens = 10, .num_lookahead_tokens = 4090}).status()));
  ASSERT_TRUE(*m->AllocateSlots(H(*m, RequestId(1)), {.num_new_tokens = 10}));
  // A hit after the first allocation; a double free.
  CacheHit hit;
  hit.num_tokens = 16;
  hit.blocks = {{BlockId(1)}};
  EXPECT_TRUE(absl::IsFailedPrecondition(
      m->AllocateSlots(H(*m, RequestId(1)), {.num_computed_tokens = 0, .num_new_tokens = 1, .hit = &hit})
          .status()));
  EXPECT_TRUE(absl::IsFailedPrecondition(m->GetComputedBlocks(H(*m, RequestId(1))).status()));
  EXPECT_TRUE(absl::IsOutOfRange(m->AppendTokens(H(*m, RequestId(1)), Tokens(5000))));
  EXPECT_TRUE(absl::IsInvalidArgument(m->RollbackTokens(H(*m, RequestId(1)), 1)));
  KVPAGE_EXPECT_INVARIANTS(*m);
  // A decode batch that names a request more than once counts all its tokens against
  // max_model_len (4,096): 4,094 + 3 fails and changes nothing; 4,094 + 2 fits.
  ASSERT_TRUE(m->AppendTokens(H(*m, RequestId(1)), Tokens(4084, 10)).ok());
  const std::vector<DecodeToken> three = {{H(*m, 1), 1}, {H(*m, 1), 2}, {H(*m, 1), 3}};
  EXPECT_TRUE(absl::IsOutOfRange(m->AppendDecodeTokens(three)));
  EXPECT_EQ(m->Tokens(H(*m, RequestId(1)))->size(), 4094u);
  ASSERT_TRUE(m->AppendDecodeTokens(absl::MakeConstSpan(three).subspan(0, 2)).ok());
  EXPECT_EQ(m->Tokens(H(*m, RequestId(1)))->size(), 4096u);
  EXPECT_EQ(m->Tokens(H(*m, RequestId(1)))->back(), 2);
  EXPECT_TRUE(absl::IsOutOfRange(m->AppendDecodeTokens(absl::MakeConstSpan(three).subspan(2))));
  KVPAGE_EXPECT_INVARIANTS(*m);
  ASSERT_TRUE(m->Free(H(*m, RequestId(1))).ok());
  EXPECT_TRUE(absl::IsNotFound(m->Free(H(*m, RequestId(1)))));
  EXPECT_EQ(m->Usage().used_bytes, 0);
  KVPAGE_EXPECT_INVARIANTS(*m);
}

// What each kind's group answers for the scheduler: only a window frees blocks of a running
// request, only linear-attention state cannot roll back and asks for aligned prefill chunks
// (with prefix caching), and only full attention counts in the lower bound on bytes.
TEST(KvCacheManagerTest, KindsAnswerWhatTheSchedulerAsks) {
  auto full = FullManager(10);
  EXPECT_FALSE(full->frees_skipped_blocks());
  EXPECT_TRUE(full->can_roll_back());
  EXPECT_EQ(full->prefill_alignment(), 0);
  EXPECT_EQ(full->MinBytesFor(0), 0);
  EXPECT_EQ(full->MinBytesFor(33), 3 * 512);  // 3 blocks of 16 tokens × 32 bytes
  EXPECT_EQ(full->MinBytesFor(std::numeric_limits<int64_t>::max() / 2),
            std::numeric_limits<int64_t>::max());  // saturates
  for (AccountingMode mode : {AccountingMode::kKvpage, AccountingMode::kVllm}) {
    auto swa = HybridManager(mode, 20);
    EXPECT_TRUE(swa->frees_skipped_blocks());
    EXPECT_TRUE(swa->can_roll_back());
    EXPECT_EQ(swa->prefill_alignment(), 0);
    EXPECT_EQ(swa->MinBytesFor(33), 3 * 512);  // the full-attention layer alone
    EXPECT_EQ(swa->group_window(kG0), 0);
    EXPECT_EQ(swa->group_window(kG1), 32);
  }
  auto gdn = GdnManager();
  EXPECT_FALSE(gdn->frees_skipped_blocks());
  EXPECT_FALSE(gdn->can_roll_back());
  EXPECT_EQ(gdn->prefill_alignment(), 16);
  EXPECT_EQ(gdn->MinBytesFor(33), 3 * 512);
  KvCacheConfig off = gdn->config();
  off.enable_prefix_caching = false;
  EXPECT_EQ((*KvCacheManager::Create(TinyModel(testing::kTinyGdn), off))->prefill_alignment(), 0);
}

// The rules the scheduler shares with the manager: a step of n tokens after c is quiet when
// c + n < NextEvent; block b is kernel blocks b·r + k; position p in block b is slot b·bs + p % bs.
TEST(KvCacheManagerTest, SharedStepAndTableRules) {
  EXPECT_TRUE(KvCacheManager::StepIsQuiet(80, 64, 15));
  EXPECT_FALSE(KvCacheManager::StepIsQuiet(80, 64, 16));
  EXPECT_FALSE(KvCacheManager::StepIsQuiet(0, 0, 1));  // before the first allocation
  EXPECT_EQ(KvCacheManager::KernelBlock(BlockId(5), 4, 3), 23);
  EXPECT_EQ(KvCacheManager::SlotOf(BlockId(5), 16, 37), 85);
}

// Once a request has computed, its recurrent state holds every token: no rollback.
TEST(KvCacheManagerTest, RecurrentStateRefusesRollback) {
  auto m = GdnManager();
  AddAndPrefill(*m, 1, Tokens(20));
  ASSERT_TRUE(m->AppendTokens(H(*m, RequestId(1)), {7, 8}).ok());
  const absl::Status refused = m->RollbackTokens(H(*m, RequestId(1)), 2);
  EXPECT_TRUE(absl::IsFailedPrecondition(refused)) << refused;
  EXPECT_EQ(refused.message(),
            "cannot roll back request 1: its linear-attention state already includes those "
            "tokens and has no checkpoint to return to");
  EXPECT_EQ(m->Tokens(H(*m, RequestId(1)))->size(), 22u);
  KVPAGE_EXPECT_INVARIANTS(*m);
}

TEST(KvCacheManagerTest, SlotMappingAndKernelBlockRows) {
  auto m = FullManager(10);
  AddAndPrefill(*m, 1, Tokens(40));  // blocks 1, 2, 3
  std::vector<int64_t> slots(3);
  ASSERT_TRUE(m->FillSlotMapping(H(*m, RequestId(1)), kG0, 15, absl::MakeSpan(slots)).ok());
  EXPECT_THAT(slots, ElementsAre(1 * 16 + 15, 2 * 16 + 0, 2 * 16 + 1));
  std::vector<int32_t> row(8, -1);
  ASSERT_TRUE(m->FillBlockTableRow(H(*m, RequestId(1)), kG0, 8, absl::MakeSpan(row)).ok());
  EXPECT_THAT(row, ElementsAre(2, 3, 4, 5, 6, 7, 0, 0));
  EXPECT_TRUE(absl::IsInvalidArgument(m->FillBlockTableRow(H(*m, RequestId(1)), kG0, 5, absl::MakeSpan(row))));
  std::vector<int64_t> past(1);
  EXPECT_TRUE(absl::IsInvalidArgument(m->FillSlotMapping(H(*m, RequestId(1)), kG0, 48, absl::MakeSpan(past))));
}

}  // namespace
}  // namespace kvpage

namespace kvpage {
namespace {

using ::testing::ElementsAre;
using testing::Ids;
using testing::Tokens;
using testing::TinyModel;

// H1 eviction cases (vllm.md §6.2): which evictions shrink the 53-token request's hit.
class VllmHybridEvictionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    KvCacheConfig c;
    c.mode = AccountingMode::kVllm;
    c.kv_budget_bytes = 20 * 512;
    c.hash_seed = 1;
    m_ = *KvCacheManager::Create(TinyModel(testing::kTinyHybridSwa), c);
    ASSERT_TRUE(m_->AddRequest({RequestId(1), testing::Concat(Tokens(48), Tokens(7, 900))}).ok());
    ASSERT_TRUE(*m_->AllocateSlots(H(*m_, RequestId(1)), {.num_new_tokens = 55}));
    ASSERT_TRUE(m_->AddRequest({RequestId(2), testing::Concat(Tokens(48), Tokens(5, 800))}).ok());
  }
  // Block `index` of group `group` in request 1's table.
  void Evict(int32_t group, int32_t index) {
    const auto table = *m_->BlockTable(H(*m_, RequestId(1)), GroupId(group));
    ASSERT_TRUE(m_->EvictCachedBlock(GroupId(group), table[index]).ok());
  }
  int64_t Hit() { return m_->GetComputedBlocks(H(*m_, RequestId(2)))->num_tokens; }

  std::unique_ptr<KvCacheManager> m_;
};

TEST_F(VllmHybridEvictionTest, SlidingWindowsDoNotNeedTheFirstBlock) {
  Evict(1, 0);
  Evict(2, 0);
  EXPECT_EQ(Hit(), 48);
}
TEST_F(VllmHybridEvictionTest, FullAttentionNeedsEveryBlock) {
  Evict(0, 0);
  EXPECT_EQ(Hit(), 0);
}
TEST_F(VllmHybridEvictionTest, ThirdBlockEverywhere) {
  Evict(0, 2);
  Evict(1, 2);
  Evict(2, 2);
  EXPECT_EQ(Hit(), 32);
}
TEST_F(VllmHybridEvictionTest, ThirdBlockOfFullOnly) {
  Evict(0, 2);
  EXPECT_EQ(Hit(), 32);
}
TEST_F(VllmHybridEvictionTest, ThirdBlockOfOneSlidingGroup) {
  Evict(1, 2);
  EXPECT_EQ(Hit(), 32);
}
TEST_F(VllmHybridEvictionTest, FullThirdAndSlidingFirstLeaveNothing) {
  // Full attention serves 32 tokens; the sliding window would then need blocks 0 and 1.
  Evict(0, 2);
  Evict(1, 0);
  EXPECT_EQ(Hit(), 0);
  KVPAGE_EXPECT_INVARIANTS(*m_);
}

// S1: sliding-window hit patterns (bs 2, window 4: two contiguous cached blocks).
struct SwaPattern {
  std::vector<bool> cached;
  int64_t expected_blocks;
};

class SlidingWindowHitPatternTest : public ::testing::TestWithParam<SwaPattern> {};

TEST_P(SlidingWindowHitPatternTest, HitBlocks) {
  const SwaPattern& p = GetParam();
  KvCacheConfig c;
  c.block_size = 2;
  c.kv_budget_bytes = 64 * 2 * 32;
  c.hash_seed = 5;
  auto m = *KvCacheManager::Create(
      TinyModel(R"({"num_hidden_layers": 1, "hidden_size": 64, "num_attention_heads": 8,
                    "num_key_value_heads": 1, "head_dim": 8, "vocab_size": 1000,
                    "max_position_embeddings": 4096, "intermediate_size": 128,
                    "sliding_window": 4})"),
      c);
  const int64_t n = static_cast<int64_t>(p.cached.size());
  const std::vector<int32_t> prompt = Tokens(2 * n + 1);
  ASSERT_TRUE(m->AddRequest({RequestId(1), prompt}).ok());
  ASSERT_TRUE(*m->AllocateSlots(H(*m, RequestId(1)), {.num_new_tokens = 2 * n + 1}));
  m->CompleteStep();
  const std::vector<BlockId> table(m->BlockTable(H(*m, RequestId(1)), GroupId(0))->begin(),
                                   m->BlockTable(H(*m, RequestId(1)), GroupId(0))->end());
  ASSERT_TRUE(m->Free(H(*m, RequestId(1))).ok());
  for (int64_t i = 0; i < n; ++i) {
    if (!p.cached[i]) {
      ASSERT_TRUE(m->EvictCachedBlock(GroupId(0), table[i]).ok());
    }
  }
  ASSERT_TRUE(m->AddRequest({RequestId(2), prompt}).ok());
  auto hit = m->GetComputedBlocks(H(*m, RequestId(2)));
  ASSERT_TRUE(hit.ok());
  EXPECT_EQ(hit->num_tokens, 2 * p.expected_blocks);
  // Only the last two blocks of the hit are real; the rest are null.
  for (int64_t i = 0; i + 2 < p.expected_blocks; ++i) EXPECT_EQ(hit->blocks[0][i], kNullBlock);
  KVPAGE_EXPECT_INVARIANTS(*m);
}

INSTANTIATE_TEST_SUITE_P(
    VllmS1, SlidingWindowHitPatternTest,
    ::testing::Values(SwaPattern{{false}, 0}, SwaPattern{{true}, 1}, SwaPattern{{true, false}, 1},
                      SwaPattern{{true, true}, 2}, SwaPattern{{true, true, false}, 2},
                      SwaPattern{{true, true, true}, 3}, SwaPattern{{true, true, true, false}, 3},
                      SwaPattern{{true, true, false, true, false, false, true, true, false, true,
                                  true, true},
                                 12},
                      SwaPattern{{true, true, false, true, false, false, true, true, false, false,
                                  false},
                                 8},
                      SwaPattern{{true, true, false, true, false, false, true, true, false, false,
                                  false, true},
                                 8}));

// Events: stored when a block is cached, removed when its page is reused, cleared on reset.
TEST(KvCacheManagerEventsTest, StoredRemovedCleared) {
  KvCacheConfig c;
  c.kv_budget_bytes = 2 * 16 * 32;
  c.chunk_bytes = c.kv_budget_bytes;
  c.enable_kv_events = true;
  c.hash_seed = 9;
  auto m = *KvCacheManager::Create(TinyModel(testing::kTinyFull), c);
  ASSERT_TRUE(m->AddRequest({RequestId(1), Tokens(33)}).ok());
  ASSERT_FALSE(*m->AllocateSlots(H(*m, RequestId(1)), {.num_new_tokens = 33}));  // 3 blocks > 2
  ASSERT_TRUE(m->Free(H(*m, RequestId(1))).ok());
  ASSERT_TRUE(m->AddRequest({RequestId(1), Tokens(32)}).ok());
  ASSERT_TRUE(*m->AllocateSlots(H(*m, RequestId(1)), {.num_new_tokens = 32}));
  EXPECT_TRUE(m->DrainEvents().empty());  // stored once the step has run
  m->CompleteStep();
  std::vector<KvEvent> events = m->DrainEvents();
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].type, KvEvent::Type::kStored);
  EXPECT_EQ(events[1].type, KvEvent::Type::kStored);
  EXPECT_EQ(events[1].parent, events[0].hash);
  ASSERT_TRUE(m->Free(H(*m, RequestId(1))).ok());
  ASSERT_TRUE(m->AddRequest({RequestId(2), Tokens(20, 500)}).ok());
  ASSERT_TRUE(*m->AllocateSlots(H(*m, RequestId(2)), {.num_new_tokens = 20}));  // evicts both
  m->CompleteStep();
  events = m->DrainEvents();
  ASSERT_EQ(events.size(), 3u);  // both pages evicted (tail block first), then one stored
  EXPECT_EQ(events[0].type, KvEvent::Type::kRemoved);
  EXPECT_EQ(events[1].type, KvEvent::Type::kRemoved);
  EXPECT_EQ(events[2].type, KvEvent::Type::kStored);
  EXPECT_TRUE(absl::IsFailedPrecondition(m->ResetPrefixCache()));
  ASSERT_TRUE(m->Free(H(*m, RequestId(2))).ok());
  ASSERT_TRUE(m->ResetPrefixCache().ok());
  events = m->DrainEvents();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].type, KvEvent::Type::kAllCleared);
  EXPECT_TRUE(m->DrainEvents().empty());
}

}  // namespace
}  // namespace kvpage

namespace kvpage {
namespace {

// Cached blocks alone never eat the budget's headroom (one chunk per pool), so a pool whose
// live requests grow still finds memory after the other pool filled up with cache.
TEST(KvCacheManagerBudgetTest, CacheGrowthLeavesHeadroomForLiveGrowth) {
  KvCacheConfig c;
  c.kv_budget_bytes = 64 * 1024;  // 8 chunks of 8 KiB; headroom = 2 chunks
  c.chunk_bytes = 8 * 1024;       // 16 full-attention blocks or 8 sliding-window blocks
  c.hash_seed = 2;
  auto m = *KvCacheManager::Create(testing::TinyModel(testing::kTinyHybridSwa), c);
  // Distinct 100-token prompts, prefilled and finished: their blocks stay cached.
  for (int i = 0; i < 12; ++i) {
    ASSERT_TRUE(m->AddRequest({RequestId(i), testing::Tokens(100, 1000 * i)}).ok());
    ASSERT_TRUE(*m->AllocateSlots(H(*m, RequestId(i)), {.num_new_tokens = 100}));
    ASSERT_TRUE(m->Free(H(*m, RequestId(i))).ok());
    KVPAGE_EXPECT_INVARIANTS(*m);
    EXPECT_LE(m->Usage().mapped_bytes, 64 * 1024 - 16 * 1024) << "after request " << i;
  }
  // A long request needs more full-attention blocks than its pool has: it takes the headroom
  // and then idle chunks of the other pool.
  ASSERT_TRUE(m->AddRequest({RequestId(100), testing::Tokens(600, 90000)}).ok());
  EXPECT_TRUE(*m->AllocateSlots(H(*m, RequestId(100)), {.num_new_tokens = 600}));
  KVPAGE_EXPECT_INVARIANTS(*m);
}

}  // namespace
}  // namespace kvpage

namespace kvpage {
namespace {

// The batch decode call serves requests in order and stops at the first that does not fit.
TEST(KvCacheManagerDecodeStepTest, ServesInOrderAndStopsWhereMemoryEnds) {
  KvCacheConfig c;
  c.kv_budget_bytes = 7 * 16 * 32;  // 7 blocks in one chunk
  c.chunk_bytes = c.kv_budget_bytes;
  c.hash_seed = 4;
  auto m = *KvCacheManager::Create(testing::TinyModel(testing::kTinyFull), c);
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(m->AddRequest({RequestId(i), testing::Tokens(32, 100 * i)}).ok());
    ASSERT_TRUE(*m->AllocateSlots(H(*m, RequestId(i)), {.num_new_tokens = 32}));  // 2 blocks each
    ASSERT_TRUE(m->AppendTokens(H(*m, RequestId(i)), {7}).ok());
  }
  // A stale handle: reported before anything changes.
  const RequestHandle h0 = H(*m, 0), h1 = H(*m, 1), h2 = H(*m, 2);
  std::vector<DecodeStep> steps = {{h0, 32, 1}, {RequestHandle(), 32, 1}};
  EXPECT_TRUE(absl::IsNotFound(m->AllocateDecodeStep(steps).status()));
  EXPECT_EQ(m->BlockTable(h0, GroupId(0))->size(), 2u);
  // Each request crosses into a third block (its next event is the end of its table, 33);
  // only one block is left.
  EXPECT_EQ(*m->NextEvent(h0), 33);
  steps = {{h0, 32, 1}, {h1, 32, 1}, {h2, 32, 1}};
  auto served = m->AllocateDecodeStep(steps);
  ASSERT_TRUE(served.ok()) << served.status();
  EXPECT_EQ(*served, 1);
  EXPECT_EQ(m->BlockTable(h0, GroupId(0))->size(), 3u);
  EXPECT_EQ(m->BlockTable(h1, GroupId(0))->size(), 2u);
  EXPECT_EQ(m->BlockTable(h2, GroupId(0))->size(), 2u);
  // Block 2 of request 0 fills at 48 tokens: the next event.
  EXPECT_EQ(*m->NextEvent(h0), 48);
  KVPAGE_EXPECT_INVARIANTS(*m);
  // Request 0 again needs nothing: served without a block.
  served = m->AllocateDecodeStep(absl::MakeConstSpan(steps).subspan(0, 1));
  EXPECT_EQ(*served, 1);
  // A bad token count is an error naming the value.
  steps = {{h1, 40, 1}};
  EXPECT_TRUE(absl::IsInvalidArgument(m->AllocateDecodeStep(steps).status()));
  EXPECT_EQ(m->BlockTable(h0, GroupId(0))->size(), 3u);
  KVPAGE_EXPECT_INVARIANTS(*m);
}

// Handles name live requests, and a handle used after Free names none (even once its slot is
// reused); batch appends are all or nothing and hash a block once it is full.
TEST(KvCacheManagerDecodeStepTest, HandlesAndBatchedTokenAppends) {
  KvCacheConfig c;
  c.kv_budget_bytes = 16 * 16 * 32;
  c.chunk_bytes = c.kv_budget_bytes;
  c.hash_seed = 4;
  auto m = *KvCacheManager::Create(testing::TinyModel(testing::kTinyFull), c);
  const RequestHandle h5 = *m->AddRequest({RequestId(5), testing::Tokens(31, 0)});
  const RequestHandle h6 = *m->AddRequest({RequestId(6), testing::Tokens(20, 100)});
  EXPECT_EQ(m->Find(RequestId(5)), h5);
  EXPECT_EQ(m->Find(RequestId(6)), h6);
  EXPECT_FALSE(m->Find(RequestId(7)).has_value());
  EXPECT_EQ(*m->Id(h6), RequestId(6));
  EXPECT_FALSE(RequestHandle().valid());
  EXPECT_TRUE(absl::IsNotFound(m->Id(RequestHandle()).status()));
  // Another manager's handle names nothing here, even at the same slot and generation.
  auto other = *KvCacheManager::Create(testing::TinyModel(testing::kTinyFull), c);
  const RequestHandle foreign = *other->AddRequest({RequestId(5), testing::Tokens(4, 0)});
  EXPECT_TRUE(absl::IsNotFound(m->Id(foreign).status()));
  EXPECT_TRUE(absl::IsNotFound(m->Free(foreign)));
  ASSERT_TRUE(*m->AllocateSlots(h5, {.num_new_tokens = 31}));
  ASSERT_TRUE(*m->AllocateSlots(h6, {.num_new_tokens = 20}));
  // A negative token anywhere: nothing is appended.
  std::vector<DecodeToken> bad = {{h5, 9}, {h6, -2}};
  EXPECT_TRUE(absl::IsInvalidArgument(m->AppendDecodeTokens(bad)));
  EXPECT_EQ(m->Tokens(h5)->size(), 31u);
  std::vector<DecodeToken> ok = {{h5, 9}, {h6, 8}};
  ASSERT_TRUE(m->AppendDecodeTokens(ok).ok());
  EXPECT_EQ(m->Tokens(h5)->back(), 9);
  EXPECT_EQ(m->Tokens(h6)->back(), 8);
  EXPECT_EQ(m->BlockTable(h5, kG0)->size(), 2u);
  EXPECT_EQ(m->BlockTable(h6, kG0)->size(), 2u);
  EXPECT_TRUE(absl::IsInvalidArgument(m->BlockTable(h5, GroupId(1)).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(m->BlockTable(h5, GroupId(-1)).status()));
  // Request 5's 32nd token completed its second block: the next step caches it, and an
  // identical 33-token prompt hits both blocks.
  std::vector<DecodeStep> step = {{h5, 31, 1}};
  ASSERT_EQ(*m->AllocateDecodeStep(step), 1);
  m->CompleteStep();
  std::vector<int32_t> same = testing::Tokens(31, 0);
  same.push_back(9);
  same.push_back(1);
  const RequestHandle h7 = *m->AddRequest({RequestId(7), same});
  EXPECT_EQ(m->GetComputedBlocks(h7)->num_tokens, 32);
  // Freed slots are reused, but the old handle stays stale; a stale handle fails before
  // anything changes.
  ASSERT_TRUE(m->Free(h6).ok());
  const RequestHandle h8 = *m->AddRequest({RequestId(8), testing::Tokens(3, 500)});
  EXPECT_NE(h8, h6);
  EXPECT_TRUE(absl::IsNotFound(m->Tokens(h6).status()));
  EXPECT_TRUE(absl::IsNotFound(m->Free(h6)));
  std::vector<DecodeToken> unknown = {{h5, 1}, {h6, 1}};
  EXPECT_TRUE(absl::IsNotFound(m->AppendDecodeTokens(unknown)));
  EXPECT_EQ(m->Tokens(h5)->size(), 32u);
  EXPECT_EQ(m->Tokens(h8)->size(), 3u);
  KVPAGE_EXPECT_INVARIANTS(*m);
}

// Decode tokens wait in a per-handle tail until they complete a block; the tokens, their
// order and the block hashes must be those of a request that got the same tokens at once,
// including when one batch names the request again after its block completed (the tail's
// first slots are then reused) and when the tail is read out (Tokens) or rolled back.
TEST(KvCacheManagerTest, DecodeTokensInTheTailKeepTheirOrderAndHashes) {
  auto m = FullManager(16);
  ASSERT_EQ(AddAndPrefill(*m, 1, testing::Tokens(20, 0)), 0);
  const RequestHandle h = H(*m, 1);
  // Tokens 20..39 in one batch: token 31 completes block 1 (positions 20..31 in tail slots
  // 4..15), then 32..39 take slots 0..7 again.
  std::vector<DecodeToken> batch;
  for (int32_t t = 20; t < 40; ++t) batch.push_back({h, t});
  ASSERT_TRUE(m->AppendDecodeTokens(batch).ok());
  KVPAGE_EXPECT_INVARIANTS(*m);
  EXPECT_EQ(*m->Tokens(H(*m, RequestId(1))), testing::Tokens(40, 0));
  // Two more, one at a time: Tokens() read the tail out, appends go on after it.
  ASSERT_TRUE(m->AppendTokens(H(*m, RequestId(1)), {40}).ok());
  std::vector<DecodeToken> one = {{h, 41}};
  ASSERT_TRUE(m->AppendDecodeTokens(one).ok());
  EXPECT_EQ(*m->Tokens(H(*m, RequestId(1))), testing::Tokens(42, 0));
  // Allocating through token 41 caches block 1 (block 2 is not full).
  ASSERT_TRUE(*m->AllocateSlots(H(*m, RequestId(1)), {.num_computed_tokens = 20, .num_new_tokens = 22}));
  m->CompleteStep();
  KVPAGE_EXPECT_INVARIANTS(*m);
  // A prompt of the same 50 tokens hits blocks 0 and 1: block 1 was hashed from tokens
  // 16..31 in order.
  ASSERT_TRUE(m->AddRequest({RequestId(2), testing::Tokens(50, 0)}).ok());
  EXPECT_EQ(m->GetComputedBlocks(H(*m, RequestId(2)))->num_tokens, 32);
  // Rolling back into the tail (42 -> 39 tokens), then on to a full block 2.
  ASSERT_TRUE(m->RollbackTokens(H(*m, RequestId(1)), 3).ok());
  EXPECT_EQ(*m->Tokens(H(*m, RequestId(1))), testing::Tokens(39, 0));
  for (int32_t t = 39; t < 48; ++t) {
    std::vector<DecodeToken> next = {{h, t}};
    ASSERT_TRUE(m->AppendDecodeTokens(next).ok());
    KVPAGE_EXPECT_INVARIANTS(*m);
  }
  EXPECT_EQ(*m->Tokens(H(*m, RequestId(1))), testing::Tokens(48, 0));
  ASSERT_TRUE(*m->AllocateSlots(H(*m, RequestId(1)), {.num_computed_tokens = 39, .num_new_tokens = 9}));
  m->CompleteStep();
  // Block 2 (tokens 32..47) is cached too now: a 49-token prompt hits all three.
  ASSERT_TRUE(m->AddRequest({RequestId(3), testing::Tokens(49, 0)}).ok());
  EXPECT_EQ(m->GetComputedBlocks(H(*m, RequestId(3)))->num_tokens, 48);
  KVPAGE_EXPECT_INVARIANTS(*m);
}

// A decode batch appends as one AppendTokens call per token does: the same tokens and block
// hashes, for a block size that is a power of two (16) and one that is not (12), with
// requests named again after their token completed a block.
TEST(KvCacheManagerTest, DecodeBatchAppendsAsSingleAppendsDo) {
  for (const int32_t block_size : {16, 12}) {
    SCOPED_TRACE(block_size);
    auto batch = FullManager(32, true, block_size);
    auto single = FullManager(32, true, block_size);
    for (KvCacheManager* m : {batch.get(), single.get()}) {
      ASSERT_EQ(AddAndPrefill(*m, 1, testing::Tokens(20, 0)), 0);
      ASSERT_EQ(AddAndPrefill(*m, 2, testing::Tokens(3, 100)), 0);
    }
    // Request 1 gets tokens 20..47 (a block completes at 23 or 31, then the tail is reused);
    // request 2 gets 103..112.
    std::vector<DecodeToken> tokens;
    for (int32_t t = 20; t < 48; ++t) {
      tokens.push_back({H(*batch, 1), t});
      if (t < 30) tokens.push_back({H(*batch, 2), 83 + t});
    }
    ASSERT_TRUE(batch->AppendDecodeTokens(tokens).ok());
    for (const DecodeToken& t : tokens) {
      const int64_t id = t.request == H(*batch, 1) ? 1 : 2;
      ASSERT_TRUE(single->AppendTokens(H(*single, id), {t.token}).ok());
    }
    for (KvCacheManager* m : {batch.get(), single.get()}) {
      KVPAGE_EXPECT_INVARIANTS(*m);
      EXPECT_EQ(*m->Tokens(H(*m, 1)), testing::Tokens(48, 0));
      EXPECT_EQ(*m->Tokens(H(*m, 2)), testing::Tokens(13, 100));
      // Allocating through the last tokens caches the full blocks, hashed from the tokens in
      // order: a prompt of request 1's 48 tokens and one more hits all of them.
      ASSERT_TRUE(*m->AllocateSlots(H(*m, 1), {.num_computed_tokens = 20, .num_new_tokens = 28}));
      m->CompleteStep();
      ASSERT_TRUE(m->AddRequest({RequestId(3), testing::Tokens(49, 0)}).ok());
      EXPECT_EQ(m->GetComputedBlocks(H(*m, 3))->num_tokens, 48 / block_size * block_size);
      KVPAGE_EXPECT_INVARIANTS(*m);
    }
  }
}

// A batch that would take a request past max_model_len fails whole: OutOfRange, nothing in.
TEST(KvCacheManagerTest, DecodeBatchStopsAtMaxModelLen) {
  KvCacheConfig c;
  c.kv_budget_bytes = 64 * 16 * 32;
  c.chunk_bytes = c.kv_budget_bytes;
  c.max_model_len = 32;
  c.hash_seed = 7;
  auto m = *KvCacheManager::Create(TinyModel(testing::kTinyFull), c);
  ASSERT_EQ(AddAndPrefill(*m, 1, testing::Tokens(31, 0)), 0);
  ASSERT_EQ(AddAndPrefill(*m, 2, testing::Tokens(5, 100)), 0);
  const std::vector<DecodeToken> over = {{H(*m, 2), 105}, {H(*m, 1), 31}, {H(*m, 1), 32}};
  EXPECT_TRUE(absl::IsOutOfRange(m->AppendDecodeTokens(over)));
  EXPECT_EQ(*m->Tokens(H(*m, 1)), testing::Tokens(31, 0));
  ASSERT_TRUE(m->AppendDecodeTokens(absl::MakeConstSpan(over).subspan(0, 2)).ok());
  KVPAGE_EXPECT_INVARIANTS(*m);
  EXPECT_EQ(*m->Tokens(H(*m, RequestId(1))), testing::Tokens(32, 0));
  EXPECT_EQ(*m->Tokens(H(*m, RequestId(2))), testing::Tokens(6, 100));
}

// A bad entry after good ones leaves the whole batch out, including a token that would have
// completed a block.
TEST(KvCacheManagerTest, BadDecodeTokenUndoesTheBatch) {
  auto m = FullManager(16);
  ASSERT_EQ(AddAndPrefill(*m, 1, testing::Tokens(15, 0)), 0);
  ASSERT_EQ(AddAndPrefill(*m, 2, testing::Tokens(3, 100)), 0);
  const RequestHandle h1 = H(*m, 1);
  const RequestHandle h2 = H(*m, 2);
  std::vector<DecodeToken> batch = {{h1, 15}, {h2, 103}, {RequestHandle(), 1}};
  EXPECT_TRUE(absl::IsNotFound(m->AppendDecodeTokens(batch)));
  EXPECT_EQ(*m->Tokens(H(*m, RequestId(1))), testing::Tokens(15, 0));
  EXPECT_EQ(*m->Tokens(H(*m, RequestId(2))), testing::Tokens(3, 100));
  KVPAGE_EXPECT_INVARIANTS(*m);
  batch[2] = {h2, -5};
  EXPECT_TRUE(absl::IsInvalidArgument(m->AppendDecodeTokens(batch)));
  EXPECT_EQ(*m->Tokens(H(*m, RequestId(1))), testing::Tokens(15, 0));
  EXPECT_EQ(*m->Tokens(H(*m, RequestId(2))), testing::Tokens(3, 100));
  KVPAGE_EXPECT_INVARIANTS(*m);
  batch.pop_back();
  ASSERT_TRUE(m->AppendDecodeTokens(batch).ok());
  EXPECT_EQ(*m->Tokens(H(*m, RequestId(1))), testing::Tokens(16, 0));
  EXPECT_EQ(*m->Tokens(H(*m, RequestId(2))), testing::Tokens(4, 100));
  KVPAGE_EXPECT_INVARIANTS(*m);
  // The completed block was hashed from tokens 0..15 once: cached by the next step, it serves
  // a 17-token prompt.
  ASSERT_TRUE(*m->AllocateSlots(H(*m, RequestId(1)), {.num_computed_tokens = 15, .num_new_tokens = 1}));
  m->CompleteStep();
  ASSERT_TRUE(m->AddRequest({RequestId(3), testing::Tokens(17, 0)}).ok());
  EXPECT_EQ(m->GetComputedBlocks(H(*m, RequestId(3)))->num_tokens, 16);
  KVPAGE_EXPECT_INVARIANTS(*m);
}

// A batch that names a request twice is refused before anything changes (issue 25): a decode
// step schedules each running request once, so a repeat is a caller's bug, not a second step.
TEST(KvCacheManagerDecodeStepTest, RequestNamedTwiceIsRefused) {
  auto m = FullManager(8);
  ASSERT_TRUE(m->AddRequest({RequestId(3), testing::Tokens(32, 0)}).ok());
  ASSERT_TRUE(m->AddRequest({RequestId(4), testing::Tokens(32, 100)}).ok());
  ASSERT_TRUE(*m->AllocateSlots(H(*m, RequestId(3)), {.num_new_tokens = 32}));
  ASSERT_TRUE(*m->AllocateSlots(H(*m, RequestId(4)), {.num_new_tokens = 32}));
  ASSERT_TRUE(m->AppendTokens(H(*m, RequestId(3)), {5}).ok());
  ASSERT_TRUE(m->AppendTokens(H(*m, RequestId(4)), {5}).ok());
  const RequestHandle h3 = H(*m, 3), h4 = H(*m, 4);
  std::vector<DecodeStep> twice = {{h3, 32, 1}, {h4, 32, 1}, {h3, 32, 1}};
  const absl::StatusOr<int64_t> served = m->AllocateDecodeStep(twice);
  EXPECT_TRUE(absl::IsInvalidArgument(served.status())) << served.status();
  EXPECT_EQ(served.status().message(), "request 3 appears twice in one decode step (entry 2)");
  EXPECT_THAT(Table(*m, 3), ElementsAre(1, 2));
  EXPECT_THAT(Table(*m, 4), ElementsAre(3, 4));
  EXPECT_EQ(m->Usage().pools[0].used_blocks, 4);
  // The check leaves nothing behind: the same requests once each are served.
  std::vector<DecodeStep> once = {{h3, 32, 1}, {h4, 32, 1}};
  ASSERT_EQ(*m->AllocateDecodeStep(once), 2);
  EXPECT_THAT(Table(*m, 3), ElementsAre(1, 2, 5));
  EXPECT_THAT(Table(*m, 4), ElementsAre(3, 4, 6));
  KVPAGE_EXPECT_INVARIANTS(*m);
}

// num_processed_tokens is -1 (num_computed_tokens) or in [0, num_computed_tokens]; any other
// negative value is refused, not read as -1 (issue 25).
TEST(KvCacheManagerTest, NegativeProcessedTokensAreRefused) {
  auto m = FullManager(8);
  const RequestHandle h = *m->AddRequest({RequestId(1), testing::Tokens(40, 0)});
  ASSERT_TRUE(*m->AllocateSlots(h, {.num_new_tokens = 32}));
  const absl::StatusOr<bool> ok = m->AllocateSlots(
      h, {.num_computed_tokens = 32, .num_new_tokens = 8, .num_processed_tokens = -7});
  EXPECT_TRUE(absl::IsInvalidArgument(ok.status()));
  EXPECT_EQ(ok.status().message(),
            "num_processed_tokens must be >= 0 (or -1 for num_computed_tokens), got -7");
  EXPECT_THAT(Table(*m, 1), ElementsAre(1, 2));
  EXPECT_TRUE(*m->AllocateSlots(
      h, {.num_computed_tokens = 32, .num_new_tokens = 8, .num_processed_tokens = -1}));
  EXPECT_TRUE(absl::IsInvalidArgument(m->RemoveSkippedBlocks(h, -7)));
  KVPAGE_EXPECT_INVARIANTS(*m);
}

// Token ids must lie in [0, vocab_size) of the model: in prompts, appends and batch appends
// (issue 25). A model whose vocab_size is unknown (0) takes any id >= 0.
TEST(KvCacheManagerTest, TokenIdsOutsideTheVocabularyAreRefused) {
  ModelSpec model = TinyModel(testing::kTinyFull);
  model.vocab_size = 1000;
  KvCacheConfig c;
  c.kv_budget_bytes = 16 * 16 * 32;
  c.chunk_bytes = c.kv_budget_bytes;
  auto m = *KvCacheManager::Create(model, c);
  absl::StatusOr<RequestHandle> added = m->AddRequest({RequestId(1), {5, 999, 1000}});
  EXPECT_TRUE(absl::IsInvalidArgument(added.status()));
  EXPECT_EQ(added.status().message(),
            "request 1 prompt token 2: token id 1000 is not below the model's vocab_size 1000");
  added = m->AddRequest({RequestId(1), {5, -3}});
  EXPECT_EQ(added.status().message(), "request 1 prompt token 1: token id -3 is negative");
  EXPECT_EQ(m->num_requests(), 0);
  const RequestHandle h = *m->AddRequest({RequestId(1), {5, 999}});
  ASSERT_TRUE(*m->AllocateSlots(h, {.num_new_tokens = 2}));
  const absl::Status appended = m->AppendTokens(h, {7, 4096});
  EXPECT_EQ(appended.message(), "token id 4096 is not below the model's vocab_size 1000");
  std::vector<DecodeToken> batch = {{h, 8}, {h, 1000}};
  EXPECT_TRUE(absl::IsInvalidArgument(m->AppendDecodeTokens(batch)));
  EXPECT_EQ(m->Tokens(h)->size(), 2u);  // nothing appended
  batch = {{h, 8}, {h, 999}};
  ASSERT_TRUE(m->AppendDecodeTokens(batch).ok());
  EXPECT_EQ(m->Tokens(h)->size(), 4u);
  // vocab_size 0 (unknown): only negative ids are refused.
  model.vocab_size = 0;
  auto any = *KvCacheManager::Create(model, c);
  EXPECT_TRUE(any->AddRequest({RequestId(2), {2000000000}}).ok());
  EXPECT_TRUE(absl::IsInvalidArgument(any->AddRequest({RequestId(3), {-1}}).status()));
  KVPAGE_EXPECT_INVARIANTS(*m);
}

// num_reserve_tokens: the rest of a prompt must fit in growing groups, but is not taken.
TEST(KvCacheManagerDecodeStepTest, ReserveTokensAreCheckedNotTaken) {
  KvCacheConfig c;
  c.kv_budget_bytes = 6 * 16 * 32;  // 6 blocks
  c.chunk_bytes = c.kv_budget_bytes;
  c.hash_seed = 4;
  auto m = *KvCacheManager::Create(testing::TinyModel(testing::kTinyFull), c);
  ASSERT_TRUE(m->AddRequest({RequestId(0), testing::Tokens(100, 0)}).ok());
  // 32 tokens now (2 blocks) + 68 more (5 more blocks): 7 > 6, refused, nothing taken.
  EXPECT_FALSE(*m->AllocateSlots(H(*m, RequestId(0)), {.num_new_tokens = 32, .num_reserve_tokens = 68}));
  EXPECT_EQ(m->Usage().used_bytes, 0);
  EXPECT_TRUE(absl::IsInvalidArgument(
      m->AllocateSlots(H(*m, RequestId(0)), {.num_new_tokens = 32, .num_reserve_tokens = -1}).status()));
  // 32 + 56 more = 88 tokens = 6 blocks: accepted, 2 taken.
  EXPECT_TRUE(*m->AllocateSlots(H(*m, RequestId(0)), {.num_new_tokens = 32, .num_reserve_tokens = 56}));
  EXPECT_EQ(m->Usage().used_bytes, 2 * 16 * 32);
  KVPAGE_EXPECT_INVARIANTS(*m);
}

}  // namespace
}  // namespace kvpage
