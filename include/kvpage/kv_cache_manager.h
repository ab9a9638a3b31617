// KvCacheManager: where every token's K/V and every request's recurrent state lives.
//
// The manager owns one pool per layer group of a model (kvpage mode) — growing pages for full
// attention and MLA, window-bounded pages for sliding-window attention, fixed state slots for
// linear attention — all drawing chunks from one byte budget. It tracks each request's tokens
// and block hashes, serves prefix-cache hits across all groups at once, hands out slots for the
// tokens of a step all-or-nothing, and frees what a request no longer needs.
//
// A server (or kvpage's scheduler) drives it once per step:
//
//   manager.NewStep();                                  // commits last step's state snapshots
//   manager.AddRequest({id, prompt, extras});           // once per request
//   auto hit = manager.GetComputedBlocks(id);           // before the first allocation only
//   bool ok = *manager.AllocateSlots(id, {.num_computed_tokens = hit->num_tokens,
//                                         .num_new_tokens = n, .hit = &*hit});
//   ... block tables, slot mappings and state slots for the kernels ...
//   manager.AppendTokens(id, sampled);                  // after the step
//   manager.Free(id);                                   // finished, aborted or preempted
//
// Accounting modes:
//   * kKvpage — per-group pools, nothing padded, chunks shared through one budget, sliding
//     windows hold only the blocks they can reach, recurrent state in native dtypes with
//     prefix-cache snapshots cached separately.
//   * kVllm   — reserves what vLLM 0.29 would: one block-id space shared by vLLM's equal-size
//     groups (padding layers and page padding included), hybrid block alignment, two state
//     blocks per linear-attention group with prefix caching. For replaying one trace under both.
//
// Error handling: API misuse (unknown or duplicate request ids, tokens past max_model_len,
// inconsistent token counts) returns an absl::Status naming the value and changes nothing. Not
// having enough memory is not an error: AllocateSlots returns false and changes nothing.
// Not thread-safe: one scheduler thread owns the manager.
#ifndef KVPAGE_KV_CACHE_MANAGER_H_
#define KVPAGE_KV_CACHE_MANAGER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kvpage/block_hash.h"
#include "kvpage/dtype.h"
#include "kvpage/kv_events.h"
#include "kvpage/memory_budget.h"
#include "kvpage/model_spec.h"
#include "kvpage/types.h"

namespace kvpage {

enum class AccountingMode : uint8_t { kKvpage, kVllm };

struct KvCacheConfig {
  AccountingMode mode = AccountingMode::kKvpage;
  int64_t kv_budget_bytes = 0;   // memory for KV and state; required (> 0)
  int32_t block_size = 16;       // tokens per block (kvpage mode; vllm mode may enlarge it)
  std::optional<DType> kv_cache_dtype;  // attention KV; unset = the model dtype
  int64_t max_model_len = 0;     // 0 = the model's max_position_embeddings
  bool enable_prefix_caching = true;
  HashAlgorithm hash_algorithm = HashAlgorithm::kXxh3_128;
  std::optional<uint64_t> hash_seed;  // unset = random root
  // Token budget of one step. kvpage: sizes the sliding-window pools' shared in-flight
  // allowance; vllm: the per-request sliding-window cap (doubled with async scheduling).
  int32_t max_num_batched_tokens = 8192;
  bool async_scheduling = true;  // vllm mode only
  // kvpage mode: bytes a pool takes from the budget at a time (rounded to whole blocks, at
  // least one block). 2 MiB is the granularity at which CUDA maps physical memory
  // (cuMemMap), and small chunks strand little memory in one pool that another needs
  // (docs/simulator.md measures 64 MiB against 2 MiB on Gemma 3).
  int64_t chunk_bytes = int64_t{2} << 20;
  // Recurrent groups with prefix caching: snapshot the state whenever a step ends on a
  // multiple of this many blocks after the prompt (prefill chunks ending on any block boundary
  // are always snapshotted). 0 = no snapshots during decode.
  int32_t decode_snapshot_interval_blocks = 32;
  bool enable_kv_events = false;
  MemoryBacking* backing = nullptr;  // GPU backing; null = CPU accounting only

