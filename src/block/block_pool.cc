#include "block/block_pool.h"

#include <algorithm>
#include <limits>
#include <ranges>
#include <utility>

#include "absl/strings/str_cat.h"
#include "block/host_tier.h"
#include "block/prefix_index.h"
#include "internal/prefetch.h"
#include "internal/status_macros.h"

namespace kvpage {

absl::Status BlockPoolConfig::Validate() const {
  if (block_bytes <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("block_bytes must be positive, got ", block_bytes));
  }
  if (blocks_per_chunk <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("blocks_per_chunk must be positive, got ", blocks_per_chunk));
  }
  if (chunk_charge_bytes < 0 ||
      (chunk_charge_bytes > 0 && chunk_charge_bytes < int64_t{blocks_per_chunk} * block_bytes)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "chunk_charge_bytes ", chunk_charge_bytes, " is below the chunk's ",
        int64_t{blocks_per_chunk} * block_bytes, " bytes"));
  }
  if (max_chunks < 0) {
    return absl::InvalidArgumentError(absl::StrCat("max_chunks must be >= 0, got ", max_chunks));
  }
  if (int64_t{max_chunks} * blocks_per_chunk >= std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a pool of ", max_chunks, " chunks x ", blocks_per_chunk, " blocks exceeds int32 ids"));
  }
  return absl::OkStatus();
}

BlockPool::BlockPool(const BlockPoolConfig& config, MemoryBudget* budget, KvEventLog* events)
    : pool_index_(config.pool_index),
      block_bytes_(config.block_bytes),
      bpc_(config.blocks_per_chunk),
      max_chunks_(config.max_chunks),
      chunk_charge_(config.chunk_charge_bytes > 0
                        ? config.chunk_charge_bytes
                        : int64_t{config.blocks_per_chunk} * config.block_bytes),
      enable_caching_(config.enable_caching),
      budget_(budget),
      events_(events) {
  // Records start with the null block's and grow as chunks are mapped (GrowBlockRecords):
  // what a budget could hold says nothing of what a run will touch.
  blocks_.assign(1, Block{});
  if (enable_caching_) keys_.assign(1, internal::PrefixKey{});
  index_ = std::make_unique<internal::PrefixIndex>();
  // One bucket per used count a chunk can have (0..bpc), made as counts are reached: vLLM's
  // one chunk of every block would otherwise start with a billion empty buckets.
  buckets_.resize(std::min(static_cast<size_t>(bpc_) + 1, kInitialBuckets));
  if (max_chunks_ <= 1) {
    chunk_shift_ = 31;  // every id is in chunk 0
  } else if ((bpc_ & (bpc_ - 1)) == 0) {
    chunk_shift_ = __builtin_ctz(static_cast<uint32_t>(bpc_));
  }
}

BlockPool::~BlockPool() = default;

void BlockPool::GrowBlockRecords(int32_t block) {
  KVPAGE_DCHECK(block > 0 && block <= capacity());
  // Double, so the copies cost O(1) per record; 64 at least, capacity() + 1 at most.
  const size_t limit = static_cast<size_t>(capacity()) + 1;
  const size_t size = std::min(
      limit, std::max({static_cast<size_t>(block) + 1, 2 * blocks_.size(), size_t{64}}));
  blocks_.resize(size, Block{});
  if (enable_caching_) {
    keys_.resize(size, internal::PrefixKey{});
    // Room for every block with a record: the map rehashes when the records grow (O(1) per
    // block over a run), never on a CacheBlock in between.
    index_->Reserve(size);
  }
}

void BlockPool::EnsureChunkRecord(int32_t chunk) {
  if (static_cast<size_t>(chunk) < chunks_.size()) return;
  const size_t size = std::min(
      static_cast<size_t>(max_chunks_),
      std::max({static_cast<size_t>(chunk) + 1, 2 * chunks_.size(), size_t{16}}));
  chunks_.resize(size, Chunk{});
}

BlockHash BlockPool::block_hash(BlockId block) const {
  if (static_cast<size_t>(block.value) >= keys_.size()) return BlockHash{};
  return keys_[block.value].hash;
}

