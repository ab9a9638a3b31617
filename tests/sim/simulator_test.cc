#include "sim/simulator.h"

#include <sys/resource.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "kvpage/catalog.h"
#include "kvpage/planner.h"
#include "nlohmann/json.hpp"
#include "sim/calibrated_cost_model.h"
#include "sim/hardware_calibration.h"
#include "sim/trace.h"
#include "testing/sanitizer.h"

namespace kvpage::sim {
namespace {

using ::testing::HasSubstr;

const std::string kConversation =
    std::string(KVPAGE_SOURCE_DIR) + "/sim/data/traces/mooncake_conversation_trace.jsonl";
constexpr int64_t kGiB = int64_t{1} << 30;

// Every step takes the same time: makes latencies exact.
class FixedCost : public CostModel {
 public:
  explicit FixedCost(double s) : s_(s) {}
  double StepTime(const StepShape&) const override { return s_; }

 private:
  double s_;
};

SimConfig QwenConfig(int64_t budget_bytes) {
  SimConfig c;
  c.model = *LoadModel("qwen3-8b");
  c.gpu = *LoadGpu("h100");
  c.scheduler.kv.kv_budget_bytes = budget_bytes;
  c.scheduler.kv.block_size = 16;
  return c;
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

std::vector<TraceRequest> Conversation(int64_t max_requests) {
  TraceOptions o;
  o.max_requests = max_requests;
  return *ReadTrace(TraceFormat::kMooncake, kConversation, o);
}

std::string JsonWithoutWall(const SimResult& r) {
  nlohmann::ordered_json j = nlohmann::ordered_json::parse(SimResultToJson(r));
  j.erase("wall_seconds");
  return j.dump(2);
}

// ---- Exact timing with a fixed step cost -------------------------------------------------

TEST(SimulatorTest, FixedCostTimesAreExact) {
  FixedCost cost(0.010);
  SimConfig c = QwenConfig(4 * kGiB);
  c.cost_model = &cost;
  c.check_invariants = true;
  // Request 0: a 32-token prompt (one step) then 3 decode steps. Request 1 arrives long
  // after request 0 has finished: the clock jumps to its arrival.
  const std::vector<TraceRequest> trace = {Request(0, 0.0, 32, 4), Request(1, 100.0, 40, 2)};
  absl::StatusOr<SimResult> r = Simulate(trace, c);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->requests.size(), 2u);
  const RequestRecord& a = r->requests[0];
  EXPECT_DOUBLE_EQ(a.first_token_s, 0.010);
  EXPECT_DOUBLE_EQ(a.finish_s, 0.040);
  EXPECT_EQ(a.output_len, 4);
  EXPECT_THAT(a.token_times_s, ::testing::ElementsAre(0.010, 0.020, 0.030, 0.040));
  const RequestRecord& b = r->requests[1];
  EXPECT_DOUBLE_EQ(b.first_token_s, 100.010);
  EXPECT_DOUBLE_EQ(b.finish_s, 100.020);
  EXPECT_EQ(r->num_steps, 6);
  EXPECT_DOUBLE_EQ(r->simulated_seconds, 100.020);
  EXPECT_EQ(r->max_concurrency, 1);
  EXPECT_EQ(r->preemptions, 0);
  EXPECT_EQ(r->prefix_cache.queried_tokens, 72);
  EXPECT_EQ(r->prefix_cache.hit_tokens, 0);
  EXPECT_EQ(r->summary.completed, 2);
  EXPECT_NEAR(r->summary.ttft_ms.mean, 10.0, 1e-9);
  EXPECT_NEAR(r->summary.tpot_ms.mean, 10.0, 1e-9);
  ASSERT_EQ(r->steps.size(), 6u);
  EXPECT_DOUBLE_EQ(r->steps[4].time_s, 100.0);  // the step after the jump starts at arrival
  EXPECT_EQ(r->steps[0].num_scheduled_tokens, 32);
  EXPECT_EQ(r->steps[1].num_scheduled_tokens, 1);
  ASSERT_EQ(r->pool_names, std::vector<std::string>{"g0_full_attention"});
  // Peak usage: request 0 holds 3 blocks after its third token; 1 block = 16 · 147,456 B.
  ASSERT_EQ(r->kv_usage.size(), 2u);
  EXPECT_DOUBLE_EQ(r->kv_usage[0].peak, 3.0 * 16 * 147456 / (4.0 * kGiB));
}

// A calibration in the config (a user's refit) replaces the bundled one of the same GPU.
TEST(SimulatorTest, ConfigCalibrationSetsTheStepTimes) {
  absl::StatusOr<GpuCalibration> cal = LoadGpuCalibration("h100");
  ASSERT_TRUE(cal.ok()) << cal.status();
  GpuCalibration slow = *cal;
  slow.gemm[0].launch_s += 1e-3;  // 1 ms more per GEMM kernel at tp 1
  const std::vector<TraceRequest> trace = {Request(0, 0.0, 32, 2)};
  SimConfig bundled = QwenConfig(4 * kGiB);
  SimConfig user = bundled;
  user.calibration = slow;
  absl::StatusOr<SimResult> a = Simulate(trace, bundled);
  absl::StatusOr<SimResult> b = Simulate(trace, user);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_EQ(a->steps.size(), 2u);
  ASSERT_EQ(b->steps.size(), 2u);
  // The steps are priced by the given calibration: a 32-token prefill, then one decode.
  auto m = CalibratedCostModel::Create(user.model, user.gpu, slow);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_DOUBLE_EQ(b->steps[0].duration_s, (*m)->StepTime(StepShape{{{0, 32}}}));
  EXPECT_DOUBLE_EQ(b->steps[1].duration_s, (*m)->StepTime(StepShape{{{32, 1}}}));
  // Qwen3-8B runs 36 layers x 4 GEMMs + the LM head: 145 kernels, 145 ms more per step.
  EXPECT_NEAR(b->steps[0].duration_s - a->steps[0].duration_s, 0.145, 1e-9);
  EXPECT_NEAR(b->steps[1].duration_s - a->steps[1].duration_s, 0.145, 1e-9);
  // The bundled file's own calibration, given explicitly, is the one used by name.
  SimConfig same = bundled;
  same.calibration = *cal;
  absl::StatusOr<SimResult> c = Simulate(Conversation(200), same);
  absl::StatusOr<SimResult> d = Simulate(Conversation(200), bundled);
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(JsonWithoutWall(*c), JsonWithoutWall(*d));
}

// ---- Admission edge cases ----------------------------------------------------------------

TEST(SimulatorTest, PromptTooLongForMaxModelLenIsDroppedAndCounted) {
  FixedCost cost(0.001);
  SimConfig c = QwenConfig(4 * kGiB);
  c.cost_model = &cost;
  c.scheduler.max_model_len = 64;
  const std::vector<TraceRequest> trace = {Request(0, 0.0, 64, 4), Request(1, 0.0, 40, 30)};
  absl::StatusOr<SimResult> r = Simulate(trace, c);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->dropped_requests, 1);
  // Request 1 stops at max_model_len: 40 prompt + 24 output tokens.
  EXPECT_EQ(r->truncated_requests, 1);
  ASSERT_EQ(r->requests.size(), 1u);
  EXPECT_EQ(r->requests[0].index, 1);
  EXPECT_EQ(r->requests[0].output_len, 24);
  EXPECT_EQ(r->prefix_cache.queried_tokens, 40);
}

// In a child limited to 512 MiB more private memory: a row claiming 2^31 − 1 output tokens
// (its token times once reserved 16 GiB up front) runs to max_model_len. Exits 0 then.
[[noreturn]] void RunHugeOutputRow() {
  FixedCost cost(0.001);
  SimConfig c = QwenConfig(4 * kGiB);
  c.cost_model = &cost;
  c.scheduler.max_model_len = 64;
  const std::vector<TraceRequest> trace = {Request(0, 0.0, 40, 2147483647)};
  std::ifstream status("/proc/self/status");
  int64_t data_kib = -1;
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmData:", 0) == 0) data_kib = std::atoll(line.c_str() + 7);
  }
  const rlim_t limit = static_cast<rlim_t>((data_kib + 512 * 1024) * 1024);
  const rlimit rl{.rlim_cur = limit, .rlim_max = limit};
  if (data_kib < 0 || setrlimit(RLIMIT_DATA, &rl) != 0) std::_Exit(3);
  absl::StatusOr<SimResult> r = Simulate(trace, c);
  std::_Exit(r.ok() && r->requests.size() == 1 && r->requests[0].output_len == 24 ? 0 : 4);
}

