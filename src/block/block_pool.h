// BlockPool: the pages of one pool, their reference counts, the prefix-cache map, and the
// free structures that decide which page is handed out next.
//
// A pool owns block ids 1..capacity(); id 0 is the null block (kNullBlock), which stands for
// positions a request no longer holds and is never allocated, freed or cached. Pages come in
// chunks of `blocks_per_chunk` consecutive ids: chunk c holds ids [1 + c·bpc, 1 + (c+1)·bpc).
// A chunk is either mapped (its memory is taken from the shared MemoryBudget) or not; only
// blocks of mapped chunks exist for allocation.
//
// Every block of a mapped chunk is in exactly one state:
//   * used         ref_count > 0; held by at least one request;
//   * cached-free  ref_count == 0 and it carries a hash: it still serves prefix hits and sits
//                  in the pool's LRU list, oldest first, evicted lazily when its page is reused;
//   * clean        ref_count == 0 and no hash: on its chunk's clean stack.
// Allocation takes clean blocks first, from the fullest chunk (so lightly used chunks drain and
// can be returned to the budget), then maps a new chunk if the budget allows (keeping the
// budget's headroom free when the pool could evict cached blocks instead), then evicts the
// least recently freed cached block. With a single chunk this reproduces vLLM's free-queue
// order exactly: hash-less frees are reused first (LIFO), untouched blocks in id order, then
// cached blocks least recently freed first.
//
// The prefix-cache map is keyed by (block hash, group id). It does not de-duplicate: two blocks
// may carry the same key (a request that did not read the cache), so tables stay append-only.
// Lookup returns the oldest block still cached under a key, as vLLM does.
//
// Memory follows use, not capacity: the records of blocks and chunks grow (geometrically) as
// chunks are mapped and their blocks first handed out, and the prefix-cache map grows with
// them, so a pool whose budget could hold 2^31 blocks costs what the blocks it touched cost.
// A block beyond the records (never handed out since the pool was built) is clean and
// unhashed; a chunk beyond them is unmapped.
//
// Not thread-safe: one scheduler thread owns a pool. Capacity queries are exact and cheap; an
// allocation that passed CanAllocate cannot fail. Misuse (freeing an unused block, touching a
// clean block) is a programmer error checked with KVPAGE_DCHECK and by CheckInvariants().
#ifndef KVPAGE_BLOCK_BLOCK_POOL_H_
#define KVPAGE_BLOCK_BLOCK_POOL_H_

#include <cassert>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "block/memory_budget.h"
#include "internal/huge_page_allocator.h"
#include "internal/prefetch.h"
#include "kvpage/kv_events.h"
#include "kvpage/types.h"

namespace kvpage {

namespace internal {
class HostTier;
class PrefixIndex;
struct PrefixKey;
}  // namespace internal

struct BlockPoolConfig {
  int32_t pool_index = 0;        // this pool's index in its MemoryBudget
  int64_t block_bytes = 0;       // bytes of one block id across all layers of the pool
  int32_t blocks_per_chunk = 1;  // ids per chunk
  int32_t max_chunks = 0;        // virtual capacity: chunks this pool may ever map
  // Bytes the budget is charged per chunk: what the backing may map for it (its slices
  // rounded to the backing's units). 0 = blocks_per_chunk × block_bytes.
  int64_t chunk_charge_bytes = 0;
  bool enable_caching = true;    // keep hashes and serve hits

  absl::Status Validate() const;
};

// What a kStored event reports beyond the hash and its parent (KvEvent). The span must stay
// valid for the CacheBlock call only; it is copied into the event.
struct StoredBlockDetail {
  bool has_parent = false;
  int64_t lora_id = 0;
  absl::Span<const int32_t> token_ids;
};

class BlockPool {
  struct Chunk;  // defined with the other private members below
  struct Block;