bool BlockPool::is_mapped(BlockId block) const {
  if (block.value <= 0 || block.value > capacity()) return false;
  const size_t c = static_cast<size_t>(ChunkOf(block.value));
  return c < chunks_.size() && chunks_[c].mapped;
}

// ---- Chunk buckets: chunks with clean blocks, indexed by how many blocks they have in use. ----

void BlockPool::BucketInsert(int32_t c) {
  Chunk& ch = chunks_[c];
  if (static_cast<size_t>(ch.used) >= buckets_.size()) [[unlikely]] {
    buckets_.resize(std::min(static_cast<size_t>(bpc_) + 1, 2 * static_cast<size_t>(ch.used)));
  }
  std::vector<int32_t>& bucket = buckets_[ch.used];
  ch.bucket_pos = static_cast<int32_t>(bucket.size());
  bucket.push_back(c);
  max_bucket_ = std::max(max_bucket_, ch.used);
}

void BlockPool::BucketRemove(int32_t c) {
  Chunk& ch = chunks_[c];
  std::vector<int32_t>& bucket = buckets_[ch.used];
  const int32_t last = bucket.back();
  bucket[ch.bucket_pos] = last;
  chunks_[last].bucket_pos = ch.bucket_pos;
  bucket.pop_back();
  ch.bucket_pos = -1;
}

void BlockPool::IdleInsert(int32_t c) {
  Chunk& ch = chunks_[c];
  if (!ch.idle_listed) {
    ch.idle_listed = true;
    idle_stack_.push_back(c);
  }
  ++num_idle_chunks_;
}

// ---- Clean stacks and the LRU list of cached-free blocks ----

void BlockPool::PushClean(int32_t b) {
  const int32_t c = ChunkOf(b);
  Chunk& ch = chunks_[c];
  if (ch.clean == ch.fresh) ch.clean_top = -1;
  blocks_[b].next = ch.clean_top;
  ch.clean_top = b;
  ++ch.clean;
  ++num_clean_;
  if (ch.clean == 1) BucketInsert(c);
}

void BlockPool::LruAppend(int32_t b, int32_t c) {
  ++chunks_[c].cached;
  ++num_cached_free_;
  blocks_[b].prev = lru_tail_;
  blocks_[b].next = -1;
  if (lru_tail_ >= 0) {
    blocks_[lru_tail_].next = b;
  } else {
    lru_head_ = b;
  }
  lru_tail_ = b;
}

void BlockPool::LruRemove(int32_t b) {
  --chunks_[ChunkOf(b)].cached;
  --num_cached_free_;
  if (blocks_[b].prev >= 0) {
    blocks_[blocks_[b].prev].next = blocks_[b].next;
  } else {
    lru_head_ = blocks_[b].next;
  }
  if (blocks_[b].next >= 0) {
    blocks_[blocks_[b].next].prev = blocks_[b].prev;
  } else {
    lru_tail_ = blocks_[b].prev;
  }
  blocks_[b].prev = blocks_[b].next = -1;
}

void BlockPool::TakeBlock(int32_t b) {
  blocks_[b].ref = 1;
  ++num_used_;
  const int32_t c = ChunkOf(b);
  Chunk& ch = chunks_[c];
  const bool in_bucket = ch.clean > 0;
  if (in_bucket) BucketRemove(c);
  if (ch.used == 0) IdleRemove(c);
  ++ch.used;
  if (in_bucket) BucketInsert(c);
}

// ---- Allocation ----

int64_t BlockPool::AllocatableNow(int64_t held_back_bytes) const {
  const int64_t bytes = std::max<int64_t>(0, budget_->free_bytes() - held_back_bytes);
  const int64_t mappable = std::min<int64_t>(num_unmapped_chunks(), bytes / chunk_charge_);
  return int64_t{num_free_blocks()} + mappable * bpc_;
}