  absl::Status Validate() const;
};

struct KvRequestSpec {
  RequestId id;
  std::vector<int32_t> prompt_tokens;
  BlockHashExtras extras;  // LoRA id, cache salt, multimodal items
  // Never read the prefix cache (e.g. prompt logprobs need every position computed); the
  // request's blocks are still cached for others.
  bool skip_prefix_cache_read = false;
};

// A prefix-cache hit: the first `num_tokens` tokens are already computed, in these blocks.
struct CacheHit {
  int64_t num_tokens = 0;
  // Per group, the hit's block-table prefix: null blocks where a sliding window does not need
  // the block; for a recurrent group, one entry: the state snapshot slot.
  std::vector<std::vector<BlockId>> blocks;
};

struct AllocationRequest {
  int64_t num_computed_tokens = 0;  // tokens whose K/V is computed (or hit) before this step
  int64_t num_new_tokens = 0;       // tokens this step computes, drafts included (> 0)
  int64_t num_lookahead_tokens = 0; // extra slots for draft tokens proposed this step
  // Tokens after this step (say the rest of a prompt being admitted) whose blocks must also be
  // obtainable for the step to succeed. They are checked, not taken: a scheduler admits a
  // prompt only if all of it will fit. kvpage mode counts growing groups (full attention, MLA);
  // a sliding window needs no more than the step's own blocks. vllm mode also counts sliding
  // windows, up to vLLM's per-request admission bound, as vLLM's full-sequence gate does.
  // Only memory is checked, not max_model_len: a scheduler may add the prompt tokens that
  // requests admitted earlier still have to compute.
  int64_t num_reserve_tokens = 0;
  // Tokens whose step has finished on the device; sliding-window blocks before the window of
  // the first unprocessed token are freed. -1 = num_computed_tokens (synchronous scheduling).
  int64_t num_processed_tokens = -1;
  const CacheHit* hit = nullptr;    // from GetComputedBlocks; first allocation only
};

// One running request's share of a decode step (AllocateDecodeStep).
struct DecodeStep {
  RequestId id;
  int64_t num_computed_tokens = 0;
  int64_t num_new_tokens = 1;
  int32_t handle = -1;  // the id's RequestHandle, or -1: skips the id lookup when it matches
};

// How far a running request can decode without the manager (QuietDecodeHorizon).
struct DecodeHorizon {
  int64_t tokens = 0;   // a quiet step ends at no more than this many tokens
  int64_t release = 0;  // and starts before this many computed tokens
};

// One sampled token of a decode step (AppendDecodeTokens).
struct DecodeToken {
  RequestId id;
  int32_t handle = -1;  // as in DecodeStep
  int32_t token = 0;
};

// Recurrent-state slots of one request in one linear-attention group for the current step.
struct StateSlots {
  int32_t read_slot = -1;   // where the kernel reads the state before the step
  int32_t write_slot = -1;  // where it writes the state after the step (may equal read_slot)
};

struct StateCopy {
  GroupId group;
  int32_t src_slot = -1;
  int32_t dst_slot = -1;
};

struct SlotToZero {
  GroupId group;
  int32_t slot = -1;
};

struct PoolUsage {
  GroupId group;
  LayerKind kind = LayerKind::kFullAttention;
  int64_t block_bytes = 0;
  int32_t used_blocks = 0;
  int32_t cached_free_blocks = 0;
  int32_t clean_blocks = 0;
  int32_t mapped_chunks = 0;
};

struct KvCacheUsage {
  int64_t budget_bytes = 0;
  int64_t mapped_bytes = 0;  // taken by pools (in chunks)
  int64_t used_bytes = 0;    // in blocks held by requests
  double usage = 0;          // used_bytes / budget_bytes
  std::vector<PoolUsage> pools;
};

struct PrefixCacheStats {
  int64_t queries = 0;          // requests that asked GetComputedBlocks
  int64_t queried_tokens = 0;   // their prompt tokens
  int64_t hit_tokens = 0;       // tokens served from the cache
};

class KvCacheManager {
 public:
  // Builds the pools for `model` under `config`. InvalidArgument naming the field for a bad
  // config; ResourceExhausted when the budget cannot hold one block of every pool.
  static absl::StatusOr<std::unique_ptr<KvCacheManager>> Create(const ModelSpec& model,
                                                                const KvCacheConfig& config);
  ~KvCacheManager();
  KvCacheManager(const KvCacheManager&) = delete;
  KvCacheManager& operator=(const KvCacheManager&) = delete;

