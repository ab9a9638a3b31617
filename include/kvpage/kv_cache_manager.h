// KvCacheManager: where every token's K/V and every request's recurrent state lives.
//
// The manager keeps one pool per layer group of a model (kvpage accounting): growing pages for
// full attention and MLA, window-bounded pages for sliding-window attention, fixed state slots
// for linear attention. All pools draw chunks from one byte budget. Each layer kind is served
// by its own group manager behind this class, which coordinates them: prefix-cache hits that
// every group can serve, all-or-nothing allocation across the pools, and chunk moves between
// pools through the shared budget.
//
// A server (or kvpage's Scheduler) drives it once per step:
//
//   RequestHandle h = *manager.AddRequest({id, prompt, extras});   // once per request
//   manager.NewStep();                                // completes the last step if need be
//   CacheHit hit = *manager.GetComputedBlocks(h);     // before the first allocation only
//   bool ok = *manager.AllocateSlots(h, {.num_computed_tokens = hit.num_tokens,
//                                        .num_new_tokens = n, .hit = &hit});
//   ... block tables, slot mappings and state slots for the kernels; the forward pass ...
//   manager.CompleteStep();                           // the forward pass has run
//   manager.AppendTokens(h, sampled);                 // after the step
//   manager.Free(h);                                  // finished, aborted or preempted
//
// Prefix caching only serves what has been written. The full blocks a step fills, and the
// recurrent-state snapshot it writes, are pending until CompleteStep (or the next NewStep):
// only then can another request hit them. A request freed before that (aborted between
// scheduling and the forward pass, or preempted in the step that allocated for it) gives
// them back uncached, so no request is ever served K/V that was never computed. A second
// request with the same prompt admitted in the same step therefore computes it too (vllm
// accounting differs: see below).
//
// Host tier (KvCacheConfig::host_cache). Blocks the device cache holds are also kept in host
// memory, saved when written (write-through) or when evicted (write-back); a prompt whose
// prefix the device lost but the host kept is loaded back instead of recomputed. The manager
// only decides the copies; the server runs them:
//
//   if (*manager.LoadFromHost(h) > 0) ... keep h out of the batch while IsLoading(h) ...
//   TierTransfers t = manager.TakeTransfers();      // every step: run t.saves and t.loads
//   manager.CompleteTransfers(t.id);                // once they have run (or failed)
//
// Requests are named by the RequestHandle that AddRequest returns; the caller's RequestId stays
// for lookup (Find) and for error messages. A handle used after Free is detected (NotFound),
// never mistaken for the request that reuses its place.
//
// Decode steps. NextEvent(h) is the first computed-token count at which the manager must hear
// of the request again: a step of n tokens after c computed ones with c + n < NextEvent(h)
// needs no block, caches none and frees none, so a caller may skip AllocateSlots for it (it
// would return true and change nothing). AllocateDecodeStep applies that rule to a whole batch.
//
// Accounting modes:
//   * kKvpage — per-group pools, nothing padded, chunks shared through one budget, sliding
//     windows hold only the blocks they can reach, recurrent state in native dtypes with
//     prefix-cache snapshots cached separately.
//   * kVllm   — reserves what the vLLM release `vllm_version` would: one block-id space shared
//     by vLLM's equal-size groups (padding layers and page padding included), hybrid block
//     alignment, vLLM's null block, the release's linear-attention state blocks. For replaying
//     one trace under both. As vLLM does, it offers a full attention block to the prefix cache
//     when the block is allocated, so a request admitted later in the same step hits blocks
//     that step writes (and a request freed before its step ran leaves them cached): it models
//     vLLM's numbers, not a contract for kernels that may skip a step. vLLM 0.33 also caches a
//     linear-attention state at allocation, but does not start a request from one that a step
//     allocated since the last CompleteStep writes: a first AllocateSlots whose hit (counting
//     those states) would end on one returns false, so the request waits for the next step.
//
// Error handling: API misuse (unknown or stale handles, duplicate ids, tokens past
// max_model_len, inconsistent token counts) returns an absl::Status naming the value and
// changes nothing. Not having enough memory is not an error: AllocateSlots returns false and
// changes nothing. That includes a memory backing that refuses to map a chunk the budget has
// room for (a GPU out of memory): the backing is asked for every chunk a step needs before
// the step takes a block, so a refusal leaves every request and every used block as they
// were, and backing_status() says why. When the budget's free bytes held the step's chunks
// nothing else changes either; when idle chunks had to be given back to make room first,
// they stay given back (their cached blocks dropped, with kRemoved events) and the hit's
// blocks go back to the cache as most recently freed. Not thread-safe: one scheduler thread
// owns the manager.
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
#include "kvpage/memory_backing.h"
#include "kvpage/model_spec.h"
#include "kvpage/types.h"
#include "kvpage/vllm_version.h"