bool BlockPool::Allocate(int32_t n, std::vector<BlockId>* out) {
  // A refused map before anything is taken leaves the pool as it was.
  if (!PremapFor(n).ok()) {
    budget_->DropPremapped();
    return false;
  }
  while (n > 0) {
    // Grow into a new chunk when out of clean blocks, unless that would only keep cache alive
    // while eating into the budget's headroom: then evict our own cached blocks instead.
    const int64_t free_after = budget_->free_bytes() - chunk_charge_;
    if (num_clean_ == 0 && num_mapped_chunks_ < max_chunks_ && free_after >= 0 &&
        (num_cached_free_ == 0 || free_after >= budget_->headroom_bytes()) &&
        MapNextChunk(out)) {
      --n;  // a one-block chunk, mapped into use
      continue;
    }
    if (num_clean_ > 0) {
      n -= TakeFromFullestChunk(n, out);
    } else if (num_cached_free_ > 0) {  // (also when the backing refused a chunk to spare it)
      EvictOldest(out);
      --n;
    } else {
      // Unreachable: the chunks needed were premapped, and a premapped chunk maps first.
      KVPAGE_DCHECK(false);
      return false;
    }
  }
  return true;
}

bool BlockPool::MapNextChunk(std::vector<BlockId>* out) {
  // The lowest unmapped chunk keeps the live id range compact. Chunks below the hint are all
  // mapped, so the search does not rescan them; chunks without a record are unmapped.
  int32_t c = first_unmapped_hint_;
  while (static_cast<size_t>(c) < chunks_.size() && chunks_[c].mapped) ++c;
  first_unmapped_hint_ = c;
  if (budget_->num_premapped(pool_index_) > 0) c = NextPremapped(c);
  // A pool that grows maps its chunks in id order, one per block taken when chunks hold one
  // block: the records of the chunk kPrefetchDistance further on are fetched now.
  const size_t ahead = static_cast<size_t>(c) + kPrefetchDistance;
  if (ahead < chunks_.size()) PrefetchChunk(ahead);
  if (!budget_->TakeChunk(pool_index_, c, chunk_charge_)) return false;
  EnsureChunkRecord(c);
  Chunk& ch = chunks_[c];
  KVPAGE_DCHECK(!ch.mapped);
  // A fresh record; the idle stack may still list the chunk, so its listing is kept.
  ch = Chunk{.mapped = true, .idle_listed = ch.idle_listed};
  ++num_mapped_chunks_;
  if (bpc_ == 1) {
    // Its one block is handed out at once: the chunk is mapped straight into use, never
    // entering the idle stack or a bucket.
    EnsureBlockRecord(1 + c);
    ch.used = 1;
    blocks_[1 + c].ref = 1;
    ++num_used_;
    out->push_back(BlockId(1 + c));
    return true;
  }
  // Every id is fresh: handed out lowest first, its record written only then.
  ch.fresh = bpc_;
  ch.clean = bpc_;
  num_clean_ += bpc_;
  IdleInsert(c);
  BucketInsert(c);
  return false;
}

void BlockPool::PrefetchChunk(size_t c) const {
  PrefetchForWrite(&chunks_[c]);
  const size_t first = 1 + c * static_cast<size_t>(bpc_);
  if (first < blocks_.size()) PrefetchForWrite(&blocks_[first]);
}

int32_t BlockPool::TakeFromFullestChunk(int32_t n, std::vector<BlockId>* out) {
  // The fullest chunk is the back of its bucket, so leaving the bucket touches no other
  // record; the record of a chunk a few takes ahead is prefetched (a decode step takes one
  // block per request, chunk after chunk).
  while (buckets_[max_bucket_].empty()) --max_bucket_;
  std::vector<int32_t>& bucket = buckets_[max_bucket_];
  const int32_t c = bucket.back();
  bucket.pop_back();
  if (bucket.size() >= kPrefetchDistance) PrefetchChunk(bucket[bucket.size() - kPrefetchDistance]);
  Chunk& ch = chunks_[c];
  ch.bucket_pos = -1;
  const int32_t k = std::min(n, ch.clean);
  if (ch.used == 0) IdleRemove(c);
  // The stack first. Used blocks' `next` links are dead: only the links still needed are read.
  const int32_t stacked = ch.clean - ch.fresh;
  const int32_t from_stack = std::min(k, stacked);
  int32_t b = ch.clean_top;
  for (int32_t i = 0; i < from_stack; ++i) {
    blocks_[b].ref = 1;
    out->push_back(BlockId(b));
    b = i + 1 < stacked ? blocks_[b].next : -1;
  }
  ch.clean_top = b;
  if (k > from_stack) {
    // Then the fresh tail, in id order; their records may not exist yet.
    const int32_t from = 1 + (c + 1) * bpc_ - ch.fresh;
    const int32_t to = from + (k - from_stack);
    EnsureBlockRecord(to - 1);
    for (int32_t f = from; f < to; ++f) {
      blocks_[f].ref = 1;
      out->push_back(BlockId(f));
    }
    ch.fresh -= k - from_stack;
  }
  ch.clean -= k;
  ch.used += k;
  num_clean_ -= k;
  num_used_ += k;
  if (ch.clean > 0) BucketInsert(c);
  return k;
}

