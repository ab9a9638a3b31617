// Serving the tiny model through kvpage's Scheduler on the host backing: the forward pass
// reads and writes K/V and state only through the step's SchedulerOutput (slot mappings, block
// tables, state read/write slots, copies and zeroes) and the reference kernels (tests only).
#ifndef KVPAGE_TESTS_E2E_PAGED_RUNNER_H_
#define KVPAGE_TESTS_E2E_PAGED_RUNNER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <vector>

#include "absl/status/statusor.h"
#include "e2e/tiny_model.h"
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
  int64_t preemptions = 0;
  int64_t prefix_hit_tokens = 0;
  int64_t state_copies = 0;         // copies run before forward passes
  int64_t resumed_from_snapshot = 0;  // new requests whose first read slot was a copy's target
  int64_t attention_checks = 0;     // paged query outputs compared with dense attention
  int64_t attention_mismatches = 0; // of those, outputs not bit-identical
  int64_t peak_mapped_bytes = 0;
  int64_t final_used_bytes = 0;     // KV bytes requests still hold at the end
};

// Runs every request to completion (or abort). Errors: any kvpage or reference-kernel status,
// and an invariant failure after a step.
absl::StatusOr<RunResult> RunPaged(const TinyModel& model, const std::vector<Request>& requests,
                                   const RunOptions& options);

}  // namespace kvpage::e2e

#endif  // KVPAGE_TESTS_E2E_PAGED_RUNNER_H_
