// Scheduler::Impl, shared by the scheduler's source files (internal).
//
//   scheduler.cc     public API: requests, Update, invariants
//   schedule.cc      Schedule(): the running pass, the waiting pass, preemption
//   batch_tables.cc  the persistent device-ready rows (block tables, slot mappings)
#ifndef KVPAGE_SCHEDULER_SCHEDULER_IMPL_H_
#define KVPAGE_SCHEDULER_SCHEDULER_IMPL_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "internal/huge_page_allocator.h"
#include "kvpage/kv_cache_manager.h"
#include "kvpage/scheduler.h"

namespace kvpage {

namespace internal {

enum class RequestStatus : uint8_t { kFree, kWaiting, kRunning };

// One request as the scheduler sees it. Lives in Scheduler::Impl::reqs, indexed by a dense
// index that outlives nothing: it is reused once the request is gone.
struct alignas(64) SchedRequest {
  // ---- The first cache line: all that a steady decode step reads or writes of a running
  // request (the running pass's quiet steady loop, Update's one-sample-each pass), for a
  // model with one attention group. Positions are 32-bit (max_model_len is at most
  // kMaxSchedulerModelLen, 2^30), so that it fits.
  RequestId id;
  uint64_t scheduled_step = 0;  // the step it was last scheduled in
  // A token at position p in [decode_from, sync_tokens) is in the last block of the first two
  // attention groups' rows, its slot there p + slot_delta[a]: no table read (SyncRow sets
  // them). slot_delta[1] is in the second line.
  int64_t slot_delta0 = 0;
  // Tokens whose K/V is computed, counting this step's once it is scheduled (drafts included
  // until Update rejects them).
  int32_t num_computed = 0;
  int32_t num_tokens = 0;       // prompt + output tokens
  int32_t decode_from = std::numeric_limits<int32_t>::max();
  // min(quiet_tokens, quiet_release, sync_tokens, sync_release) (RefreshSteadyUntil): a plain
  // decode step at c with decode_from <= c < steady_until is quiet and its row steady.
  int32_t steady_until = 0;
  int32_t row = -1;             // its row in the batch tables (-1 when not running)
  int32_t num_scheduled = 0;    // this step's tokens (num_computed before it: the difference)
  int32_t kv_handle = -1;       // KvCacheManager::RequestHandle while in_manager
  // The token count at which the request finishes by length: min(prompt_len + max_new_tokens,
  // max_model_len), one bound for the two limits.
  int32_t length_limit = 0;
  RequestStatus status = RequestStatus::kFree;
  bool has_stop_tokens = false;
  bool fresh = false;           // admitted or resumed and not yet reported as new
  bool resumed = false;
  // ---- The second line: the running pass's other bounds, the second group's slots.
  // The KV cache's QuietDecodeHorizon, read after each call that allocates for the request:
  // a plain decode step with num_tokens <= quiet_tokens and num_computed < quiet_release
  // needs no call at all.
  int64_t quiet_tokens = 0;
  int64_t quiet_release = 0;
  // The row is up to date while num_computed < sync_release (a sliding window frees no block
  // before; see SyncRow) and c + n + lookahead <= sync_tokens.
  int64_t sync_release = 0;
  int64_t sync_tokens = 0;
  int64_t slot_delta1 = 0;      // see slot_delta0
  // Without speculative decoding (Scheduler::Impl::fast_rows among others) both stay 0.
  int32_t num_drafts = 0;       // drafts the server proposed for the next step
  int32_t num_scheduled_drafts = 0;

  // ---- Cold.
  uint64_t visited_step = 0;    // the step whose running pass considered it and scheduled nothing
  bool in_manager = false;      // the KvCacheManager holds the request (running, or at the
                                // head of the queue after a failed admission)
  std::vector<int32_t> stop_token_ids;
  // Prompt, then every output token: held here only while the KV cache does not hold the
  // request (it moves in at admission and is copied back out at preemption).
  std::vector<int32_t> tokens;
  int64_t prompt_len = 0;
  int32_t max_new_tokens = 0;
  int32_t priority = 0;
  int32_t num_preemptions = 0;
  double arrival_time = 0;
  uint64_t seq = 0;  // order of AddRequest: the last tie-break
  std::string cache_salt;
  int64_t lora_id = 0;
  // How far each attention group's row copies the manager's table.
  absl::InlinedVector<int32_t, 2> synced_blocks;    // manager blocks copied
  absl::InlinedVector<int32_t, 2> synced_released;  // leading null blocks copied

