// Scheduler: continuous batching on top of the KvCacheManager, as vLLM v1's scheduler does it.
//
// A server hands the scheduler its requests and, every step, asks what to run:
//
//   auto scheduler = *Scheduler::Create(model, config);
//   scheduler->AddRequest({.id = id, .prompt_token_ids = prompt, .max_new_tokens = 256});
//   while (scheduler->HasUnfinishedRequests()) {
//     const SchedulerOutput& out = scheduler->Schedule();
//     ... run out.transfers (host tier), upload the step (kvpage/step_image.h), zero
//         out.slots_to_zero, then the forward pass on out.attention[a] (block_table,
//         slot_mapping), out.states[s] (read/write slots), out.seq_lens, out.query_start_loc ...
//     ModelOutput result = ...;   // the tokens of each request with samples = true
//     auto step = scheduler->Update(out, result);   // finished requests, step stats
//   }
//
// There are no prefill and decode phases: every request has tokens computed and tokens still
// to compute, and one token budget per step (max_num_batched_tokens) covers prompt chunks,
// decode tokens and draft tokens alike (vLLM v1's model). Running requests are served first,
// in queue order; then waiting ones, if the step preempted nobody, while max_num_seqs, the
// budget, max_loras and the KV cache allow (reserve_full_prompt, watermark). A waiting request
// starts from its prefix-cache hit; one the host tier extends waits outside the queue for its
// loads (SchedulerOutput::transfers, CompleteTransfers). When the KV cache runs out, the
// scheduler preempts by recompute: FCFS takes the last running request, priority the worst
// (highest priority value, latest arrival). Preempted requests go back to the front of the
// waiting queue and usually resume from the prefix cache. Update ends requests on a stop
// token, max_new_tokens or max_model_len; Abort and Finish end them from outside.
//
// Batch layout. The scheduler keeps one row per running request in block tables that it
// updates in place (only new blocks are written), so a decode step costs O(requests), not
// O(context), and reports the entries that changed as table runs, so a server patches a
// device copy with O(changes) bytes. Rows are dense: when a request leaves, the last row
// moves into its place (reported in `row_moves`). Rows of running requests not scheduled this
// step have zero query tokens and a sequence length of 0; kernels skip them.
//
// Time and randomness are the caller's: the scheduler reads no clock (arrival times come with
// the requests) and draws no random numbers. Not thread-safe: one thread drives it.
#ifndef KVPAGE_SCHEDULER_H_
#define KVPAGE_SCHEDULER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kvpage/kv_cache_manager.h"
#include "kvpage/model_spec.h"
#include "kvpage/types.h"