  // ---- Requests --------------------------------------------------------------------------
  // AlreadyExists for a live id; InvalidArgument for an empty prompt or a negative token id;
  // OutOfRange if the prompt exceeds max_model_len.
  absl::Status AddRequest(KvRequestSpec spec);
  // Appends sampled (accepted) tokens. OutOfRange past max_model_len; NotFound for an unknown id.
  absl::Status AppendTokens(RequestId id, absl::Span<const int32_t> tokens);
  // AppendTokens of one token for each of many requests (the sampled tokens of a decode
  // step). All or nothing: errors as AppendTokens, for the first bad entry, before anything
  // changes.
  absl::Status AppendDecodeTokens(absl::Span<const DecodeToken> tokens);
  // The same appends from the caller's own loop over its batch (see DecodeAppender), for a
  // scheduler that visits every request after a step anyway: no array of entries to build.
  class DecodeAppender;
  DecodeAppender StartDecodeAppend();
  // Drops the last `num_tokens` generated tokens (e.g. rejected speculative tokens) and the
  // hashes of blocks they completed, so those blocks leave the prefix cache; the blocks stay
  // allocated for the next step. FailedPrecondition (nothing changed) when such a block is
  // shared with another request, or when the model has linear-attention layers and the tokens
  // were computed (their state cannot be rewound).
  absl::Status RollbackTokens(RequestId id, int64_t num_tokens);
  // Frees every block and slot of the request, last block first. NotFound for an unknown id.
  absl::Status Free(RequestId id);
  bool HasRequest(RequestId id) const;
  // A small integer naming a live request until it is freed (then reused), or -1 for an
  // unknown id. Batch calls given it with the id skip the id lookup; a stale handle is
  // detected (it no longer matches the id) and the id is looked up instead.
  int32_t RequestHandle(RequestId id) const;
  // The request's tokens: prompt, then appended tokens. NotFound for an unknown id.
  absl::StatusOr<absl::Span<const int32_t>> Tokens(RequestId id) const;
  int64_t num_requests() const;

  // ---- Steps -------------------------------------------------------------------------------
  // Marks the start of a scheduling step: state snapshots written by the previous step become
  // visible to prefix-cache lookups.
  void NewStep();
  // The longest prefix every group can serve, capped so the last token is recomputed.
  // FailedPrecondition once the request holds blocks; NotFound for an unknown id.
  absl::StatusOr<CacheHit> GetComputedBlocks(RequestId id);
  // Finds blocks for the step's tokens in every group, all-or-nothing: true on success, false
  // (and nothing changed but out-of-window frees) when memory is short. Errors for misuse.
  absl::StatusOr<bool> AllocateSlots(RequestId id, const AllocationRequest& request);
  // AllocateSlots for many running requests at once, in order (no hits, no lookahead): the
  // decode step of a continuous batch. Returns k, the number of requests served: requests
  // [0, k) have their slots; request k did not fit and it and the ones after it are unchanged.
  // Errors as AllocateSlots (NotFound for an unknown id before anything changes); requests
  // before a failing one keep their slots. With `horizons` (one entry per step, else
  // InvalidArgument), entry i of each served step receives QuietDecodeHorizon of its request
  // right after the step, so a scheduler need not ask for it (entries of unserved steps are
  // unspecified).
  absl::StatusOr<int64_t> AllocateDecodeStep(absl::Span<const DecodeStep> steps,
                                             absl::Span<DecodeHorizon> horizons = {});
  // The request's quiet decode steps: a step of one token after c computed tokens, c >= 0 and
  // c + 1 at most the request's token count, with c + 1 <= horizon.tokens and
  // c < horizon.release needs no new block, caches none and frees none, so AllocateSlots (no
  // hit, lookahead or reserve) would return true and change nothing; a scheduler may skip the
  // call. In steady decode that is every step but the one in block_size that fills or crosses
  // a block. The horizon holds until the request is next allocated, rolled back, has skipped
  // blocks removed, or is freed; appending tokens does not move it. {0, 0} (no quiet step)
  // before the first allocation and for models with linear-attention state, whose every step
  // moves a state slot. `handle` as in DecodeStep. NotFound for an unknown id.
  absl::StatusOr<DecodeHorizon> QuietDecodeHorizon(RequestId id, int32_t handle = -1) const;
  // Blocks (all pools together) AllocateSlots would need to take from the pools for this
  // step. Same arguments; does not change anything.
  absl::StatusOr<int64_t> BlocksNeeded(RequestId id, const AllocationRequest& request) const;
  // Frees sliding-window blocks that no token from `num_processed_tokens` on can reach.
  // `handle` is a hint as in DecodeStep.
  absl::Status RemoveSkippedBlocks(RequestId id, int64_t num_processed_tokens,
                                   int32_t handle = -1);