TEST(SimulatorDeathTest, OutputLengthOfARowDoesNotSizeMemory) {
  if (KVPAGE_UNDER_SANITIZER) GTEST_SKIP() << "the sanitizer's mappings count against RLIMIT_DATA";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(RunHugeOutputRow(), ::testing::ExitedWithCode(0), "");
}

// A max_model_len above kMaxRequestTokens is refused before the scheduler is built: the
// scheduler's start-up probe alone would build that many token ids (4 GiB at 2^30).
TEST(SimulatorTest, MaxModelLenAboveTheSimulatorsLimitIsRefused) {
  FixedCost cost(0.001);
  SimConfig c = QwenConfig(4 * kGiB);
  c.cost_model = &cost;
  c.scheduler.max_model_len = int64_t{1} << 30;
  absl::StatusOr<SimResult> r = Simulate({Request(0, 0.0, 8, 2)}, c);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("max_model_len 1073741824 is more than the "
                                              "simulator runs: at most 16777216 tokens"));
  c.scheduler.max_model_len = kMaxRequestTokens;
  EXPECT_TRUE(c.Validate().ok());
}

// In a child limited to 128 MiB more private memory: 2,048 requests of 32,768 tokens arrive
// at once (256 MiB of token ids) and run four at a time. Only the requests the scheduler
// looks at get their ids built (Replica::waiting_window(), 5 here), so the run finishes; with
// every arrival built at once it dies of bad_alloc. Exits 0 when it finishes as expected.
[[noreturn]] void RunBurstOfLongPrompts() {
  FixedCost cost(0.001);
  SimConfig c = QwenConfig(24 * kGiB);
  c.cost_model = &cost;
  c.scheduler.max_num_seqs = 4;
  c.scheduler.max_num_batched_tokens = 4 * 32768;
  c.record_token_times = false;
  std::vector<TraceRequest> trace;
  for (int64_t i = 0; i < 2048; ++i) trace.push_back(Request(i, 0.0, 32768, 1));
  std::ifstream status("/proc/self/status");
  int64_t data_kib = -1;
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmData:", 0) == 0) data_kib = std::atoll(line.c_str() + 7);
  }
  const rlim_t limit = static_cast<rlim_t>((data_kib + 128 * 1024) * 1024);
  const rlimit rl{.rlim_cur = limit, .rlim_max = limit};
  if (data_kib < 0 || setrlimit(RLIMIT_DATA, &rl) != 0) std::_Exit(3);
  absl::StatusOr<SimResult> r = Simulate(trace, c);
  // One step each four: 4 · 32,768 prompt tokens, and the one output token each.
  std::_Exit(r.ok() && r->summary.completed == 2048 && r->max_concurrency == 4 &&
                     r->num_steps == 512
                 ? 0
                 : 4);
}

