#include "sim/fleet.h"

#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "kvpage/catalog.h"
#include "nlohmann/json.hpp"
#include "sim/simulator.h"
#include "sim/trace.h"

namespace kvpage::sim {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

const std::string kConversation =
    std::string(KVPAGE_SOURCE_DIR) + "/sim/data/traces/mooncake_conversation_trace.jsonl";
constexpr int64_t kGiB = int64_t{1} << 30;
constexpr RouterKind kAllRouters[] = {RouterKind::kRoundRobin, RouterKind::kLeastLoaded,
                                      RouterKind::kPrefixAware, RouterKind::kKvEvents};

// Every step takes the same time.
class FixedCost : public CostModel {
 public:
  explicit FixedCost(double s) : s_(s) {}
  double StepTime(const StepShape&) const override { return s_; }

 private:
  double s_;
};

// A millisecond per scheduled token: a replica serving two prompts takes twice as long.
class PerTokenCost : public CostModel {
 public:
  double StepTime(const StepShape& step) const override {
    return 0.001 * static_cast<double>(step.NumNewTokens());
  }
};

SimConfig QwenConfig(int64_t budget_bytes) {
  SimConfig c;
  c.model = *LoadModel("qwen3-8b");
  c.gpu = *LoadGpu("h100");
  c.scheduler.kv.kv_budget_bytes = budget_bytes;
  c.scheduler.kv.block_size = 16;
  return c;
}

FleetConfig Fleet(const SimConfig& replica, int32_t replicas, RouterKind router) {
  FleetConfig f;
  f.replica = replica;
  f.replicas = replicas;
  f.router = router;
  return f;
}

TraceRequest Request(int64_t index, double arrival, int32_t prompt, int32_t output) {
  TraceRequest r;
  r.index = index;
  r.arrival_s = arrival;
  r.prompt_len = prompt;
  r.output_len = output;
  r.segments = {{StreamKey(0, StreamKind::kRequestUnique, static_cast<uint64_t>(index)), prompt}};
  return r;
}

// `shared` tokens of prefix group `group`, then `unique` tokens of the request's own.
TraceRequest SharedPrefixRequest(int64_t index, double arrival, uint64_t group, int32_t shared,
                                 int32_t unique, int32_t output) {
  TraceRequest r = Request(index, arrival, shared + unique, output);
  r.segments = {{StreamKey(0, StreamKind::kPrefixGroup, group), shared},
                {StreamKey(0, StreamKind::kRequestUnique, static_cast<uint64_t>(index)), unique}};
  return r;
}

std::vector<TraceRequest> Conversation(int64_t max_requests) {
  TraceOptions o;
  o.max_requests = max_requests;
  return *ReadTrace(TraceFormat::kMooncake, kConversation, o);
}

// The trace indices each replica served.
std::vector<std::vector<int64_t>> Routes(const FleetResult& r) {
  std::vector<std::vector<int64_t>> routes;
  for (const ReplicaStats& s : r.replicas) {
    routes.emplace_back();
    for (const RequestRecord& q : s.result.requests) routes.back().push_back(q.index);
  }
  return routes;
}

std::string JsonWithoutWall(const SimResult& r) {
  nlohmann::ordered_json j = nlohmann::ordered_json::parse(SimResultToJson(r));
  j.erase("wall_seconds");
  return j.dump(2);
}

std::string RequestsCsv(const std::vector<RequestRecord>& records) {
  std::ostringstream out;
  WriteRequestsCsv(records, out);
  return out.str();
}

// ---- Names and configuration ------------------------------------------------------------

TEST(FleetTest, RouterNamesRoundTrip) {
  for (RouterKind kind : kAllRouters) {
    absl::StatusOr<RouterKind> parsed = ParseRouterKind(RouterKindName(kind));
    ASSERT_TRUE(parsed.ok()) << RouterKindName(kind);
    EXPECT_EQ(*parsed, kind);
  }
  absl::StatusOr<RouterKind> bad = ParseRouterKind("random");
  EXPECT_TRUE(absl::IsInvalidArgument(bad.status()));
  EXPECT_THAT(bad.status().message(), HasSubstr("'random'"));
  EXPECT_THAT(bad.status().message(), HasSubstr("kv-events"));
}

TEST(FleetTest, BadConfigsNameTheValue) {
  const SimConfig c = QwenConfig(4 * kGiB);
  for (int32_t n : {0, -3, 100000}) {
    const absl::Status s = SimulateFleet({Request(0, 0, 32, 2)}, Fleet(c, n, RouterKind::kRoundRobin))
                               .status();
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << n;
    EXPECT_THAT(s.message(), HasSubstr(absl::StrCat("got ", n)));
  }
  FleetConfig f = Fleet(c, 2, RouterKind::kPrefixAware);
  f.overlap_weight = -1;
  EXPECT_THAT(f.Validate().message(), HasSubstr("got -1"));
  // A replica's own errors still come through.
  f = Fleet(c, 2, RouterKind::kRoundRobin);
  f.replica.vocab_size = 1;
  EXPECT_THAT(f.Validate().message(), HasSubstr("vocab_size must be >= 2, got 1"));
  EXPECT_TRUE(absl::IsInvalidArgument(
      SimulateFleet({Request(0, 1, 32, 2), Request(1, 0, 32, 2)}, Fleet(c, 2, RouterKind::kRoundRobin))
          .status()));
}

// ---- Routes and timelines, computed by hand --------------------------------------------

// Two 32-token prompts at t = 0 on one replica share a 64-token step (64 ms); on two
// replicas each runs its own 32 ms step, on its own timeline.
TEST(FleetTest, ReplicasStepOnTheirOwnTimelines) {
  PerTokenCost cost;
  SimConfig c = QwenConfig(4 * kGiB);
  c.cost_model = &cost;
  c.check_invariants = true;
  const std::vector<TraceRequest> trace = {Request(0, 0.0, 32, 2), Request(1, 0.0, 32, 2),
                                           Request(2, 0.005, 16, 1)};
  absl::StatusOr<FleetResult> one = SimulateFleet(trace, Fleet(c, 1, RouterKind::kRoundRobin));
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_DOUBLE_EQ(one->requests[0].first_token_s, 0.064);
  absl::StatusOr<FleetResult> two = SimulateFleet(trace, Fleet(c, 2, RouterKind::kRoundRobin));
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_THAT(Routes(*two), ElementsAre(ElementsAre(0, 2), ElementsAre(1)));
  ASSERT_EQ(two->requests.size(), 3u);
  // Replica 0: request 0's prefill [0, 32 ms); request 2, which arrived at 5 ms, waits for
  // the step's end; then one step of request 0's decode token and request 2's prefill
  // [32, 49 ms).
  EXPECT_DOUBLE_EQ(two->requests[0].first_token_s, 0.032);
  EXPECT_DOUBLE_EQ(two->requests[0].finish_s, 0.032 + 0.017);
  EXPECT_DOUBLE_EQ(two->requests[2].first_token_s, 0.032 + 0.017);
  // Replica 1: prefill [0, 32 ms), decode [32, 33 ms).
  EXPECT_DOUBLE_EQ(two->requests[1].first_token_s, 0.032);
  EXPECT_DOUBLE_EQ(two->requests[1].finish_s, 0.033);
  EXPECT_EQ(two->replicas[0].routed, 2);
  EXPECT_EQ(two->replicas[1].routed, 1);
  EXPECT_DOUBLE_EQ(two->replicas[0].busy_s, 0.049);
  EXPECT_DOUBLE_EQ(two->replicas[1].busy_s, 0.033);
  EXPECT_DOUBLE_EQ(two->load_imbalance, 0.049 / ((0.049 + 0.033) / 2));
  EXPECT_DOUBLE_EQ(two->simulated_seconds, 0.049);
  EXPECT_EQ(two->summary.completed, 3);
  EXPECT_EQ(two->event_bytes, 0);
}

// Outstanding tokens (prompt not yet prefilled + output not yet generated), by hand:
//   t = 0      req0 (100 + 10) -> r0: loads 110, 0, 0
//              req1 (50 + 5)   -> r1: loads 110, 55, 0
//              req2 (200 + 1)  -> r2: loads 110, 55, 201
//              req3 (10 + 1)   -> r1 (55 is least): loads 110, 66, 201
//   every replica then begins a prefill step of all its prompts (10 ms):
//              loads 10, 5 + 1 = 6, 1
//   t = 5 ms   req4 (8 + 1)    -> r2 (1 is least)
TEST(FleetTest, LeastLoadedCountsOutstandingTokens) {
  FixedCost cost(0.010);
  SimConfig c = QwenConfig(4 * kGiB);
  c.cost_model = &cost;
  c.check_invariants = true;
  const std::vector<TraceRequest> trace = {Request(0, 0, 100, 10), Request(1, 0, 50, 5),
                                           Request(2, 0, 200, 1), Request(3, 0, 10, 1),
                                           Request(4, 0.005, 8, 1)};
  absl::StatusOr<FleetResult> r = SimulateFleet(trace, Fleet(c, 3, RouterKind::kLeastLoaded));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(Routes(*r), ElementsAre(ElementsAre(0), ElementsAre(1, 3), ElementsAre(2, 4)));
  // Request 4 waits for replica 2's first step: its first token comes at 20 ms.
  EXPECT_DOUBLE_EQ(r->requests[4].first_token_s, 0.020);
  // Round-robin sends request 3 to replica 0 and request 4 to replica 1.
  absl::StatusOr<FleetResult> rr = SimulateFleet(trace, Fleet(c, 3, RouterKind::kRoundRobin));
  ASSERT_TRUE(rr.ok()) << rr.status();
  EXPECT_THAT(Routes(*rr), ElementsAre(ElementsAre(0, 3), ElementsAre(1, 4), ElementsAre(2)));
}

// Requests 0 and 1 start prefix groups 7 and 9 on replicas 0 and 1; later requests of
// each group go where their prefix is cached. Request 2 (group 9, at t = 10 s, both replicas
// idle): cost on r0 = 288 / 16 = 18 blocks, on r1 = (288 - 256) / 16 = 2.
TEST(FleetTest, PrefixAwareSendsASharedPrefixToTheReplicaHoldingIt) {
  FixedCost cost(0.010);
  SimConfig c = QwenConfig(4 * kGiB);
  c.cost_model = &cost;
  c.check_invariants = true;
  const std::vector<TraceRequest> trace = {
      SharedPrefixRequest(0, 0, 7, 256, 32, 2), SharedPrefixRequest(1, 0, 9, 256, 32, 2),
      SharedPrefixRequest(2, 10, 9, 256, 32, 2), SharedPrefixRequest(3, 20, 7, 256, 32, 2)};
  for (RouterKind kind : {RouterKind::kPrefixAware, RouterKind::kKvEvents}) {
    absl::StatusOr<FleetResult> r = SimulateFleet(trace, Fleet(c, 2, kind));
    ASSERT_TRUE(r.ok()) << RouterKindName(kind) << ": " << r.status();
    EXPECT_THAT(Routes(*r), ElementsAre(ElementsAre(0, 3), ElementsAre(1, 2)))
        << RouterKindName(kind);
    EXPECT_EQ(r->requests[2].hit_tokens, 256);
    EXPECT_EQ(r->requests[3].hit_tokens, 256);
    EXPECT_EQ(r->prefix_cache.hit_tokens, 512);
    EXPECT_EQ(r->prefix_cache.queried_tokens, 4 * 288);
  }
  absl::StatusOr<FleetResult> rr = SimulateFleet(trace, Fleet(c, 2, RouterKind::kRoundRobin));
  ASSERT_TRUE(rr.ok()) << rr.status();
  EXPECT_THAT(Routes(*rr), ElementsAre(ElementsAre(0, 2), ElementsAre(1, 3)));
  EXPECT_EQ(rr->prefix_cache.hit_tokens, 0);
}

// ---- Equivalences and invariants on the Mooncake trace ---------------------------------

TEST(FleetTest, OneReplicaReproducesSimulateWithEveryRouter) {
  SimConfig c = QwenConfig(8 * kGiB);
  c.check_invariants = true;
  const std::vector<TraceRequest> trace = Conversation(40);
  absl::StatusOr<SimResult> single = Simulate(trace, c);
  ASSERT_TRUE(single.ok()) << single.status();
  ASSERT_GT(single->prefix_cache.hit_tokens, 0);
  ASSERT_GT(single->preemptions, 0);  // 8 GiB is tight: preemptions happen
  for (RouterKind kind : kAllRouters) {
    absl::StatusOr<FleetResult> fleet = SimulateFleet(trace, Fleet(c, 1, kind));
    ASSERT_TRUE(fleet.ok()) << RouterKindName(kind) << ": " << fleet.status();
    ASSERT_EQ(fleet->replicas.size(), 1u);
    EXPECT_EQ(JsonWithoutWall(fleet->replicas[0].result), JsonWithoutWall(*single))
        << RouterKindName(kind);
    EXPECT_EQ(RequestsCsv(fleet->requests), RequestsCsv(single->requests));
    EXPECT_EQ(SummaryToJson(fleet->summary), SummaryToJson(single->summary));
    EXPECT_EQ(fleet->prefix_cache.hit_tokens, single->prefix_cache.hit_tokens);
    EXPECT_EQ(fleet->replicas[0].routed, 40);
    EXPECT_DOUBLE_EQ(fleet->load_imbalance, 1.0);
  }
}

TEST(FleetTest, InvariantsHoldAfterEveryStepWithEveryRouter) {
  SimConfig c = QwenConfig(8 * kGiB);
  c.check_invariants = true;
  const std::vector<TraceRequest> trace = Conversation(40);
  for (RouterKind kind : kAllRouters) {
    absl::StatusOr<FleetResult> r = SimulateFleet(trace, Fleet(c, 3, kind));
    ASSERT_TRUE(r.ok()) << RouterKindName(kind) << ": " << r.status();
    int64_t routed = 0, dropped = 0, queried = 0, hits = 0;
    for (const ReplicaStats& s : r->replicas) {
      routed += s.routed;
      dropped += s.result.dropped_requests;
      queried += s.result.prefix_cache.queried_tokens;
      hits += s.result.prefix_cache.hit_tokens;
      EXPECT_EQ(s.result.summary.completed + s.result.dropped_requests, s.routed);
      EXPECT_GT(s.busy_s, 0);
      EXPECT_LE(s.result.kv_usage[0].peak, 1.0);
    }
    EXPECT_EQ(routed, 40);
    EXPECT_EQ(r->summary.completed + dropped, 40);
    EXPECT_EQ(r->prefix_cache.queried_tokens, queried);
    EXPECT_EQ(r->prefix_cache.hit_tokens, hits);
    EXPECT_GE(r->load_imbalance, 1.0);
    for (size_t i = 1; i < r->requests.size(); ++i) {
      EXPECT_LT(r->requests[i - 1].index, r->requests[i].index);
    }
  }
}

// w = 0 leaves the load term only: prefix-aware then routes exactly as least-loaded.
TEST(FleetTest, PrefixAwareWithOverlapWeightZeroIsLeastLoaded) {
  const SimConfig c = QwenConfig(16 * kGiB);
  const std::vector<TraceRequest> trace = Conversation(100);
  FleetConfig f = Fleet(c, 3, RouterKind::kPrefixAware);
  f.overlap_weight = 0;
  absl::StatusOr<FleetResult> prefix = SimulateFleet(trace, f);
  ASSERT_TRUE(prefix.ok()) << prefix.status();
  absl::StatusOr<FleetResult> least = SimulateFleet(trace, Fleet(c, 3, RouterKind::kLeastLoaded));
  ASSERT_TRUE(least.ok()) << least.status();
  EXPECT_EQ(Routes(*prefix), Routes(*least));
  EXPECT_EQ(prefix->prefix_cache.hit_tokens, least->prefix_cache.hit_tokens);
}

// With one full-attention group, the events carry every change of the cache: the router's
// own index then answers exactly what the managers answer, and both routers agree.
TEST(FleetTest, KvEventsAgreesWithPrefixAwareWhenEventsCarryEverything) {
  SimConfig c = QwenConfig(16 * kGiB);
  const std::vector<TraceRequest> trace = Conversation(300);
  absl::StatusOr<FleetResult> prefix = SimulateFleet(trace, Fleet(c, 4, RouterKind::kPrefixAware));
  ASSERT_TRUE(prefix.ok()) << prefix.status();
  absl::StatusOr<FleetResult> events = SimulateFleet(trace, Fleet(c, 4, RouterKind::kKvEvents));
  ASSERT_TRUE(events.ok()) << events.status();
  EXPECT_EQ(Routes(*events), Routes(*prefix));
  EXPECT_EQ(events->prefix_cache.hit_tokens, prefix->prefix_cache.hit_tokens);
  EXPECT_GT(prefix->prefix_cache.hit_tokens, 0);
  EXPECT_EQ(prefix->event_bytes, 0);
  EXPECT_GT(events->event_bytes, 0);
  EXPECT_DOUBLE_EQ(events->event_bytes_per_s,
                   static_cast<double>(events->event_bytes) / events->simulated_seconds);
}

TEST(FleetTest, JsonHasTheFleetFields) {
  FixedCost cost(0.010);
  SimConfig c = QwenConfig(4 * kGiB);
  c.cost_model = &cost;
  const FleetConfig f = Fleet(c, 2, RouterKind::kLeastLoaded);
  absl::StatusOr<FleetResult> r =
      SimulateFleet({Request(0, 0, 32, 2), Request(1, 0, 32, 2), Request(2, 0, 32, 2)}, f);
  ASSERT_TRUE(r.ok()) << r.status();
  const nlohmann::ordered_json j = nlohmann::ordered_json::parse(FleetResultToJson(*r, f));
  EXPECT_EQ(j["completed"], 3);
  EXPECT_EQ(j["router"], "least-loaded");
  EXPECT_EQ(j["replicas"], 2);
  ASSERT_EQ(j["per_replica"].size(), 2u);
  EXPECT_EQ(j["per_replica"][0]["routed"], 2);
  EXPECT_EQ(j["per_replica"][1]["routed"], 1);
  EXPECT_EQ(j["event_bytes"], 0);
}

}  // namespace
}  // namespace kvpage::sim