  // Output tokens so far (prompt_len is in the cold part: not for the hot loops).
  int64_t NumOutput() const { return num_tokens - prompt_len; }
  // A plain decode step: one known token, no drafts.
  bool PlainDecode() const { return num_tokens - num_computed == 1 && num_drafts == 0; }
  // Its step is within the KV cache's quiet decode horizon: the cache need not hear of it.
  bool InQuietHorizon() const {
    return num_tokens <= quiet_tokens && num_computed < quiet_release;
  }
  // Its row can be written from these fields alone for a plain decode step at position c:
  // the row is current and the token falls in the last block of the first two attention
  // groups (Scheduler::Impl::fast_rows).
  bool SteadyRowAt(int64_t c) const {
    return !fresh && c >= decode_from && c + 1 <= sync_tokens && c < sync_release;
  }
  // PlainDecode() && InQuietHorizon() && SteadyRowAt(num_computed), from one range and the
  // first line alone. REQUIRES: no speculative decoding (num_drafts is 0).
  bool QuietSteadyDecode() const {
    const int32_t c = num_computed;
    return num_tokens == c + 1 && !fresh && c >= decode_from && c < steady_until;
  }
  void SetQuietHorizon(const DecodeHorizon& h) {
    quiet_tokens = h.tokens;
    quiet_release = h.release;
    RefreshSteadyUntil();
  }
  // What steady_until must be: the least of the quiet and sync bounds, capped to 32 bits
  // (every bound past max_model_len acts alike). Pairwise: std::min of an initializer list
  // is a loop over it.
  int32_t SteadyBound() const {
    const int64_t quiet = std::min(quiet_tokens, quiet_release);
    const int64_t sync = std::min(sync_tokens, sync_release);
    return static_cast<int32_t>(
        std::min(std::min(quiet, sync), int64_t{std::numeric_limits<int32_t>::max()}));
  }
  // After quiet_* or sync_* change.
  void RefreshSteadyUntil() { steady_until = SteadyBound(); }
  // slot_delta0 or slot_delta1.
  int64_t& SlotDelta(size_t a) { return a == 0 ? slot_delta0 : slot_delta1; }
};
static_assert(offsetof(SchedRequest, quiet_tokens) == 64,
              "a steady decode step reads the first line alone");
static_assert(offsetof(SchedRequest, num_scheduled_drafts) < 128,
              "other steps (two attention groups, syncs, window releases) read two lines");

// Where plain decode rows are written (Scheduler::Impl::PlainRowTargets): the output
// arrays' addresses, held in locals so the stores cannot make the compiler reload them.
struct PlainRows {
  ScheduledRequest* requests = nullptr;
  int64_t* slots0 = nullptr;
  int64_t* slots1 = nullptr;  // the second attention group's, if any
  int32_t* seq_lens = nullptr;
  int32_t* query_start = nullptr;

