// Scheduler::Impl, shared by the scheduler's source files (internal).
//
//   scheduler.cc     public API: requests, queues, Update, invariants
//   schedule.cc      Schedule(): the running pass, the waiting pass, preemption, the output
//   batch_tables.cc  the persistent device-ready rows (block tables, slot mappings)
//   graph_padding.cc the output padded to CUDA-graph sizes
//
// The scheduler decides nothing about memory on its own: it asks the KvCacheManager, and keeps
// one number from it per request, NextEvent, to know when a decode step changes nothing in the
// cache (so the step need not be sent to it, the request's row is still current and no window
// block is due for release).
#ifndef KVPAGE_SCHEDULER_SCHEDULER_IMPL_H_
#define KVPAGE_SCHEDULER_SCHEDULER_IMPL_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "kvpage/kv_cache_manager.h"
#include "kvpage/scheduler.h"

namespace kvpage {

namespace internal {

// InvalidArgument naming `name`[i] unless `sizes` is strictly increasing within [1, limit].
absl::Status ValidateCaptureSizes(absl::string_view name, absl::Span<const int32_t> sizes,
                                  absl::string_view limit_name, int32_t limit);
// The first of `sizes` (sorted) at or above n; n itself when `sizes` is empty; -1 when n is
// above them all.
int32_t PaddedSize(absl::Span<const int32_t> sizes, int32_t n);

// kLoading: out of the waiting queue while its prefix loads from the host tier.
enum class RequestStatus : uint8_t { kFree, kWaiting, kRunning, kLoading };

// How far a request's row copies the manager's table in one attention group.
struct RowSync {
  int32_t blocks = 0;    // manager blocks copied
  int32_t released = 0;  // leading null blocks (released by a sliding window) copied
  // The slot of a position p in the row's last block (from (blocks − 1) · block_size on) is
  // p + last_block_offset: a decode step, whose token is almost always there, reads no table.
  int64_t last_block_offset = 0;
};

// One request as the scheduler sees it. Lives in Scheduler::Impl::reqs at a dense index that
// is reused once the request is gone. What a decode step reads and writes comes first: the
// first cache line holds all that scheduling it and building its row touch.
struct alignas(64) SchedRequest {
  RequestHandle kv;  // in the KV cache, while in_manager
  int32_t row = -1;  // its row in the batch tables (-1 when not running)
  // Tokens whose K/V is computed, counting this step's once it is scheduled (drafts included
  // until Update rejects them).
  int64_t num_computed = 0;
  int64_t num_tokens = 0;  // prompt + output tokens
  // The KV cache's NextEvent, read after each call that may change the request's tables: a
  // step ending before it changed nothing there.
  int64_t next_event = 0;
  uint64_t scheduled_step = 0;       // the step it was last scheduled in
  int32_t num_scheduled = 0;         // this step's tokens
  int32_t num_scheduled_drafts = 0;  // of which drafts
  int32_t num_drafts = 0;            // drafts the server proposed for the next step
  bool row_stale = false;  // the cache's tables changed since the row was copied
  bool fresh = false;      // admitted or resumed and not yet reported as new
  bool resumed = false;
  bool has_stop_tokens = false;
  // ---- The second line.
  RequestId id;
  // The token count at which the request finishes by length: min(prompt_len +
  // max_new_tokens, max_model_len).
  int64_t length_limit = 0;
  RequestStatus status = RequestStatus::kFree;
  bool in_manager = false;  // the KV cache holds the request (running, or at the head of the
                            // queue after a failed admission)
  uint64_t visited_step = 0;  // the step whose running pass considered it and scheduled nothing
  // Async scheduling: tokens of outputs not yet through Update, and the output tokens those
  // steps will sample (vLLM's num_output_placeholders; tokens past num_tokens that are already
  // scheduled). Both 0 between steps under synchronous scheduling.
  int64_t num_in_flight = 0;
  int32_t num_placeholders = 0;