TEST(SimulatorDeathTest, RequestsWaitingBehindTheSchedulerHoldNoTokenIds) {
  if (KVPAGE_UNDER_SANITIZER) GTEST_SKIP() << "the sanitizer's mappings count against RLIMIT_DATA";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(RunBurstOfLongPrompts(), ::testing::ExitedWithCode(0), "");
}

// 4 MiB of KV holds one 16-token block of Qwen3-8B (147,456 B per token, 2.25 MiB per block):
// the scheduler lowers max_model_len to 16, so a 100-token prompt is dropped, and an explicit
// max_model_len the cache cannot hold is an error naming it.
TEST(SimulatorTest, RequestsLongerThanTheCacheAreDroppedOrRejected) {
  FixedCost cost(0.001);
  SimConfig c = QwenConfig(int64_t{4} << 20);
  c.cost_model = &cost;
  const std::vector<TraceRequest> trace = {Request(0, 0.0, 8, 2), Request(1, 1.0, 100, 2)};
  absl::StatusOr<SimResult> r = Simulate(trace, c);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->dropped_requests, 1);
  EXPECT_EQ(r->summary.completed, 1);
  EXPECT_EQ(r->max_model_len, 16);  // the length in effect, not the model's 40,960
  EXPECT_EQ(nlohmann::json::parse(SimResultToJson(*r))["max_model_len"], 16);
  c.scheduler.max_model_len = 200;
  r = Simulate(trace, c);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("max_model_len 200"));
}