namespace kvpage {

enum class SchedulingPolicy : uint8_t { kFcfs, kPriority };

// The longest max_model_len a scheduler takes (2^30 tokens): the batch's sequence lengths and
// query offsets are int32, as the kernels read them.
inline constexpr int64_t kMaxSchedulerModelLen = int64_t{1} << 30;

// Field names and defaults follow vLLM's engine arguments where the concept is the same.
struct SchedulerConfig {
  // The KV cache. Its max_num_batched_tokens and max_model_len are overwritten with the
  // scheduler's below.
  KvCacheConfig kv;
  int32_t max_num_batched_tokens = 8192;  // token budget of one step
  int32_t max_num_seqs = 256;             // running requests at most
  // 0 = the model's max_position_embeddings (at most kMaxSchedulerModelLen), lowered to the
  // longest request the KV cache can hold on its own; an explicit value that does not fit,
  // or exceeds kMaxSchedulerModelLen, is an error (such a request could never run).
  int64_t max_model_len = 0;
  // Off: a prompt runs in one step, so max_model_len may not exceed max_num_batched_tokens
  // (an explicit one that does is an error; the model's own is lowered to it).
  bool enable_chunked_prefill = true;
  // A request computes at most this many prompt tokens per step (0 = no cap): long prompts
  // then share the budget instead of filling it.
  int32_t long_prefill_token_threshold = 0;
  SchedulingPolicy policy = SchedulingPolicy::kFcfs;
  // Admit a waiting request only if its whole prompt fits in the KV cache now (vLLM's
  // scheduler_reserve_full_isl): no admission that would preempt itself later.
  bool reserve_full_prompt = true;
  // Admit only while KV usage stays at or below 1 − watermark after the admission.
  double watermark = 0.0;
  // Draft tokens per request and step (speculative decoding); the server proposes them in
  // ModelOutput. Not supported with linear-attention layers (their state cannot roll back).
  int32_t num_speculative_tokens = 0;
  // Block size of the kernels' block tables; 0 = the cache's. Must divide every attention
  // group's block size.
  int32_t kernel_block_size = 0;
  // LoRA adapters in one batch at most (vLLM's --max-loras; 0 = no limit). The adapters of
  // running requests count, scheduled this step or not; a waiting request with another
  // adapter is passed over, keeping its place, and those behind it may start.
  int32_t max_loras = 0;
  // CUDA graphs (vLLM's cudagraph_capture_sizes, one list per dimension): each step is padded
  // up to the first row count (per-row arrays) and the first token count (slot mappings) at
  // or above its own, with inert padding, so the server replays the graph it captured for
  // that pair (SchedulerOutput::padded). A step above the largest size of either list is not
  // padded (run it eagerly). Strictly increasing and positive; rows at most max_num_seqs,
  // tokens at most max_num_batched_tokens. Empty: that dimension is never padded.
  std::vector<int32_t> cuda_graph_row_sizes;
  std::vector<int32_t> cuda_graph_token_sizes;
  // Async scheduling (vLLM's AsyncScheduler): Schedule() may run once more before the
  // previous output's Update(), each running request assumed to sample its token (an output
  // placeholder). See "Async scheduling" at Scheduler. Not with num_speculative_tokens > 0.
  bool async_scheduling = false;