  // Row r.row for request r's plain decode step (one token, no drafts) at position c, as the
  // k-th scheduled request, its token the t-th of the slot mappings. REQUIRES:
  // r.SteadyRowAt(c), and kTwoGroups == (slots1 != nullptr) (Write decides at run time).
  // kStatic: the entry and query start hold what a steady step writes but for the position
  // (Scheduler::Impl::static_rows), so only what moves with the position is written.
  template <bool kTwoGroups, bool kStatic = false>
  void WriteFor(const SchedRequest& r, int64_t c, size_t k, int32_t t,
                bool samples) const {
    // Everything is read before anything is written (the stores could alias the request).
    const RequestId id = r.id;
    const int32_t row = r.row;
    const int64_t slot0 = c + r.slot_delta0;
    const int64_t slot1 = kTwoGroups ? c + r.slot_delta1 : 0;
    ScheduledRequest& sr = requests[k];
    if constexpr (kStatic) {
      KVPAGE_DCHECK(sr.id == id && sr.row == row && !sr.is_new && !sr.resumed &&
                    sr.num_scheduled_tokens == 1 && sr.num_draft_tokens == 0 &&
                    sr.samples == samples && query_start[row] == t);
    } else {
      sr.id = id;
      sr.row = row;
      sr.is_new = false;
      sr.resumed = false;
      sr.num_scheduled_tokens = 1;
      sr.num_draft_tokens = 0;
      sr.samples = samples;
    }
    sr.num_computed_tokens = c;
    // A token's slot is its cache block times the cache block size plus its offset, whatever
    // the kernel block size (kernel block b·r + j is the j-th part of cache block b).
    slots0[t] = slot0;
    if constexpr (kTwoGroups) slots1[t] = slot1;
    seq_lens[row] = static_cast<int32_t>(c + 1);
    if constexpr (!kStatic) query_start[row] = t;
  }
  void Write(const SchedRequest& r, int64_t c, size_t k, int32_t t,
             bool samples) const {
    if (slots1 != nullptr) {
      WriteFor<true>(r, c, k, t, samples);
    } else {
      WriteFor<false>(r, c, k, t, samples);
    }
  }
  // The same in a steady decode step: the row-th request and token, which samples.
  template <bool kTwoGroups, bool kStatic = false>
  void WriteSteadyFor(const SchedRequest& r, int64_t c) const {
    WriteFor<kTwoGroups, kStatic>(r, c, static_cast<size_t>(r.row), r.row, /*samples=*/true);
  }
  void WriteSteady(const SchedRequest& r, int64_t c) const {
    Write(r, c, static_cast<size_t>(r.row), r.row, /*samples=*/true);
  }
};

// Orders the priority queue: lower priority value, then earlier arrival, then earlier add.
struct PriorityLess {
  const std::vector<SchedRequest>* reqs;
  bool operator()(int32_t a, int32_t b) const;  // true if a runs after b (a max-heap on "worse")
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

  // ---- Queues (scheduler.cc) ----
  void PushWaiting(int32_t q, bool front);
  int32_t PeekWaiting() const;
  void PopWaiting();
  void EraseWaiting(int32_t q);
  // Frees the request's blocks and row and drops it from `running` (order kept).
  void LeaveRunning(int32_t q);
  void Release(int32_t q);  // the index can be reused
  // Drops the request from the KV cache (blocks and all), keeping its tokens here.
  absl::Status FreeKeepingTokens(int32_t q);