void BlockPool::EvictOldest(std::vector<BlockId>* out) {
  // Its hash goes, its page is reused.
  KVPAGE_DCHECK(lru_head_ >= 0);
  const int32_t b = lru_head_;
  LruRemove(b);
  if (tier_ != nullptr && tier_->policy() == HostTierPolicy::kWriteBack) {
    tier_->OfferSave(b, keys_[b].hash, keys_[b].group, /*pinned=*/false);
  }
  DropHash(b);
  TakeBlock(b);
  out->push_back(BlockId(b));
}

void BlockPool::Touch(absl::Span<const BlockId> blocks) {
  for (BlockId id : blocks) {
    const int32_t b = id.value;
    KVPAGE_DCHECK(b > 0 && b <= capacity());
    if (blocks_[b].ref > 0) {
      ++blocks_[b].ref;
      continue;
    }
    KVPAGE_DCHECK(blocks_[b].has_hash);  // a free block can only be hit while it is cached
    LruRemove(b);
    TakeBlock(b);
  }
}

void BlockPool::Free(absl::Span<const BlockId> blocks) {
  // Consecutive blocks of one chunk form a run: the chunk leaves its bucket at the start of
  // the run and goes back once at the end, with its counters and stack top updated once.
  int32_t run_chunk = -1;
  int32_t freed = 0, pushed = 0, top = -1;
  auto close_run = [&]() {
    if (run_chunk < 0) return;
    Chunk& ch = chunks_[run_chunk];
    ch.used -= freed;
    ch.clean += pushed;
    ch.clean_top = top;
    num_used_ -= freed;
    num_clean_ += pushed;
    if (ch.used == 0) IdleInsert(run_chunk);  // it had a used block: the one that opened the run
    if (ch.clean > 0) BucketInsert(run_chunk);
  };
  for (BlockId id : blocks) {
    const int32_t b = id.value;
    if (b == kNullBlock.value) continue;
    KVPAGE_DCHECK(b > 0 && b <= capacity() && blocks_[b].ref > 0);
    if (--blocks_[b].ref > 0) continue;
    const int32_t c = ChunkOf(b);
    if (bpc_ == 1) {
      // The chunk was wholly used (its one block): no bucket to leave, idle from now on.
      Chunk& ch = chunks_[c];
      ch.used = 0;
      --num_used_;
      IdleInsert(c);
      if (blocks_[b].has_hash) {
        LruAppend(b, c);
      } else {
        blocks_[b].next = -1;
        ch.clean_top = b;
        ch.clean = 1;
        ++num_clean_;
        BucketInsert(c);
      }
      continue;
    }
    if (c != run_chunk) {
      close_run();
      const Chunk& ch = chunks_[c];
      run_chunk = c;
      if (ch.clean > 0) BucketRemove(c);
      freed = 0;
      pushed = 0;
      // The stack holds clean − fresh blocks (the fresh tail has no links).
      top = ch.clean > ch.fresh ? ch.clean_top : -1;
    }
    ++freed;
    if (blocks_[b].has_hash) {
      LruAppend(b, c);
    } else {
      blocks_[b].next = top;
      top = b;
      ++pushed;
    }
  }
  close_run();
}

