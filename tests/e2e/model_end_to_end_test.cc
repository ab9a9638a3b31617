// ModelEndToEnd: a tiny decoder with sliding-window, Gated-DeltaNet-style and full-attention
// layers served through kvpage's Scheduler on the host backing, its K/V and state read and
// written only through the scheduler's outputs and the reference kernels. Every property
// compares the generated tokens with DenseGenerate (each request alone, no paging), and every
// paged attention output with dense attention over the same K/V, bit for bit. With a host
// tier, the runner copies its saves and loads between the device backing and a second host
// backing, and the tokens must not change however the tier is configured, late or failing.
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

// MiniMax's lightning attention keeps a recurrent state and no conv state: with conv kernel
// 1 the linear group's conv tensor holds 0 bytes per slot, and the paged run must still give
// DenseGenerate's tokens, with and without prefix caching.
TEST(ModelEndToEnd, StateWithoutConvGivesTheSameTokens) {
  const TinyModel model(1, /*conv_kernel=*/1);
  EXPECT_EQ(model.ConvStateValues(), 0);
  const std::vector<Request> requests = Workload();
  RunOptions options = SmallSteps();
  const RunResult on = MustRun(model, requests, options);
  options.enable_prefix_caching = false;
  const RunResult off = MustRun(model, requests, options);
  EXPECT_EQ(on.tokens, Expected(model, requests));
  EXPECT_EQ(off.tokens, on.tokens);
  EXPECT_EQ(on.prefix_hit_tokens, 32);  // as with the conv state: hits follow block bounds
  EXPECT_EQ(on.attention_mismatches, 0);
  EXPECT_EQ(on.final_used_bytes, 0);
}

