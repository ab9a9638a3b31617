// KvCacheManager::CachedPrefixTokens: the hit a prompt would get now, asked read-only.
#include <cstdint>
#include <memory>
#include <vector>

#include <gtest/gtest.h>

#include "block/manager_test_util.h"
#include "kvpage/kv_cache_manager.h"

namespace kvpage {
namespace {

using testing::H;
using testing::TinyModel;

std::unique_ptr<KvCacheManager> Manager(bool caching) {
  KvCacheConfig c;
  c.block_size = 16;
  c.kv_budget_bytes = int64_t{64} * 16 * 32;  // 64 blocks of the tiny model
  c.chunk_bytes = c.kv_budget_bytes;
  c.enable_prefix_caching = caching;
  c.hash_seed = 7;
  auto m = KvCacheManager::Create(TinyModel(testing::kTinyFull), c);
  EXPECT_TRUE(m.ok()) << m.status();
  return *std::move(m);
}

std::vector<int32_t> Prompt(int32_t n, int32_t first = 0) {
  std::vector<int32_t> p;
  for (int32_t i = 0; i < n; ++i) p.push_back(first + i);
  return p;
}

// Prefills a 40-token prompt (two full blocks cached) and frees the request.
void CacheFortyTokens(KvCacheManager& m) {
  ASSERT_TRUE(m.AddRequest({RequestId(1), Prompt(40)}).ok());
  auto ok = m.AllocateSlots(H(m, RequestId(1)), {.num_new_tokens = 40});
  ASSERT_TRUE(ok.ok() && *ok);
  m.CompleteStep();
  ASSERT_TRUE(m.Free(H(m, RequestId(1))).ok());
}

TEST(CachedPrefixTokensTest, AnswersWhatAdmissionWouldHitAndChangesNothing) {
  std::unique_ptr<KvCacheManager> m = Manager(true);
  EXPECT_EQ(m->CachedPrefixTokens(Prompt(40)), 0);
  CacheFortyTokens(*m);
  const PrefixCacheStats before = m->prefix_cache_stats();
  const std::vector<BlockId> free_before = m->FreeBlockOrder(GroupId(0));
  EXPECT_EQ(m->CachedPrefixTokens(Prompt(40)), 32);
  EXPECT_EQ(m->CachedPrefixTokens(Prompt(33)), 32);  // (33 - 1) / 16 = 2 blocks may hit
  EXPECT_EQ(m->CachedPrefixTokens(Prompt(32)), 16);  // the last token is recomputed
  EXPECT_EQ(m->CachedPrefixTokens(Prompt(100)), 32);
  EXPECT_EQ(m->CachedPrefixTokens(Prompt(40, 1)), 0);  // another first block
  EXPECT_EQ(m->CachedPrefixTokens({}), 0);
  EXPECT_EQ(m->CachedPrefixTokens(Prompt(40), {.lora_id = 3}), 0);  // another adapter
  EXPECT_EQ(m->prefix_cache_stats().queries, before.queries);
  EXPECT_EQ(m->prefix_cache_stats().hit_tokens, before.hit_tokens);
  EXPECT_EQ(m->FreeBlockOrder(GroupId(0)), free_before);
  EXPECT_EQ(m->num_requests(), 0);
  // Admission then gets exactly that hit.
  ASSERT_TRUE(m->AddRequest({RequestId(2), Prompt(100)}).ok());
  auto hit = m->GetComputedBlocks(H(*m, RequestId(2)));
  ASSERT_TRUE(hit.ok());
  EXPECT_EQ(hit->num_tokens, 32);
  ASSERT_TRUE(m->CheckInvariants().ok());
}

TEST(CachedPrefixTokensTest, IsZeroWithoutPrefixCaching) {
  std::unique_ptr<KvCacheManager> m = Manager(false);
  CacheFortyTokens(*m);
  EXPECT_EQ(m->CachedPrefixTokens(Prompt(40)), 0);
}

}  // namespace
}  // namespace kvpage