// ---- Prefix cache ----

void BlockPool::CacheBlock(BlockId block, BlockHash hash, GroupId group, BlockHash parent,
                           const StoredBlockDetail* detail) {
  const int32_t b = block.value;
  if (!enable_caching_ || blocks_[b].has_hash) return;
  KVPAGE_DCHECK(b > 0 && blocks_[b].ref > 0);
  blocks_[b].has_hash = 1;
  internal::PrefixKey& key = keys_[b];
  key.hash = hash;
  key.group = group.value;
  key.dup_next = -1;
  const int32_t head = index_->FindOrInsert(hash, group.value, b);
  if (head == 0) {
    key.dup_last = b;
    if (events_->enabled()) AddStored(hash, group, parent, detail);
    if (tier_ != nullptr && tier_->policy() == HostTierPolicy::kWriteThrough &&
        tier_->OfferSave(b, hash, group.value, /*pinned=*/true)) {
      ++blocks_[b].ref;  // held until the save completes
    }
  } else {
    // A duplicate goes to the end of the chain: lookups keep returning the oldest block
    // under the key, and after it is evicted the next oldest, as vLLM's do.
    keys_[keys_[head].dup_last].dup_next = b;
    keys_[head].dup_last = b;
  }
}

void BlockPool::AddStored(BlockHash hash, GroupId group, BlockHash parent,
                          const StoredBlockDetail* detail) {
  KvEvent event{KvEvent::Type::kStored, group, hash, parent};
  if (detail != nullptr) {
    event.has_parent = detail->has_parent;
    if (!detail->has_parent) event.parent = BlockHash{};
    event.lora_id = detail->lora_id;
    event.token_ids.assign(detail->token_ids.begin(), detail->token_ids.end());
  }
  events_->Add(std::move(event));
}

bool BlockPool::HostHolds(BlockHash hash, GroupId group) const {
  return tier_ != nullptr && tier_->Find(hash, group.value) != 0;
}

BlockId BlockPool::Lookup(BlockHash hash, GroupId group) const {
  return BlockId(index_->Find(hash, group.value));  // 0 = kNullBlock
}

void BlockPool::DropHash(int32_t b) {
  internal::PrefixKey& key = keys_[b];
  const int32_t head = index_->Find(key.hash, key.group);
  KVPAGE_DCHECK(head != 0);
  if (head == b) {
    index_->Replace(key.hash, key.group, std::max(key.dup_next, 0));  // 0: the key goes
    if (key.dup_next < 0) {
      if (events_->enabled()) {  // an event holds a vector: not even built when off
        events_->Add(KvEvent{KvEvent::Type::kRemoved, GroupId(key.group), key.hash, BlockHash{}});
      }
    } else {
      keys_[key.dup_next].dup_last = key.dup_last;  // the next oldest heads the chain
    }
  } else {
    int32_t p = head;
    while (keys_[p].dup_next != b) p = keys_[p].dup_next;
    keys_[p].dup_next = key.dup_next;
    if (keys_[head].dup_last == b) keys_[head].dup_last = p;
  }
  blocks_[b].has_hash = 0;
  key = internal::PrefixKey{};
}

bool BlockPool::Uncache(BlockId block) {
  const int32_t b = block.value;
  if (b <= 0 || !HasRecord(b) || !blocks_[b].has_hash) return false;
  const bool cached_free = blocks_[b].ref == 0;
  if (cached_free) LruRemove(b);
  DropHash(b);
  if (cached_free) PushClean(b);
  return true;
}

absl::Status BlockPool::ResetPrefixCache() {
  if (num_used_ > 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot reset the prefix cache while ", num_used_, " blocks are in use"));
  }
  while (lru_head_ >= 0) {
    const int32_t b = lru_head_;
    LruRemove(b);
    blocks_[b].has_hash = 0;
    keys_[b] = internal::PrefixKey{};
    PushClean(b);
  }
  index_->Clear();
  if (enable_caching_) index_->Reserve(blocks_.size());  // as sized by GrowBlockRecords
  events_->Add(KvEvent{KvEvent::Type::kAllCleared, GroupId(), BlockHash{}, BlockHash{}});
  return absl::OkStatus();
}