// A trace row may describe a 2^31 - 1 token prompt (Mooncake's input_length is an int32): it is
// dropped without its 8 GiB of token ids ever being built. Outside sanitizer builds the test
// runs under a 2 GiB address-space limit, so building them fails it with bad_alloc.
TEST(SimulatorTest, HugePromptIsDroppedWithoutBuildingIt) {
  rlimit old{};
  ASSERT_EQ(getrlimit(RLIMIT_AS, &old), 0);
  if (!KVPAGE_UNDER_SANITIZER) {
    const rlimit two_gib{int64_t{2} << 30, old.rlim_max};
    ASSERT_EQ(setrlimit(RLIMIT_AS, &two_gib), 0);
  }
  FixedCost cost(0.001);
  SimConfig c = QwenConfig(4 * kGiB);
  c.cost_model = &cost;
  const std::vector<TraceRequest> trace = {Request(0, 0.0, 2147483647, 2),
                                           Request(1, 1.0, 8, 2)};
  absl::StatusOr<SimResult> r = Simulate(trace, c);
  setrlimit(RLIMIT_AS, &old);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->dropped_requests, 1);
  EXPECT_EQ(r->summary.completed, 1);
  EXPECT_EQ(r->prefix_cache.queried_tokens, 8);
}

// Without chunked prefill a 10,000-token prompt never fits the 8,192-token step: the error
// says so rather than blaming the KV budget, which could hold it many times over.
// Without chunked prefill a prompt runs in one step, so the scheduler's max_model_len is the
// step budget (8,192) and a longer prompt is dropped, as one over max_model_len always is.
TEST(SimulatorTest, PromptOverTheStepBudgetWithoutChunkingIsDropped) {
  FixedCost cost(0.001);
  SimConfig c = QwenConfig(4 * kGiB);
  c.cost_model = &cost;
  c.scheduler.enable_chunked_prefill = false;
  const std::vector<TraceRequest> trace = {Request(0, 0.0, 10000, 2), Request(1, 0.0, 100, 2)};
  absl::StatusOr<SimResult> r = Simulate(trace, c);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->dropped_requests, 1);
  EXPECT_EQ(r->max_model_len, 8192);
}

TEST(SimulatorTest, UnsortedTraceIsInvalid) {
  SimConfig c = QwenConfig(4 * kGiB);
  const std::vector<TraceRequest> trace = {Request(0, 2.0, 8, 2), Request(1, 1.0, 8, 2)};
  absl::StatusOr<SimResult> r = Simulate(trace, c);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("request 1 arrives at 1"));
}

TEST(SimulatorTest, ArrivalThatIsNotFiniteIsInvalid) {
  SimConfig c = QwenConfig(4 * kGiB);
  std::vector<TraceRequest> trace = {Request(0, 0.0, 8, 2), Request(1, 1.0, 8, 2)};
  trace[1].arrival_s = std::numeric_limits<double>::quiet_NaN();
  absl::StatusOr<SimResult> r = Simulate(trace, c);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(), "trace request 1 arrives at nan s: arrival times must be finite");
  trace[1].arrival_s = -std::numeric_limits<double>::infinity();
  EXPECT_THAT(Simulate(trace, c).status().message(), HasSubstr("arrives at -inf s"));
}

// Sampled and prompt token ids stay inside the model's vocabulary (the scheduler refuses others).
TEST(SimulatorTest, VocabularyLargerThanTheModelsIsInvalid) {
  SimConfig c = QwenConfig(4 * kGiB);
  c.model = *LoadModel("mistral-7b-v0.3");  // vocab_size 32768
  const std::vector<TraceRequest> trace = {Request(0, 0.0, 8, 2)};
  absl::StatusOr<SimResult> r = Simulate(trace, c);  // c.vocab_size: 100,000
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(), "vocab_size 100000 exceeds the model's vocab_size 32768");
  c.vocab_size = 32768;
  std::vector<TraceRequest> in_vocab = trace;
  in_vocab[0].vocab_size = 32768;
  r = Simulate(in_vocab, c);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->requests.size(), 1u);
}

// ---- Mooncake conversation trace -----------------------------------------------------------

