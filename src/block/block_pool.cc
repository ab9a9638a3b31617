#include "kvpage/block_pool.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
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
      enable_caching_(config.enable_caching),
      budget_(budget),
      events_(events) {
  const size_t n = static_cast<size_t>(capacity()) + 1;
  ref_.assign(n, 0);
  has_hash_.assign(n, 0);
  hash_.assign(n, BlockHash{});
  hash_group_.assign(n, -1);
  next_.assign(n, -1);
  prev_.assign(n, -1);
  dup_next_.assign(n, -1);
  chunks_.assign(max_chunks_, Chunk{});
  bucket_head_.assign(bpc_ + 1, -1);
  if (max_chunks_ <= 1) {
    chunk_shift_ = 31;  // every id is in chunk 0
  } else if ((bpc_ & (bpc_ - 1)) == 0) {
    chunk_shift_ = __builtin_ctz(static_cast<uint32_t>(bpc_));
  }
}

bool BlockPool::is_mapped(BlockId block) const {
  if (block.value <= 0 || block.value > capacity()) return false;
  return chunks_[ChunkOf(block.value)].mapped;
}

// ---- Chunk buckets: chunks with clean blocks, indexed by how many blocks they have in use. ----

void BlockPool::BucketInsert(int32_t c) {
  Chunk& ch = chunks_[c];
  ch.prev = -1;
  ch.next = bucket_head_[ch.used];
  if (ch.next >= 0) chunks_[ch.next].prev = c;
  bucket_head_[ch.used] = c;
  max_bucket_ = std::max(max_bucket_, ch.used);
}

void BlockPool::BucketRemove(int32_t c) {
  Chunk& ch = chunks_[c];
  if (ch.prev >= 0) {
    chunks_[ch.prev].next = ch.next;
  } else {
    bucket_head_[ch.used] = ch.next;
  }
  if (ch.next >= 0) chunks_[ch.next].prev = ch.prev;
  ch.prev = ch.next = -1;
}

void BlockPool::OnUsedChange(int32_t c, int32_t delta) {
  Chunk& ch = chunks_[c];
  const bool in_bucket = ch.clean > 0;
  if (in_bucket) BucketRemove(c);
  if (ch.used == 0) IdleRemove(c);
  ch.used += delta;
  if (ch.used == 0) IdleInsert(c);
  if (in_bucket) BucketInsert(c);
}

void BlockPool::MapChunk(int32_t c) {
  Chunk& ch = chunks_[c];
  KVPAGE_DCHECK(!ch.mapped);
  ch = Chunk{};
  ch.mapped = true;
  // Stack the ids so the lowest id is handed out first.
  const int32_t first = 1 + c * bpc_;
  for (int32_t b = first + bpc_ - 1; b >= first; --b) {
    next_[b] = ch.clean_top;
    ch.clean_top = b;
  }
  ch.clean = bpc_;
  num_clean_ += bpc_;
  ++num_mapped_chunks_;
  IdleInsert(c);
  BucketInsert(c);
}

void BlockPool::IdleInsert(int32_t c) {
  Chunk& ch = chunks_[c];
  ch.idle_prev = -1;
  ch.idle_next = idle_head_;
  if (idle_head_ >= 0) chunks_[idle_head_].idle_prev = c;
  idle_head_ = c;
  ++num_idle_chunks_;
}

void BlockPool::IdleRemove(int32_t c) {
  Chunk& ch = chunks_[c];
  if (ch.idle_prev >= 0) {
    chunks_[ch.idle_prev].idle_next = ch.idle_next;
  } else {
    idle_head_ = ch.idle_next;
  }
  if (ch.idle_next >= 0) chunks_[ch.idle_next].idle_prev = ch.idle_prev;
  ch.idle_prev = ch.idle_next = -1;
  --num_idle_chunks_;
}

void BlockPool::UnmapChunk(int32_t c) {
  Chunk& ch = chunks_[c];
  KVPAGE_DCHECK(ch.mapped && ch.used == 0 && ch.cached == 0);
  if (ch.clean > 0) BucketRemove(c);
  num_clean_ -= ch.clean;
  const int32_t first = 1 + c * bpc_;
  for (int32_t b = first; b < first + bpc_; ++b) next_[b] = -1;
  IdleRemove(c);
  ch = Chunk{};
  first_unmapped_hint_ = std::min(first_unmapped_hint_, c);
  --num_mapped_chunks_;
  budget_->GiveChunk(pool_index_, c, chunk_bytes());
}

// ---- Clean stacks and the LRU list of cached-free blocks ----

void BlockPool::PushClean(int32_t b) {
  const int32_t c = ChunkOf(b);
  Chunk& ch = chunks_[c];
  if (ch.clean == 0) {
    ch.clean_top = -1;
  }
  next_[b] = ch.clean_top;
  ch.clean_top = b;
  ++ch.clean;
  ++num_clean_;
  if (ch.clean == 1) BucketInsert(c);
}