// Steps padded to CUDA-graph sizes run the reference kernels over the padded arrays (empty
// rows, slot -1 tokens): the padding is inert, so the tokens are those of unpadded steps. Row
// sizes {1, 2, 4, 8} and token sizes {1, 2, 4, 8} cover every step of 8-token steps and 8
// rows; with row sizes {1, 2} only, steps with more rows run unpadded.
TEST(ModelEndToEnd, CudaGraphPaddingGivesTheSameTokens) {
  const TinyModel model(1);
  const std::vector<Request> requests = Workload();
  RunOptions options = SmallSteps();
  const RunResult eager = MustRun(model, requests, options);
  options.cuda_graph_row_sizes = {1, 2, 4, 8};
  options.cuda_graph_token_sizes = {1, 2, 4, 8};
  const RunResult padded = MustRun(model, requests, options);
  options.cuda_graph_row_sizes = {1, 2};
  const RunResult some = MustRun(model, requests, options);
  EXPECT_EQ(eager.padded_steps, 0);
  EXPECT_EQ(padded.padded_steps, padded.steps);
  EXPECT_EQ(padded.steps, eager.steps);
  EXPECT_EQ(padded.steps, 38);
  // Padding changes no scheduling: the same 38 steps, 13 of them with at most 2 rows.
  EXPECT_EQ(some.steps, 38);
  EXPECT_EQ(some.padded_steps, 13);
  EXPECT_EQ(eager.tokens, Expected(model, requests));
  EXPECT_EQ(padded.tokens, eager.tokens);
  EXPECT_EQ(some.tokens, eager.tokens);
  EXPECT_EQ(padded.attention_checks, eager.attention_checks);
  EXPECT_EQ(eager.attention_mismatches + padded.attention_mismatches + some.attention_mismatches,
            0);
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

// Async scheduling (step N + 1 scheduled and run before step N's Update) generates the same
// tokens as synchronous scheduling, with the cache roomy and with preemptions.
TEST(ModelEndToEnd, AsyncSchedulingGivesTheSameTokens) {
  const TinyModel model(1);
  const std::vector<Request> requests = Workload();
  for (const int64_t budget : {int64_t{64} * 1024, int64_t{16} * 1024}) {
    SCOPED_TRACE(budget);
    RunOptions options = SmallSteps();
    options.kv_budget_bytes = budget;
    const RunResult sync = MustRun(model, requests, options);
    options.async_scheduling = true;
    const RunResult async = MustRun(model, requests, options);
    EXPECT_EQ(sync.tokens, Expected(model, requests));
    EXPECT_EQ(async.tokens, sync.tokens);
    EXPECT_EQ(async.attention_mismatches, 0);
    EXPECT_GT(async.attention_checks, 0);
    EXPECT_EQ(async.final_used_bytes, 0);
    if (budget < 64 * 1024) {
      EXPECT_GT(async.preemptions, 0);
    }
  }
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


// Shared-prefix requests separated by unrelated ones, one at a time, on a device budget that
// cannot keep the prefix cached past an unrelated request.
std::vector<Request> EvictingWorkload() {
  std::vector<Request> requests;
  std::vector<int32_t> shared;
  for (int32_t j = 0; j < 16; ++j) shared.push_back((j * 13 + 7) % 64);
  for (int32_t i = 0; i < 8; ++i) {
    Request r{.id = RequestId(200 + i), .max_new_tokens = 4 + i % 3};
    if (i % 2 == 0) r.prompt = shared;
    for (int32_t j = 0; j < (i % 2 == 0 ? 5 + i : 24); ++j) {
      r.prompt.push_back((i * 29 + j * 3 + 2) % 64);
    }
    requests.push_back(r);
  }
  return requests;
}

// One request at a time (8-token steps) on 16 KiB for the pools: each unrelated request evicts
// the shared prefix from device memory, so without a host tier nothing hits.
RunOptions EvictingOptions(int64_t host_budget_bytes, HostTierPolicy policy) {
  RunOptions options = SmallSteps();
  options.max_num_seqs = 1;
  options.kv_budget_bytes = 16 * 1024;
  options.max_model_len = 48;
  options.host_budget_bytes = host_budget_bytes;
  options.host_policy = policy;
  return options;
}

int64_t Loaded(const RunResult& r, LayerKind kind) {
  const auto it = r.loaded_blocks.find(kind);
  return it == r.loaded_blocks.end() ? 0 : it->second;
}

void ExpectClean(const RunResult& r) {
  EXPECT_EQ(r.attention_mismatches, 0);
  EXPECT_EQ(r.final_used_bytes, 0);
  EXPECT_EQ(r.host.saving_blocks, 0);
}

// The tier off, write-through, write-back, and host budgets small enough to thrash: the same
// tokens every time. The three later shared-prefix requests each load their 16-token prefix
// back (attention blocks and the linear layer's state snapshot at its end).
TEST(ModelEndToEnd, HostTierGivesTheSameTokens) {
  const TinyModel model(1);
  const std::vector<Request> requests = EvictingWorkload();
  const auto expected = Expected(model, requests);
  const RunResult off = MustRun(model, requests, EvictingOptions(0, HostTierPolicy::kWriteThrough));
  EXPECT_EQ(off.tokens, expected);
  EXPECT_EQ(off.prefix_hit_tokens, 0);
  EXPECT_EQ(off.host_hit_tokens, 0);
  EXPECT_EQ(off.transfers, 0);
  ExpectClean(off);

  struct Case {
    int64_t host_budget_bytes;
    HostTierPolicy policy;
    int64_t host_hit_tokens, loads, linear_loads, evictions;
  };
  const Case cases[] = {
      {64 * 1024, HostTierPolicy::kWriteThrough, 48, 8, 3, 0},
      {64 * 1024, HostTierPolicy::kWriteBack, 48, 7, 3, 0},
      {8 * 1024, HostTierPolicy::kWriteBack, 48, 7, 3, 71},      // thrashes, still hits
      {8 * 1024, HostTierPolicy::kWriteThrough, 0, 0, 0, 112},   // thrashes the prefix out
      {4 * 1024, HostTierPolicy::kWriteThrough, 0, 0, 0, 96},
      {4 * 1024, HostTierPolicy::kWriteBack, 0, 0, 0, 101},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(testing::Message() << "host budget " << c.host_budget_bytes << ", policy "
                                    << static_cast<int>(c.policy));
    const RunResult r = MustRun(model, requests, EvictingOptions(c.host_budget_bytes, c.policy));
    EXPECT_EQ(r.tokens, expected);
    EXPECT_EQ(r.host_hit_tokens, c.host_hit_tokens);
    EXPECT_EQ(r.prefix_hit_tokens, c.host_hit_tokens);  // the device alone serves nothing
    EXPECT_EQ(r.host.loads, c.loads);
    EXPECT_EQ(Loaded(r, LayerKind::kLinearAttention), c.linear_loads);
    EXPECT_EQ(r.host.evictions, c.evictions);
    EXPECT_EQ(r.load_starts.size(), c.host_hit_tokens / 16);
    ExpectClean(r);
  }
}

// Transfers reported three steps after they were scheduled: the loading requests wait out of
// the batch (their load targets hold NaN until then) and generate the same tokens, while the
// next request runs (the run takes no more steps). Under write-through, blocks whose saves are
// in flight stay pinned in device memory, so one of the three later shared-prefix requests
// finds its prefix there instead of in host memory.
TEST(ModelEndToEnd, LoadsInFlightForStepsGiveTheSameTokens) {
  const TinyModel model(1);
  const std::vector<Request> requests = EvictingWorkload();
  struct Case {
    HostTierPolicy policy;
    int64_t prefix_hit_tokens, host_hit_tokens, steps, steps_late;
  };
  for (const Case& c : {Case{HostTierPolicy::kWriteThrough, 48, 32, 53, 53},
                        Case{HostTierPolicy::kWriteBack, 48, 48, 53, 53}}) {
    RunOptions options = EvictingOptions(64 * 1024, c.policy);
    const RunResult prompt = MustRun(model, requests, options);
    options.transfer_delay_steps = 3;
    const RunResult late = MustRun(model, requests, options);
    EXPECT_EQ(late.tokens, Expected(model, requests));
    EXPECT_EQ(late.prefix_hit_tokens, c.prefix_hit_tokens);
    EXPECT_EQ(late.host_hit_tokens, c.host_hit_tokens);
    EXPECT_EQ(prompt.steps, c.steps);
    EXPECT_EQ(late.steps, c.steps_late);
    ExpectClean(late);
  }
}

// Loads reported failed (succeeded = false, nothing copied, the targets left holding NaN):
// the request computes the prefix instead. The first failed transfer, then every one.
TEST(ModelEndToEnd, FailedLoadsRecomputeThePrefix) {
  const TinyModel model(1);
  const std::vector<Request> requests = EvictingWorkload();
  struct Case {
    HostTierPolicy policy;
    int64_t host_hit_tokens_one_failed;
  };
  for (const Case& c : {Case{HostTierPolicy::kWriteThrough, 16},
                        Case{HostTierPolicy::kWriteBack, 32}}) {
    RunOptions options = EvictingOptions(64 * 1024, c.policy);
    options.transfer_delay_steps = 1;
    options.failed_load_transfers = 1;
    const RunResult one = MustRun(model, requests, options);
    options.failed_load_transfers = 100;
    const RunResult all = MustRun(model, requests, options);
    EXPECT_EQ(one.tokens, Expected(model, requests));
    EXPECT_EQ(all.tokens, one.tokens);
    EXPECT_EQ(one.host_hit_tokens, c.host_hit_tokens_one_failed);
    EXPECT_EQ(all.host_hit_tokens, 0);
    EXPECT_EQ(all.prefix_hit_tokens, 0);
    EXPECT_EQ(all.host.loads, 0);
    EXPECT_GT(one.host.failed_transfers, 0);
    ExpectClean(one);
    ExpectClean(all);
  }
}

// Each request that loads is aborted while its load is in flight (right after the step that
// started it, and one step later): the others' tokens do not change and every block is free
// once the transfers are reported.
TEST(ModelEndToEnd, AbortWhileLoadingLeavesEveryBlockFree) {
  const TinyModel model(1);
  const std::vector<Request> requests = EvictingWorkload();
  const auto expected = Expected(model, requests);
  for (HostTierPolicy policy : {HostTierPolicy::kWriteThrough, HostTierPolicy::kWriteBack}) {
    RunOptions options = EvictingOptions(64 * 1024, policy);
    options.transfer_delay_steps = 2;
    const RunResult baseline = MustRun(model, requests, options);
    const bool through = policy == HostTierPolicy::kWriteThrough;
    ASSERT_EQ(baseline.load_starts.size(), through ? 2u : 3u);
    const std::vector<int64_t> host_hits = through ? std::vector<int64_t>{16, 16, 16, 16}
                                                   : std::vector<int64_t>{16, 16, 32, 32, 32, 32};
    auto host_hit = host_hits.begin();
    for (const auto& [start, victim] : baseline.load_starts) {
      for (const auto& [step, point] : {std::pair{start, StepPoint::kAfterSchedule},
                                        std::pair{start + 1, StepPoint::kAfterUpdate}}) {
        RunOptions aborting = options;
        aborting.hook = [&, step = step, point = point](int64_t s, StepPoint p,
                                                        const SchedulerOutput*) {
          return s == step && p == point ? std::vector<RequestId>{victim}
                                         : std::vector<RequestId>{};
        };
        const RunResult r = MustRun(model, requests, aborting);
        SCOPED_TRACE(testing::Message() << "request " << victim.value << " aborted at step "
                                        << step);
        EXPECT_FALSE(r.tokens.contains(victim.value));
        for (const auto& [id, tokens] : expected) {
          if (id == victim.value) continue;
          EXPECT_EQ(r.tokens.at(id), tokens) << "request " << id;
        }
        EXPECT_EQ(r.host_hit_tokens, *host_hit++);  // the other requests' loads
        ExpectClean(r);
      }
    }
  }
}

}  // namespace
}  // namespace kvpage::e2e
