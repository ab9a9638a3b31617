// Shared helpers for planner tests: load a bundled model, plan, and check row invariants.
#ifndef KVPAGE_TESTS_TESTING_PLAN_CHECKS_H_
#define KVPAGE_TESTS_TESTING_PLAN_CHECKS_H_

#include <gtest/gtest.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "kvpage/catalog.h"
#include "kvpage/planner.h"

namespace kvpage::testing {

constexpr int64_t kKiB = 1024;
constexpr int64_t kMiB = 1024 * 1024;
constexpr int64_t kGiB = int64_t{1024} * 1024 * 1024;

// Every row must add up: groups sum to reserved, kv + state = reserved, bytes_per_token is
// reserved / context, state only comes from linear-attention groups.
inline void ExpectRowInvariants(const PlanRow& row) {
  int64_t sum = 0, state = 0;
  for (const GroupReservation& g : row.groups) {
    EXPECT_GE(g.reserved_bytes, 0);
    EXPECT_GT(g.num_layers, 0);
    EXPECT_GE(g.padding_layers, 0);
    sum += g.reserved_bytes;
    if (g.kind == LayerKind::kLinearAttention) state += g.reserved_bytes;
  }
  EXPECT_EQ(sum, row.reserved_bytes);
  EXPECT_EQ(state, row.state_bytes);
  EXPECT_EQ(row.kv_bytes + row.state_bytes, row.reserved_bytes);
  EXPECT_DOUBLE_EQ(row.bytes_per_token,
                   static_cast<double>(row.reserved_bytes) / static_cast<double>(row.context));
  if (row.max_concurrency.has_value()) {
    EXPECT_GE(*row.max_concurrency, 0);
  }
  // A refusal always comes with something to try, and only a refusal does.
  EXPECT_EQ(row.refusal.empty(), row.fixes.empty()) << row.refusal;
}

// Plans `contexts` for a bundled model and checks every row's invariants.
inline Plan PlanBundled(const char* model_name, const PlanOptions& options,
                        const std::vector<int64_t>& contexts,
                        std::optional<int64_t> budget = std::nullopt) {
  auto model = LoadModel(model_name);
  EXPECT_TRUE(model.ok()) << model.status();
  if (!model.ok()) return Plan{};
  auto plan = MakePlan(*model, options, contexts, budget);
  EXPECT_TRUE(plan.ok()) << plan.status();
  if (!plan.ok()) return Plan{};
  EXPECT_EQ(plan->rows.size(), contexts.size());
  for (const PlanRow& row : plan->rows) ExpectRowInvariants(row);
  return *plan;
}

inline PlanOptions WithPolicy(Policy policy) {
  PlanOptions o;
  o.policy = policy;
  return o;
}

}  // namespace kvpage::testing

#endif  // KVPAGE_TESTS_TESTING_PLAN_CHECKS_H_