void BlockPool::LruAppend(int32_t b) {
  prev_[b] = lru_tail_;
  next_[b] = -1;
  if (lru_tail_ >= 0) {
    next_[lru_tail_] = b;
  } else {
    lru_head_ = b;
  }
  lru_tail_ = b;
}

void BlockPool::LruRemove(int32_t b) {
  if (prev_[b] >= 0) {
    next_[prev_[b]] = next_[b];
  } else {
    lru_head_ = next_[b];
  }
  if (next_[b] >= 0) {
    prev_[next_[b]] = prev_[b];
  } else {
    lru_tail_ = prev_[b];
  }
  prev_[b] = next_[b] = -1;
}

void BlockPool::TakeBlock(int32_t b) {
  ref_[b] = 1;
  ++num_used_;
  OnUsedChange(ChunkOf(b), +1);
}

// ---- Allocation ----

int64_t BlockPool::AllocatableNow() const {
  const int64_t chunk = chunk_bytes();
  const int64_t mappable = std::min<int64_t>(num_unmapped_chunks(), budget_->free_bytes() / chunk);
  return int64_t{num_free_blocks()} + mappable * bpc_;
}

void BlockPool::Allocate(int32_t n, std::vector<BlockId>* out) {
  while (n > 0) {
    // Grow into a new chunk when out of clean blocks, unless that would only keep cache alive
    // while eating into the budget's headroom: then evict our own cached blocks instead.
    const int64_t free_after = budget_->free_bytes() - chunk_bytes();
    if (num_clean_ == 0 && num_mapped_chunks_ < max_chunks_ && free_after >= 0 &&
        (num_cached_free_ == 0 || free_after >= budget_->headroom_bytes())) {
      // Map the lowest unmapped chunk: keeps the live id range compact. Chunks below the
      // hint are all mapped, so the search does not rescan them.
      int32_t c = first_unmapped_hint_;
      while (chunks_[c].mapped) ++c;
      first_unmapped_hint_ = c;
      if (budget_->TakeChunk(pool_index_, c, chunk_bytes())) MapChunk(c);
    }
    if (num_clean_ > 0) {
      // Take a run from the fullest chunk and re-bucket it once.
      while (bucket_head_[max_bucket_] < 0) --max_bucket_;
      const int32_t c = bucket_head_[max_bucket_];
      Chunk& ch = chunks_[c];
      const int32_t k = std::min(n, ch.clean);
      BucketRemove(c);
      if (ch.used == 0) IdleRemove(c);
      int32_t b = ch.clean_top;
      for (int32_t i = 0; i < k; ++i) {
        ref_[b] = 1;
        out->push_back(BlockId(b));
        const int32_t next = next_[b];
        next_[b] = -1;
        b = next;
      }
      ch.clean_top = b;
      ch.clean -= k;
      ch.used += k;
      num_clean_ -= k;
      num_used_ += k;
      if (ch.clean > 0) BucketInsert(c);
      n -= k;
      continue;
    }
    // Evict the least recently freed cached block: its hash goes, its page is reused.
    KVPAGE_DCHECK(lru_head_ >= 0);
    const int32_t b = lru_head_;
    LruRemove(b);
    DropHash(b);
    --chunks_[ChunkOf(b)].cached;
    --num_cached_free_;
    TakeBlock(b);
    out->push_back(BlockId(b));
    --n;
  }
}

void BlockPool::Touch(absl::Span<const BlockId> blocks) {
  for (BlockId id : blocks) {
    const int32_t b = id.value;
    KVPAGE_DCHECK(b > 0 && b <= capacity());
    if (ref_[b] > 0) {
      ++ref_[b];
      continue;
    }
    KVPAGE_DCHECK(has_hash_[b]);  // a free block can only be hit while it is cached
    LruRemove(b);
    --chunks_[ChunkOf(b)].cached;
    --num_cached_free_;
    TakeBlock(b);
  }
}

void BlockPool::Free(absl::Span<const BlockId> blocks) {
  // Consecutive blocks of one chunk form a run: the chunk leaves its bucket at the start of
  // the run and goes back once at the end, instead of once per block.
  int32_t run_chunk = -1;
  int32_t used_at_start = 0;
  auto close_run = [&]() {
    if (run_chunk < 0) return;
    Chunk& ch = chunks_[run_chunk];
    if (used_at_start > 0 && ch.used == 0) IdleInsert(run_chunk);
    if (ch.clean > 0) BucketInsert(run_chunk);
    run_chunk = -1;
  };
  for (BlockId id : blocks) {
    const int32_t b = id.value;
    if (b == kNullBlock.value) continue;
    KVPAGE_DCHECK(b > 0 && b <= capacity() && ref_[b] > 0);
    if (--ref_[b] > 0) continue;
    const int32_t c = ChunkOf(b);
    if (c != run_chunk) {
      close_run();
      run_chunk = c;
      used_at_start = chunks_[c].used;
      if (chunks_[c].clean > 0) BucketRemove(c);
    }
    Chunk& ch = chunks_[c];
    --ch.used;
    --num_used_;
    if (has_hash_[b]) {
      LruAppend(b);
      ++ch.cached;
      ++num_cached_free_;
    } else {
      next_[b] = ch.clean > 0 ? ch.clean_top : -1;
      ch.clean_top = b;
      ++ch.clean;
      ++num_clean_;
    }
  }
  close_run();
}

