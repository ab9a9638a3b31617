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

}  // namespace kvpage::internal

#endif  // KVPAGE_PLANNER_POLICIES_H_