  // ---- Cold.
  // Prompt, then every output token: held here only while the KV cache does not hold the
  // request (it moves in at admission and is copied back out at preemption).
  std::vector<int32_t> tokens;
  std::vector<int32_t> stop_token_ids;
  int64_t prompt_len = 0;
  int32_t max_new_tokens = 0;
  int32_t priority = 0;
  int32_t num_preemptions = 0;
  // A prefill chunk ends here when it would cross it (CacheHit::match_tokens at admission):
  // where the prompt diverges from what the cache knows (vllm accounting: where full
  // attention's hit ends), so a chunk that must align (AlignedChunk) ends there. 0 = none.
  int64_t chunk_stop = 0;
  int64_t loaded_tokens = 0;  // prompt tokens its last host-tier load brought back
  int64_t num_cached_tokens = -1;  // prefix-hit tokens at its first admission (-1 before)
  bool host_load_failed = false;  // a load failed: it computes its prefix instead
  double arrival_time = 0;
  uint64_t seq = 0;  // order of AddRequest: the last tie-break
  int64_t queue_key = 0;  // FCFS: place in the waiting queue (Scheduler::Impl::PushWaiting)
  std::string cache_salt;
  int64_t lora_id = 0;
  std::vector<MultimodalItem> mm_items;
  bool skip_prefix_cache_read = false;

  int64_t NumOutput() const { return num_tokens - prompt_len; }
  // A step of n more tokens would change nothing in the KV cache (KvCacheManager::NextEvent).
  bool QuietStep(int64_t n) const {
    return KvCacheManager::StepIsQuiet(next_event, num_computed, n);
  }
  // A plain decode step: one known token, no drafts.
  bool PlainDecode() const { return num_tokens - num_computed == 1 && num_drafts == 0; }
  // Tokens whose steps have run (Update applied them): what a sliding window may release up to.
  int64_t NumProcessed() const { return num_computed - num_in_flight; }
};

// Orders the priority queue: lower priority value, then earlier arrival, then earlier add.
struct PriorityLess {
  const std::vector<SchedRequest>* reqs;
  bool operator()(int32_t a, int32_t b) const;  // true if a runs after b (a max-heap on "worse")
};

// Orders the waiting queue, first admitted first: FCFS by queue_key, priority by PriorityLess.
struct WaitingOrder {
  const std::vector<SchedRequest>* reqs;
  bool fcfs;
  bool operator()(int32_t a, int32_t b) const {
    return fcfs ? (*reqs)[a].queue_key < (*reqs)[b].queue_key : PriorityLess{reqs}(b, a);
  }
};

}  // namespace internal

class Scheduler::Impl {
 public:
  // ---- Construction (scheduler.cc) ----
  static absl::StatusOr<std::unique_ptr<Impl>> Build(const ModelSpec& model,
                                                     const SchedulerConfig& config);
  // Lowers max_model_len to the longest request the KV cache can hold on its own, or fails
  // when the length was set explicitly (a request that long could never run).
  absl::Status FitMaxModelLen(bool explicit_len);
  bool RequestFits(int64_t len);
  // Takes the host-tier transfers queued so far and completes them as failed (the probe's).
  void DropTransfers();
  // The backing's refusal a probe met (KvCacheManager::backing_status), with the probe named;
  // OK when it refused nothing (scheduler_checks.cc).
  absl::Status ProbeBackingStatus() const;
  // InvalidArgument naming the request that proposes more drafts than num_speculative_tokens
  // (scheduler_checks.cc).
  absl::Status CheckDraftCounts(const SchedulerOutput& output, const ModelOutput& result) const;

  // ---- Queues (scheduler.cc) ----
  // FCFS puts a request at the back, or at the front (a preempted one; the latest first);
  // priority order ignores `front`.
  void PushWaiting(int32_t q, bool front);
  // Frees the request's blocks and row and drops it from `running` (order kept).
  void LeaveRunning(int32_t q);
  // Points the latest output's block tables at copies (frozen_tables) that row moves leave
  // alone.
  void FreezeOutputTables();
  void Release(int32_t q);  // the index can be reused
  // Drops the request from the KV cache (blocks and all), keeping its tokens here.
  void FreeKeepingTokens(int32_t q);