// A burst of requests sharing prefixes, in a cache small enough to evict and preempt: the
// paths where an unordered decision would show. Synthetic, so it stays cheap under ASan.
std::vector<TraceRequest> SharedPrefixBurst() {
  SyntheticTraceOptions o;
  o.num_requests = 40;
  o.arrival.kind = ArrivalKind::kPoisson;
  o.arrival.rate_per_s = 20;
  o.prompt_len = {LengthDistribution::Kind::kUniform, 500, 3000, 1, 1 << 20};
  o.output_len = {LengthDistribution::Kind::kUniform, 8, 64, 1, 1 << 20};
  o.shared_prefix_fraction = 0.5;
  o.num_prefix_groups = 4;
  o.seed = 3;
  return *GenerateSyntheticTrace(o);
}

TEST(SimulatorTest, DeterministicJsonForTheSameSeed) {
  const std::vector<TraceRequest> trace = SharedPrefixBurst();
  SimConfig c = QwenConfig(2 * kGiB);  // about 14,500 tokens: evicts and preempts
  c.scheduler.kv.chunk_bytes = int64_t{16} << 20;
  c.seed = 7;
  absl::StatusOr<SimResult> a = Simulate(trace, c);
  absl::StatusOr<SimResult> b = Simulate(trace, c);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_GT(a->preemptions, 0);
  EXPECT_GT(a->prefix_cache.hit_tokens, 0);
  EXPECT_EQ(JsonWithoutWall(*a), JsonWithoutWall(*b));
}

TEST(SimulatorTest, JsonHasEveryField) {
  SimConfig c = QwenConfig(4 * kGiB);
  absl::StatusOr<SimResult> r = Simulate(SharedPrefixBurst(), c);
  ASSERT_TRUE(r.ok()) << r.status();
  const nlohmann::json j = nlohmann::json::parse(SimResultToJson(*r));
  for (const char* key :
       {"completed", "request_throughput", "output_throughput", "total_token_throughput",
        "mean_ttft_ms", "median_ttft_ms", "p90_ttft_ms", "p99_ttft_ms", "mean_tpot_ms",
        "p99_tpot_ms", "mean_itl_ms", "p99_itl_ms", "mean_e2el_ms", "p99_e2el_ms",
        "preemptions", "prefix_cache", "kv_usage", "kv_mapped", "max_concurrency",
        "simulated_seconds", "wall_seconds"}) {
    EXPECT_TRUE(j.contains(key)) << key;
  }
  EXPECT_EQ(j["completed"], 40);
  EXPECT_TRUE(j["prefix_cache"].contains("hit_rate"));
  EXPECT_TRUE(j["kv_usage"]["total"].contains("peak"));
  EXPECT_TRUE(j["kv_usage"]["g0_full_attention"].contains("mean"));
}

// With a pool that never evicts, the simulated hits equal an unlimited cache's. The first 400
// requests run in every build (sanitizers included), against their own ideal.
TEST(SimulatorTest, PrefixHitsMatchTheIdealOnATracePrefix) {
  const std::vector<TraceRequest> trace = Conversation(400);
  const IdealPrefixHits ideal = ComputeIdealPrefixHits(trace, 16);
  SimConfig c = QwenConfig(2048 * kGiB);
  c.scheduler.max_model_len = 131072;
  c.scheduler.kv.chunk_bytes = 64 * kGiB;  // few chunks: see docs/simulator.md on chunk maps
  c.record_token_times = false;
  absl::StatusOr<SimResult> r = Simulate(trace, c);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->dropped_requests, 0);
  EXPECT_EQ(r->prefix_cache.queried_tokens, ideal.input_tokens);
  EXPECT_LE(r->prefix_cache.hit_tokens, ideal.hit_tokens);
  EXPECT_GE(r->prefix_cache.hit_tokens, 0.98 * static_cast<double>(ideal.hit_tokens));
}

TEST(SimulatorTest, PrefixHitsMatchTheIdealOnTheWholeTrace) {
  if (KVPAGE_UNDER_SANITIZER) GTEST_SKIP() << "whole trace too slow under sanitizers";
  const std::vector<TraceRequest> trace = Conversation(0);
  SimConfig c = QwenConfig(30000 * kGiB);
  c.scheduler.max_model_len = 131072;
  c.scheduler.kv.chunk_bytes = 64 * kGiB;
  c.record_token_times = false;
  c.record_steps = false;
  absl::StatusOr<SimResult> r = Simulate(trace, c);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->dropped_requests, 0);
  EXPECT_EQ(r->preemptions, 0);
  EXPECT_EQ(r->prefix_cache.queried_tokens, 144'793'823);
  // ComputeIdealPrefixHits(trace, 16) (pinned in trace_test.cc): 54,097,440.
  EXPECT_LE(r->prefix_cache.hit_tokens, 54'097'440);
  EXPECT_GE(r->prefix_cache.hit_tokens, 0.98 * 54'097'440);
}