  // ---- What the kernels read ---------------------------------------------------------------
  int32_t num_groups() const;
  LayerKind group_kind(GroupId group) const;
  int32_t group_block_size(GroupId group) const;
  // Sliding-window length in tokens (0 for other kinds).
  int32_t group_window(GroupId group) const;
  // The request's block table in an attention group (null blocks included). `handle` is a hint
  // as in DecodeStep: when it is the id's RequestHandle, the request is found without a map
  // lookup; otherwise (or -1) the id decides.
  absl::StatusOr<absl::Span<const BlockId>> BlockTable(RequestId id, GroupId group,
                                                       int32_t handle = -1) const;
  // The same table for a caller that holds a valid (id, handle) pair and an attention group
  // (a scheduler syncing its rows every step): no Status to build and check; an empty span
  // when the request or the group is not valid, which BlockTable tells apart from a request
  // that holds no block yet.
  absl::Span<const BlockId> BlockTableOrEmpty(RequestId id, GroupId group, int32_t handle) const;
  // Writes the table as int32 kernel-block ids into `row` (padded with 0): each manager block b
  // expands to b·r … b·r + r − 1 with r = group_block_size / kernel_block_size.
  // InvalidArgument if kernel_block_size does not divide the block size or the row is short.
  absl::Status FillBlockTableRow(RequestId id, GroupId group, int32_t kernel_block_size,
                                 absl::Span<int32_t> row) const;
  // slot = block_table[pos / bs] · bs + pos % bs for positions [start, start + out.size()).
  // InvalidArgument if a position has no block (or only the null block).
  absl::Status FillSlotMapping(RequestId id, GroupId group, int64_t start,
                               absl::Span<int64_t> out) const;
  // Read and write state slots of a linear-attention group for the current step.
  absl::StatusOr<StateSlots> GetStateSlots(RequestId id, GroupId group) const;
  // State copies to run before the next forward pass, and newly allocated slots to zero.
  std::vector<StateCopy> TakeStateCopies();
  std::vector<SlotToZero> TakeSlotsToZero();

  // ---- Accounting --------------------------------------------------------------------------
  KvCacheUsage Usage() const;
  PrefixCacheStats prefix_cache_stats() const;
  std::vector<KvEvent> DrainEvents();
  // FailedPrecondition while a request holds blocks.
  absl::Status ResetPrefixCache();
  // Removes one block from the prefix cache (a KV connector found its data invalid, or a test
  // shapes the cache). Holders keep the block. InvalidArgument for an unknown group or id.
  absl::Status EvictCachedBlock(GroupId group, BlockId block);
  // The order in which the pool behind `group` would hand out its free blocks: clean blocks
  // first (fullest chunk first), then cached blocks least recently freed first. For tests and
  // debugging; O(pool size).
  std::vector<BlockId> FreeBlockOrder(GroupId group) const;
  // Checks every pool and every request's tables against the pools' reference counts.
  absl::Status CheckInvariants() const;
  const KvCacheConfig& config() const;

  class Impl;