namespace kvpage {

enum class AccountingMode : uint8_t { kKvpage, kVllm };

// When a block reaches the host tier.
enum class HostTierPolicy : uint8_t {
  kWriteThrough,  // every full block, once per hash, when the step that wrote it completes
  kWriteBack,     // a cached block when device memory evicts it
};

// A prefix cache in host memory behind the device's (kvpage accounting): blocks the device
// cache evicts stay reachable through a load over PCIe instead of a recompute. Each pool gets
// a share of the budget in proportion to its device capacity, as slots of its block size.
struct HostCacheConfig {
  int64_t budget_bytes = 0;  // 0 = no host tier
  HostTierPolicy policy = HostTierPolicy::kWriteThrough;
  // Host memory behind the slots (a HostMemoryBacking, or the server's pinned memory). It is
  // reserved with the device's MemoryLayout, each pool's max_chunks set to the tier's, and
  // slot s of a pool is block id s in it. Null = accounting only. Must outlive the manager.
  MemoryBacking* backing = nullptr;
};
// The longest max_model_len a KvCacheManager takes (2^40 tokens), so that token and block
// counts (max_model_len + 1, a step's end plus its reserve) never overflow.
inline constexpr int64_t kMaxManagerModelLen = int64_t{1} << 40;

struct KvCacheConfig {
  AccountingMode mode = AccountingMode::kKvpage;
  VllmVersion vllm_version = kCurrentVllmVersion;  // the release vllm mode follows
  int64_t kv_budget_bytes = 0;   // memory for KV and state; required (> 0)
  int32_t block_size = 16;       // tokens per block (kvpage mode; vllm mode may enlarge it)
  std::optional<DType> kv_cache_dtype;  // attention KV; unset = the model dtype
  // 0 = the model's max_position_embeddings; at most kMaxManagerModelLen.
  int64_t max_model_len = 0;
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
  // Recurrent groups with prefix caching: snapshot the state whenever a step ends on a token
  // count that is a multiple of this many blocks (counted from the first token, not from the
  // end of the prompt). Prefill chunks ending on any block boundary within the prompt are
  // always snapshotted. 0 = no snapshots during decode.
  int32_t decode_snapshot_interval_blocks = 32;
  bool enable_kv_events = false;
  MemoryBacking* backing = nullptr;  // GPU backing; null = CPU accounting only
  HostCacheConfig host_cache;

  absl::Status Validate() const;
};

// Names a live request of one KvCacheManager, from AddRequest until Free. A copyable value;
// a default-constructed handle names no request.
class RequestHandle {
 public:
  RequestHandle() = default;
  bool valid() const { return slot_ >= 0; }
  friend bool operator==(RequestHandle, RequestHandle) = default;