 public:
  // REQUIRES: config.Validate().ok(); budget outlives the pool.
  BlockPool(const BlockPoolConfig& config, MemoryBudget* budget, KvEventLog* events);
  ~BlockPool();
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  // ---- Capacity -------------------------------------------------------------------------
  int32_t capacity() const { return max_chunks_ * bpc_; }  // ids 1..capacity()
  int32_t blocks_per_chunk() const { return bpc_; }
  int64_t block_bytes() const { return block_bytes_; }
  int64_t chunk_bytes() const { return int64_t{bpc_} * block_bytes_; }
  // Bytes one chunk takes from the budget (>= chunk_bytes()).
  int64_t chunk_charge() const { return chunk_charge_; }
  int32_t num_mapped_chunks() const { return num_mapped_chunks_; }
  int32_t num_used_blocks() const { return num_used_; }
  int32_t num_cached_free_blocks() const { return num_cached_free_; }
  int32_t num_clean_blocks() const { return num_clean_; }
  // Blocks this pool can hand out without mapping a chunk: clean + cached-free.
  int32_t num_free_blocks() const { return num_clean_ + num_cached_free_; }
  // Mapped chunks with no used block: their memory can go back to the budget.
  int32_t num_idle_chunks() const { return num_idle_chunks_; }
  // The chunk holding `block`, and whether a mapped chunk has no used block.
  int32_t ChunkIndex(BlockId block) const { return ChunkOf(block.value); }
  bool IsIdleChunk(int32_t chunk) const {
    return static_cast<size_t>(chunk) < chunks_.size() && chunks_[chunk].mapped &&
           chunks_[chunk].used == 0;
  }
  // Chunks not yet mapped that this pool could still map.
  int32_t num_unmapped_chunks() const { return max_chunks_ - num_mapped_chunks_; }

  // ---- Allocation ------------------------------------------------------------------------
  // Takes `n` blocks (ref 0 -> 1), mapping chunks from the budget when the pool runs out of
  // clean blocks and the budget has room, and evicting cached-free blocks (LRU) otherwise.
  // Appends the ids to *out. The chunks the blocks cannot come without are asked of the
  // backing first (PremapFor): when it refuses one, Allocate returns false having taken
  // nothing (the error is the budget's backing_error()). A chunk the pool would only map to
  // keep its cache that the backing refuses is replaced by evicting. REQUIRES: n <=
  // num_free_blocks() + what the budget can map.
  [[nodiscard]] bool Allocate(int32_t n, std::vector<BlockId>* out);
  // Maps, ahead of Allocate(n), the chunks it cannot do without (those beyond the free blocks,
  // less the pool's chunks premapped already), lowest unmapped first (MemoryBudget::Premap).
  // Nothing else changes. The backing's error when it refuses (the chunks premapped before
  // the refusal stay premapped: MemoryBudget::DropPremapped gives them back);
  // ResourceExhausted when the pool or the budget cannot hold them.
  absl::Status PremapFor(int64_t n);
  // Blocks Allocate(n) could hand out now, counting chunks the budget's free bytes can map
  // (less `held_back_bytes`, kept for other pools).
  int64_t AllocatableNow(int64_t held_back_bytes = 0) const;
  // n <= AllocatableNow(), without its division when the free blocks or one chunk suffice.
  bool CanAllocateNow(int64_t n) const {
    const int64_t short_by = n - num_free_blocks();
    if (short_by <= 0) return true;
    if (short_by <= bpc_) {
      return num_unmapped_chunks() > 0 && chunk_charge_ <= budget_->free_bytes();
    }
    return n <= AllocatableNow();
  }

  // Takes one reference on each block (a prefix hit). A cached-free block leaves the LRU list.
  // REQUIRES: every id is used or cached-free (not clean, not null).
  void Touch(absl::Span<const BlockId> blocks);
  // Drops one reference on each block, in the given order. Blocks reaching 0 become clean
  // (pushed so they are reused first) when they carry no hash, or cached-free (appended to the
  // LRU tail, evicted last) when they do. Pass a request's blocks last-to-first so the tail of a
  // prefix chain is evicted before its head. Null ids are skipped.
  void Free(absl::Span<const BlockId> blocks);

  // ---- Prefix cache ------------------------------------------------------------------------
  // Registers a full block under (hash, group). No-op when caching is off or the block already
  // carries a hash. REQUIRES: the block is used. When the key is new and events are recorded,
  // records a kStored event carrying `detail` (null: only hash and parent).
  void CacheBlock(BlockId block, BlockHash hash, GroupId group, BlockHash parent,
                  const StoredBlockDetail* detail = nullptr);
  // Whether CacheBlock's events are recorded (the manager then computes their detail).
  bool records_events() const { return events_ != nullptr && events_->enabled(); }
  // The block cached under (hash, group) longest ago among those still cached, or kNullBlock.
  // Does not take a reference.
  BlockId Lookup(BlockHash hash, GroupId group) const;
  // Drops the block's hash, if it has one (e.g. a KV connector reports its data invalid). A
  // cached-free block becomes clean; a used block stays with its holders. Returns whether a
  // hash was dropped.
  bool Uncache(BlockId block);
  // Drops every hash. FailedPrecondition if any block is used.
  absl::Status ResetPrefixCache();

