// The three reservation policies behind MakePlan. Each fills one PlanRow for one context.
#ifndef KVPAGE_PLANNER_POLICIES_H_
#define KVPAGE_PLANNER_POLICIES_H_

#include <cstdint>
#include <optional>

#include "absl/status/statusor.h"
#include "kvpage/model_spec.h"
#include "kvpage/planner.h"

namespace kvpage::internal {

inline int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
inline int64_t RoundUp(int64_t a, int64_t b) { return CeilDiv(a, b) * b; }

// K + V bytes of one token in one attention layer (MLA: the latent only).
absl::StatusOr<int64_t> AttentionTokenBytes(const AttentionShape& shape, DType dtype);

// REQUIRES: options.Validate().ok(), context > 0, *budget >= 0 when set.
absl::StatusOr<PlanRow> PlanKvpageRow(const ModelSpec& model, const PlanOptions& options,
                                      int64_t context, std::optional<int64_t> budget);
absl::StatusOr<PlanRow> PlanVllmRow(const ModelSpec& model, const PlanOptions& options,
                                    int64_t context, std::optional<int64_t> budget);
absl::StatusOr<PlanRow> PlanLlamaCppRow(const ModelSpec& model, const PlanOptions& options,
                                        int64_t context, std::optional<int64_t> budget);

}  // namespace kvpage::internal

#endif  // KVPAGE_PLANNER_POLICIES_H_
