// The host tier behind the device prefix cache: write-through and write-back saves, loads of a
// prefix the device evicted, failed and abandoned transfers, refused host memory, CPU events,
// recurrent snapshots, and a randomized run with invariants after every operation.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <random>

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

// Tiny full attention: 512-byte blocks, `device_blocks` of them in one chunk, `host_blocks`
// host slots.
std::unique_ptr<KvCacheManager> TieredManager(int32_t device_blocks, int32_t host_blocks,
                                              HostTierPolicy policy,
                                              MemoryBacking* host_backing = nullptr,
                                              bool events = false) {
  KvCacheConfig c;
  c.kv_budget_bytes = int64_t{device_blocks} * 512;
  c.chunk_bytes = 512;
  c.hash_seed = 7;
  c.enable_kv_events = events;
  c.host_cache = {.budget_bytes = int64_t{host_blocks} * 512, .policy = policy,
                  .backing = host_backing};
  auto m = KvCacheManager::Create(TinyModel(testing::kTinyFull), c);
  EXPECT_TRUE(m.ok()) << m.status();
  return *std::move(m);
}

// Adds a request and computes its whole prompt from the device cache's hit; completes the step.
int64_t Prefill(KvCacheManager& m, int64_t id, const std::vector<int32_t>& prompt) {
  if (!m.Find(RequestId(id)).has_value()) {
    EXPECT_TRUE(m.AddRequest({RequestId(id), prompt}).ok());
  }
  auto hit = m.GetComputedBlocks(H(m, id));
  EXPECT_TRUE(hit.ok()) << hit.status();
  const AllocationRequest req{.num_computed_tokens = hit->num_tokens,
                              .num_new_tokens =
                                  static_cast<int64_t>(prompt.size()) - hit->num_tokens,
                              .hit = &*hit};
  auto ok = m.AllocateSlots(H(m, id), req);
  EXPECT_TRUE(ok.ok() && *ok) << ok.status();
  m.CompleteStep();
  KVPAGE_EXPECT_INVARIANTS(m);
  return hit->num_tokens;
}

std::vector<int32_t> Devices(absl::Span<const TierCopy> copies) {
  std::vector<int32_t> ids;
  for (const TierCopy& c : copies) ids.push_back(c.device.value);
  return ids;
}
std::vector<int32_t> Hosts(absl::Span<const TierCopy> copies) {
  std::vector<int32_t> ids;
  for (const TierCopy& c : copies) ids.push_back(c.host);
  return ids;
}

const std::vector<int32_t> kCommon = Tokens(48);

// Saves r1's 3 full blocks, then has r2 (160 other tokens) evict them from the device.
void SaveThenEvict(KvCacheManager& m) {
  Prefill(m, 1, Concat(kCommon, Tokens(7, 1000)));
  ASSERT_TRUE(m.Free(H(m, 1)).ok());
  ASSERT_TRUE(m.CompleteTransfers(m.TakeTransfers().id).ok());
  Prefill(m, 2, Tokens(160, 5000));
  ASSERT_TRUE(m.Free(H(m, 2)).ok());
  KVPAGE_EXPECT_INVARIANTS(m);
}