// ---- Chunks ----

int32_t BlockPool::NumCleanIdleChunks() const {
  return static_cast<int32_t>(std::ranges::count_if(
      chunks_, [](const Chunk& ch) { return ch.mapped && ch.used == 0 && ch.cached == 0; }));
}

bool BlockPool::ReleaseIdleChunk(bool allow_cache_loss) {
  // The idle chunk with the fewest cached blocks, the lowest index among equals. The scan
  // also drops the chunks that stopped being idle.
  int32_t best = -1;
  size_t kept = 0;
  for (const int32_t c : idle_stack_) {
    Chunk& ch = chunks_[c];
    if (!ch.mapped || ch.used != 0) {
      ch.idle_listed = false;
      continue;
    }
    idle_stack_[kept++] = c;
    if (!allow_cache_loss && ch.cached > 0) continue;
    if (best < 0 || std::pair(ch.cached, c) < std::pair(chunks_[best].cached, best)) best = c;
  }
  idle_stack_.resize(kept);
  if (best < 0) return false;
  ReleaseChunk(best);
  return true;
}

int32_t BlockPool::ReleaseIdleChunks() {
  // One pass over the idle stack: every listed chunk that is still idle goes back.
  int32_t released = 0;
  for (const int32_t c : idle_stack_) {
    chunks_[c].idle_listed = false;
    if (!IsIdleChunk(c)) continue;
    ReleaseChunk(c);
    ++released;
  }
  idle_stack_.clear();
  return released;
}

void BlockPool::ReleaseChunk(int32_t c) {
  const int32_t first = 1 + c * bpc_;
  const int32_t end = std::min(first + bpc_, num_block_records());
  if (tier_ != nullptr) tier_->CancelSaves(first, first + bpc_ - 1);
  for (int32_t b = first; b < end; ++b) {
    // A cached block's page goes with its chunk: counted clean until the chunk is dropped.
    Uncache(BlockId(b));
    blocks_[b].next = -1;
  }
  Chunk& ch = chunks_[c];
  KVPAGE_DCHECK(ch.mapped && ch.used == 0 && ch.cached == 0);
  if (ch.clean > 0) BucketRemove(c);
  num_clean_ -= ch.clean;
  IdleRemove(c);
  ch = Chunk{.idle_listed = ch.idle_listed};
  first_unmapped_hint_ = std::min(first_unmapped_hint_, c);
  --num_mapped_chunks_;
  budget_->GiveChunk(pool_index_, c, chunk_charge_);
}

// ---- Introspection ----

std::vector<BlockId> BlockPool::FreeOrder() const {
  std::vector<BlockId> order;
  for (const std::vector<int32_t>& bucket : std::views::reverse(buckets_)) {
    for (const int32_t c : std::views::reverse(bucket)) {
      const Chunk& ch = chunks_[c];
      for (int32_t b = ch.clean_top, k = 0; k < ch.clean - ch.fresh; b = blocks_[b].next, ++k) {
        order.push_back(BlockId(b));
      }
      const int32_t end = 1 + (c + 1) * bpc_;
      for (int32_t b = end - ch.fresh; b < end; ++b) order.push_back(BlockId(b));
    }
  }
  // Then the chunks Allocate would map, lowest first, their ids in order: while cached blocks
  // remain only those that leave the budget's headroom free, the rest once they are evicted.
  const int64_t free_bytes = budget_->free_bytes();
  const int64_t mappable = std::min<int64_t>(num_unmapped_chunks(), free_bytes / chunk_charge_);
  const int64_t before_eviction =
      num_cached_free_ == 0
          ? mappable
          : std::clamp<int64_t>((free_bytes - budget_->headroom_bytes()) / chunk_charge_, 0,
                                mappable);
  int32_t next_chunk = first_unmapped_hint_;
  auto append_unmapped = [&](int64_t chunks) {
    for (int64_t k = 0; k < chunks; ++k, ++next_chunk) {
      while (static_cast<size_t>(next_chunk) < chunks_.size() && chunks_[next_chunk].mapped) {
        ++next_chunk;
      }
      const int32_t first = 1 + next_chunk * bpc_;
      for (int32_t b = first; b < first + bpc_; ++b) order.push_back(BlockId(b));
    }
  };
  append_unmapped(before_eviction);
  for (int32_t b = lru_head_; b >= 0; b = blocks_[b].next) order.push_back(BlockId(b));
  append_unmapped(mappable - before_eviction);
  return order;
}

