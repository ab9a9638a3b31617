// A load from the host tier keeps the host slots it reads: the device blocks it takes may evict
// cached blocks, and under write-back each eviction asks the (full) host tier for a slot. That
// slot must never be one the load is about to read.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <random>
#include <set>

#include "block/manager_test_util.h"
#include "kvpage/kv_cache_manager.h"

namespace kvpage {
namespace {

using testing::Concat;
using testing::H;
using testing::TinyModel;
using testing::Tokens;

// Tiny full attention: 512-byte blocks of 16 tokens, one per chunk.
std::unique_ptr<KvCacheManager> WriteBackManager(int32_t device_blocks, int32_t host_blocks) {
  KvCacheConfig c;
  c.kv_budget_bytes = int64_t{device_blocks} * 512;
  c.chunk_bytes = 512;
  c.hash_seed = 7;
  c.host_cache = {.budget_bytes = int64_t{host_blocks} * 512,
                  .policy = HostTierPolicy::kWriteBack};
  auto m = KvCacheManager::Create(TinyModel(testing::kTinyFull), c);
  EXPECT_TRUE(m.ok()) << m.status();
  return *std::move(m);
}

// Adds (if need be) and computes a request's whole prompt after its device hit; completes the
// step and returns the hit.
int64_t Prefill(KvCacheManager& m, int64_t id, const std::vector<int32_t>& prompt) {
  if (!m.Find(RequestId(id)).has_value()) {
    EXPECT_TRUE(m.AddRequest({RequestId(id), prompt}).ok());
  }
  const CacheHit hit = *m.GetComputedBlocks(H(m, id));
  const absl::StatusOr<bool> ok = m.AllocateSlots(
      H(m, id), {.num_computed_tokens = hit.num_tokens,
                 .num_new_tokens = static_cast<int64_t>(prompt.size()) - hit.num_tokens,
                 .hit = &hit});
  EXPECT_TRUE(ok.ok() && *ok) << ok.status();
  m.CompleteStep();
  return hit.num_tokens;
}

std::set<int32_t> HostSlots(absl::Span<const TierCopy> copies) {
  std::set<int32_t> slots;
  for (const TierCopy& c : copies) slots.insert(c.host);
  return slots;
}

const std::vector<int32_t> kCommon = Tokens(48);

// Device: 4 blocks; host: 3 slots. r1's 3-block prefix is saved as r2 evicts it, filling the
// host tier. r3 loads it back into 3 device blocks, 2 of which r2's cached blocks give up: their
// write-back saves find the host tier full of the very slots r3 reads.
TEST(HostTierLoadPinTest, WriteBackSavesOfALoadsEvictionsNeverTakeItsSlots) {
  auto m = WriteBackManager(4, 3);
  Prefill(*m, 1, Concat(kCommon, Tokens(7, 1000)));
  ASSERT_TRUE(m->Free(H(*m, 1)).ok());
  Prefill(*m, 2, Tokens(55, 5000));
  TierTransfers t = m->TakeTransfers();
  ASSERT_EQ(HostSlots(t.saves), (std::set<int32_t>{1, 2, 3}));
  ASSERT_TRUE(m->CompleteTransfers(t.id).ok());
  ASSERT_TRUE(m->Free(H(*m, 2)).ok());
  KVPAGE_EXPECT_INVARIANTS(*m);

  ASSERT_TRUE(m->AddRequest({RequestId(3), Concat(kCommon, Tokens(5, 4000))}).ok());
  EXPECT_EQ(m->GetComputedBlocks(H(*m, 3))->num_tokens, 0);
  EXPECT_EQ(*m->LoadFromHost(H(*m, 3)), 48);
  KVPAGE_EXPECT_INVARIANTS(*m);
  t = m->TakeTransfers();
  EXPECT_EQ(HostSlots(t.loads), (std::set<int32_t>{1, 2, 3}));
  // Every host slot is pinned by the load: the evicted blocks find none to be saved into.
  EXPECT_TRUE(t.saves.empty());
  ASSERT_TRUE(m->CompleteTransfers(t.id).ok());
  KVPAGE_EXPECT_INVARIANTS(*m);
  EXPECT_EQ(Prefill(*m, 3, Concat(kCommon, Tokens(5, 4000))), 48);
  ASSERT_TRUE(m->Free(H(*m, 3)).ok());
  KVPAGE_EXPECT_INVARIANTS(*m);
  EXPECT_EQ(m->Usage().pools[0].used_blocks, 0);
}

// Requests over 8 prefixes on a host tier smaller than the device cache, so that loads and
// write-back saves compete for host slots: no transfer reads and writes the same host slot,
// and invariants hold after every operation.
TEST(HostTierLoadPinTest, RandomizedLoadsOnASmallHostTier) {
  auto m = WriteBackManager(12, 6);
  std::mt19937 rng(5);
  std::vector<int64_t> live;
  std::vector<uint64_t> open;
  int64_t loads = 0;
  for (int64_t id = 0; id < 600; ++id) {
    const std::vector<int32_t> prompt =
        Concat(Tokens(16 * (1 + rng() % 3), 100 * (rng() % 8)), Tokens(1 + rng() % 10, 9000));
    ASSERT_TRUE(m->AddRequest({RequestId(id), prompt}).ok());
    const int64_t loaded = *m->LoadFromHost(H(*m, id));
    KVPAGE_EXPECT_INVARIANTS(*m);
    loads += loaded > 0 ? 1 : 0;
    if (loaded == 0) {  // computes its prompt, or waits without blocks if memory is short
      const CacheHit hit = *m->GetComputedBlocks(H(*m, id));
      ASSERT_TRUE(m->AllocateSlots(H(*m, id),
                                   {.num_computed_tokens = hit.num_tokens,
                                    .num_new_tokens =
                                        static_cast<int64_t>(prompt.size()) - hit.num_tokens,
                                    .hit = &hit})
                      .ok());
      m->CompleteStep();
    }
    live.push_back(id);
    const TierTransfers t = m->TakeTransfers();
    std::set<int32_t> read = HostSlots(t.loads);
    for (int32_t slot : HostSlots(t.saves)) {
      EXPECT_FALSE(read.contains(slot)) << "transfer " << t.id << " saves into host slot "
                                        << slot << ", which a load reads";
    }
    if (t.id != 0) open.push_back(t.id);
    // Transfers complete one or two requests late; requests leave two at a time.
    while (open.size() > 2) {
      ASSERT_TRUE(m->CompleteTransfers(open.front()).ok());
      open.erase(open.begin());
    }
    while (live.size() > 2) {
      ASSERT_TRUE(m->Free(H(*m, live.front())).ok());
      live.erase(live.begin());
    }
    KVPAGE_EXPECT_INVARIANTS(*m);
  }
  for (uint64_t id : open) ASSERT_TRUE(m->CompleteTransfers(id).ok());
  for (int64_t id : live) ASSERT_TRUE(m->Free(H(*m, id)).ok());
  KVPAGE_EXPECT_INVARIANTS(*m);
  EXPECT_EQ(m->Usage().pools[0].used_blocks, 0);
  EXPECT_GT(loads, 50);
}

}  // namespace
}  // namespace kvpage
