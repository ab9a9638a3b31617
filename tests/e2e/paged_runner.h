// Serving the tiny model through kvpage's Scheduler on the host backing: the forward pass
// reads and writes K/V and state only through the step's SchedulerOutput (slot mappings, block
// tables, state read/write slots, copies and zeroes) and the reference kernels (tests only).
// With a host tier, its slots live in a second host backing and the runner copies each output's
// transfers between the two, one memcpy per layer tensor and block.
#ifndef KVPAGE_TESTS_E2E_PAGED_RUNNER_H_
#define KVPAGE_TESTS_E2E_PAGED_RUNNER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <vector>

#include "absl/status/statusor.h"
#include "e2e/tiny_model.h"
#include "kvpage/kv_cache_manager.h"
#include "kvpage/scheduler.h"

namespace kvpage::e2e {

// Where in a step a hook runs.
enum class StepPoint : uint8_t { kBeforeSchedule, kAfterSchedule, kAfterForward, kAfterUpdate };

struct RunOptions {
  bool enable_prefix_caching = true;
  int64_t kv_budget_bytes = 64 * 1024;  // for the pools; the null blocks come on top
  int64_t chunk_bytes = 1024;
  int32_t block_size = 4;
  int32_t max_num_batched_tokens = 24;
  int32_t max_num_seqs = 8;
  int32_t decode_snapshot_interval_blocks = 2;
  int64_t max_model_len = TinyModel::kMaxPositions;
  // Host tier (KvCacheConfig::host_cache); 0 = none.
  int64_t host_budget_bytes = 0;
  HostTierPolicy host_policy = HostTierPolicy::kWriteThrough;
  // A transfer's saves are copied when its output is scheduled (before the forward pass, as
  // write-back needs). Its loads' device blocks are then filled with 0xff (NaN in bf16 and f32)
  // and copied from the host only when the transfer is reported, after the Update of the step
  // this many steps later: a block read before Scheduler::CompleteTransfers gives NaN.
  int32_t transfer_delay_steps = 0;
  // The first this many transfers that carry loads are reported failed (succeeded = false):
  // nothing of them is copied, their load targets keep the 0xff fill.
  int32_t failed_load_transfers = 0;
  // SchedulerConfig::cuda_graph_row_sizes / cuda_graph_token_sizes: the reference kernels then
  // run over the padded arrays (num_padded_rows sequences, num_padded_tokens tokens), as a
  // replayed CUDA graph would.
  std::vector<int32_t> cuda_graph_row_sizes;
  std::vector<int32_t> cuda_graph_token_sizes;
  // SchedulerConfig::async_scheduling: step N + 1 is scheduled and run before step N's
  // Update (the runner knows each sampled token at once, as a device does). No hook.
  bool async_scheduling = false;
  // Called at every point of every step (step counts from 0; `out` is null before Schedule):
  // the requests it returns are aborted there (ids no longer live are skipped).
  std::function<std::vector<RequestId>(int64_t step, StepPoint point, const SchedulerOutput* out)>
      hook;
};

struct Request {
  RequestId id;
  std::vector<int32_t> prompt;
  int32_t max_new_tokens = 8;
};

struct RunResult {
  std::map<int64_t, std::vector<int32_t>> tokens;  // generated tokens of finished requests
  int64_t steps = 0;
  int64_t padded_steps = 0;         // steps laid out for a CUDA graph (SchedulerOutput::padded)
  int64_t preemptions = 0;
  int64_t prefix_hit_tokens = 0;
  int64_t resumed_from_snapshot = 0;  // new requests that started from a prefix hit (a
                                      // snapshot's slot, for linear-attention state)
  int64_t attention_checks = 0;     // paged query outputs compared with dense attention
  int64_t attention_mismatches = 0; // of those, outputs not bit-identical
  int64_t peak_mapped_bytes = 0;
  int64_t final_used_bytes = 0;     // KV bytes held at the end, every transfer reported
  int64_t host_hit_tokens = 0;      // SchedulerStats::host_hit_tokens
  HostCacheStats host;              // the tier's counters at the end
  int64_t transfers = 0;            // transfers reported (failed ones included)
  std::map<LayerKind, int64_t> loaded_blocks;  // blocks loaded, by their group's kind
  // (step, request) of every request that started loading from the host tier.
  std::vector<std::pair<int64_t, RequestId>> load_starts;
};

// Runs every request to completion (or abort), then reports the transfers still in flight
// (scheduling empty steps for the saves the last step queued). Errors: any kvpage or
// reference-kernel status, an invariant failure after a step, and transfers still queued after
// that.
absl::StatusOr<RunResult> RunPaged(const TinyModel& model, const std::vector<Request>& requests,
                                   const RunOptions& options);

}  // namespace kvpage::e2e

#endif  // KVPAGE_TESTS_E2E_PAGED_RUNNER_H_