absl::Status BlockPool::CheckInvariants() const {
  auto fail = [](auto&&... parts) { return absl::InternalError(absl::StrCat(parts...)); };
  if (blocks_.empty() || blocks_[0].ref != 0 || blocks_[0].has_hash) {
    return fail("null block is referenced or hashed");
  }
  if (blocks_.size() > static_cast<size_t>(capacity()) + 1 ||
      chunks_.size() > static_cast<size_t>(max_chunks_) ||
      (enable_caching_ ? keys_.size() != blocks_.size() : !keys_.empty())) {
    return fail("records for ", blocks_.size(), " blocks, ", keys_.size(), " keys and ",
                chunks_.size(), " chunks in a pool of ", capacity(), " blocks");
  }
  // Blocks and chunks beyond the records are unused, unhashed and unmapped by construction;
  // only what has a record is walked.
  const int32_t records = num_block_records();
  int32_t used = 0, cached = 0, clean = 0, mapped = 0, idle = 0;
  for (int32_t c = 0; c < static_cast<int32_t>(chunks_.size()); ++c) {
    const Chunk& ch = chunks_[c];
    if (c < first_unmapped_hint_ && !ch.mapped) {
      return fail("chunk ", c, " is unmapped below the hint ", first_unmapped_hint_);
    }
    const int32_t first = 1 + c * bpc_;
    const int32_t end = first + bpc_;
    int32_t u = 0, k = 0;
    for (int32_t b = first; b < std::min(end, records); ++b) {
      if (blocks_[b].ref < 0) return fail("block ", b, " has ref ", blocks_[b].ref);
      if (!ch.mapped && (blocks_[b].ref != 0 || blocks_[b].has_hash)) {
        return fail("block ", b, " of unmapped chunk ", c, " is in use or hashed");
      }
      if (b >= end - ch.fresh && (blocks_[b].ref != 0 || blocks_[b].has_hash)) {
        return fail("fresh block ", b, " of chunk ", c, " is in use or hashed");
      }
      u += blocks_[b].ref > 0 ? 1 : 0;
      k += (blocks_[b].ref == 0 && blocks_[b].has_hash) ? 1 : 0;
    }
    if (!ch.mapped) continue;
    ++mapped;
    idle += u == 0 ? 1 : 0;
    if (u != ch.used || k != ch.cached || ch.used + ch.cached + ch.clean != bpc_) {
      return fail("chunk ", c, " counters used/cached/clean ", ch.used, "/", ch.cached, "/",
                  ch.clean, " but blocks say ", u, "/", k, "/", bpc_ - u - k);
    }
    if (ch.fresh < 0 || ch.fresh > ch.clean || (bpc_ == 1 && ch.fresh != 0)) {
      return fail("chunk ", c, " has ", ch.fresh, " fresh blocks of ", ch.clean, " clean");
    }
    // The stack holds blocks below the fresh tail (whose blocks are free and unhashed, above).
    const int32_t tail = end - ch.fresh;
    for (int32_t b = ch.clean_top, n = 0; n < ch.clean - ch.fresh; b = blocks_[b].next, ++n) {
      if (b < first || b >= tail || b >= records || blocks_[b].ref != 0 || blocks_[b].has_hash) {
        return fail("clean stack of chunk ", c, " holds block ", b);
      }
    }
    if (ch.clean > ch.fresh ? ch.clean_top < 0 : ch.clean_top != -1) {
      return fail("chunk ", c, " has stack head ", ch.clean_top, " for ", ch.clean - ch.fresh,
                  " stacked blocks");
    }
    if (u == 0 && !ch.idle_listed) return fail("idle chunk ", c, " is not on the idle stack");
    used += u;
    cached += k;
    clean += ch.clean;
    // A chunk without clean blocks is in no bucket: the bucket entries are checked below.
    if (ch.clean == 0) continue;
    if (static_cast<size_t>(ch.used) >= buckets_.size()) {
      return fail("chunk ", c, " has clean blocks but no bucket");
    }
    const std::vector<int32_t>& bucket = buckets_[static_cast<size_t>(ch.used)];
    if (ch.bucket_pos < 0 || ch.bucket_pos >= static_cast<int32_t>(bucket.size()) ||
        bucket[ch.bucket_pos] != c) {
      return fail("chunk ", c, " bucket membership is wrong");
    }
    if (ch.used > max_bucket_) return fail("chunk ", c, " above max_bucket_");
  }
  // Every bucket entry is a chunk with clean blocks at its recorded position.
  for (const std::vector<int32_t>& bucket : buckets_) {
    for (size_t i = 0; i < bucket.size(); ++i) {
      const Chunk& ch = chunks_[bucket[i]];
      if (ch.bucket_pos != static_cast<int32_t>(i) || ch.clean == 0) {
        return fail("bucket entry ", i, " holds chunk ", bucket[i], " at position ", ch.bucket_pos);
      }
    }
  }
  // The idle stack holds each listed chunk once (idle ones must be listed, checked above).
  std::vector<uint8_t> seen(chunks_.size(), 0);
  for (const int32_t c : idle_stack_) {
    if (c < 0 || static_cast<size_t>(c) >= chunks_.size() || seen[c] || !chunks_[c].idle_listed) {
      return fail("idle stack is broken at chunk ", c);
    }
    seen[c] = 1;
  }
  const auto listed = std::ranges::count_if(chunks_, &Chunk::idle_listed);
  if (listed != static_cast<int32_t>(idle_stack_.size())) {
    return fail(listed, " chunks are marked listed but the idle stack holds ", idle_stack_.size());
  }
  if (used != num_used_ || cached != num_cached_free_ || clean != num_clean_ ||
      mapped != num_mapped_chunks_ || idle != num_idle_chunks_) {
    return fail("pool totals used/cached/clean/mapped/idle ", num_used_, "/", num_cached_free_,
                "/", num_clean_, "/", num_mapped_chunks_, "/", num_idle_chunks_, " but found ",
                used, "/", cached, "/", clean, "/", mapped, "/", idle);
  }
  int32_t lru = 0;
  for (int32_t b = lru_head_, p = -1; b >= 0; p = b, b = blocks_[b].next, ++lru) {
    if (blocks_[b].prev != p || blocks_[b].ref != 0 || !blocks_[b].has_hash) return fail("LRU list broken at ", b);
    if (lru > num_cached_free_) return fail("LRU list longer than the cached-free count");
  }
  if (lru != num_cached_free_) return fail("LRU holds ", lru, " blocks, expected ", num_cached_free_);
  int64_t chained = 0;
  int32_t bad = 0, bad_last = 0;
  index_->ForEach([&](BlockHash hash, int32_t group, int32_t head) {
    if (head <= 0 || static_cast<size_t>(head) >= keys_.size() || !(keys_[head].hash == hash) ||
        keys_[head].group != group) {
      bad = head;
      return;
    }
    int32_t last = head;
    for (int32_t b = head; b >= 0; last = b, b = keys_[b].dup_next, ++chained) {
      if (!blocks_[b].has_hash || !(keys_[b].hash == keys_[head].hash) ||
          keys_[b].group != keys_[head].group) {
        bad = b;
      }
    }
    if (keys_[head].dup_last != last) bad_last = head;
  });
  if (bad != 0) return fail("hash map entry points at block ", bad, " which carries another key");
  if (bad_last != 0) return fail("the duplicate chain of block ", bad_last, " ends elsewhere");
  int64_t hashed = 0;
  for (size_t b = 1; b < blocks_.size(); ++b) hashed += blocks_[b].has_hash;
  if (hashed != chained) return fail(hashed, " hashed blocks but ", chained, " in the map");
  return absl::OkStatus();
}

}  // namespace kvpage