 private:
  friend class KvCacheManager;
  RequestHandle(uint32_t manager, int32_t slot, uint32_t generation)
      : manager_(manager), slot_(slot), generation_(generation) {}
  uint32_t manager_ = 0;     // which KvCacheManager issued it (each has its own number)
  int32_t slot_ = -1;        // the request's place in the manager, reused after Free
  uint32_t generation_ = 0;  // how many requests held that place before
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
  // Models with recurrent state, prefix caching on. kvpage accounting: the leading prompt
  // tokens whose full-attention blocks the cache knows, cached or written by a step that has
  // not completed yet; >= num_tokens, block-aligned. Past num_tokens no state snapshot exists
  // (or its step is still running), so the prompt diverges from every other there. A prefill
  // chunk that ends at match_tokens snapshots the state exactly where the next request with
  // this prefix can resume (kvpage's Scheduler does so). Under vllm accounting: the longest
  // prefix one group serves alone, i.e. full attention's hit (vLLM's shared-prefix junction,
  // where its scheduler ends a chunk). Other models: num_tokens.
  int64_t match_tokens = 0;
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
  RequestHandle request;
  int64_t num_computed_tokens = 0;
  int64_t num_new_tokens = 1;
};

// One sampled token of a decode step (AppendDecodeTokens).
struct DecodeToken {
  RequestHandle request;
  int32_t token = 0;
};

// Recurrent-state slots of one request in one linear-attention group for the current step.
struct StateSlots {
  int32_t read_slot = -1;   // where the kernel reads the state before the step
  int32_t write_slot = -1;  // where it writes the state after the step (may equal read_slot)
};

struct SlotToZero {
  GroupId group;
  int32_t slot = -1;
};

// One block copied between device memory and the host tier: in every tensor of the group's
// pool (MemoryLayout), device block `device` and host slot `host` (block id `host` of the host
// backing's layout).
struct TierCopy {
  GroupId group;
  BlockId device;
  int32_t host = 0;
};

// Copies for the server to run (KvCacheManager::TakeTransfers), then report with
// CompleteTransfers(id).
//   * saves: device -> host. Write-through saves read blocks that stay held until the
//     transfer completes: run them any time (a copy stream beside the forward pass).
//     Write-back saves read blocks that were evicted to be reused: run them before the next
//     forward pass writes the cache.
//   * loads: host -> device, into blocks nobody reads until the transfer completes; the
//     requests waiting for them stay out of the batch until then.
// Within one transfer, run the saves before the loads: a load may write a block that a
// write-back save reads (evicted to make room for the load).
struct TierTransfers {
  uint64_t id = 0;  // 0 when there is nothing to run
  std::vector<TierCopy> saves;
  std::vector<TierCopy> loads;
  bool empty() const { return saves.empty() && loads.empty(); }
};

struct HostCacheStats {
  int64_t budget_bytes = 0;
  int64_t mapped_bytes = 0;      // host memory the tier has mapped (slots it touched)
  int64_t ready_blocks = 0;      // loadable slots
  int64_t saving_blocks = 0;     // saves not yet completed
  int64_t saves = 0;             // blocks saved (completed)
  int64_t loads = 0;             // blocks loaded (completed)
  int64_t failed_transfers = 0;  // blocks of transfers completed as failed
  int64_t evictions = 0;         // ready slots evicted for room
  int64_t loaded_tokens = 0;     // prompt tokens served by loads (LoadFromHost)
  int64_t saved_bytes = 0;
  int64_t loaded_bytes = 0;
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

namespace internal {
struct KvCacheManagerAccess;
}  // namespace internal

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
  // AlreadyExists for a live id; InvalidArgument for a negative id, an empty prompt, a
  // token id outside [0, vocab_size) (the model's; any id >= 0 when it is 0) or multimodal
  // items outside the prompt (BlockHashExtras::Validate); OutOfRange if the prompt exceeds
  // max_model_len.
  absl::StatusOr<RequestHandle> AddRequest(KvRequestSpec spec);
  // The live request with this id, if any.
  std::optional<RequestHandle> Find(RequestId id) const;
  // The id the request was added with. NotFound for a stale handle.
  absl::StatusOr<RequestId> Id(RequestHandle request) const;
  // Appends sampled (accepted) tokens. OutOfRange past max_model_len; InvalidArgument for a
  // token id outside [0, vocab_size), as AddRequest.
  absl::Status AppendTokens(RequestHandle request, absl::Span<const int32_t> tokens);
  // AppendTokens of one token for each entry (the sampled tokens of a decode step; a request
  // may appear more than once). All or nothing: errors as AppendTokens, for the first bad
  // entry, before anything changes.
  absl::Status AppendDecodeTokens(absl::Span<const DecodeToken> tokens);
  // Drops the last `num_tokens` generated tokens (e.g. rejected speculative tokens) and the
  // hashes of blocks they completed, so those blocks leave the prefix cache; the blocks stay
  // allocated for the next step. FailedPrecondition (nothing changed) when such a block is
  // shared with another request, when the model has linear-attention layers and the tokens
  // were computed (their state cannot be rewound), or when a sliding window has already freed
  // a block the window of the last kept token reads (rolling back only tokens of the current
  // step, as speculative decoding does, never meets this).
  absl::Status RollbackTokens(RequestHandle request, int64_t num_tokens);
  // Frees every block and slot of the request, last block first; the handle is then stale.
  absl::Status Free(RequestHandle request);
  // The request's tokens: prompt, then appended tokens. Valid until the next call that
  // changes the request.
  absl::StatusOr<absl::Span<const int32_t>> Tokens(RequestHandle request) const;
  int64_t num_requests() const;
  // Every per-request call returns NotFound, naming the handle, for a handle that names no
  // live request (default-constructed, from another manager, or used after Free).

