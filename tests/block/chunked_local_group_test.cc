// Chunked-local attention (Llama 4's RoPE layers) in the block manager, with exact block ids:
// blocks of finished chunks are freed, prefix hits skip the chunks before the hit's own, and a
// rollback into a freed chunk is refused.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "block/manager_test_util.h"
#include "kvpage/kv_cache_manager.h"

namespace kvpage {
namespace {

using ::testing::ElementsAre;
using testing::Concat;
using testing::H;
using testing::Ids;
using testing::Tokens;
using testing::TinyModel;

constexpr GroupId kChunked{0};  // layers 0–2 (RoPE): chunks of 32 tokens = two blocks
constexpr GroupId kFull{1};     // layer 3 (NoPE)

std::unique_ptr<KvCacheManager> ChunkedManager(AccountingMode mode = AccountingMode::kKvpage) {
  KvCacheConfig c;
  c.mode = mode;
  c.kv_budget_bytes = 1 << 20;
  c.chunk_bytes = mode == AccountingMode::kVllm ? c.kv_budget_bytes : 64 << 10;
  c.hash_seed = 1;
  auto m = KvCacheManager::Create(TinyModel(testing::kTinyChunked), c);
  EXPECT_TRUE(m.ok()) << m.status();
  return *std::move(m);
}

std::vector<int32_t> Table(const KvCacheManager& m, int64_t id, GroupId g) {
  auto t = m.BlockTable(H(m, RequestId(id)), g);
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? Ids(*t) : std::vector<int32_t>{};
}

int32_t Used(const KvCacheManager& m, GroupId g) { return m.Usage().pools[g.value].used_blocks; }

// Adds request `id`, allocates its prompt after its hit and completes the step; the hit.
CacheHit Prefill(KvCacheManager& m, int64_t id, const std::vector<int32_t>& prompt) {
  EXPECT_TRUE(m.AddRequest({RequestId(id), prompt}).ok());
  auto hit = m.GetComputedBlocks(H(m, RequestId(id)));
  EXPECT_TRUE(hit.ok()) << hit.status();
  const int64_t fresh = static_cast<int64_t>(prompt.size()) - hit->num_tokens;
  auto ok = m.AllocateSlots(H(m, RequestId(id)), {.num_computed_tokens = hit->num_tokens,
                                                 .num_new_tokens = fresh,
                                                 .hit = &*hit});
  EXPECT_TRUE(ok.ok() && *ok) << ok.status();
  m.CompleteStep();
  KVPAGE_EXPECT_INVARIANTS(m);
  return *hit;
}

TEST(ChunkedLocalGroupTest, ModelHasAChunkedAndAFullGroup) {
  auto m = ChunkedManager();
  ASSERT_EQ(m->num_groups(), 2);
  EXPECT_EQ(m->group_kind(kChunked), LayerKind::kChunkedLocal);
  EXPECT_EQ(m->group_kind(kFull), LayerKind::kFullAttention);
  EXPECT_TRUE(m->frees_skipped_blocks());
  EXPECT_TRUE(m->can_roll_back());
}

TEST(ChunkedLocalGroupTest, RefusesAChunkedGroupWithoutAChunk) {
  ModelSpec spec = TinyModel(testing::kTinyChunked);
  spec.groups[0].spec.attention_chunk_size = 0;
  KvCacheConfig c;
  c.kv_budget_bytes = 1 << 20;
  const auto m = KvCacheManager::Create(spec, c);
  ASSERT_TRUE(absl::IsInvalidArgument(m.status())) << m.status();
  EXPECT_THAT(m.status().message(), ::testing::HasSubstr("attention_chunk_size 0"));
}

// A request crossing chunk boundaries frees the blocks of each finished chunk, and only those.
TEST(ChunkedLocalGroupTest, CrossingAChunkBoundaryFreesThePreviousChunk) {
  auto m = ChunkedManager();
  Prefill(*m, 1, Tokens(60));  // blocks 0–3; token 60 is in chunk [32, 64)
  EXPECT_THAT(Table(*m, 1, kChunked), ElementsAre(1, 2, 3, 4));
  // Block 0 dies at the first chunk boundary past its end (32): a step ending at 33.
  EXPECT_EQ(*m->NextEvent(H(*m, 1)), 33);
  ASSERT_TRUE(m->RemoveSkippedBlocks(H(*m, RequestId(1)), 60).ok());
  EXPECT_THAT(Table(*m, 1, kChunked), ElementsAre(0, 0, 3, 4));
  EXPECT_THAT(Table(*m, 1, kFull), ElementsAre(1, 2, 3, 4));
  EXPECT_EQ(Used(*m, kChunked), 2);
  EXPECT_EQ(Used(*m, kFull), 4);
  // Block 2 dies at 64; block 3 fills (is cached) at 64 first.
  EXPECT_EQ(*m->NextEvent(H(*m, 1)), 64);
  KVPAGE_EXPECT_INVARIANTS(*m);

  // Ten decode-side tokens take the request to 70, across the boundary at 64.
  ASSERT_TRUE(m->AppendTokens(H(*m, RequestId(1)), Tokens(10, 500)).ok());
  ASSERT_TRUE(*m->AllocateSlots(H(*m, RequestId(1)),
                                {.num_computed_tokens = 60, .num_new_tokens = 10}));
  m->CompleteStep();
  EXPECT_THAT(Table(*m, 1, kChunked), ElementsAre(0, 0, 3, 4, 5));
  ASSERT_TRUE(m->RemoveSkippedBlocks(H(*m, RequestId(1)), 70).ok());
  EXPECT_THAT(Table(*m, 1, kChunked), ElementsAre(0, 0, 0, 0, 5));
  EXPECT_EQ(Used(*m, kChunked), 1);
  EXPECT_EQ(Used(*m, kFull), 5);
  KVPAGE_EXPECT_INVARIANTS(*m);

  // Keeping 63 tokens would recompute token 62, whose chunk [32, 64) is freed: refused, and
  // nothing changes. Keeping 65 recomputes token 64, in the live chunk.
  EXPECT_TRUE(absl::IsFailedPrecondition(m->RollbackTokens(H(*m, RequestId(1)), 7)));
  EXPECT_EQ(m->Tokens(H(*m, RequestId(1)))->size(), 70u);
  ASSERT_TRUE(m->RollbackTokens(H(*m, RequestId(1)), 5).ok());
  EXPECT_EQ(m->Tokens(H(*m, RequestId(1)))->size(), 65u);
  ASSERT_TRUE(m->Free(H(*m, RequestId(1))).ok());
  EXPECT_EQ(Used(*m, kChunked), 0);
  KVPAGE_EXPECT_INVARIANTS(*m);
}

// A hit needs, in the chunked group, only the cached run from the chunk of its end; the blocks
// before count without a lookup (null entries), as in vLLM's find_longest_cache_hit.
TEST(ChunkedLocalGroupTest, PrefixHitsSkipTheChunksBeforeTheHitsOwn) {
  auto m = ChunkedManager();
  Prefill(*m, 1, Tokens(100));  // full blocks 0–5 cached in both groups
  EXPECT_THAT(Table(*m, 1, kChunked), ElementsAre(1, 2, 3, 4, 5, 6, 7));

  // 96 tokens: the hit ends on a chunk boundary, so the chunked group reads none of them.
  const CacheHit hit = Prefill(*m, 2, Concat(Tokens(100), Tokens(5, 900)));
  EXPECT_EQ(hit.num_tokens, 96);
  EXPECT_THAT(Ids(hit.blocks[kChunked.value]), ElementsAre(0, 0, 0, 0, 0, 0));
  EXPECT_THAT(Ids(hit.blocks[kFull.value]), ElementsAre(1, 2, 3, 4, 5, 6));
  EXPECT_THAT(Table(*m, 2, kChunked), ElementsAre(0, 0, 0, 0, 0, 0, 8));
  EXPECT_THAT(Table(*m, 2, kFull), ElementsAre(1, 2, 3, 4, 5, 6, 8));

  // 80 tokens shared: full attention serves 5 blocks; the chunked group the block of chunk
  // [64, 96) only.
  const CacheHit mid = Prefill(*m, 3, Concat(Tokens(80), Tokens(30, 700)));
  EXPECT_EQ(mid.num_tokens, 80);
  EXPECT_THAT(Ids(mid.blocks[kChunked.value]), ElementsAre(0, 0, 0, 0, 5));
  EXPECT_THAT(Ids(mid.blocks[kFull.value]), ElementsAre(1, 2, 3, 4, 5));
  KVPAGE_EXPECT_INVARIANTS(*m);
}

// vllm accounting: vLLM 0.33 turns its hybrid manager off for a model with an
// attention_chunk_size, so the chunked layers are managed as full attention in one group.
TEST(ChunkedLocalGroupTest, VllmPromotesChunkedLayersBesideFullOnes) {
  auto m = ChunkedManager(AccountingMode::kVllm);
  ASSERT_EQ(m->num_groups(), 1);
  EXPECT_EQ(m->group_kind(GroupId(0)), LayerKind::kFullAttention);
  EXPECT_FALSE(m->frees_skipped_blocks());
  Prefill(*m, 1, Tokens(60));
  ASSERT_TRUE(m->RemoveSkippedBlocks(H(*m, RequestId(1)), 60).ok());
  EXPECT_THAT(Table(*m, 1, GroupId(0)), ElementsAre(1, 2, 3, 4));
}

}  // namespace
}  // namespace kvpage
