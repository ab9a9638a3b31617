// SearchFewestReplicas against synthetic monotone probes: the exact counts it tries, the
// answer, the upper bound, and errors.
#include "sim/slo_search.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <vector>

namespace kvpage::sim {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;

// A probe met from `threshold` replicas on that records the counts it was asked for.
struct Threshold {
  int32_t threshold;
  std::vector<int32_t> asked;

  ReplicaProbe Probe() {
    return [this](int32_t replicas) -> absl::StatusOr<ProbeOutcome> {
      asked.push_back(replicas);
      // One "latency" that falls as replicas grow: 100 / replicas, limit 100 / threshold.
      return ProbeOutcome{replicas >= threshold, {100.0 / replicas}};
    };
  }
};

std::vector<int32_t> Counts(const ReplicaSearchResult& r) {
  std::vector<int32_t> counts;
  for (const ReplicaProbeRecord& p : r.probes) counts.push_back(p.replicas);
  return counts;
}

TEST(SloSearchTest, DoublesThenBisects) {
  Threshold t{5, {}};
  auto r = SearchFewestReplicas(t.Probe(), {.max_replicas = 64});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(t.asked, ElementsAre(1, 2, 4, 8, 6, 5));
  EXPECT_THAT(Counts(*r), ElementsAreArray(t.asked));
  ASSERT_TRUE(r->fewest.has_value());
  EXPECT_EQ(*r->fewest, 5);
  EXPECT_TRUE(r->probes[3].outcome.met);  // 8 replicas
  EXPECT_DOUBLE_EQ(r->probes[3].outcome.values_ms[0], 12.5);
}

TEST(SloSearchTest, ExactProbeSequences) {
  const struct {
    int32_t threshold, max;
    std::vector<int32_t> asked;
    int32_t fewest;  // 0: none
  } cases[] = {
      {1, 64, {1}, 1},
      {2, 64, {1, 2}, 2},
      {3, 64, {1, 2, 4, 3}, 3},
      {8, 64, {1, 2, 4, 8, 6, 7}, 8},
      {9, 64, {1, 2, 4, 8, 16, 12, 10, 9}, 9},
      {33, 64, {1, 2, 4, 8, 16, 32, 64, 48, 40, 36, 34, 33}, 33},
      {20, 24, {1, 2, 4, 8, 16, 24, 20, 18, 19}, 20},  // doubling capped at the bound
      {24, 24, {1, 2, 4, 8, 16, 24, 20, 22, 23}, 24},
      {25, 24, {1, 2, 4, 8, 16, 24}, 0},                // never met within the bound
      {2, 1, {1}, 0},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(testing::Message() << "threshold " << c.threshold << " max " << c.max);
    Threshold t{c.threshold, {}};
    auto r = SearchFewestReplicas(t.Probe(), {.max_replicas = c.max});
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_THAT(t.asked, ElementsAreArray(c.asked));
    EXPECT_EQ(r->fewest.value_or(0), c.fewest);
    // Invariants: no count probed twice; every probe's verdict is the predicate's.
    for (size_t i = 0; i < r->probes.size(); ++i) {
      EXPECT_EQ(r->probes[i].outcome.met, r->probes[i].replicas >= c.threshold);
      for (size_t j = 0; j < i; ++j) EXPECT_NE(r->probes[i].replicas, r->probes[j].replicas);
    }
  }
}

TEST(SloSearchTest, FindsEveryThresholdWithinTwiceLogProbes) {
  for (int32_t threshold = 1; threshold <= 300; ++threshold) {
    Threshold t{threshold, {}};
    auto r = SearchFewestReplicas(t.Probe(), {.max_replicas = 256});
    ASSERT_TRUE(r.ok());
    if (threshold > 256) {
      EXPECT_FALSE(r->fewest.has_value()) << threshold;
      EXPECT_EQ(t.asked.back(), 256);
      continue;
    }
    ASSERT_TRUE(r->fewest.has_value()) << threshold;
    EXPECT_EQ(*r->fewest, threshold);
    EXPECT_LE(t.asked.size(), 17u) << threshold;  // 9 doublings + 8 bisections at most
  }
}

TEST(SloSearchTest, ProbeErrorEndsTheSearchNamingTheCount) {
  int calls = 0;
  ReplicaProbe probe = [&](int32_t replicas) -> absl::StatusOr<ProbeOutcome> {
    ++calls;
    if (replicas == 4) return absl::ResourceExhaustedError("request 7 can never run");
    return ProbeOutcome{false, {}};
  };
  auto r = SearchFewestReplicas(probe, {.max_replicas = 64});
  EXPECT_TRUE(absl::IsResourceExhausted(r.status()));
  EXPECT_EQ(r.status().message(), "at 4 replicas: request 7 can never run");
  EXPECT_EQ(calls, 3);
}

TEST(SloSearchTest, RejectsBadBoundNamingIt) {
  ReplicaProbe never = [](int32_t) -> absl::StatusOr<ProbeOutcome> { return ProbeOutcome{}; };
  for (int32_t bad : {0, -1, 4097}) {
    auto r = SearchFewestReplicas(never, {.max_replicas = bad});
    EXPECT_TRUE(absl::IsInvalidArgument(r.status()));
    EXPECT_NE(r.status().message().find(std::to_string(bad)), std::string::npos);
  }
}

}  // namespace
}  // namespace kvpage::sim