const char* kPinnedH100Calibration = R"({"calibration": {
  "gemm": [{"tp": 1, "launch_us": 4.951, "hbm_efficiency": 0.902,
            "tokens": [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024,
                       1536, 2048, 3072, 4096],
            "efficiency": [0.003, 0.006, 0.0122, 0.0245, 0.0477, 0.0714, 0.0935, 0.1411,
                           0.1854, 0.2393, 0.344, 0.4426, 0.5389, 0.5426, 0.7203, 0.6273,
                           0.6958, 0.691, 0.7508, 0.7178, 0.7303]}],
  "small_ops": [
    {"op": "input_layernorm", "width": "hidden", "per": "layer", "launch_us": 3.74, "ns_per_kilo_element": 2.32954},
    {"op": "post_attention_layernorm", "width": "hidden", "per": "layer", "launch_us": 3.672, "ns_per_kilo_element": 2.49205},
    {"op": "attn_rope", "width": "hidden_per_tp", "per": "layer", "launch_us": 2.181, "ns_per_kilo_element": 4.37632},
    {"op": "mlp_act", "width": "hidden_per_tp", "per": "layer", "launch_us": 1.916, "ns_per_kilo_element": 8.40855},
    {"op": "add", "width": "hidden", "per": "layer", "launch_us": 1.131, "ns_per_kilo_element": 1.57698},
    {"op": "emb", "width": "hidden", "per": "step", "launch_us": 2.644, "ns_per_kilo_element": 6.34549}],
  "attention": {"prefill_efficiency": 0.35}}})";

// Gemma 3 4B (5 sliding-window layers per full one) on an H100 cost model with 8 GiB of KV,
// the first 150 requests of the conversation trace, prefix caching on (the default). vLLM's
// admission gate counts each prompt's sliding-window blocks (up to its per-request bound);
// kvpage's counts only what a window can hold: kvpage runs 24 requests at once against 21, and
// the queue drains sooner. (With prefix caching off kvpage preempts more; docs/simulator.md.)
TEST(SimulatorTest, KvpageRunsMoreGemmaRequestsThanVllmAccounting) {
  const std::vector<TraceRequest> trace = Conversation(150);
  SimConfig c;
  c.model = *LoadModel("gemma-3-4b-it");
  c.gpu = *LoadGpu("h100");
  // The concurrency below depends on where step boundaries fall, so the step times are pinned
  // to the H100 fit this test was written against (tp 1 of sim/data/hardware/h100-sxm.json at
  // commit f7a144e): a refit of the bundled constants does not move them.
  auto cal = ParseGpuCalibration(kPinnedH100Calibration, "pinned");
  ASSERT_TRUE(cal.ok()) << cal.status();
  c.calibration = *cal;
  c.scheduler.kv.kv_budget_bytes = 8 * kGiB;
  c.record_token_times = false;
  c.record_steps = false;
  absl::StatusOr<SimResult> kvpage = Simulate(trace, c);
  c.scheduler.kv.mode = AccountingMode::kVllm;
  absl::StatusOr<SimResult> vllm = Simulate(trace, c);
  ASSERT_TRUE(kvpage.ok()) << kvpage.status();
  ASSERT_TRUE(vllm.ok()) << vllm.status();
  // 23: a prompt admitted in the step that writes its shared prefix computes it too (blocks
  // become hits once their step has completed); 24 when same-step hits were served.
  EXPECT_EQ(kvpage->max_concurrency, 23);
  EXPECT_EQ(vllm->max_concurrency, 21);
  EXPECT_LT(kvpage->summary.ttft_ms.mean, vllm->summary.ttft_ms.mean);
  EXPECT_GT(kvpage->summary.output_throughput, vllm->summary.output_throughput);
}

}  // namespace
}  // namespace kvpage::sim