  // ---- Schedule (schedule.cc) ----
  // Frees the blocks every running request's sliding windows have moved past.
  void ReleaseOutOfWindowBlocks();
  void ScheduleRunning(int64_t& budget);
  void ScheduleWaiting(int64_t& budget);
  // Allocates a running request's step through AllocateSlots, preempting others when memory
  // is short. False when the request itself was preempted (the running pass stops).
  bool AllocateOrPreempt(int32_t q, int32_t n, int64_t& budget);
  // The victim for the next preemption: FCFS the last running request, priority the worst.
  int32_t PickVictim() const;
  void Preempt(int32_t victim, int64_t& budget);
  // Request q computes n tokens (the last `drafts` of them drafts) this step: its counts,
  // the budget and the list of scheduled requests.
  void RecordScheduled(int32_t q, int32_t n, int32_t drafts, int64_t& budget);
  void MarkScheduled(internal::SchedRequest& r, int32_t n, int32_t drafts);  // the counts only
  void UnmarkScheduled(internal::SchedRequest& r);  // undoes MarkScheduled
  // Was request r considered by this step's running pass (scheduled or not)?
  bool Visited(const internal::SchedRequest& r) const {
    return r.scheduled_step == step || r.visited_step == step;
  }
  // Reads the KV cache's quiet decode horizon for r, after a call that allocated for it.
  void RefreshQuiet(internal::SchedRequest& r);
  // Tokens request q would compute this step before the budget (prompt chunking rules).
  int32_t TokensToSchedule(const internal::SchedRequest& r, int64_t budget) const;
  // Fills `out` for the requests in `scheduled`, which compute `total_tokens` tokens in all.
  void BuildOutput(int64_t total_tokens);
  // Steady decode output: in a step where every running request decodes one token, row r is
  // the r-th scheduled request and its token the r-th of the slot mappings, so the running
  // pass writes a steady row (SchedRequest::SteadyRowAt) in place while it holds the request,
  // and leaves the others in deferred_rows. PrepareSteadyOutput sizes the arrays for it;
  // FinishSteadyOutput (from BuildOutput, when the step turned out so) writes the deferred
  // rows in row order and the new-block offsets around them. Any other step is built whole
  // by BuildOutput, over whatever the pass wrote.
  internal::PlainRows PrepareSteadyOutput();
  void FinishSteadyOutput();
  // The output arrays as they are sized now (empty when !fast_rows).
  internal::PlainRows PlainRowTargets();
  // Writes row `row` of the output for request q, the k-th scheduled, whose tokens start at
  // `tokens` in the slot mappings: any row (syncing it first when the step changed its
  // tables). Returns its token count.
  int32_t WriteRow(int32_t q, size_t row, size_t k, int32_t tokens);

  // ---- Update (scheduler.cc) ----
  // Every request's sampled-token count against what it was scheduled for.
  absl::Status CheckSampleCounts(const SchedulerOutput& output, const ModelOutput& result) const;
  // Apply a step's checked samples to its requests, finishing those that stop. For a step
  // where every request sampled one token and none had drafts (out.one_sample_each), the tokens
  // go to the KV cache in the same pass. ApplySamples, for any step, leaves the single tokens
  // to append in append_tokens and returns how many.
  void ApplyOneSampleEach(const SchedulerOutput& output, const int32_t* sampled,
                          UpdateResult& update);
  size_t ApplySamples(const SchedulerOutput& output, const ModelOutput& result,
                      UpdateResult& update);
  // ApplyOneSampleEach's common case over requests owners[i], owners[i + 1], … (row order):
  // a sample that neither ends its request nor completes a block (no stop tokens to look for,
  // below the length limit, not the block's last slot) is counted and appended. Returns the
  // index of the first request it did not take, or n. A loop of its own with no call in it,
  // so that its values stay in registers.
  [[gnu::noinline]] static size_t TakePlainSamples(
      internal::SchedRequest* rq, const int32_t* owners, const int32_t* sampled, size_t i,
      size_t n, const KvCacheManager::DecodeAppender::KnownTails& known);
  // The index of the request scheduled as sr, or -1 when it is gone: its row's owner, unless
  // rows moved since the output was built (an abort in between), then by its id.
  int32_t ScheduledIndexOf(const ScheduledRequest& sr) const {
    const size_t row = static_cast<size_t>(sr.row);
    if (row < row_owner.size() && reqs[row_owner[row]].id == sr.id) return row_owner[row];
    auto it = index_of.find(sr.id);
    return it == index_of.end() ? -1 : it->second;
  }
  // Whether the request r found for sr is still the one scheduled as sr in this step (not
  // aborted since, its index not reused): else its results are dropped.
  bool StillScheduled(const internal::SchedRequest& r, const ScheduledRequest& sr) const {
    return r.status == internal::RequestStatus::kRunning && r.id == sr.id &&
           r.scheduled_step == step;
  }
  // Request q finished: report it, free its blocks and row, release its index.
  void Finish(int32_t q, FinishReason reason, UpdateResult& update);

