// The simulator with a host tier (SimConfig::pcie_gbps, scheduler.kv.host_cache): exact hits,
// bytes and times on a small trace whose prefixes the device cache cannot keep.
#include <cstdint>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "kvpage/catalog.h"
#include "nlohmann/json.hpp"
#include "sim/fleet.h"
#include "sim/simulator.h"
#include "sim/trace.h"

namespace kvpage::sim {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kGiB = int64_t{1} << 30;
constexpr int64_t kBlockBytes = 16 * 147456;  // one Qwen3-8B block of 16 tokens

class FixedCost : public CostModel {
 public:
  explicit FixedCost(double s) : s_(s) {}
  double StepTime(const StepShape&) const override { return s_; }

 private:
  double s_;
};

// Two rounds over 8 prompts: prefix group i (512 tokens) then 16 tokens of the request's own,
// 4 output tokens; one request a second. The device (256 MiB: 113 blocks, about 3 prompts)
// has evicted every prefix by the time the second round asks for it again.
std::vector<TraceRequest> TwoRounds() {
  std::vector<TraceRequest> trace;
  for (int64_t i = 0; i < 16; ++i) {
    TraceRequest r;
    r.index = i;
    r.arrival_s = static_cast<double>(i);
    r.prompt_len = 528;
    r.output_len = 4;
    r.segments = {{StreamKey(0, StreamKind::kPrefixGroup, static_cast<uint64_t>(i % 8)), 512},
                  {StreamKey(0, StreamKind::kRequestUnique, static_cast<uint64_t>(i)), 16}};
    trace.push_back(r);
  }
  return trace;
}

SimConfig Config(const CostModel* cost, int64_t host_bytes, HostTierPolicy policy) {
  SimConfig c;
  c.model = *LoadModel("qwen3-8b");
  c.gpu = *LoadGpu("h100");
  c.cost_model = cost;
  c.check_invariants = true;
  c.scheduler.kv.kv_budget_bytes = 256 << 20;
  c.scheduler.kv.host_cache.budget_bytes = host_bytes;
  c.scheduler.kv.host_cache.policy = policy;
  return c;
}

TEST(HostTierSimTest, WriteThroughServesTheSecondRoundFromTheHost) {
  FixedCost cost(0.010);
  const std::vector<TraceRequest> trace = TwoRounds();
  absl::StatusOr<SimResult> none = Simulate(trace, Config(&cost, 0, HostTierPolicy::kWriteThrough));
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(none->prefix_cache.hit_tokens, 0);
  EXPECT_FALSE(none->host_tier.has_value());

  absl::StatusOr<SimResult> r =
      Simulate(trace, Config(&cost, 1024 * kGiB, HostTierPolicy::kWriteThrough));
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(r->host_tier.has_value());
  const SimHostTier& h = *r->host_tier;
  // Every second-round request loads its 512-token prefix (32 blocks) back.
  EXPECT_EQ(r->prefix_cache.hit_tokens, 8 * 512);
  EXPECT_EQ(h.host_hit_tokens, 8 * 512);
  EXPECT_EQ(h.device_hit_tokens, 0);
  EXPECT_EQ(h.stats.loads, 8 * 32);
  // Every full block is saved once: 33 per first-round prompt, then the own block of each
  // second-round one.
  EXPECT_EQ(h.stats.saves, 8 * 33 + 8);
  EXPECT_EQ(h.stats.saved_bytes, h.stats.saves * kBlockBytes);
  EXPECT_EQ(h.stats.loaded_bytes, h.stats.loads * kBlockBytes);
  EXPECT_EQ(h.stats.evictions, 0);
  EXPECT_DOUBLE_EQ(h.link_busy_s, static_cast<double>((8 * 33 + 8 + 8 * 32) * kBlockBytes) / 32e9);
  EXPECT_DOUBLE_EQ(h.save_wait_s, 0);
  EXPECT_DOUBLE_EQ(h.bytes_per_s,
                   static_cast<double>(h.stats.saved_bytes + h.stats.loaded_bytes) /
                       r->simulated_seconds);
  // A second-round request waits for its loads (32 blocks at 32 GB/s), then prefills 16
  // tokens in one step.
  const double load_s = 32.0 * kBlockBytes / 32e9;
  ASSERT_EQ(r->requests.size(), 16u);
  EXPECT_NEAR(r->requests[8].first_token_s - r->requests[8].arrival_s, load_s + 0.010, 1e-12);
  EXPECT_NEAR(r->requests[0].first_token_s - r->requests[0].arrival_s, 0.010, 1e-12);
}

TEST(HostTierSimTest, WriteBackMovesFewerBytesAndTheStepWaitsForItsSaves) {
  FixedCost cost(0.010);
  const std::vector<TraceRequest> trace = TwoRounds();
  absl::StatusOr<SimResult> wt =
      Simulate(trace, Config(&cost, 1024 * kGiB, HostTierPolicy::kWriteThrough));
  absl::StatusOr<SimResult> wb =
      Simulate(trace, Config(&cost, 1024 * kGiB, HostTierPolicy::kWriteBack));
  ASSERT_TRUE(wt.ok()) << wt.status();
  ASSERT_TRUE(wb.ok()) << wb.status();
  const SimHostTier& b = *wb->host_tier;
  EXPECT_EQ(wb->prefix_cache.hit_tokens, 8 * 512);
  EXPECT_EQ(b.host_hit_tokens, 8 * 512);
  EXPECT_EQ(b.stats.loads, 8 * 32);
  // Only blocks the device evicts are saved, each key once: 269 of the 272 keys.
  EXPECT_EQ(b.stats.saves, 272 - 3);
  EXPECT_LT(b.stats.saved_bytes + b.stats.loaded_bytes,
            wt->host_tier->stats.saved_bytes + wt->host_tier->stats.loaded_bytes);
  // With one request at a time the link is idle when a step begins: a forward pass waits for
  // exactly its own saves. 159 of the blocks were evicted by steps that ran a forward pass; the
  // others made room for loads, in steps that ran none.
  EXPECT_NEAR(b.save_wait_s, 159.0 * kBlockBytes / 32e9, 1e-12);
  EXPECT_DOUBLE_EQ(wt->host_tier->save_wait_s, 0);
}

TEST(HostTierSimTest, JsonHasTheHostTierOnlyWithOne) {
  FixedCost cost(0.010);
  const std::vector<TraceRequest> trace = TwoRounds();
  absl::StatusOr<SimResult> none = Simulate(trace, Config(&cost, 0, HostTierPolicy::kWriteThrough));
  absl::StatusOr<SimResult> r = Simulate(trace, Config(&cost, kGiB, HostTierPolicy::kWriteBack));
  ASSERT_TRUE(none.ok() && r.ok());
  EXPECT_FALSE(nlohmann::ordered_json::parse(SimResultToJson(*none)).contains("host_tier"));
  const nlohmann::ordered_json j = nlohmann::ordered_json::parse(SimResultToJson(*r));
  ASSERT_TRUE(j.contains("host_tier"));
  std::vector<std::string> keys;
  for (const auto& [k, v] : j["host_tier"].items()) keys.push_back(k);
  EXPECT_THAT(keys, ::testing::ElementsAre(
                        "budget_bytes", "policy", "pcie_gbps", "device_hit_tokens",
                        "host_hit_tokens", "saves", "loads", "saved_bytes", "loaded_bytes",
                        "evictions", "failed_transfers", "bytes_per_s", "link_busy_s",
                        "save_wait_s"));
  EXPECT_EQ(j["host_tier"]["budget_bytes"], kGiB);
  EXPECT_EQ(j["host_tier"]["policy"], "write-back");
  EXPECT_EQ(j["host_tier"]["pcie_gbps"], 32.0);
}

TEST(HostTierSimTest, FleetSumsItsReplicasHostTiers) {
  FixedCost cost(0.010);
  FleetConfig f;
  f.replica = Config(&cost, 1024 * kGiB, HostTierPolicy::kWriteThrough);
  f.replicas = 2;
  absl::StatusOr<FleetResult> r = SimulateFleet(TwoRounds(), f);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(r->host_tier.has_value());
  int64_t host_hits = 0, saves = 0, loads = 0;
  for (const ReplicaStats& s : r->replicas) {
    ASSERT_TRUE(s.result.host_tier.has_value());
    host_hits += s.result.host_tier->host_hit_tokens;
    saves += s.result.host_tier->stats.saves;
    loads += s.result.host_tier->stats.loads;
  }
  // Round robin sends both rounds of a prefix to the same replica (8 is even), 4 prefixes to
  // each: a device holds about 3, so the second round hits all of them, the heads of some
  // prefixes still on the device and the rest loaded back.
  EXPECT_EQ(r->host_tier->host_hit_tokens, host_hits);
  EXPECT_EQ(r->prefix_cache.hit_tokens, 8 * 512);
  EXPECT_EQ(r->host_tier->device_hit_tokens, 1536);
  EXPECT_EQ(r->host_tier->host_hit_tokens, 2560);
  EXPECT_EQ(r->host_tier->stats.saves, saves);
  EXPECT_EQ(r->host_tier->stats.loads, loads);
  EXPECT_EQ(r->host_tier->budget_bytes, 2 * 1024 * kGiB);
}

// The kv-events router's index skips host-tier events (hashes alone, no token ids, which it
// would refuse) and mirrors device caches, as prefix-aware reads them: the two route alike.
TEST(HostTierSimTest, KvEventsRouterIgnoresHostTierEvents) {
  FixedCost cost(0.010);
  FleetConfig f;
  f.replica = Config(&cost, 1024 * kGiB, HostTierPolicy::kWriteThrough);
  f.replicas = 3;
  f.router = RouterKind::kPrefixAware;
  absl::StatusOr<FleetResult> aware = SimulateFleet(TwoRounds(), f);
  f.router = RouterKind::kKvEvents;
  absl::StatusOr<FleetResult> events = SimulateFleet(TwoRounds(), f);
  ASSERT_TRUE(aware.ok()) << aware.status();
  ASSERT_TRUE(events.ok()) << events.status();
  ASSERT_EQ(aware->replicas.size(), events->replicas.size());
  for (size_t r = 0; r < aware->replicas.size(); ++r) {
    EXPECT_EQ(aware->replicas[r].routed, events->replicas[r].routed) << r;
  }
  EXPECT_EQ(events->prefix_cache.hit_tokens, aware->prefix_cache.hit_tokens);
  EXPECT_EQ(events->host_tier->host_hit_tokens, aware->host_tier->host_hit_tokens);
  EXPECT_GT(events->event_bytes, 0);
}

TEST(HostTierSimTest, LinkRateMustBePositive) {
  FixedCost cost(0.010);
  SimConfig c = Config(&cost, kGiB, HostTierPolicy::kWriteThrough);
  c.pcie_gbps = 0;
  absl::StatusOr<SimResult> r = Simulate(TwoRounds(), c);
  EXPECT_TRUE(absl::IsInvalidArgument(r.status()));
  EXPECT_THAT(r.status().message(), HasSubstr("pcie_gbps"));
}

}  // namespace
}  // namespace kvpage::sim