  absl::Status Validate() const;
};

struct RequestSpec {
  RequestId id;
  std::vector<int32_t> prompt_token_ids;
  int32_t max_new_tokens = 16;
  std::vector<int32_t> stop_token_ids;  // any of them ends the request (and is output)
  int32_t priority = 0;                 // lower runs first (priority policy)
  double arrival_time = 0;              // seconds, the caller's clock
  std::string cache_salt;               // requests with different salts never share blocks
  int64_t lora_id = 0;                  // 0 = none
  // Images and other multimodal inputs behind placeholder tokens of the prompt: sorted by
  // offset, apart, inside the prompt, non-empty identifiers (BlockHashExtras::Validate). A
  // block shares KV only with blocks of the same items at the same places.
  std::vector<MultimodalItem> mm_items;
  // Never read the prefix cache (prompt logprobs need every position computed); the
  // request's blocks are still cached for others.
  bool skip_prefix_cache_read = false;
};

enum class FinishReason : uint8_t { kStop, kLength, kMaxModelLen, kAborted };
absl::string_view FinishReasonName(FinishReason reason);

// One request in this step's batch.
struct ScheduledRequest {
  RequestId id;
  int64_t num_computed_tokens = 0;  // before this step
  int32_t row = -1;                 // its row in every table of the step
  int32_t num_scheduled_tokens = 0; // drafts included
  int32_t num_draft_tokens = 0;     // the last num_draft_tokens scheduled tokens are drafts
  bool is_new = false;              // first step since admission (or resumption)
  bool resumed = false;             // is_new after a preemption: outputs so far are recomputed
  bool samples = false;             // the step ends at the request's last known token
};
static_assert(sizeof(ScheduledRequest) == 32, "two to a cache line");

// Entries [first, first + count) of one row of a block table take the values
// AttentionBatch::table_values[value_offset, value_offset + count).
struct TableRun {
  int32_t row = 0;
  int32_t first = 0;
  int32_t count = 0;
  int32_t value_offset = 0;
};

// An attention group's part of the batch.
struct AttentionBatch {
  GroupId group;
  LayerKind kind = LayerKind::kFullAttention;
  int32_t kernel_block_size = 0;
  int32_t window = 0;             // sliding window in tokens, 0 otherwise
  int32_t max_blocks_per_row = 0; // row stride of block_table
  // int32 [num_padded_rows, max_blocks_per_row] kernel-block ids, 0 past a request's blocks
  // and where a sliding window released a block. Owned by the scheduler; valid until the next
  // call.
  absl::Span<const int32_t> block_table;
  // int64 [num_padded_tokens]: slot = block · kernel_block_size + offset of each new token
  // (in scheduled-request order, drafts included; -1 for padding).
  std::vector<int64_t> slot_mapping;
  // Every entry of block_table that changed since the previous output (new blocks, released
  // blocks, rows moved or freed), as runs of one row each. Applied in order to a copy that
  // started as zeros and saw every earlier output's runs, they give block_table: a server
  // keeps the table on the device and patches it with O(changed entries) bytes per step
  // (kvpage::cuda::DeviceStepTables does; kvpage::ApplyTableRuns on the host).
  std::vector<TableRun> table_runs;
  std::vector<int32_t> table_values;
};

// Applies `batch`'s table runs to a host copy of its block table ([rows, max_blocks_per_row],
// zeros at first). InvalidArgument if a run falls outside `table`.
absl::Status ApplyTableRuns(const AttentionBatch& batch, absl::Span<int32_t> table);

// A linear-attention group's part of the batch: where each row reads and writes its state.
struct StateBatch {
  GroupId group;
  std::vector<int32_t> read_slots;   // [num_padded_rows], -1 for rows not scheduled
  std::vector<int32_t> write_slots;  // [num_padded_rows]
};

struct SchedulerOutput {
  uint64_t step = 0;
  std::vector<ScheduledRequest> requests;  // this step's batch, in query order
  int64_t total_num_scheduled_tokens = 0;
  int32_t num_rows = 0;                    // running requests, scheduled or not
  // CUDA-graph padding (SchedulerConfig::cuda_graph_row_sizes / _token_sizes). The per-row
  // arrays (query_start_loc, seq_lens, block_table rows, state slots) hold num_padded_rows
  // rows and the slot mappings num_padded_tokens tokens. Padded rows have no query tokens
  // (query_start_loc stays at total_num_scheduled_tokens), seq_len 0, state slots -1 and
  // all-zero table rows; padded tokens have slot -1. Kernels skip all of it. `padded`: both
  // fit a configured size (or their list is empty) and the step is laid out for the graph of
  // (num_padded_rows, num_padded_tokens); otherwise the counts equal num_rows and
  // total_num_scheduled_tokens.
  bool padded = false;
  int32_t num_padded_rows = 0;
  int32_t num_padded_tokens = 0;
  // Per row: query start offsets [num_padded_rows + 1] and sequence lengths after the step
  // (0 for rows not scheduled).
  std::vector<int32_t> query_start_loc;
  std::vector<int32_t> seq_lens;
  std::vector<AttentionBatch> attention;
  std::vector<StateBatch> states;
  // State slots newly given to a request: zero them before the forward pass. (State is never
  // copied: a step reads its request's latest state, or a prefix-cache snapshot, in place.)
  std::vector<SlotToZero> slots_to_zero;
  // Copies between device memory and the host tier (config.kv.host_cache; TierTransfers says
  // when each kind runs), to report with Scheduler::CompleteTransfers(transfers.id). Requests
  // waiting for their loads are not in this batch.
  TierTransfers transfers;
  // Rows that moved since the last step (a request left and the last row filled its place).
  std::vector<std::pair<int32_t, int32_t>> row_moves;  // (from, to)
  std::vector<RequestId> finished_ids;    // finished or aborted since the last step
  std::vector<RequestId> preempted_ids;   // preempted in this step
  // Every scheduled request samples exactly one token (each has samples = true, and
  // speculative decoding is off), as in a step of plain decoding: ModelOutput::sampled_offsets
  // may be left empty.
  bool one_sample_each = false;
};

// What the forward pass produced, aligned with SchedulerOutput::requests.
struct ModelOutput {
  // Sampled tokens of request i: sampled_token_ids[offsets[i] .. offsets[i + 1]). A request
  // with samples = false gets none; otherwise 1 + the number of accepted drafts.
  std::vector<int32_t> sampled_token_ids;
  // [num_scheduled + 1]. May be empty when no request samples, or when the output's
  // one_sample_each is set and sampled_token_ids holds one token per request, in order (the
  // offsets would be 0, 1, …, n: a server need not write them, nor Update check them).
  std::vector<int32_t> sampled_offsets;
  // Drafts proposed for the next step (speculative decoding), same CSR layout; may be empty.
  std::vector<int32_t> draft_token_ids;
  std::vector<int32_t> draft_offsets;
};

struct FinishedRequest {
  RequestId id;
  FinishReason reason = FinishReason::kStop;
  int32_t num_output_tokens = 0;
  // Prompt tokens the prefix cache (device or host tier) served at the request's first
  // admission (vLLM's num_cached_tokens); 0 if it never ran.
  int64_t num_cached_tokens = 0;
};

struct StepStats {
  int32_t num_running = 0;
  int32_t num_waiting = 0;
  int64_t num_scheduled_tokens = 0;
  int32_t num_preempted = 0;
  int64_t num_accepted_drafts = 0;
  int64_t num_rejected_drafts = 0;
};

struct UpdateResult {
  std::vector<FinishedRequest> finished;
  StepStats stats;
};

// Lifetime counters.
struct SchedulerStats {
  uint64_t steps = 0;
  int64_t preemptions = 0;
  int64_t finished = 0;
  int64_t aborted = 0;
  // Prompt tokens of admitted requests and how many of them the prefix cache served, counted
  // once per request at its first admission (the KV cache's own stats count every lookup,
  // including those of a request that then had to wait).
  int64_t admitted_prompt_tokens = 0;
  int64_t prefix_hit_tokens = 0;
  // Of prefix_hit_tokens, those loaded back from the host tier first.
  int64_t host_hit_tokens = 0;
};

// Async scheduling (SchedulerConfig::async_scheduling) hides scheduling and output processing
// behind the forward pass, as vLLM's AsyncScheduler does: the server schedules step N + 1 while
// step N runs, then applies step N's tokens.
//
//   const SchedulerOutput* in_flight = nullptr;
//   while (scheduler->HasUnfinishedRequests() || in_flight != nullptr) {
//     const SchedulerOutput* next = nullptr;
//     if (scheduler->HasUnfinishedRequests()) {
//       next = &scheduler->Schedule();
//       ... queue next's forward pass; a placeholder's input is the token step N samples ...
//     }
//     if (in_flight != nullptr) scheduler->Update(*in_flight, TokensOf(*in_flight));
//     in_flight = next;
//   }
//
// * One output may await Update when Schedule is called; with two outstanding, Schedule
//   returns the latest again. Update takes every output, in order (FailedPrecondition
//   otherwise); the one before the latest stays valid until then, except its block_table,
//   which reads the live tables: copy it before calling Schedule again.
// * A request that samples in an output not yet applied is assumed to produce its token (an
//   output placeholder): Schedule gives it its next step, at that token's position. It is
//   not scheduled again when that token will end it by length (max_new_tokens, max_model_len).
// * Update(N) reconciles what a step later knows: a request that stops (stop token, length)
//   or that the server aborts or finishes leaves at once, and the tokens sampled for it in
//   the step after are dropped (Update takes them or none). A request preempted by step N + 1
//   keeps the tokens step N samples for it: they join its outputs (and may end it), and it
//   recomputes them when it resumes.
// * KV cache: Schedule completes the previous step in the cache (KvCacheManager::NewStep), so
//   the server must have queued that step's forward pass, in stream order, before calling
//   Schedule again. A block is hashed only once every token in it is known, so a placeholder
//   never enters the prefix cache: the block it completes is cached by the Update that
//   applies the step writing it (KvCacheManager::CacheComputedBlocks). Sliding windows keep
//   the blocks steps in flight read.
// * Not with speculative decoding (Create refuses num_speculative_tokens > 0).
class Scheduler {
 public:
  // InvalidArgument naming the field for a bad config (or one the model cannot run, such as
  // drafts with linear-attention layers); the KV cache's errors otherwise.
  static absl::StatusOr<std::unique_ptr<Scheduler>> Create(const ModelSpec& model,
                                                           const SchedulerConfig& config);
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues a request. AlreadyExists for a live id; InvalidArgument for an empty prompt, a
  // token id outside [0, vocab_size) (the model's; any id >= 0 when it is 0), max_new_tokens
  // < 1 or an arrival_time that is NaN or infinite (it orders the priority queue);
  // OutOfRange when the prompt leaves no room for one output token under max_model_len.
  absl::Status AddRequest(RequestSpec spec);
  // Removes a waiting or running request and frees its blocks at once. NotFound if unknown
  // (or already finished). Between Schedule and Update the latest output stays as it was
  // (its block tables then read a copy), so the server may run it as planned. It may also
  // skip the aborted request's part: under kKvpage accounting nothing that step fills becomes
  // a prefix hit (KvCacheManager::CompleteStep). Under kVllm accounting blocks are cached when
  // allocated, so a request admitted in the same step may read them: run it.
  absl::Status Abort(RequestId id);
  // Ends a waiting or running request for a reason the server found (a stop string, a
  // client gone: kStop, kAborted, ...) at once, as Abort does (same rules between Schedule
  // and Update), but counted as finished (kAborted counts as an abort) and answered with its
  // FinishedRequest. NotFound if unknown or already finished.
  absl::StatusOr<FinishedRequest> Finish(RequestId id, FinishReason reason);