 private:
  explicit KvCacheManager(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Appends one sampled token at a time to decoding requests: what AppendDecodeTokens does for
// an array of DecodeToken, for a caller that visits each request in a loop of its own. The
// common case (a valid handle, a block size that is a power of two, no block completed twice)
// is inline and touches only the manager's per-handle arrays; a token that completes a block
// has the block hashed at Finish (or destruction), the completions together.
//
// Each Append stands alone: it appends its token, or returns the error AppendTokens would
// give (NotFound, InvalidArgument for a negative token, OutOfRange at max_model_len) and
// changes nothing. A request may be named more than once.
//
// REQUIRES: no other call to the manager from StartDecodeAppend until Finish (the appender
// holds pointers into the manager's arrays). Movable, not copyable.
class KvCacheManager::DecodeAppender {
 public:
  DecodeAppender(DecodeAppender&& other) noexcept : DecodeAppender(other) { other.impl_ = nullptr; }
  DecodeAppender& operator=(DecodeAppender&&) = delete;
  ~DecodeAppender() { Finish(); }

  // `handle` as in DecodeToken: RequestHandle(id), or -1 (the id is then looked up).
  absl::Status Append(RequestId id, int32_t handle, int32_t token) {
    const uint32_t h = static_cast<uint32_t>(handle);
    if (h < num_handles_ && ids_[h] == id && token >= 0 && due_[h] == 0) [[likely]] {
      int64_t& count = counts_[h];
      if (count < max_model_len_) [[likely]] {
        const int64_t offset = count & tail_mask_;
        tails_[size_t{h} * tail_stride_ + static_cast<size_t>(offset)] = token;
        ++count;
        if (offset == tail_mask_) Completed(h);
        return absl::OkStatus();
      }
    }
    return AppendSlow(id, handle, token);
  }
  // Hashes the blocks the appends completed. The manager may be used again afterwards.
  void Finish();

 private:
  friend class KvCacheManager;
  friend class Scheduler;  // AppendKnown, Known, Completed
  // For the scheduler, whose own state guarantees what Append checks: every append may take
  // the inline path (block size a power of two).
  bool AllInline() const { return num_handles_ > 0; }
  // Append without its checks. REQUIRES: AllInline(); `handle` is the handle of a live request;
  // token >= 0; the request holds fewer than max_model_len tokens and was not appended to since
  // StartDecodeAppend.
  void AppendKnown(uint32_t h, int32_t token) {
    if (Known().Append(h, token)) Completed(h);
  }
  // AppendKnown's arrays, for a loop over many appends: a copy of them whose address does not
  // escape (the appender's does), so that the loop's stores do not make the compiler reload
  // them from the appender for every token.
  struct KnownTails {
    int64_t* counts;
    int32_t* tails;
    size_t stride;
    int64_t mask;
    // AppendKnown but for the completion: true when the token completed a block, for which
    // the caller then calls Completed(h).
    bool Append(uint32_t h, int32_t token) const {
      int64_t& count = counts[h];
      const int64_t offset = count & mask;
      tails[size_t{h} * stride + static_cast<size_t>(offset)] = token;
      ++count;
      return offset == mask;
    }
    // Append when the token does not complete a block; false (nothing appended) when it would.
    bool AppendWithinBlock(uint32_t h, int32_t token) const {
      if ((counts[h] & mask) == mask) return false;
      Append(h, token);
      return true;
    }
  };
  KnownTails Known() const { return {counts_, tails_, tail_stride_, tail_mask_}; }
  DecodeAppender(const DecodeAppender&) = default;
  explicit DecodeAppender(Impl* impl);
  void Completed(uint32_t h);
  absl::Status AppendSlow(RequestId id, int32_t handle, int32_t token);

  Impl* impl_ = nullptr;
  // The inline path's view of the manager's per-handle arrays. num_handles_ is 0 when the
  // block size is not a power of two (every append then takes AppendSlow).
  uint32_t num_handles_ = 0;
  const RequestId* ids_ = nullptr;      // handle -> id
  uint8_t* due_ = nullptr;              // handle -> a completed block not yet hashed
  int64_t* counts_ = nullptr;           // handle -> token count
  int32_t* tails_ = nullptr;            // tail_stride_ tokens per handle
  size_t tail_stride_ = 0;
  int64_t tail_mask_ = 0;               // block size − 1
  int64_t max_model_len_ = 0;
};

}  // namespace kvpage

#endif  // KVPAGE_KV_CACHE_MANAGER_H_