// ---- Prefix cache ----

void BlockPool::CacheBlock(BlockId block, BlockHash hash, GroupId group, BlockHash parent) {
  const int32_t b = block.value;
  if (!enable_caching_ || has_hash_[b]) return;
  KVPAGE_DCHECK(b > 0 && ref_[b] > 0);
  has_hash_[b] = 1;
  hash_[b] = hash;
  hash_group_[b] = group.value;
  auto [it, inserted] = cached_.try_emplace(HashKey{hash, group.value}, b);
  if (inserted) {
    dup_next_[b] = -1;
    events_->Add(KvEvent{KvEvent::Type::kStored, group, hash, parent});
  } else {
    // Keep the first block as the one lookups return; chain the duplicate behind it.
    dup_next_[b] = dup_next_[it->second];
    dup_next_[it->second] = b;
  }
}

BlockId BlockPool::Lookup(BlockHash hash, GroupId group) const {
  auto it = cached_.find(HashKey{hash, group.value});
  return it == cached_.end() ? kNullBlock : BlockId(it->second);
}

void BlockPool::DropHash(int32_t b) {
  const HashKey key{hash_[b], hash_group_[b]};
  auto it = cached_.find(key);
  KVPAGE_DCHECK(it != cached_.end());
  if (it->second == b) {
    if (dup_next_[b] < 0) {
      cached_.erase(it);
      events_->Add(KvEvent{KvEvent::Type::kRemoved, GroupId(key.group), key.hash, BlockHash{}});
    } else {
      it->second = dup_next_[b];
    }
  } else {
    int32_t p = it->second;
    while (dup_next_[p] != b) p = dup_next_[p];
    dup_next_[p] = dup_next_[b];
  }
  dup_next_[b] = -1;
  has_hash_[b] = 0;
  hash_[b] = BlockHash{};
  hash_group_[b] = -1;
}

bool BlockPool::Uncache(BlockId block) {
  const int32_t b = block.value;
  if (b <= 0 || b > capacity() || !has_hash_[b]) return false;
  if (ref_[b] == 0) {
    LruRemove(b);
    --chunks_[ChunkOf(b)].cached;
    --num_cached_free_;
    DropHash(b);
    PushClean(b);
  } else {
    DropHash(b);
  }
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
    --chunks_[ChunkOf(b)].cached;
    --num_cached_free_;
    has_hash_[b] = 0;
    hash_[b] = BlockHash{};
    hash_group_[b] = -1;
    dup_next_[b] = -1;
    PushClean(b);
  }
  cached_.clear();
  events_->Add(KvEvent{KvEvent::Type::kAllCleared, GroupId(), BlockHash{}, BlockHash{}});
  return absl::OkStatus();
}

// ---- Chunks ----

int32_t BlockPool::NumCleanIdleChunks() const {
  int32_t n = 0;
  for (const Chunk& ch : chunks_) n += (ch.mapped && ch.used == 0 && ch.cached == 0) ? 1 : 0;
  return n;
}

bool BlockPool::ReleaseIdleChunk(bool allow_cache_loss) {
  // The idle chunk with the fewest cached blocks, the lowest index among equals.
  int32_t best = -1;
  for (int32_t c = idle_head_; c >= 0; c = chunks_[c].idle_next) {
    const Chunk& ch = chunks_[c];
    if (!allow_cache_loss && ch.cached > 0) continue;
    if (best < 0 || ch.cached < chunks_[best].cached ||
        (ch.cached == chunks_[best].cached && c < best)) {
      best = c;
    }
  }
  if (best < 0) return false;
  const int32_t first = 1 + best * bpc_;
  for (int32_t b = first; b < first + bpc_; ++b) {
    if (!has_hash_[b]) continue;
    LruRemove(b);
    DropHash(b);
    --chunks_[best].cached;
    --num_cached_free_;
    // The page is gone with its chunk; it is counted clean until UnmapChunk drops the chunk.
    PushClean(b);
  }
  UnmapChunk(best);
  return true;
}

// ---- Introspection ----