  // ---- Steps -------------------------------------------------------------------------------
  // The step allocated since the last call has run: the K/V and recurrent state it writes are
  // in device memory (or its forward pass is queued, in stream order, before any work that
  // reads the cache next). Full blocks it filled join the prefix cache, each with a kStored
  // event, and each recurrent group's written state becomes the request's (with its snapshot
  // for the prefix cache). Call it after the forward pass and before freeing the requests the
  // step finished; a request freed while its step is pending caches nothing of that step
  // (see the top of this file). Idempotent; cheap when nothing is pending.
  void CompleteStep();
  // Marks the start of a scheduling step. Calls CompleteStep first: a server that only starts
  // a new step once the previous one has run may rely on it, but then the blocks of a request
  // it frees after the previous step are not cached.
  void NewStep();
  // Async scheduling: every step computing the request's first `num_tokens` tokens has run,
  // and those tokens are known (appended), so their full blocks join the prefix cache now
  // (vLLM's cache_blocks after an output arrives). A block whose last token was a placeholder
  // when its step was allocated is cached here, once the token is appended. Blocks of a later
  // step stay pending. InvalidArgument when num_tokens is outside [0, the request's tokens].
  absl::Status CacheComputedBlocks(RequestHandle request, int64_t num_tokens);
  // The longest prefix every group can serve, capped so the last token is recomputed.
  // FailedPrecondition once the request holds blocks.
  absl::StatusOr<CacheHit> GetComputedBlocks(RequestHandle request);
  // Finds blocks for the step's tokens in every group, all-or-nothing: true on success, false
  // (and nothing changed but out-of-window frees) when memory is short. Errors for misuse.
  // Once the request holds blocks, num_computed_tokens may move ahead of the last step the
  // manager saw as far as the blocks it holds reach (a caller skips quiet steps, see the top
  // of this file; past them it is InvalidArgument). It may go back before the start of that
  // step (a recompute after a failed KV load) under RollbackTokens' rules: FailedPrecondition
  // with linear-attention state, or when a sliding window has freed a block the window of
  // the first recomputed token reads. Nothing is checked about tokens in between: whether
  // their K/V was written is the caller's to know.
  absl::StatusOr<bool> AllocateSlots(RequestHandle request, const AllocationRequest& step);
  // AllocateSlots for many running requests at once, in order (no hits, no lookahead): the
  // decode step of a continuous batch. Steps that end before their request's NextEvent are
  // skipped; the others are allocated as AllocateSlots would. Returns k, the number of steps
  // served: steps [0, k) have their slots; step k did not fit and it and the ones after it are
  // unchanged. A stale handle anywhere is NotFound, and a request named twice InvalidArgument,
  // before anything changes; other errors as AllocateSlots (steps before a failing one keep
  // their slots).
  absl::StatusOr<int64_t> AllocateDecodeStep(absl::Span<const DecodeStep> steps);
  // The first computed-token count at which the manager must hear of the request again (see
  // the top of this file). At most max_model_len + 1; 0 before the first allocation and for
  // models with linear-attention state, whose every step moves a state slot. Holds until the
  // request is next allocated, rolled back, has skipped blocks removed, or is freed; appending
  // tokens does not move it.
  absl::StatusOr<int64_t> NextEvent(RequestHandle request) const;
  // The rule NextEvent states: a step of n tokens after c computed ones with c + n <
  // next_event needs nothing (written without overflow).
  static bool StepIsQuiet(int64_t next_event, int64_t c, int64_t n) { return n < next_event - c; }
  // Blocks (all pools together) AllocateSlots would need to take from the pools for this
  // step. Same arguments; changes nothing.
  absl::StatusOr<int64_t> BlocksNeeded(RequestHandle request, const AllocationRequest& step) const;
  // Frees sliding-window blocks that no token from `num_processed_tokens` on can reach.
  // InvalidArgument when the count is outside [0, the request's tokens].
  absl::Status RemoveSkippedBlocks(RequestHandle request, int64_t num_processed_tokens);

