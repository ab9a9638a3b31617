// Per-request and per-group bookkeeping of the KvCacheManager (internal).
#ifndef KVPAGE_BLOCK_REQUEST_STATE_H_
#define KVPAGE_BLOCK_REQUEST_STATE_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "block/huge_page_arena.h"
#include "kvpage/block_hash.h"
#include "kvpage/model_spec.h"
#include "kvpage/types.h"

namespace kvpage::internal {

// How one layer group is laid out in the manager.
struct GroupLayout {
  GroupId id;
  LayerKind kind = LayerKind::kFullAttention;
  int32_t num_layers = 0;
  int32_t padding_layers = 0;  // vllm mode
  int32_t block_size = 0;      // tokens per block (attention groups)
  int32_t window = 0;          // sliding window, in tokens
  int32_t pool = 0;            // index into the manager's pools
  int64_t block_bytes = 0;     // bytes one block id of this group costs

  bool IsAttention() const { return kind != LayerKind::kLinearAttention; }
};

// A request's holdings in one group.
struct GroupState {
  // Attention: the block table, one entry per block of tokens, kNullBlock where a sliding
  // window released the block.
  std::vector<BlockId> blocks;
  int64_t num_cached_blocks = 0;  // blocks [0, n) have been offered to the prefix cache
  int64_t num_released = 0;       // sliding window: blocks [0, n) are null

  // Linear attention. `cur` holds the state after the last committed step (-1: none yet, the
  // state is zero). A snapshot `cur` is shared with the prefix cache; a scratch `cur` is the
  // request's own and is updated in place.
  int32_t cur = -1;
  bool cur_is_snapshot = false;
  // The step in flight: read `read`, write `write`; `snapshot_block` >= 0 registers `write`
  // under that block's hash when the step commits.
  bool step_pending = false;
  int32_t read = -1;
  int32_t write = -1;
  int64_t snapshot_block = -1;
  std::vector<int32_t> extra;  // vllm accounting: the second state block it keeps per group
};

// Aligned to a cache line, so the first line holds what every decode step reads.
struct alignas(64) RequestState {
  RequestState(RequestId request_id, int32_t block_size, BlockHashExtras extras,
               HugePageArena* arena)
      : id(request_id), tokens(ArenaAllocator<int32_t>(arena)),
        hashes(block_size, std::move(extras)) {}

  // Read by every decode step: kept together at the front, in one cache line.
  RequestId id;
  int32_t handle = -1;     // KvCacheManager::RequestHandle
  bool allocated = false;  // has been through AllocateSlots
  bool skip_prefix_cache_read = false;
  // Summaries of `groups` that let a decode step that needs nothing new return at once
  // (KvCacheManager::Impl::RefreshSummary keeps them current). How many tokens the tables
  // cover is kept only in the manager's flat DecodeSummary, so that a step crossing into a
  // new block does not touch this line at all.
  int64_t cached_blocks = 0;   // min over attention groups of num_cached_blocks
  int64_t next_release = 0;    // smallest processed count at which a window frees a block
  // ---- End of the first line.

  // ---- The second line: all that completing a decode block reads of the state (moving the
  // tail into `tokens` and hashing the block) when the request has no extra hash keys.

  // The request's tokens (prompt, then outputs) up to the last full block at least: decode
  // tokens of the block being filled may still sit in the manager's per-handle tail
  // (KvCacheManager::Impl::token_tails) and move here when the block completes. The count of
  // all tokens is the manager's token_counts[handle]. In the manager's arena (huge pages): a
  // decode step appends to a few dozen of these vectors, each far from the others.
  alignas(64) std::vector<int32_t, ArenaAllocator<int32_t>> tokens;
  RequestBlockHashes hashes;  // its first RequestBlockHashes::kHotBytes in this line

  int64_t prompt_len = 0;

  // By group id. Up to two groups (plain full attention; full attention with a sliding
  // window or with linear attention) keep their records here, in lines whose addresses are
  // known from the state's: a decode step fetches them with the first line, not after it.
  alignas(64) absl::InlinedVector<GroupState, 2> groups;
};
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Winvalid-offsetof"  // GCC lays out this struct as written
static_assert(offsetof(RequestState, tokens) == 64 &&
              offsetof(RequestState, hashes) + RequestBlockHashes::kHotBytes <= 128,
              "completing a block reads the second line of the state only");
// The vector's header, then its inline records: the first record's table header is in the
// groups' first line, the second's in the second (KvCacheManager::Impl::PrefetchState).
constexpr size_t kGroupsHeaderBytes =
    sizeof(absl::InlinedVector<GroupState, 2>) - 2 * sizeof(GroupState);
static_assert(offsetof(RequestState, groups) % 64 == 0 &&
                  kGroupsHeaderBytes + offsetof(GroupState, blocks) +
                          sizeof(std::vector<BlockId>) <= 64 &&
                  kGroupsHeaderBytes + sizeof(GroupState) + offsetof(GroupState, blocks) >= 64 &&
                  kGroupsHeaderBytes + sizeof(GroupState) + offsetof(GroupState, blocks) +
                          sizeof(std::vector<BlockId>) <= 128,
              "inline group records' table headers are in the groups' first two lines");
#pragma GCC diagnostic pop

}  // namespace kvpage::internal

#endif  // KVPAGE_BLOCK_REQUEST_STATE_H_