  // ---- Host tier ------------------------------------------------------------------------------
  // Puts `tier` (it must outlive the pool; null = none) behind this pool's prefix cache.
  // Write-through: a key cached for the first time is offered for saving, its block holding
  // one more reference (a pin) until the manager completes the save. Write-back: a cached block
  // this pool evicts to reuse it is offered, unpinned (its data is read before the step that
  // reuses it runs). Queued saves of a chunk given back are dropped.
  void set_host_tier(internal::HostTier* tier) { tier_ = tier; }
  internal::HostTier* host_tier() const { return tier_; }
  // Whether the host tier has a ready copy of (hash, group).
  bool HostHolds(BlockHash hash, GroupId group) const;

  // ---- Chunks ------------------------------------------------------------------------------
  // Gives back one idle chunk (evicting its cached blocks), preferring the idle chunk with the
  // fewest cached blocks. Returns false if there is none. `allow_cache_loss` = false only
  // releases chunks whose blocks are all clean.
  bool ReleaseIdleChunk(bool allow_cache_loss);
  // Gives back every idle chunk (evicting their cached blocks) in one pass; returns how many.
  int32_t ReleaseIdleChunks();
  int32_t NumCleanIdleChunks() const;

  // ---- Introspection ------------------------------------------------------------------------
  // 0 / false for an id the pool never handed out (beyond its records) or out of range.
  int32_t ref_count(BlockId block) const {
    return HasRecord(block.value) ? blocks_[block.value].ref : 0;
  }
  bool is_cached(BlockId block) const {
    return HasRecord(block.value) && blocks_[block.value].has_hash != 0;
  }
  // Ids below this have records; every id from it up to capacity() is unused and unhashed
  // (a walk over the pool's blocks may stop here). At most capacity() + 1.
  int32_t num_block_records() const { return static_cast<int32_t>(blocks_.size()); }
  BlockHash block_hash(BlockId block) const;
  bool is_mapped(BlockId block) const;
  // Every block Allocate could hand out now, in the order it would: clean blocks, the blocks
  // of the chunks the budget's free bytes could map (lowest chunk first, ids in order; those
  // that would eat into the budget's headroom only after the cached ones), cached-free blocks
  // in eviction order. Before the first allocation: ids 1..capacity() as the budget allows,
  // like vLLM's free queue. For tests; O(capacity).
  std::vector<BlockId> FreeOrder() const;
  // free + used = mapped, states disjoint, LRU and clean stacks consistent with ref counts and
  // hashes, hash map entries point at hashed blocks, chunk counters add up.
  absl::Status CheckInvariants() const;

 private:
  // 32 bytes, two to a cache line: a block handed out touches one chunk record.
  //
  // A chunk's clean blocks, in the order they are handed out, are its clean stack (blocks
  // freed without a hash since it was mapped, last freed first: `clean - fresh` of them,
  // linked through Block::next) and then its `fresh` tail: the last `fresh` ids of the chunk,
  // in id order, not handed out since it was mapped. Mapping a chunk writes no block record,
  // so a chunk of a billion blocks (vLLM's one pool) costs records only for what it hands out.
  struct alignas(32) Chunk {
    int32_t used = 0;         // blocks with ref > 0
    int32_t cached = 0;       // cached-free blocks
    int32_t clean = 0;        // clean blocks: the stack's, then the fresh tail's
    int32_t clean_top = -1;   // head of the clean stack (a block id), -1 when the stack is empty
    int32_t fresh = 0;        // the fresh tail: ids [end - fresh, end), end = the chunk's last + 1
    int32_t bucket_pos = -1;  // index in buckets_[used] while clean > 0
    bool mapped = false;
    bool idle_listed = false;  // on idle_stack_ (which may hold it after it stopped being idle)
  };

  // How many chunks ahead of the one it takes Allocate prefetches.
  static constexpr size_t kPrefetchDistance = 8;
  // Buckets made up front; a chunk reaching a higher used count grows buckets_ (doubling).
  static constexpr size_t kInitialBuckets = 4096;