  // ---- What the model's layer kinds ask of a scheduler (each kind's group answers) ---------
  // RemoveSkippedBlocks can free blocks of a running request (a sliding window).
  bool frees_skipped_blocks() const;
  // RollbackTokens can drop tokens a request has computed (not with linear-attention state,
  // which every step overwrites): speculative decoding needs it.
  bool can_roll_back() const;
  // A prefill chunk should end on a multiple of this many tokens (or at
  // CacheHit::match_tokens), so that a later request with the same prefix can resume where it
  // ended (linear-attention state is kept at block boundaries, with prefix caching); 0 when any
  // end serves.
  int32_t prefill_alignment() const;
  // Bytes a request of `num_tokens` tokens holds at least, in the groups whose blocks grow
  // with every token (full attention, MLA): a lower bound on what it needs, computed without
  // building it. INT64_MAX when it overflows.
  int64_t MinBytesFor(int64_t num_tokens) const;

  // ---- What the kernels read ---------------------------------------------------------------
  int32_t num_groups() const;
  // For a group outside [0, num_groups()) the group_* accessors answer full attention and 0,
  // and FreeBlockOrder an empty list.
  LayerKind group_kind(GroupId group) const;
  // Tokens per block of an attention group; 0 for a linear-attention group, which holds one
  // state slot per request instead of blocks of tokens.
  int32_t group_block_size(GroupId group) const;
  // Sliding-window length in tokens (0 for other kinds).
  int32_t group_window(GroupId group) const;
  // The request's block table in an attention group (null blocks included). InvalidArgument
  // for a group that is not an attention group.
  absl::StatusOr<absl::Span<const BlockId>> BlockTable(RequestHandle request,
                                                       GroupId group) const;
  // The rules from a table to what the kernels read, used by FillBlockTableRow, FillSlotMapping
  // and the Scheduler's batch tables: manager block b is kernel blocks b·r … b·r + r − 1 (r =
  // group_block_size / kernel_block_size), and the token at position p, in table entry
  // p / block_size = b, has slot b·block_size + p % block_size.
  static int32_t KernelBlock(BlockId block, int32_t ratio, int32_t k) {
    return block.value * ratio + k;
  }
  static int64_t SlotOf(BlockId block, int64_t block_size, int64_t pos) {
    return int64_t{block.value} * block_size + pos % block_size;
  }
  // Writes the table as int32 kernel-block ids into `row` (padded with 0): each manager block b
  // expands to KernelBlock(b, r, 0 … r − 1) with r = group_block_size / kernel_block_size.
  // InvalidArgument if kernel_block_size does not divide the block size or the row is short.
  absl::Status FillBlockTableRow(RequestHandle request, GroupId group, int32_t kernel_block_size,
                                 absl::Span<int32_t> row) const;
  // SlotOf(block_table[pos / bs], bs, pos) for positions [start, start + out.size()).
  // InvalidArgument if a position has no block (or only the null block).
  absl::Status FillSlotMapping(RequestHandle request, GroupId group, int64_t start,
                               absl::Span<int64_t> out) const;
  // Read and write state slots of a linear-attention group for the current step.
  absl::StatusOr<StateSlots> GetStateSlots(RequestHandle request, GroupId group) const;
  // Newly allocated state slots to zero before the next forward pass. (No state is ever
  // copied: a prefix-cache snapshot is the slot a step wrote, read in place by the next one.)
  std::vector<SlotToZero> TakeSlotsToZero();