  // ---- Batch tables (batch_tables.cc) ----
  void InitTables();
  void TakeRow(int32_t q);  // the next free row, cleared sync state
  void FreeRow(int32_t q);  // the last row moves into the hole
  // Copies what changed in the manager's tables into the request's row, appends the new
  // blocks to each group's CSR of this step's output, and sets the row's bounds (sync_tokens,
  // sync_release, decode_from, slot_delta0 and slot_delta1).
  void SyncRow(internal::SchedRequest& r);
  // SyncRow when one_plain_group and the table grew by exactly one block since the last copy
  // (a decode step crossed into it); false (nothing changed) otherwise.
  bool SyncOneNewBlock(internal::SchedRequest& r);
  absl::Status CheckTables() const;

  // ---- State ----
  SchedulerConfig config;
  std::unique_ptr<KvCacheManager> kv;
  int64_t max_model_len = 0;
  bool has_state_groups = false;
  bool has_sliding_groups = false;
  int32_t cache_block_size = 0;  // the manager's hash block size

  struct GroupInfo {
    GroupId id;
    LayerKind kind = LayerKind::kFullAttention;
    int32_t block_size = 0;
    int32_t window = 0;
    int32_t ratio = 1;       // manager block -> kernel blocks
    int32_t stride = 0;      // kernel blocks per row
    int32_t max_manager_blocks = 0;
    std::vector<int32_t, HugePageAllocator<int32_t>> table;  // [max_num_seqs, stride]
  };
  std::vector<GroupInfo> attention;  // attention groups, in group order
  std::vector<GroupId> state_groups;
  // A plain decode row can be written from the request's fields alone: one or two attention
  // groups (SchedRequest::slot_delta0 and slot_delta1), no state group, no speculative
  // decoding.
  bool fast_rows = false;
  // One attention group, not a sliding window, whose kernel blocks are the manager's (ratio
  // 1): SyncRow's common case, one new block, takes SyncOneNewBlock.
  bool one_plain_group = false;

  std::vector<internal::SchedRequest> reqs;
  std::vector<int32_t> free_indices;
  absl::flat_hash_map<RequestId, int32_t> index_of;
  std::vector<int32_t> running;     // queue order
  std::deque<int32_t> fcfs_waiting;
  std::vector<int32_t> priority_waiting;  // a heap under PriorityLess
  std::vector<int32_t> row_owner;   // row -> request index
  uint64_t next_seq = 0;

  // The step being built.
  uint64_t step = 0;
  bool applied = true;  // Update has consumed the latest output
  bool preempted_this_step = false;
  std::vector<int32_t> scheduled;  // request indices scheduled this step
  std::vector<DecodeStep> decode_batch;
  std::vector<int32_t> decode_batch_index;
  std::vector<DecodeHorizon> decode_horizons;  // AllocateDecodeStep's, per decode_batch entry
  SchedulerOutput out;
  std::vector<std::pair<int32_t, int32_t>> pending_row_moves;
  std::vector<RequestId> pending_finished;
  std::vector<uint8_t> row_scheduled;  // scratch, per row
  // Steady decode output (see PrepareSteadyOutput): whether this step's running pass writes
  // steady rows in place (cleared when the step turns out otherwise), the rows when it began,
  // and the rows it left to FinishSteadyOutput.
  bool steady_output = false;
  size_t steady_rows = 0;
  std::vector<int32_t> deferred_rows;
  // The latest output is a steady one (its k-th request is row k's owner) and no row has
  // changed since: Update finds each request through row_owner.
  bool rows_match_output = false;
  // The latest output is a steady one whose every entry a steady step wrote (none through
  // WriteRow), and no row has changed since: entry k is row k's owner, not new, one token,
  // no drafts, sampling, and query_start_loc[k] == k. A steady step then writes only what
  // moves with the position (PlainRows::WriteFor<…, kStatic>). Schedule takes it into
  // static_this_step and clears it (rows are taken only within Schedule); FinishSteadyOutput
  // sets it; FreeRow clears it.
  bool static_rows = false;
  bool static_this_step = false;
  std::vector<DecodeToken> append_tokens;  // scratch for Update's batched token append
  std::vector<std::pair<int32_t, FinishReason>> finishing;  // scratch of ApplyOneSampleEach
  SchedulerStats stats;
};

}  // namespace kvpage

#endif  // KVPAGE_SCHEDULER_SCHEDULER_IMPL_H_