  // Decides the next step. The returned output lives in the scheduler until the next call
  // (async scheduling: until its Update). While the latest output has not been through Update
  // (async: nor the one before it), Schedule returns it again unchanged: a step is scheduled
  // once and applied once.
  const SchedulerOutput& Schedule();
  // Applies the step's results: appends sampled tokens, rolls back rejected drafts, finishes
  // requests (stop token, max_new_tokens, max_model_len) and frees their blocks. A request
  // aborted since Schedule may be given its tokens or none; they are dropped.
  // InvalidArgument (nothing changed) when `result` does not match `output` (sizes, a token
  // for a request that does not sample, more tokens than drafts + 1, token ids outside
  // [0, vocab_size), drafts when num_speculative_tokens is 0);
  // FailedPrecondition when `output` is not the oldest Schedule() output not yet applied
  // (synchronous scheduling: the latest).
  absl::StatusOr<UpdateResult> Update(const SchedulerOutput& output, const ModelOutput& result);

  // Host tier: the transfers of an output (SchedulerOutput::transfers.id) have run, or
  // failed (`succeeded` = false: their requests compute the prefix instead). Requests whose
  // loads they finish return to the waiting queue in their place. NotFound for an unknown
  // or completed id. A request whose loads never complete waits until this call or Abort.
  absl::Status CompleteTransfers(uint64_t id, bool succeeded = true);