  // ---- Host tier (KvCacheConfig::host_cache) --------------------------------------------------
  // Before a request's first allocation, after GetComputedBlocks: when the host tier extends
  // the prefix the device serves, starts bringing it back. Holds the device blocks of the
  // longest prefix both tiers serve together, takes device blocks for its host blocks, queues
  // their loads (TakeTransfers) and returns the tokens they add; 0 when the host adds nothing,
  // device memory is short, or there is no tier. Until the loads complete, IsLoading is true
  // and AllocateSlots refuses the request (FailedPrecondition); then GetComputedBlocks serves
  // the whole prefix from device memory, held for the request until its first allocation or
  // Free. FailedPrecondition once the request holds blocks or while its loads are in flight.
  absl::StatusOr<int64_t> LoadFromHost(RequestHandle request);
  absl::StatusOr<bool> IsLoading(RequestHandle request) const;
  // The copies queued since the last call, under a new id (0 and empty when none).
  TierTransfers TakeTransfers();
  // The server has run transfers `id`. Saved slots become loadable (kStored events with
  // medium kHost) and loaded blocks join the device prefix cache. `succeeded` = false: the
  // copies did not happen (and never will): saved slots are dropped, loaded blocks freed
  // uncached, their requests compute the prefix instead. Either way every block the transfer
  // held is given back. NotFound for an id not taken or already completed.
  absl::Status CompleteTransfers(uint64_t id, bool succeeded = true);
  HostCacheStats host_cache_stats() const;

  // ---- Accounting --------------------------------------------------------------------------
  // The tokens a request with this prompt would be served from the prefix cache if it were
  // added and asked GetComputedBlocks now: the longest prefix every group can serve, capped so
  // the last token is recomputed; 0 with prefix caching off, or for extras AddRequest would
  // refuse (BlockHashExtras::Validate). Changes nothing (no request, no block, no
  // statistics): for a router comparing servers. O(prompt blocks).
  int64_t CachedPrefixTokens(absl::Span<const int32_t> prompt_tokens,
                             const BlockHashExtras& extras = {}) const;
  KvCacheUsage Usage() const;
  PrefixCacheStats prefix_cache_stats() const;
  std::vector<KvEvent> DrainEvents();
  // Drops the device prefix cache (the host tier keeps its copies). FailedPrecondition while
  // a block is in use: held by a request, a load, or a write-through save not completed.
  absl::Status ResetPrefixCache();
  // Gives every chunk with no used block back to the budget, and its memory back to the
  // backing, dropping the cached blocks it holds; returns the bytes the budget got back. For a
  // server trimming memory while idle (Scheduler::Create calls it after its probe).
  // Memory changes only between steps: while a step is pending (AllocateSlots or
  // AllocateDecodeStep ran since the last CompleteStep or NewStep), its slot mappings may point
  // into chunks that became idle since (a request aborted before the forward pass), so this
  // unmaps nothing and returns 0; the release happens at the next CompleteStep (or NewStep).
  int64_t ReleaseIdleChunks();
  // Removes one block from the prefix cache (a KV connector found its data invalid, or a test
  // shapes the cache). Holders keep the block. InvalidArgument for an unknown group or id.
  absl::Status EvictCachedBlock(GroupId group, BlockId block);
  // The order in which the pool behind `group` would hand out its free blocks: clean blocks
  // first (fullest chunk first), the blocks of chunks the budget could still map, then cached
  // blocks least recently freed first (BlockPool::FreeOrder). Before the first allocation under
  // vllm accounting: every block id, 1 up, as in vLLM's free queue. For tests and debugging;
  // O(pool size).
  std::vector<BlockId> FreeBlockOrder(GroupId group) const;
  // Checks every pool and every request's tables against the pools' reference counts.
  absl::Status CheckInvariants() const;
  // The most recent error the memory backing (KvCacheConfig::backing) returned: a refused
  // map (AllocateSlots then returned false) or a failed unmap. OK when it never failed (and
  // always without a backing). The status the backing gave, unchanged.
  absl::Status backing_status() const;
  const KvCacheConfig& config() const;

 private:
  class Impl;
  friend struct internal::KvCacheManagerAccess;  // the library's own sources name Impl by it

  explicit KvCacheManager(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvpage

#endif  // KVPAGE_KV_CACHE_MANAGER_H_