  // ---- Schedule (schedule.cc) ----
  // Frees the blocks every running request's sliding windows have moved past.
  void ReleaseOutOfWindowBlocks();
  void ScheduleRunning(int64_t& budget);
  // Schedules the plain decode steps of running[i], running[i + 1], …, passing those that
  // reach their next event to one AllocateDecodeStep call; returns the index of the first
  // request it did not take.
  size_t ScheduleDecodeRun(size_t i, int64_t& budget);
  // Prompt tokens (after this step) that running requests still have to compute.
  int64_t RunningPromptTokensLeft() const;
  // The cache's usage is above 1 − watermark.
  bool OverWatermark() const;
  void ScheduleWaiting(int64_t& budget);
  // Adds waiting request q to the KV cache (if it is not there) and asks for its prefix hit.
  CacheHit Admit(internal::SchedRequest& r);
  // Allocates the first step of waiting request q. False, with no
  // blocks kept, when memory is short or the cache would end over the watermark.
  bool AllocateAdmission(int32_t q, const AllocationRequest& req);
  // LoRA adapters of the running requests, scheduled this step or not (vLLM's rule), into
  // batch_loras; nothing when config.max_loras is 0.
  void CollectBatchLoras();
  // A request with this adapter may join the batch under config.max_loras.
  bool LoraFits(int64_t lora_id) const;
  // Moves waiting request q to running with its first step of n tokens after a hit of
  // `hit_tokens`.
  void StartRunning(int32_t q, int64_t hit_tokens, int32_t n, int64_t& budget);
  // Starts loading waiting request q's prefix from the host tier if that extends its hit;
  // it then leaves the queue for `loading`. Returns whether it did.
  bool StartLoad(int32_t q);
  // Allocates a running request's step through AllocateSlots, preempting others when memory
  // is short. False when the request itself was preempted.
  bool AllocateOrPreempt(int32_t q, int32_t n, int64_t& budget);
  // The victim for the next preemption: FCFS the last running request, priority the worst.
  int32_t PickVictim() const;
  void Preempt(int32_t victim, int64_t& budget);
  // Request q computes n tokens (the last `drafts` of them drafts) this step.
  void RecordScheduled(int32_t q, int32_t n, int32_t drafts, int64_t& budget);
  void MarkScheduled(internal::SchedRequest& r, int32_t n, int32_t drafts);  // counts only
  void UnmarkScheduled(internal::SchedRequest& r);  // undoes MarkScheduled
  bool Visited(const internal::SchedRequest& r) const {
    return r.scheduled_step == step || r.visited_step == step;
  }
  // Reads the KV cache's NextEvent for r after a call that may have changed its tables.
  void RefreshNextEvent(internal::SchedRequest& r);
  // Tokens request r would compute this step within the budget (prompt chunking rules).
  int32_t TokensToSchedule(const internal::SchedRequest& r, int64_t budget) const;
  // When the cache asks for aligned chunks (prefill_alignment > 0: recurrent state with prefix
  // caching): how much of an n-token prefill chunk to run so that it ends where later
  // requests can resume. kvpage accounting ends it at chunk_stop or the last aligned boundary
  // it reaches; vllm accounting follows vLLM's block-aligned split, which may leave 0 tokens
  // (the request waits for more budget).
  int64_t AlignedChunk(const internal::SchedRequest& r, int64_t n) const;
  // Fills `out` for the requests in `scheduled`, which compute `total_tokens` tokens in all.
  void BuildOutput(int64_t total_tokens);
  // Pads the built output to the configured CUDA-graph sizes (SchedulerOutput::padded).
  void PadForCudaGraph();
  // Writes request r's entry `sr` of the output and its row's sequence length (after its row
  // is synced). Returns its token count.
  int32_t WriteRow(internal::SchedRequest& r, size_t row, ScheduledRequest& sr);
  struct GroupInfo;
  // Writes one attention group's slot mapping for every scheduled request (after WriteRow).
  void WriteSlots(const GroupInfo& g, AttentionBatch& batch);

  // ---- Update (scheduler.cc) ----
  // `indices`: the output's request indices (scheduled or prev_scheduled).
  absl::Status CheckModelOutput(const SchedulerOutput& output, const ModelOutput& result,
                                absl::Span<const int32_t> indices) const;
  // Applies the checked samples: tokens to the KV cache, finished requests out.
  void ApplySamples(const SchedulerOutput& output, const ModelOutput& result,
                    absl::Span<const int32_t> indices, UpdateResult& update);
  // Async scheduling: the tokens an output sampled for request q after a later Schedule
  // preempted it (vLLM's stale output): appended to its tokens, which they may end.
  void ApplyStaleSamples(int32_t q, const int32_t* sampled, int32_t k, UpdateResult& update);
  // Request q finished: report it, free its blocks and row, release its index.
  void Finish(int32_t q, FinishReason reason, UpdateResult& update);
  // Async scheduling: request q leaves while outputs are not through Update: they drop
  // whatever the server samples for it.
  void ForgetInOutputs(int32_t q);
  // Outputs Schedule returned that Update has not applied yet (at most 1, or 2 with async).
  uint64_t outstanding() const { return step - applied_step; }
  SchedulerOutput& Out() { return outputs[cur]; }
  // Takes a live request out of the queues or the batch (Abort, Scheduler::Finish) and lists
  // it in the next output's finished_ids; the caller counts it and Releases it. NotFound for
  // an id that is not queued or running.
  absl::StatusOr<int32_t> Remove(RequestId id);

