// The host tier behind the device prefix cache: building it, loading a request's prefix back,
// handing copies to the server and completing them.
//
// A save is queued by a pool (write-through when a key is first cached, write-back when a
// cached block is evicted) into its tier; a load by LoadFromHost. TakeTransfers moves both
// into one numbered transfer; CompleteTransfers finishes it: saved slots become loadable,
// loaded blocks join the device cache, and every device block the transfer held goes back.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "block/manager_impl.h"
#include "block/memory_description.h"
#include "internal/status_macros.h"

namespace kvpage {

using internal::HitScope;
using internal::RequestState;

absl::Status KvCacheManager::Impl::BuildHostTiers(
    const ModelSpec& model, DType dtype, const std::vector<internal::GroupLayout>& layouts) {
  const HostCacheConfig& host = config.host_cache;
  if (host.budget_bytes <= 0) return absl::OkStatus();
  // Each pool's share follows its device capacity in bytes.
  long double total = 0;
  for (const auto& pool : pools) total += static_cast<long double>(pool->capacity()) * pool->block_bytes();
  std::vector<int32_t> chunks(pools.size(), 0);
  for (size_t p = 0; p < pools.size(); ++p) {
    const BlockPool& pool = *pools[p];
    const long double share = host.budget_bytes *
                              (static_cast<long double>(pool.capacity()) * pool.block_bytes() / total);
    const long double slots = std::min<long double>(share / pool.block_bytes(), (1u << 31) - 2);
    chunks[p] = static_cast<int32_t>(slots / pool.blocks_per_chunk());
  }
  if (host.backing != nullptr) {
    KVPAGE_ASSIGN_OR_RETURN(MemoryLayout memory,
                            internal::DescribeMemory(model, config, dtype, layouts, pools));
    memory.budget_bytes = host.budget_bytes;
    for (size_t p = 0; p < pools.size(); ++p) memory.pools[p].max_chunks = chunks[p];
    KVPAGE_RETURN_IF_ERROR(host.backing->Reserve(memory));
  }
  for (size_t p = 0; p < pools.size(); ++p) {
    const internal::HostTierConfig tc{.pool_index = static_cast<int32_t>(p),
                                      .slot_bytes = pools[p]->block_bytes(),
                                      .slots_per_chunk = pools[p]->blocks_per_chunk(),
                                      .max_chunks = chunks[p],
                                      .policy = host.policy};
    tiers.push_back(std::make_unique<internal::HostTier>(tc, host.backing, &events));
    pools[p]->set_host_tier(tiers.back().get());
  }
  host_stats.budget_bytes = host.budget_bytes;
  return absl::OkStatus();
}

void KvCacheManager::Impl::ReleaseHeld(int32_t slot) {
  Held& h = held[slot];
  for (const auto& [pool, block] : h.blocks) pools[pool]->Free({block});
  h.blocks.clear();
}

void KvCacheManager::Impl::CountTierRefs(std::vector<std::vector<int32_t>>& refs) const {
  for (const Held& h : held) {
    for (const auto& [pool, block] : h.blocks) ++refs[pool][block.value];
  }
  auto count_saves = [&](int32_t pool, absl::Span<const internal::PendingSave> saves) {
    for (const internal::PendingSave& s : saves) {
      if (s.pinned) ++refs[pool][s.device];
    }
  };
  for (const auto& [transfer_id, t] : transfers) {
    for (const Save& s : t.saves) count_saves(s.pool, {&s.save, 1});
    for (const Load& l : t.loads) ++refs[l.pool][l.device];
  }
  for (const Load& l : queued_loads) ++refs[l.pool][l.device];
  for (size_t p = 0; p < tiers.size(); ++p) count_saves(static_cast<int32_t>(p), tiers[p]->queued());
}

absl::Status KvCacheManager::Impl::CheckTiers() const {
  int64_t mapped = 0;
  for (const auto& tier : tiers) {
    KVPAGE_RETURN_IF_ERROR(tier->CheckInvariants());
    mapped += tier->mapped_bytes();
  }
  if (mapped > config.host_cache.budget_bytes && !tiers.empty()) {
    return absl::InternalError(absl::StrCat("host tiers map ", mapped, " bytes of a ",
                                            config.host_cache.budget_bytes, "-byte budget"));
  }
  for (size_t slot = 0; slot < held.size(); ++slot) {
    if (states[slot] == nullptr && !held[slot].blocks.empty()) {
      return absl::InternalError(absl::StrCat("free slot ", slot, " holds loaded blocks"));
    }
  }
  return absl::OkStatus();
}

namespace {

// The blocks of a hit of `length` blocks from both tiers, per pool: device blocks to hold and
// host slots to load (with the group and hash index each load is cached under).
struct TieredHit {
  std::vector<std::pair<int32_t, BlockId>> device;
  std::vector<ManagerImpl::Load> loads;
};

TieredHit CollectHit(const ManagerImpl& m, absl::Span<const BlockHash> hashes,
                     int64_t length) {
  TieredHit hit;
  for (const auto& g : m.groups) {
    const int32_t pool = g->layout().pool;
    const int32_t group = g->layout().id.value;
    for (int64_t i : g->HitKeys(length)) {
      if (i < 0) continue;
      const BlockId b = m.pools[pool]->Lookup(hashes[i], GroupId(group));
      if (b != kNullBlock) {
        hit.device.emplace_back(pool, b);
      } else {
        hit.loads.push_back({.pool = pool,
                             .group = group,
                             .host = m.tiers[pool]->Find(hashes[i], group),
                             .hash_index = i});
      }
    }
  }
  return hit;
}

// Whether the pools can hold the hit's device blocks (those sitting free leave the free lists)
// and take a block for each load. Idle chunks holding hit blocks stop being idle: they cannot
// be given away for the loads.
bool CanHold(const ManagerImpl& m, const TieredHit& hit) {
  std::vector<int64_t> need(m.pools.size(), 0), pinned(m.pools.size(), 0);
  std::vector<std::pair<int32_t, int32_t>> idle;  // (pool, chunk)
  for (const auto& [pool, b] : hit.device) {
    const BlockPool& p = *m.pools[pool];
    if (p.ref_count(b) != 0) continue;
    ++need[pool];
    if (p.IsIdleChunk(p.ChunkIndex(b))) idle.emplace_back(pool, p.ChunkIndex(b));
  }
  std::sort(idle.begin(), idle.end());
  idle.erase(std::unique(idle.begin(), idle.end()), idle.end());
  for (const auto& [pool, chunk] : idle) ++pinned[pool];
  for (const ManagerImpl::Load& l : hit.loads) ++need[l.pool];
  return m.CanTake(need, pinned);
}

// Holds the hit's device blocks for the request, takes a device block for each load and
// queues the loads. False, with nothing changed, when the backing refuses the chunks.
bool StartLoads(ManagerImpl& m, const RequestState& st, TieredHit& hit) {
  // Pinned first: taking device blocks may evict (write-back: save) and so claim host slots.
  for (const ManagerImpl::Load& l : hit.loads) m.tiers[l.pool]->Pin(l.host);
  ManagerImpl::Held& h = m.held[st.slot];
  for (const auto& [pool, b] : hit.device) {
    m.pools[pool]->Touch({b});
    h.blocks.emplace_back(pool, b);
  }
  std::vector<int64_t> need(m.pools.size(), 0);
  for (const ManagerImpl::Load& l : hit.loads) ++need[l.pool];
  m.MakeRoom(need);
  if (!m.PremapChunks(need)) {  // the request computes its prefix instead
    for (const ManagerImpl::Load& l : hit.loads) m.tiers[l.pool]->Unpin(l.host);
    m.ReleaseHeld(st.slot);
    return false;
  }
  for (ManagerImpl::Load& l : hit.loads) {
    m.scratch_blocks.clear();
    m.TakeFromPool(l.pool, 1, absl::MakeSpan(need), m.ReservedForOthers(l.pool, need),
                   &m.scratch_blocks);
    l.device = m.scratch_blocks[0].value;
    l.slot = st.slot;
    l.generation = m.generations[st.slot];
    m.queued_loads.push_back(l);
  }
  m.budget->DropPremapped();
  h.loads_in_flight = static_cast<int32_t>(hit.loads.size());
  return true;
}

}  // namespace

absl::StatusOr<int64_t> KvCacheManager::LoadFromHost(RequestHandle request) {
  Impl& m = *impl_;
  RequestState* st = m.Get(request);
  if (st == nullptr) return m.Stale(request);
  if (st->allocated || m.held[st->slot].loads_in_flight > 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "request ", st->id.value,
        st->allocated ? " already holds blocks" : " is loading from the host tier already"));
  }
  if (!m.has_host_tier() || !m.config.enable_prefix_caching || st->skip_prefix_cache_read ||
      !m.held[st->slot].blocks.empty()) {
    return 0;
  }
  const absl::Span<const BlockHash> hashes = st->hashes.hashes();
  const int64_t max_blocks = std::min<int64_t>((m.NumTokens(st->slot) - 1) / m.block_size,
                                               static_cast<int64_t>(hashes.size()));
  if (max_blocks <= 0) return 0;
  const int64_t on_device = m.LongestHitLength(hashes, max_blocks);
  const int64_t tiered = m.LongestHitLength(hashes, max_blocks, nullptr, HitScope::kDeviceAndHost);
  if (tiered <= on_device) return 0;
  TieredHit hit = CollectHit(m, hashes, tiered);
  if (!CanHold(m, hit) || !StartLoads(m, *st, hit)) return 0;
  const int64_t tokens = (tiered - on_device) * m.block_size;
  m.host_stats.loaded_tokens += tokens;
  return tokens;
}