TEST(HostTierTest, WriteThroughSavesOnceAndLoadsAnEvictedPrefix) {
  auto m = TieredManager(10, 32, HostTierPolicy::kWriteThrough);
  Prefill(*m, 1, Concat(kCommon, Tokens(7, 1000)));
  TierTransfers t = m->TakeTransfers();
  EXPECT_EQ(t.id, 1u);
  EXPECT_THAT(Devices(t.saves), ElementsAre(1, 2, 3));
  EXPECT_THAT(Hosts(t.saves), ElementsAre(1, 2, 3));
  EXPECT_TRUE(t.loads.empty());
  // Pinned until the save completes: the request and the save hold each block.
  EXPECT_EQ(m->Usage().pools[0].used_blocks, 4);
  ASSERT_TRUE(m->Free(H(*m, 1)).ok());
  EXPECT_EQ(m->Usage().pools[0].used_blocks, 3);
  KVPAGE_EXPECT_INVARIANTS(*m);
  ASSERT_TRUE(m->CompleteTransfers(t.id).ok());
  EXPECT_EQ(m->Usage().pools[0].used_blocks, 0);
  EXPECT_EQ(m->host_cache_stats().ready_blocks, 3);
  EXPECT_EQ(m->CompleteTransfers(t.id).code(), absl::StatusCode::kNotFound);

  // A second request with the same prefix saves nothing again.
  Prefill(*m, 3, Concat(kCommon, Tokens(9, 3000)));
  EXPECT_TRUE(m->TakeTransfers().empty());
  ASSERT_TRUE(m->Free(H(*m, 3)).ok());

  Prefill(*m, 2, Tokens(160, 5000));  // evicts the prefix from the device
  t = m->TakeTransfers();
  EXPECT_EQ(t.saves.size(), 10u);
  ASSERT_TRUE(m->CompleteTransfers(t.id).ok());
  ASSERT_TRUE(m->Free(H(*m, 2)).ok());

  ASSERT_TRUE(m->AddRequest({RequestId(4), Concat(kCommon, Tokens(5, 4000))}).ok());
  EXPECT_EQ(m->GetComputedBlocks(H(*m, 4))->num_tokens, 0);
  EXPECT_EQ(*m->LoadFromHost(H(*m, 4)), 48);
  EXPECT_TRUE(*m->IsLoading(H(*m, 4)));
  EXPECT_EQ(m->LoadFromHost(H(*m, 4)).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(m->AllocateSlots(H(*m, 4), {.num_new_tokens = 53}).status().code(),
            absl::StatusCode::kFailedPrecondition);
  KVPAGE_EXPECT_INVARIANTS(*m);
  t = m->TakeTransfers();
  EXPECT_TRUE(t.saves.empty());
  EXPECT_THAT(Hosts(t.loads), ElementsAre(1, 2, 3));
  ASSERT_TRUE(m->CompleteTransfers(t.id).ok());
  EXPECT_FALSE(*m->IsLoading(H(*m, 4)));
  const CacheHit hit = *m->GetComputedBlocks(H(*m, 4));
  EXPECT_EQ(hit.num_tokens, 48);
  EXPECT_EQ(Ids(hit.blocks[0]), Devices(t.loads));
  auto ok = m->AllocateSlots(
      H(*m, 4), {.num_computed_tokens = 48, .num_new_tokens = 5, .hit = &hit});
  ASSERT_TRUE(ok.ok() && *ok);
  KVPAGE_EXPECT_INVARIANTS(*m);
  const HostCacheStats s = m->host_cache_stats();
  EXPECT_EQ(s.saves, 13);
  EXPECT_EQ(s.loads, 3);
  EXPECT_EQ(s.loaded_tokens, 48);
  EXPECT_EQ(s.loaded_bytes, 3 * 512);
  EXPECT_EQ(s.ready_blocks, 13);
  ASSERT_TRUE(m->Free(H(*m, 4)).ok());
  EXPECT_EQ(m->Usage().pools[0].used_blocks, 0);
  KVPAGE_EXPECT_INVARIANTS(*m);
}

TEST(HostTierTest, WriteBackSavesWhatTheDeviceEvicts) {
  auto m = TieredManager(10, 32, HostTierPolicy::kWriteBack);
  Prefill(*m, 1, Concat(kCommon, Tokens(7, 1000)));
  EXPECT_TRUE(m->TakeTransfers().empty());  // nothing evicted yet
  ASSERT_TRUE(m->Free(H(*m, 1)).ok());
  Prefill(*m, 2, Tokens(160, 5000));
  // Evicted to make room for r2, which now holds them: read before its forward pass writes.
  TierTransfers t = m->TakeTransfers();
  EXPECT_THAT(Devices(t.saves), ElementsAre(3, 2, 1));
  EXPECT_THAT(Hosts(t.saves), ElementsAre(1, 2, 3));
  ASSERT_TRUE(m->CompleteTransfers(t.id).ok());
  ASSERT_TRUE(m->Free(H(*m, 2)).ok());
  ASSERT_TRUE(m->AddRequest({RequestId(4), Concat(kCommon, Tokens(5, 4000))}).ok());
  EXPECT_EQ(*m->LoadFromHost(H(*m, 4)), 48);
  t = m->TakeTransfers();
  EXPECT_EQ(t.loads.size(), 3u);
  // The loads evicted three of r2's blocks: saved in turn.
  EXPECT_EQ(t.saves.size(), 3u);
  ASSERT_TRUE(m->CompleteTransfers(t.id).ok());
  EXPECT_EQ(Prefill(*m, 4, Concat(kCommon, Tokens(5, 4000))), 48);
  ASSERT_TRUE(m->Free(H(*m, 4)).ok());
  KVPAGE_EXPECT_INVARIANTS(*m);
}

TEST(HostTierTest, FailedLoadFreesItsBlocksAndTheRequestComputes) {
  auto m = TieredManager(10, 32, HostTierPolicy::kWriteThrough);
  SaveThenEvict(*m);
  ASSERT_TRUE(m->CompleteTransfers(m->TakeTransfers().id).ok());
  ASSERT_TRUE(m->AddRequest({RequestId(4), Concat(kCommon, Tokens(5, 4000))}).ok());
  EXPECT_EQ(*m->LoadFromHost(H(*m, 4)), 48);
  const TierTransfers t = m->TakeTransfers();
  EXPECT_EQ(m->Usage().pools[0].used_blocks, 3);
  ASSERT_TRUE(m->CompleteTransfers(t.id, /*succeeded=*/false).ok());
  EXPECT_EQ(m->Usage().pools[0].used_blocks, 0);
  EXPECT_FALSE(*m->IsLoading(H(*m, 4)));
  EXPECT_EQ(m->host_cache_stats().failed_transfers, 3);
  EXPECT_EQ(Prefill(*m, 4, Concat(kCommon, Tokens(5, 4000))), 0);
  ASSERT_TRUE(m->Free(H(*m, 4)).ok());
  // The host copies are still there: failing a load drops nothing from the host tier.
  EXPECT_EQ(m->host_cache_stats().ready_blocks, 13);
  KVPAGE_EXPECT_INVARIANTS(*m);
}

TEST(HostTierTest, AbortDuringALoadKeepsItsBlocksUntilTheTransferCompletes) {
  auto m = TieredManager(10, 32, HostTierPolicy::kWriteThrough);
  SaveThenEvict(*m);
  ASSERT_TRUE(m->CompleteTransfers(m->TakeTransfers().id).ok());
  ASSERT_TRUE(m->AddRequest({RequestId(4), Concat(kCommon, Tokens(5, 4000))}).ok());
  EXPECT_EQ(*m->LoadFromHost(H(*m, 4)), 48);
  ASSERT_TRUE(m->Free(H(*m, 4)).ok());
  KVPAGE_EXPECT_INVARIANTS(*m);
  const TierTransfers t = m->TakeTransfers();  // the copy may already be running
  EXPECT_EQ(t.loads.size(), 3u);
  EXPECT_EQ(m->Usage().pools[0].used_blocks, 3);
  ASSERT_TRUE(m->CompleteTransfers(t.id).ok());
  EXPECT_EQ(m->Usage().pools[0].used_blocks, 0);
  KVPAGE_EXPECT_INVARIANTS(*m);
}

TEST(HostTierTest, AbortDuringAWriteThroughSaveKeepsTheBlockPinned) {
  auto m = TieredManager(10, 32, HostTierPolicy::kWriteThrough);
  Prefill(*m, 1, Concat(kCommon, Tokens(7, 1000)));
  ASSERT_TRUE(m->Free(H(*m, 1)).ok());
  const TierTransfers t = m->TakeTransfers();
  EXPECT_EQ(m->Usage().pools[0].used_blocks, 3);
  ASSERT_TRUE(m->CompleteTransfers(t.id, /*succeeded=*/false).ok());
  EXPECT_EQ(m->Usage().pools[0].used_blocks, 0);
  EXPECT_EQ(m->host_cache_stats().ready_blocks, 0);
  KVPAGE_EXPECT_INVARIANTS(*m);
}

// Host memory that refuses every map after `allowed` chunks.
class RefusingBacking final : public MemoryBacking {
 public:
  explicit RefusingBacking(int32_t allowed) : allowed_(allowed) {}
  absl::Status MapChunk(int32_t, int32_t) override {
    if (allowed_ == 0) return absl::ResourceExhaustedError("host memory refused");
    --allowed_;
    return absl::OkStatus();
  }
  absl::Status UnmapChunk(int32_t, int32_t) override { return absl::OkStatus(); }

 private:
  int32_t allowed_;
};

TEST(HostTierTest, RefusedHostMemoryDropsSavesAndLosesNothing) {
  RefusingBacking backing(2);
  auto m = TieredManager(10, 32, HostTierPolicy::kWriteThrough, &backing);
  Prefill(*m, 1, Concat(kCommon, Tokens(7, 1000)));
  const TierTransfers t = m->TakeTransfers();
  EXPECT_THAT(Hosts(t.saves), ElementsAre(1, 2));  // the third slot's chunk was refused
  ASSERT_TRUE(m->CompleteTransfers(t.id).ok());
  ASSERT_TRUE(m->Free(H(*m, 1)).ok());
  EXPECT_EQ(m->Usage().pools[0].used_blocks, 0);
  const HostCacheStats s = m->host_cache_stats();
  EXPECT_EQ(s.ready_blocks, 2);
  EXPECT_EQ(s.mapped_bytes, 2 * 512);
  KVPAGE_EXPECT_INVARIANTS(*m);
}

TEST(HostTierTest, HostEventsNameTheCpuMedium) {
  auto m = TieredManager(10, 2, HostTierPolicy::kWriteThrough, nullptr, /*events=*/true);
  Prefill(*m, 1, Concat(kCommon, Tokens(7, 1000)));
  m->DrainEvents();
  ASSERT_TRUE(m->CompleteTransfers(m->TakeTransfers().id).ok());
  std::vector<KvEvent> events = m->DrainEvents();
  ASSERT_EQ(events.size(), 2u);  // two slots: the third block found none free
  for (const KvEvent& e : events) {
    EXPECT_EQ(e.type, KvEvent::Type::kStored);
    EXPECT_EQ(e.medium, KvMedium::kHost);
    EXPECT_FALSE(e.has_parent);
    EXPECT_TRUE(e.token_ids.empty());
  }
  ASSERT_TRUE(m->Free(H(*m, 1)).ok());
  // New blocks evict the host tier's least recently used slot.
  Prefill(*m, 2, Tokens(16, 7000));
  ASSERT_TRUE(m->CompleteTransfers(m->TakeTransfers().id).ok());
  events = m->DrainEvents();
  ASSERT_GE(events.size(), 2u);
  const KvEvent& removed = events[events.size() - 2];
  EXPECT_EQ(removed.type, KvEvent::Type::kRemoved);
  EXPECT_EQ(removed.medium, KvMedium::kHost);
  EXPECT_EQ(events.back().medium, KvMedium::kHost);
}

TEST(HostTierTest, RecurrentSnapshotsAreTieredToo) {
  // Tiny Gated-DeltaNet hybrid: a snapshot at the end of the 48-token prompt chunk.
  KvCacheConfig c;
  c.kv_budget_bytes = 64 << 10;
  c.chunk_bytes = 4096;
  c.hash_seed = 7;
  c.host_cache = {.budget_bytes = 1 << 20, .policy = HostTierPolicy::kWriteThrough};
  auto created = KvCacheManager::Create(TinyModel(testing::kTinyGdn), c);
  ASSERT_TRUE(created.ok()) << created.status();
  KvCacheManager& m = **created;
  const std::vector<int32_t> prompt = Concat(kCommon, Tokens(7, 1000));
  ASSERT_TRUE(m.AddRequest({RequestId(1), prompt}).ok());
  // Two chunks: the first ends on the prefix's last block boundary, so a snapshot is kept.
  ASSERT_TRUE(*m.AllocateSlots(H(m, 1), {.num_new_tokens = 48}));
  m.CompleteStep();
  ASSERT_TRUE(*m.AllocateSlots(H(m, 1), {.num_computed_tokens = 48, .num_new_tokens = 7}));
  m.CompleteStep();
  ASSERT_TRUE(m.Free(H(m, 1)).ok());
  TierTransfers t = m.TakeTransfers();
  ASSERT_TRUE(m.CompleteTransfers(t.id).ok());
  const HostCacheStats saved = m.host_cache_stats();
  EXPECT_EQ(saved.saves, 3 + 1);  // three attention blocks, one state snapshot
  ASSERT_TRUE(m.ResetPrefixCache().ok());  // the device forgets; the host tier keeps its copies
  ASSERT_TRUE(m.AddRequest({RequestId(2), Concat(kCommon, Tokens(5, 4000))}).ok());
  EXPECT_EQ(m.GetComputedBlocks(H(m, 2))->num_tokens, 0);
  EXPECT_EQ(*m.LoadFromHost(H(m, 2)), 48);
  t = m.TakeTransfers();
  EXPECT_EQ(t.loads.size(), 3u + 1u);
  ASSERT_TRUE(m.CompleteTransfers(t.id).ok());
  const CacheHit hit = *m.GetComputedBlocks(H(m, 2));
  EXPECT_EQ(hit.num_tokens, 48);
  ASSERT_TRUE(*m.AllocateSlots(H(m, 2), {.num_computed_tokens = 48, .num_new_tokens = 5,
                                         .hit = &hit}));
  KVPAGE_EXPECT_INVARIANTS(m);
  ASSERT_TRUE(m.Free(H(m, 2)).ok());
  KVPAGE_EXPECT_INVARIANTS(m);
}

TEST(HostTierTest, ConfigErrorsNameTheField) {
  KvCacheConfig c;
  c.kv_budget_bytes = 1 << 20;
  c.host_cache.budget_bytes = -1;
  EXPECT_THAT(c.Validate().message(), ::testing::HasSubstr("host_cache.budget_bytes"));
  c.host_cache.budget_bytes = 1 << 20;
  c.mode = AccountingMode::kVllm;
  EXPECT_THAT(c.Validate().message(), ::testing::HasSubstr("kvpage accounting"));
}

// Random requests, steps, frees and transfers completed late, failed or never before the
// request leaves; invariants after every operation; at the end every block is back.
TEST(HostTierTest, RandomizedOperationsKeepEveryInvariant) {
  for (HostTierPolicy policy : {HostTierPolicy::kWriteThrough, HostTierPolicy::kWriteBack}) {
    auto m = TieredManager(16, 48, policy);
    std::mt19937 rng(policy == HostTierPolicy::kWriteBack ? 11 : 7);
    std::vector<uint64_t> open;
    std::vector<int64_t> live;
    int64_t next_id = 0, loads = 0;
    for (int op = 0; op < 4000; ++op) {
      const int kind = static_cast<int>(rng() % 5);
      if (kind == 0) {  // a request with one of 16 prefixes
        const int64_t id = next_id++;
        const std::vector<int32_t> prompt =
            Concat(Tokens(16 * (1 + rng() % 4), 100 * (rng() % 16)), Tokens(1 + rng() % 20, 9000));
        ASSERT_TRUE(m->AddRequest({RequestId(id), prompt}).ok());
        live.push_back(id);
        const int64_t loaded = *m->LoadFromHost(H(*m, id));
        loads += loaded > 0;
        if (loaded == 0) {
          const CacheHit hit = *m->GetComputedBlocks(H(*m, id));
          const AllocationRequest req{
              .num_computed_tokens = hit.num_tokens,
              .num_new_tokens = static_cast<int64_t>(prompt.size()) - hit.num_tokens,
              .hit = &hit};
          ASSERT_TRUE(m->AllocateSlots(H(*m, id), req).ok());
        }
      } else if (kind == 1) {
        m->CompleteStep();
      } else if (kind == 2 && !live.empty()) {  // a request leaves, loading or not
        const size_t i = rng() % live.size();
        ASSERT_TRUE(m->Free(H(*m, live[i])).ok());
        live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
      } else if (kind == 3) {
        const TierTransfers t = m->TakeTransfers();
        if (t.id != 0) open.push_back(t.id);
      } else if (!open.empty()) {
        const size_t i = rng() % open.size();
        ASSERT_TRUE(m->CompleteTransfers(open[i], rng() % 5 != 0).ok());
        open.erase(open.begin() + static_cast<std::ptrdiff_t>(i));
      }
      KVPAGE_EXPECT_INVARIANTS(*m);
    }
    m->CompleteStep();
    for (int64_t id = 0; id < next_id; ++id) {
      if (m->Find(RequestId(id)).has_value()) {
        ASSERT_TRUE(m->Free(H(*m, id)).ok());
      }
    }
    const TierTransfers last = m->TakeTransfers();
    if (last.id != 0) open.push_back(last.id);
    for (uint64_t id : open) ASSERT_TRUE(m->CompleteTransfers(id).ok());
    KVPAGE_EXPECT_INVARIANTS(*m);
    EXPECT_EQ(m->Usage().pools[0].used_blocks, 0);
    // (384 and 145 loads with these seeds: the tier is exercised, not bypassed.)
    EXPECT_GT(loads, 100);
    EXPECT_GT(m->host_cache_stats().loads, 100);
  }
}

}  // namespace
}  // namespace kvpage
