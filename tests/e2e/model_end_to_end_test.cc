// ModelEndToEnd: a tiny decoder with sliding-window, Gated-DeltaNet-style and full-attention
// layers served through kvpage's Scheduler on the host backing, its K/V and state read and
// written only through the scheduler's outputs and the reference kernels. Every property
// compares the generated tokens with DenseGenerate (each request alone, no paging), and every
// paged attention output with dense attention over the same K/V, bit for bit.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <vector>

#include "e2e/paged_runner.h"
#include "e2e/tiny_model.h"

namespace kvpage::e2e {
namespace {

// Eight requests: four share a 14-token prefix (three full blocks of 4 and two more tokens),
// the others are unrelated; 9 to 31 prompt tokens, 6 to 13 new tokens each.
std::vector<Request> Workload() {
  std::vector<Request> requests;
  const std::vector<int32_t> shared = {3, 14, 15, 9, 26, 5, 35, 8, 9, 7, 9, 32, 38, 4};
  for (int32_t i = 0; i < 8; ++i) {
    Request r{.id = RequestId(100 + i), .max_new_tokens = 6 + i};
    if (i % 2 == 0) r.prompt = shared;
    for (int32_t j = 0; j < 9 + 2 * i; ++j) r.prompt.push_back((i * 17 + j * 5 + 1) % 64);
    requests.push_back(r);
  }
  return requests;
}

std::map<int64_t, std::vector<int32_t>> Expected(const TinyModel& model,
                                                 const std::vector<Request>& requests) {
  std::map<int64_t, std::vector<int32_t>> tokens;
  for (const Request& r : requests) tokens[r.id.value] = DenseGenerate(model, r.prompt, r.max_new_tokens);
  return tokens;
}

[[maybe_unused]] RunResult MustRun(const TinyModel& model, const std::vector<Request>& requests,
                  const RunOptions& options) {
  absl::StatusOr<RunResult> result = RunPaged(model, requests, options);
  EXPECT_TRUE(result.ok()) << result.status();
  return result.ok() ? *result : RunResult{};
}

// Steps of 8 tokens (two blocks), so prefill chunks end on block boundaries and the linear
// layer's state is snapshotted there: the prefix cache can serve hybrid requests.
RunOptions SmallSteps() {
  RunOptions options;
  options.max_num_batched_tokens = 8;
  return options;
}

TEST(ModelEndToEnd, PrefixCachingOnAndOffGiveTheSameTokens) {
  const TinyModel model(1);
  const std::vector<Request> requests = Workload();
  RunOptions options = SmallSteps();
  const RunResult on = MustRun(model, requests, options);
  options.enable_prefix_caching = false;
  const RunResult off = MustRun(model, requests, options);
  EXPECT_EQ(on.tokens, Expected(model, requests));
  EXPECT_EQ(off.tokens, on.tokens);
  // Three of the four requests sharing the prefix were served 8 or 12 of its tokens.
  EXPECT_EQ(on.prefix_hit_tokens, 32);
  EXPECT_EQ(off.prefix_hit_tokens, 0);
  EXPECT_EQ(on.attention_mismatches, 0);
  EXPECT_EQ(off.attention_mismatches, 0);
  EXPECT_EQ(on.final_used_bytes, 0);
  EXPECT_EQ(off.final_used_bytes, 0);
}

TEST(ModelEndToEnd, PreemptionByRecomputeGivesTheSameTokens) {
  const TinyModel model(1);
  const std::vector<Request> requests = Workload();
  RunOptions options = SmallSteps();
  options.kv_budget_bytes = 16 * 1024;
  const RunResult cached = MustRun(model, requests, options);
  options.enable_prefix_caching = false;
  options.max_num_batched_tokens = 16;
  const RunResult uncached = MustRun(model, requests, options);
  EXPECT_EQ(cached.preemptions, 5);
  EXPECT_EQ(uncached.preemptions, 1);
  EXPECT_EQ(cached.tokens, Expected(model, requests));
  EXPECT_EQ(uncached.tokens, cached.tokens);
  EXPECT_EQ(cached.attention_mismatches + uncached.attention_mismatches, 0);
}

// One request aborted at one point of one step, for every step and point of the run: the
// others' tokens never change, nothing stays held, invariants hold after every step.
TEST(ModelEndToEnd, AbortsAtEveryPointOfAStep) {
  const TinyModel model(1);
  const std::vector<Request> requests = Workload();
  const auto expected = Expected(model, requests);
  const RunResult baseline = MustRun(model, requests, SmallSteps());
  ASSERT_EQ(baseline.steps, 38);
  int64_t runs = 0, aborted_running = 0;
  for (int64_t step = 0; step < baseline.steps; ++step) {
    for (StepPoint point : {StepPoint::kBeforeSchedule, StepPoint::kAfterSchedule,
                            StepPoint::kAfterForward, StepPoint::kAfterUpdate}) {
      const RequestId victim(100 + step % 8);
      RunOptions options = SmallSteps();
      bool in_batch = false;
      options.hook = [&](int64_t s, StepPoint p, const SchedulerOutput* out) {
        if (s != step || p != point) return std::vector<RequestId>{};
        if (out != nullptr) {
          for (const ScheduledRequest& r : out->requests) in_batch |= r.id == victim;
        }
        return std::vector<RequestId>{victim};
      };
      const RunResult r = MustRun(model, requests, options);
      ++runs;
      aborted_running += in_batch ? 1 : 0;
      for (const auto& [id, tokens] : expected) {
        if (id == victim.value && !r.tokens.contains(id)) continue;  // aborted before finishing
        EXPECT_EQ(r.tokens.at(id), tokens) << "request " << id << ", abort at step " << step << " point " << static_cast<int>(point);
      }
      EXPECT_EQ(r.attention_mismatches, 0) << "abort at step " << step << " point " << static_cast<int>(point);
      EXPECT_EQ(r.final_used_bytes, 0);
    }
  }
  EXPECT_EQ(runs, 152);
  EXPECT_GT(aborted_running, 0);
}

// A hybrid request whose prompt extends a finished one starts from the state snapshot taken
// at the end of that one's 20-token prompt (a block boundary) instead of recomputing those
// tokens, and generates what it would have alone.
TEST(ModelEndToEnd, HybridRequestResumesFromAStateSnapshot) {
  const TinyModel model(1);
  Request first{.id = RequestId(1), .max_new_tokens = 4};
  for (int32_t j = 0; j < 20; ++j) first.prompt.push_back((j * 11 + 3) % 64);
  Request second{.id = RequestId(2), .prompt = first.prompt, .max_new_tokens = 6};
  for (int32_t j = 0; j < 6; ++j) second.prompt.push_back((j * 7 + 5) % 64);
  RunOptions options = SmallSteps();
  options.max_num_seqs = 1;  // the second request starts after the first finished
  const RunResult resumed = MustRun(model, {first, second}, options);
  options.enable_prefix_caching = false;
  const RunResult recomputed = MustRun(model, {first, second}, options);
  EXPECT_EQ(resumed.tokens, Expected(model, {first, second}));
  EXPECT_EQ(recomputed.tokens, resumed.tokens);
  EXPECT_EQ(resumed.resumed_from_snapshot, 1);
  EXPECT_EQ(resumed.prefix_hit_tokens, 20);
  EXPECT_EQ(recomputed.prefix_hit_tokens, 0);
  // 20 tokens not recomputed in each of the 3 attention layers.
  EXPECT_EQ(recomputed.attention_checks - resumed.attention_checks, 60);
  EXPECT_EQ(resumed.attention_mismatches, 0);
}

// Every query of every step, paged attention over the block tables equals dense attention over
// the same K/V (collected by token prefix from whichever request computed them), bit for bit.
TEST(ModelEndToEnd, PagedAttentionEqualsDenseAttention) {
  const TinyModel model(1);
  RunOptions options;
  options.enable_prefix_caching = false;
  const RunResult r = MustRun(model, Workload(), options);
  // 3 attention layers × 252 computed tokens (184 prompt + 76 generated − 8 never fed back).
  EXPECT_EQ(r.attention_checks, 756);
  EXPECT_EQ(r.attention_mismatches, 0);
}

}  // namespace
}  // namespace kvpage::e2e