absl::StatusOr<bool> KvCacheManager::IsLoading(RequestHandle request) const {
  const Impl& m = *impl_;
  const RequestState* st = m.Get(request);
  if (st == nullptr) return m.Stale(request);
  return m.has_host_tier() && m.held[st->slot].loads_in_flight > 0;
}

TierTransfers KvCacheManager::TakeTransfers() {
  Impl& m = *impl_;
  TierTransfers out;
  Impl::Transfer t;
  for (size_t p = 0; p < m.tiers.size(); ++p) {
    for (const internal::PendingSave& s : m.tiers[p]->TakeSaves()) {
      out.saves.push_back(TierCopy{GroupId(s.group), BlockId(s.device), s.host});
      t.saves.push_back(Impl::Save{static_cast<int32_t>(p), s});
    }
  }
  for (const Impl::Load& l : m.queued_loads) {
    out.loads.push_back(TierCopy{GroupId(l.group), BlockId(l.device), l.host});
  }
  t.loads.swap(m.queued_loads);
  if (out.empty()) return out;
  out.id = m.next_transfer_id++;
  m.transfers.emplace(out.id, std::move(t));
  return out;
}

absl::Status KvCacheManager::CompleteTransfers(uint64_t id, bool succeeded) {
  Impl& m = *impl_;
  const auto it = m.transfers.find(id);
  if (it == m.transfers.end()) {
    return absl::NotFoundError(absl::StrCat("no transfer ", id, " is in flight"));
  }
  Impl::Transfer t = std::move(it->second);
  m.transfers.erase(it);
  HostCacheStats& stats = m.host_stats;
  for (const Impl::Save& s : t.saves) {
    m.tiers[s.pool]->FinishSave(s.save.host, succeeded);
    if (s.save.pinned) m.pools[s.pool]->Free({BlockId(s.save.device)});
    (succeeded ? stats.saves : stats.failed_transfers)++;
    if (succeeded) stats.saved_bytes += m.pools[s.pool]->block_bytes();
  }
  for (const Impl::Load& l : t.loads) {
    m.tiers[l.pool]->Unpin(l.host);
    (succeeded ? stats.loads : stats.failed_transfers)++;
    if (succeeded) stats.loaded_bytes += m.pools[l.pool]->block_bytes();
    RequestState* owner =
        m.generations[l.slot] == l.generation ? m.states[l.slot].get() : nullptr;
    const BlockId block(l.device);
    if (owner == nullptr) {  // the request left while its load ran
      m.pools[l.pool]->Free({block});
      continue;
    }
    if (succeeded) m.groups[l.group]->CacheLoaded(m.View(*owner), block, l.hash_index);
    // Held for the request until its first allocation (an unloaded block goes back clean).
    Impl::Held& h = m.held[l.slot];
    if (succeeded) {
      h.blocks.emplace_back(l.pool, block);
    } else {
      m.pools[l.pool]->Free({block});
    }
    --h.loads_in_flight;
  }
  return absl::OkStatus();
}

HostCacheStats KvCacheManager::host_cache_stats() const {
  const Impl& m = *impl_;
  HostCacheStats s = m.host_stats;
  s.mapped_bytes = s.ready_blocks = s.saving_blocks = s.evictions = 0;
  for (const auto& tier : m.tiers) {
    s.mapped_bytes += tier->mapped_bytes();
    s.ready_blocks += tier->num_ready();
    s.saving_blocks += tier->num_saving();
    s.evictions += tier->evictions();
  }
  return s;
}

}  // namespace kvpage