  bool HasUnfinishedRequests() const;
  int32_t num_running() const;
  // Waiting requests, those loading from the host tier included.
  int32_t num_waiting() const;
  const SchedulerStats& stats() const;
  // The KV cache, for reading (usage, tables, statistics). Its events are drained through
  // DrainKvEvents, the one call that changes it from outside.
  const KvCacheManager& kv_cache() const;
  // KvCacheManager::DrainEvents: the KV events since the last call, oldest first (empty
  // unless config.kv.enable_kv_events). A server that enables events must drain them, or
  // they accumulate.
  std::vector<KvEvent> DrainKvEvents();
  // KvCacheManager::ReleaseIdleChunks: gives the cache's chunks with no used block back to
  // the budget and their memory to the backing (prefix-cached blocks in them are dropped);
  // returns the bytes given back. For a server trimming memory while idle. Between Schedule and
  // Update the step's tables may point into idle chunks (a request aborted before the forward
  // pass): then nothing is released and it returns 0; Update releases them.
  int64_t ReleaseIdleChunks();
  const SchedulerConfig& config() const;
  int64_t max_model_len() const;  // in effect (see SchedulerConfig::max_model_len)
  // Every running request's table row matches the manager's, rows are dense, queues hold each
  // live request once, and the KV cache's own invariants hold.
  absl::Status CheckInvariants() const;

 private:
  class Impl;

  explicit Scheduler(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvpage

#endif  // KVPAGE_SCHEDULER_H_
