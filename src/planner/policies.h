// The three reservation policies behind MakePlan. Each fills one PlanRow for one context.
// CeilDiv, RoundUp and AttentionTokenBytes come from model/kv_sizing.h.
#ifndef KVPAGE_PLANNER_POLICIES_H_
#define KVPAGE_PLANNER_POLICIES_H_

#include <cstdint>
#include <optional>

#include "absl/status/statusor.h"
#include "kvpage/model_spec.h"
#include "kvpage/planner.h"
#include "model/kv_sizing.h"

namespace kvpage::internal {

// REQUIRES: options.Validate().ok(), context > 0, *budget >= 0 when set.
absl::StatusOr<PlanRow> PlanKvpageRow(const ModelSpec& model, const PlanOptions& options,
                                      int64_t context, std::optional<int64_t> budget);
absl::StatusOr<PlanRow> PlanVllmRow(const ModelSpec& model, const PlanOptions& options,
                                    int64_t context, std::optional<int64_t> budget);
absl::StatusOr<PlanRow> PlanLlamaCppRow(const ModelSpec& model, const PlanOptions& options,
                                        int64_t context, std::optional<int64_t> budget);

// vllm: bytes of one block id, what every group's block costs across the shared tensors.
absl::StatusOr<int64_t> VllmBlockIdBytes(const ModelSpec& model, const PlanOptions& options);

// vllm: fills row.refusal and row.fixes when vLLM would refuse to start with
// --max-model-len = row.context (src/planner/vllm_start.cc). `shard` is `whole` split by
// options.tp; `budget` is one GPU's.
// REQUIRES: row is PlanVllmRow(shard, options, row.context, budget)'s.
absl::Status CheckVllmStart(const ModelSpec& whole, const ModelSpec& shard,
                            const PlanOptions& options, std::optional<int64_t> budget,
                            PlanRow& row);

}  // namespace kvpage::internal

#endif  // KVPAGE_PLANNER_POLICIES_H_
