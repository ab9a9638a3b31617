// Renders plans as JSON (the contract other tools read), CSV and text tables.
//
// JSON contract, one plan:
//   {"model": "...", "policy": "...", "kv_cache_dtype": "...", ["tp": 2,] "kv_budget_bytes": null,
//    "rows": [{"context": 32768, "reserved_bytes": 0, "kv_bytes": 0, "state_bytes": 0,
//              "shared_bytes": 0, "snapshot_bytes": 0, "bytes_per_token": 0.0,
//              "max_concurrency": null,
//              "groups": [{"kind": "full_attention|sliding_window|mla|linear_attention",
//                          "num_layers": 0, "padding_layers": 0, "block_size": 0,
//                          "blocks": 0, "reserved_bytes": 0}],
//              ["vllm_starts": true, ["refusal": "...", "fixes": ["--max-model-len 14560"]]]}]}
// "tp" appears only when the plan is of one GPU of several (Plan::tp > 1); "vllm_starts" only
// under the vllm policy, "refusal" and "fixes" only where it is false (PlanRow::refusal).
// Several plans: {"plans": [plan, …]}.
#ifndef KVPAGE_PLAN_FORMAT_H_
#define KVPAGE_PLAN_FORMAT_H_

#include <string>

#include "absl/types/span.h"
#include "kvpage/planner.h"

namespace kvpage {

// One plan as a JSON object, or {"plans": [...]} for any other count. Pretty-printed.
std::string PlansToJson(absl::Span<const Plan> plans);

// One line per (plan, row): model,policy,kv_cache_dtype,context,reserved_bytes,kv_bytes,
// state_bytes,shared_bytes,snapshot_bytes,bytes_per_token,max_concurrency (empty if unset),
// vllm_starts (true/false under vllm, else empty),vllm_refusal (quoted; empty if none).
std::string PlansToCsv(absl::Span<const Plan> plans);

// A readable table of one plan (MiB = 2^20 bytes); "tp N (per GPU)" in its title when tp > 1.
std::string PlanToTable(const Plan& plan);

// Side-by-side table of plans of one model under different policies, one line per context.
// REQUIRES: all plans share the model and the list of contexts.
std::string CompareTable(absl::Span<const Plan> plans);

}  // namespace kvpage

#endif  // KVPAGE_PLAN_FORMAT_H_