std::vector<BlockId> BlockPool::FreeOrder() const {
  std::vector<BlockId> order;
  for (int32_t u = bpc_; u >= 0; --u) {
    for (int32_t c = bucket_head_[u]; c >= 0; c = chunks_[c].next) {
      for (int32_t b = chunks_[c].clean_top, k = 0; k < chunks_[c].clean; b = next_[b], ++k) {
        order.push_back(BlockId(b));
      }
    }
  }
  for (int32_t b = lru_head_; b >= 0; b = next_[b]) order.push_back(BlockId(b));
  return order;
}

absl::Status BlockPool::CheckInvariants() const {
  auto fail = [](auto&&... parts) { return absl::InternalError(absl::StrCat(parts...)); };
  if (ref_[0] != 0 || has_hash_[0]) return fail("null block is referenced or hashed");
  int32_t used = 0, cached = 0, clean = 0, mapped = 0, idle = 0;
  for (int32_t c = 0; c < max_chunks_; ++c) {
    const Chunk& ch = chunks_[c];
    if (c < first_unmapped_hint_ && !ch.mapped) {
      return fail("chunk ", c, " is unmapped below the hint ", first_unmapped_hint_);
    }
    const int32_t first = 1 + c * bpc_;
    int32_t u = 0, k = 0;
    for (int32_t b = first; b < first + bpc_; ++b) {
      if (ref_[b] < 0) return fail("block ", b, " has ref ", ref_[b]);
      if (!ch.mapped && (ref_[b] != 0 || has_hash_[b])) {
        return fail("block ", b, " of unmapped chunk ", c, " is in use or hashed");
      }
      u += ref_[b] > 0 ? 1 : 0;
      k += (ref_[b] == 0 && has_hash_[b]) ? 1 : 0;
    }
    if (!ch.mapped) continue;
    ++mapped;
    idle += u == 0 ? 1 : 0;
    if (u != ch.used || k != ch.cached || ch.used + ch.cached + ch.clean != bpc_) {
      return fail("chunk ", c, " counters used/cached/clean ", ch.used, "/", ch.cached, "/",
                  ch.clean, " but blocks say ", u, "/", k, "/", bpc_ - u - k);
    }
    int32_t walked = 0;
    for (int32_t b = ch.clean_top; walked < ch.clean; b = next_[b], ++walked) {
      if (b < first || b >= first + bpc_ || ref_[b] != 0 || has_hash_[b]) {
        return fail("clean stack of chunk ", c, " holds block ", b);
      }
    }
    bool in_bucket = false;
    for (int32_t x = bucket_head_[ch.used]; x >= 0; x = chunks_[x].next) in_bucket |= x == c;
    if (in_bucket != (ch.clean > 0)) return fail("chunk ", c, " bucket membership is wrong");
    used += u;
    cached += k;
    clean += ch.clean;
  }
  // The idle list holds exactly the mapped chunks with no used block.
  int32_t listed = 0;
  for (int32_t c = idle_head_, prev = -1; c >= 0; prev = c, c = chunks_[c].idle_next) {
    if (!chunks_[c].mapped || chunks_[c].used != 0 || chunks_[c].idle_prev != prev ||
        ++listed > max_chunks_) {
      return fail("idle list is broken at chunk ", c);
    }
  }
  if (listed != idle) return fail("idle list holds ", listed, " chunks, ", idle, " are idle");
  if (used != num_used_ || cached != num_cached_free_ || clean != num_clean_ ||
      mapped != num_mapped_chunks_ || idle != num_idle_chunks_) {
    return fail("pool totals used/cached/clean/mapped/idle ", num_used_, "/", num_cached_free_,
                "/", num_clean_, "/", num_mapped_chunks_, "/", num_idle_chunks_, " but found ",
                used, "/", cached, "/", clean, "/", mapped, "/", idle);
  }
  int32_t lru = 0;
  for (int32_t b = lru_head_, p = -1; b >= 0; p = b, b = next_[b], ++lru) {
    if (prev_[b] != p || ref_[b] != 0 || !has_hash_[b]) return fail("LRU list broken at ", b);
    if (lru > num_cached_free_) return fail("LRU list longer than the cached-free count");
  }
  if (lru != num_cached_free_) return fail("LRU holds ", lru, " blocks, expected ", num_cached_free_);
  int64_t chained = 0;
  for (const auto& [key, head] : cached_) {
    for (int32_t b = head; b >= 0; b = dup_next_[b], ++chained) {
      if (!has_hash_[b] || !(hash_[b] == key.hash) || hash_group_[b] != key.group) {
        return fail("hash map entry points at block ", b, " which carries another key");
      }
    }
  }
  int64_t hashed = 0;
  for (size_t b = 1; b < has_hash_.size(); ++b) hashed += has_hash_[b];
  if (hashed != chained) return fail(hashed, " hashed blocks but ", chained, " in the map");
  return absl::OkStatus();
}

}  // namespace kvpage