  // ---- Batch tables (batch_tables.cc) ----
  void InitTables();
  void TakeRow(int32_t q);  // the next free row
  void FreeRow(int32_t q);  // the last row moves into the hole
  // Copies what changed in the manager's tables into the request's row: entries a window
  // released become 0, new blocks are copied.
  void SyncRow(internal::SchedRequest& r);
  // Moves the entries changed since the last output into `batch`'s table runs.
  void WriteTableRuns(GroupInfo& g, AttentionBatch& batch);
  absl::Status CheckTables() const;

  // ---- State ----
  SchedulerConfig config;
  std::unique_ptr<KvCacheManager> kv;
  int64_t max_model_len = 0;
  // Token ids must be below this: the model's vocab_size when known, else 2^31.
  uint32_t token_limit = uint32_t{1} << 31;
  // KvCacheManager::prefill_alignment (0: chunks end anywhere).
  int32_t prefill_alignment = 0;

  struct GroupInfo {
    GroupId id;
    int32_t block_size = 0;
    int32_t ratio = 1;   // manager block -> kernel blocks
    int32_t stride = 0;  // kernel blocks per row
    std::vector<int32_t> table;  // [max_num_seqs, stride]
    std::vector<internal::RowSync> sync;  // [max_num_seqs]: how far each row copies its table
    // Entries of each row changed since the last output, [lo, hi) (empty: lo >= hi), and the
    // rows with some: the next output's table runs.
    std::vector<std::pair<int32_t, int32_t>> changed;  // [max_num_seqs]
    std::vector<int32_t> changed_rows;
    void MarkChanged(int32_t row, int32_t lo, int32_t hi);
  };
  std::vector<GroupInfo> attention;  // attention groups, in group order
  std::vector<GroupId> state_groups;

  std::vector<internal::SchedRequest> reqs;
  std::vector<int32_t> free_indices;
  absl::flat_hash_map<RequestId, int32_t> index_of;
  std::vector<int32_t> running;  // queue order
  std::vector<int32_t> loading;  // waiting for host-tier loads (kLoading)
  std::set<int32_t, internal::WaitingOrder> waiting{internal::WaitingOrder{&reqs, true}};
  int64_t front_key = 0, back_key = 0;  // the lowest and highest queue_key given so far
  std::vector<int32_t> row_owner;         // row -> request index
  uint64_t next_seq = 0;

  // The step being built.
  uint64_t step = 0;
  uint64_t applied_step = 0;  // the latest step Update has applied (steps apply in order)
  bool preempted_this_step = false;
  // Request indices scheduled this step; once the output is built, in its order (requests[k]
  // is scheduled[k]), with -1 for a request aborted since.
  std::vector<int32_t> scheduled;
  // Async scheduling: `scheduled` of the output before (Out()'s other buffer).
  std::vector<int32_t> prev_scheduled;
  absl::flat_hash_set<int64_t> batch_loras;  // CollectBatchLoras
  std::vector<DecodeStep> decode_batch;
  std::vector<size_t> decode_events;  // ScheduleDecodeRun: decode_batch[e] is running[...[e]]
  // The latest output is outputs[cur]; async scheduling alternates between the two, so the
  // previous output stays valid until its Update.
  SchedulerOutput outputs[2];
  int cur = 0;
  // Copies of the output's block tables, made when an abort moves rows while the output is
  // still to be run (Abort): the output then reads these, not the tables being changed.
  std::vector<std::vector<int32_t>> frozen_tables;
  std::vector<std::pair<int32_t, int32_t>> pending_row_moves;
  std::vector<RequestId> pending_finished;
  std::vector<DecodeToken> append_tokens;  // scratch of Update
  std::vector<std::pair<int32_t, FinishReason>> finishing;  // scratch of Update
  SchedulerStats stats;
};

}  // namespace kvpage

#endif  // KVPAGE_SCHEDULER_SCHEDULER_IMPL_H_