  int32_t ChunkOf(int32_t block) const {
    return chunk_shift_ >= 0 ? (block - 1) >> chunk_shift_ : (block - 1) / bpc_;
  }
  bool HasRecord(int32_t block) const { return static_cast<size_t>(block) < blocks_.size(); }
  // Grows the records (blocks_, keys_ and the prefix-cache map with them) to hold id `block`,
  // at least doubling them (up to capacity() + 1) so that growth costs O(1) per block.
  void GrowBlockRecords(int32_t block);
  void EnsureBlockRecord(int32_t block) {
    if (!HasRecord(block)) [[unlikely]] GrowBlockRecords(block);
  }
  // The same for chunk records (up to max_chunks).
  void EnsureChunkRecord(int32_t chunk);
  // Allocate's three sources, in the order it tries them. MapNextChunk maps the lowest
  // unmapped chunk unless the budget refuses; it returns whether it appended a block to *out
  // (a one-block chunk is mapped straight into use). TakeFromFullestChunk takes up to n clean
  // blocks of the fullest chunk; EvictOldest reuses the least recently freed cached block.
  bool MapNextChunk(std::vector<BlockId>* out);
  // The lowest chunk from `from` on that is premapped for this pool (one must be).
  int32_t NextPremapped(int32_t from) const;
  int32_t TakeFromFullestChunk(int32_t n, std::vector<BlockId>* out);
  void EvictOldest(std::vector<BlockId>* out);
  // Starts loading the records of a chunk and of its first block, which Allocate takes soon.
  void PrefetchChunk(size_t chunk) const;
  // Evicts an idle chunk's cached blocks and unmaps it.
  void ReleaseChunk(int32_t chunk);
  void PushClean(int32_t block);
  void BucketInsert(int32_t chunk);
  void BucketRemove(int32_t chunk);
  void IdleInsert(int32_t chunk);  // the chunk became idle (counted in num_idle_chunks_)
  void IdleRemove(int32_t /*chunk*/) { --num_idle_chunks_; }  // idle_stack_ drops it lazily
  // A block becomes cached-free (appended to the LRU list, counted in its chunk and the pool)
  // or stops being one.
  void LruAppend(int32_t block, int32_t chunk);
  void LruRemove(int32_t block);
  void DropHash(int32_t block);  // removes the block's map entry and emits BlockRemoved
  // Records the kStored event of a new key (events enabled).
  void AddStored(BlockHash hash, GroupId group, BlockHash parent,
                 const StoredBlockDetail* detail);
  void TakeBlock(int32_t block);  // a free block becomes used (ref 1)

  const int32_t pool_index_;
  const int64_t block_bytes_;
  const int32_t bpc_;
  const int32_t max_chunks_;
  const int64_t chunk_charge_;
  const bool enable_caching_;
  int32_t chunk_shift_ = -1;  // log2(bpc) when bpc is a power of two (or one chunk): no divide
  MemoryBudget* const budget_;
  KvEventLog* const events_;
  internal::HostTier* tier_ = nullptr;

  // What taking, touching or freeing a block reads and writes, in one 16-byte record (one
  // cache line to fetch, not one per field).
  struct Block {
    int32_t ref = 0;
    int32_t next = -1;  // clean stack link, or LRU next (meaningless while used)
    int32_t prev = -1;  // LRU prev
    uint8_t has_hash = 0;
  };
  // Per block, indexed by id (index 0 = the null block), for ids below the records' end.
  std::vector<Block, HugePageAllocator<Block>> blocks_;
  // Hash, group and duplicate chain of every block: as many as blocks_ while caching is on,
  // none while it is off.
  std::vector<internal::PrefixKey, HugePageAllocator<internal::PrefixKey>> keys_;

  // Per chunk, for the chunks below the records' end (every chunk above is unmapped).
  std::vector<Chunk, HugePageAllocator<Chunk>> chunks_;
  // buckets_[u]: the chunks with clean blocks and u used blocks, as arrays (not linked lists)
  // so that taking the next chunk reads no neighbour's record and the chunks handed out next
  // are known in advance (prefetched). Allocation pops from the back of the fullest bucket.
  std::vector<std::vector<int32_t>> buckets_;
  int32_t max_bucket_ = -1;  // highest non-empty bucket (or an upper bound of it)
  int32_t lru_head_ = -1, lru_tail_ = -1;
  // (hash, group) -> the first block of its duplicate chain; keys live in keys_.
  std::unique_ptr<internal::PrefixIndex> index_;

  int32_t first_unmapped_hint_ = 0;  // every chunk below it is mapped
  // Every idle chunk, plus chunks that stopped being idle since the last ReleaseIdleChunk (it
  // drops those as it scans): a chunk leaving the idle set touches nothing but its counter.
  std::vector<int32_t> idle_stack_;
  int32_t num_mapped_chunks_ = 0;
  int32_t num_idle_chunks_ = 0;
  int32_t num_used_ = 0;
  int32_t num_cached_free_ = 0;
  int32_t num_clean_ = 0;
};

}  // namespace kvpage

#endif  // KVPAGE_BLOCK_BLOCK_POOL_H_
