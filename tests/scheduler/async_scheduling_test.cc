// Async scheduling (SchedulerConfig::async_scheduling): Schedule() runs once more before the
// previous output's Update(), with exact token counts for requests that end a step late, an
// abort between Schedule and Update, preemption with a step in flight, blocks cached only once
// their tokens arrive, and the same tokens as synchronous scheduling on a random workload.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <random>

#include "block/manager_test_util.h"
#include "kvpage/scheduler.h"
#include "scheduler/scheduler_test_util.h"

namespace kvpage {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::Concat;
using testing::Tokens;
using testing::TinyModel;

// kTinyFull costs 512 bytes per 16-token block: a budget of `blocks` blocks, one chunk.
SchedulerConfig AsyncConfig(int32_t blocks, int32_t budget_tokens = 8192) {
  SchedulerConfig c;
  c.kv.block_size = 16;
  c.kv.kv_budget_bytes = int64_t{blocks} * 512;
  c.kv.chunk_bytes = c.kv.kv_budget_bytes;
  c.kv.hash_seed = 7;
  c.max_num_batched_tokens = budget_tokens;
  c.async_scheduling = true;
  return c;
}

std::unique_ptr<Scheduler> Make(const SchedulerConfig& c) {
  auto s = Scheduler::Create(TinyModel(testing::kTinyFull), c);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *std::move(s) : nullptr;
}

RequestSpec Req(int64_t id, std::vector<int32_t> prompt, int32_t max_new,
                std::vector<int32_t> stop = {}) {
  RequestSpec r;
  r.id = RequestId(id);
  r.prompt_token_ids = std::move(prompt);
  r.max_new_tokens = max_new;
  r.stop_token_ids = std::move(stop);
  return r;
}

// Every sampling request gets `token`.
ModelOutput SampleAll(const SchedulerOutput& out, int32_t token = 5) {
  ModelOutput m;
  m.sampled_offsets.push_back(0);
  for (const ScheduledRequest& r : out.requests) {
    if (r.samples) m.sampled_token_ids.push_back(token);
    m.sampled_offsets.push_back(static_cast<int32_t>(m.sampled_token_ids.size()));
  }
  return m;
}

// (id, tokens scheduled) of the step.
std::map<int64_t, int32_t> Scheduled(const SchedulerOutput& out) {
  std::map<int64_t, int32_t> m;
  for (const ScheduledRequest& r : out.requests) m[r.id.value] = r.num_scheduled_tokens;
  return m;
}

TEST(AsyncSchedulingTest, SpeculativeDecodingIsRefused) {
  SchedulerConfig c = AsyncConfig(16);
  c.num_speculative_tokens = 2;
  const absl::Status s = c.Validate();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("num_speculative_tokens must be 0, got 2"));
  EXPECT_EQ(Scheduler::Create(TinyModel(testing::kTinyFull), c).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// A 20-token prompt with max_new_tokens 3 (length limit 23): the decode steps run at the
// positions of placeholder tokens, and the last step is not scheduled because the one in
// flight samples the third token.
TEST(AsyncSchedulingTest, LengthFinishesOneStepLate) {
  auto s = Make(AsyncConfig(16));
  ASSERT_TRUE(s->AddRequest(Req(0, Tokens(20), 3)).ok());
  const SchedulerOutput& o1 = s->Schedule();
  ASSERT_EQ(o1.requests.size(), 1u);
  EXPECT_EQ(o1.requests[0].num_scheduled_tokens, 20);
  EXPECT_TRUE(o1.requests[0].samples);
  // Step 2 before step 1's tokens: position 20, whose token step 1 samples.
  const SchedulerOutput& o2 = s->Schedule();
  ASSERT_NE(&o1, &o2);
  EXPECT_EQ(o2.step, 2u);
  ASSERT_EQ(o2.requests.size(), 1u);
  EXPECT_EQ(o2.requests[0].num_computed_tokens, 20);
  EXPECT_EQ(o2.requests[0].num_scheduled_tokens, 1);
  EXPECT_TRUE(o2.requests[0].samples);
  EXPECT_EQ(o2.seq_lens[0], 21);
  // Two outputs await Update: Schedule returns the latest again.
  EXPECT_EQ(&s->Schedule(), &o2);
  EXPECT_EQ(s->Schedule().step, 2u);
  EXPECT_SCHED_INVARIANTS(*s);
  auto u1 = s->Update(o1, SampleAll(o1, 7));
  ASSERT_TRUE(u1.ok()) << u1.status();
  EXPECT_TRUE(u1->finished.empty());
  // Step 3: position 21 (step 2's token); the output before it stays valid.
  const SchedulerOutput& o3 = s->Schedule();
  EXPECT_EQ(o3.step, 3u);
  EXPECT_EQ(o2.step, 2u);
  ASSERT_EQ(o3.requests.size(), 1u);
  EXPECT_EQ(o3.requests[0].num_computed_tokens, 21);
  ASSERT_TRUE(s->Update(o2, SampleAll(o2, 8)).ok());
  // Step 4: step 3 samples the third token, so nothing is scheduled.
  const SchedulerOutput& o4 = s->Schedule();
  EXPECT_EQ(o4.step, 4u);
  EXPECT_TRUE(o4.requests.empty());
  EXPECT_EQ(o4.num_rows, 1);
  auto u3 = s->Update(o3, SampleAll(o3, 9));
  ASSERT_TRUE(u3.ok());
  ASSERT_EQ(u3->finished.size(), 1u);
  EXPECT_EQ(u3->finished[0].reason, FinishReason::kLength);
  EXPECT_EQ(u3->finished[0].num_output_tokens, 3);
  ASSERT_TRUE(s->Update(o4, ModelOutput{}).ok());
  EXPECT_FALSE(s->HasUnfinishedRequests());
  EXPECT_EQ(s->kv_cache().Usage().used_bytes, 0);
  EXPECT_EQ(s->stats().steps, 4u);
  EXPECT_SCHED_INVARIANTS(*s);
}

// A stop token arrives while the next step (already scheduled) computes after it: the request
// ends at once, its row leaves, and what the server samples for it in that step is dropped.
TEST(AsyncSchedulingTest, StopTokenEndsTheRequestAndDropsTheStepAfter) {
  auto s = Make(AsyncConfig(16));
  ASSERT_TRUE(s->AddRequest(Req(0, Tokens(20), 10, {99})).ok());
  ASSERT_TRUE(s->AddRequest(Req(1, Tokens(20, 100), 10)).ok());
  const SchedulerOutput& o1 = s->Schedule();
  const SchedulerOutput& o2 = s->Schedule();
  EXPECT_EQ(Scheduled(o2), (std::map<int64_t, int32_t>{{0, 1}, {1, 1}}));
  auto u1 = s->Update(o1, SampleAll(o1, 99));
  ASSERT_TRUE(u1.ok());
  ASSERT_EQ(u1->finished.size(), 1u);
  EXPECT_EQ(u1->finished[0].id, RequestId(0));
  EXPECT_EQ(u1->finished[0].reason, FinishReason::kStop);
  EXPECT_EQ(u1->finished[0].num_output_tokens, 1);
  EXPECT_EQ(s->num_running(), 1);
  EXPECT_SCHED_INVARIANTS(*s);
  // Step 2 still lists request 0 (the server may have launched it); its token is dropped.
  auto u2 = s->Update(o2, SampleAll(o2, 99));
  ASSERT_TRUE(u2.ok()) << u2.status();
  EXPECT_TRUE(u2->finished.empty());  // 99 is not request 1's stop token
  const SchedulerOutput& o3 = s->Schedule();
  EXPECT_THAT(o3.finished_ids, ElementsAre(RequestId(0)));
  EXPECT_EQ(Scheduled(o3), (std::map<int64_t, int32_t>{{1, 1}}));
  EXPECT_EQ(o3.num_rows, 1);
  EXPECT_EQ(s->stats().finished, 1);
  EXPECT_SCHED_INVARIANTS(*s);
}

// Abort between Schedule and Update with two outputs outstanding: both drop the request's
// tokens, given or not, and its blocks are free at once.
TEST(AsyncSchedulingTest, AbortWithTwoStepsInFlight) {
  auto s = Make(AsyncConfig(16));
  ASSERT_TRUE(s->AddRequest(Req(0, Tokens(40), 10)).ok());
  ASSERT_TRUE(s->AddRequest(Req(1, Tokens(20, 100), 10)).ok());
  const SchedulerOutput& o1 = s->Schedule();
  const SchedulerOutput& o2 = s->Schedule();
  EXPECT_EQ(s->kv_cache().Usage().used_bytes, (3 + 2) * 512);
  ASSERT_TRUE(s->Abort(RequestId(0)).ok());
  EXPECT_EQ(s->kv_cache().Usage().used_bytes, 2 * 512);
  EXPECT_EQ(s->num_running(), 1);
  EXPECT_SCHED_INVARIANTS(*s);
  ASSERT_TRUE(s->Update(o1, SampleAll(o1)).ok());  // a token for request 0 too
  ModelOutput only_one;  // none for request 0 (o2 lists it first)
  only_one.sampled_token_ids = {6};
  only_one.sampled_offsets = {0, 0, 1};
  ASSERT_EQ(o2.requests[0].id, RequestId(0));
  ASSERT_TRUE(s->Update(o2, only_one).ok());
  EXPECT_EQ(s->stats().aborted, 1);
  const SchedulerOutput& o3 = s->Schedule();
  EXPECT_THAT(o3.finished_ids, ElementsAre(RequestId(0)));
  EXPECT_EQ(Scheduled(o3), (std::map<int64_t, int32_t>{{1, 1}}));
  EXPECT_EQ(o3.requests[0].num_computed_tokens, 21);  // prompt 20, then step 2's position 20
  EXPECT_SCHED_INVARIANTS(*s);
}

// Outputs apply once each, oldest first.
TEST(AsyncSchedulingTest, UpdateTakesOutputsInOrder) {
  auto s = Make(AsyncConfig(16));
  ASSERT_TRUE(s->AddRequest(Req(0, Tokens(20), 10)).ok());
  const SchedulerOutput& o1 = s->Schedule();
  const SchedulerOutput& o2 = s->Schedule();
  EXPECT_EQ(s->Update(o2, SampleAll(o2)).status().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(s->Update(o1, SampleAll(o1)).ok());
  EXPECT_EQ(s->Update(o1, SampleAll(o1)).status().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(s->Update(o2, SampleAll(o2)).ok());
  EXPECT_EQ(s->Update(o2, SampleAll(o2)).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_SCHED_INVARIANTS(*s);
}

// 7 blocks: A (64 tokens, 4 blocks) and B (32 tokens, 2 blocks) compute their prompts in step
// 1; step 2, scheduled before step 1's tokens, gives A its 7th block and preempts B, the last
// running request, whose step 1 is in flight. Step 1's token for B still counts: here it is
// B's stop token, which ends B from the waiting queue.
TEST(AsyncSchedulingTest, PreemptedRequestKeepsItsTokenInFlight) {
  for (const bool stop : {false, true}) {
    SCOPED_TRACE(stop ? "stop" : "no stop");
    auto s = Make(AsyncConfig(7, 100));
    ASSERT_TRUE(s->AddRequest(Req(0, Tokens(64), 4)).ok());
    ASSERT_TRUE(s->AddRequest(Req(1, Tokens(32, 1000), 3, {99})).ok());
    const SchedulerOutput& o1 = s->Schedule();
    EXPECT_EQ(Scheduled(o1), (std::map<int64_t, int32_t>{{0, 64}, {1, 32}}));
    const SchedulerOutput& o2 = s->Schedule();
    EXPECT_EQ(Scheduled(o2), (std::map<int64_t, int32_t>{{0, 1}}));
    EXPECT_THAT(o2.preempted_ids, ElementsAre(RequestId(1)));
    EXPECT_EQ(s->kv_cache().Usage().used_bytes, 5 * 512);
    EXPECT_SCHED_INVARIANTS(*s);
    ModelOutput m1;
    m1.sampled_token_ids = {5, stop ? 99 : 6};
    m1.sampled_offsets = {0, 1, 2};
    ASSERT_EQ(o1.requests[1].id, RequestId(1));
    auto u1 = s->Update(o1, m1);
    ASSERT_TRUE(u1.ok()) << u1.status();
    EXPECT_SCHED_INVARIANTS(*s);
    if (stop) {
      ASSERT_EQ(u1->finished.size(), 1u);
      EXPECT_EQ(u1->finished[0].id, RequestId(1));
      EXPECT_EQ(u1->finished[0].reason, FinishReason::kStop);
      EXPECT_EQ(u1->finished[0].num_output_tokens, 1);
      EXPECT_EQ(s->num_waiting(), 0);
    } else {
      EXPECT_TRUE(u1->finished.empty());
      EXPECT_EQ(s->num_waiting(), 1);
    }
    // A finishes (4 tokens); B then resumes, recomputing its prompt and the kept token.
    std::map<int64_t, int32_t> outputs;
    const SchedulerOutput* prev = &o2;
    bool resumed = false;
    for (int i = 0; i < 20 && (s->HasUnfinishedRequests() || prev != nullptr); ++i) {
      const SchedulerOutput* next = s->HasUnfinishedRequests() ? &s->Schedule() : nullptr;
      if (next != nullptr) {
        for (const ScheduledRequest& r : next->requests) {
          if (r.id == RequestId(1) && r.resumed) {
            resumed = true;
            EXPECT_EQ(r.num_computed_tokens, 32);  // its prompt's two blocks, cached
            EXPECT_EQ(r.num_scheduled_tokens, 1);  // the kept token
          }
        }
      }
      auto u = s->Update(*prev, SampleAll(*prev, 7));
      ASSERT_TRUE(u.ok()) << u.status();
      for (const FinishedRequest& f : u->finished) outputs[f.id.value] = f.num_output_tokens;
      EXPECT_SCHED_INVARIANTS(*s);
      prev = next;
    }
    EXPECT_FALSE(s->HasUnfinishedRequests());
    EXPECT_EQ(outputs[0], 4);
    EXPECT_EQ(resumed, !stop);
    if (!stop) {
      EXPECT_EQ(outputs[1], 3);
    }
    EXPECT_EQ(s->stats().preemptions, 1);
  }
}

// The block a placeholder completes is hashed only once its token arrives, and cached only
// once the step that wrote it is applied.
TEST(AsyncSchedulingTest, PlaceholderBlocksAreCachedOnlyWithTheirToken) {
  auto s = Make(AsyncConfig(16));
  ASSERT_TRUE(s->AddRequest(Req(0, Tokens(15), 8)).ok());
  const std::vector<int32_t> real = Concat(Tokens(15), {500, 1});
  const std::vector<int32_t> other = Concat(Tokens(15), {501, 1});
  auto cached = [&](const std::vector<int32_t>& prompt) {
    return s->kv_cache().CachedPrefixTokens(prompt);
  };
  const SchedulerOutput& o1 = s->Schedule();  // positions 0-14, samples token 15
  const SchedulerOutput& o2 = s->Schedule();  // position 15: block 0 full, token unknown
  EXPECT_EQ(o2.requests[0].num_computed_tokens, 15);
  ASSERT_TRUE(s->Update(o1, SampleAll(o1, 500)).ok());
  EXPECT_EQ(cached(real), 0);  // step 2 wrote position 15 and has not been applied
  const SchedulerOutput& o3 = s->Schedule();  // position 16: block 1
  EXPECT_EQ(o3.requests[0].num_computed_tokens, 16);
  EXPECT_EQ(cached(real), 0);
  ASSERT_TRUE(s->Update(o2, SampleAll(o2, 1)).ok());
  EXPECT_EQ(cached(real), 16);
  EXPECT_EQ(cached(other), 0);
  ASSERT_TRUE(s->Update(o3, SampleAll(o3, 2)).ok());
  EXPECT_SCHED_INVARIANTS(*s);
}

// One request's tokens under a made-up model: a function of the request and its outputs so far.
int32_t NextToken(int64_t id, int64_t num_output) {
  return static_cast<int32_t>((id * 7919 + num_output * 104729) % 1000);
}

struct RunResult {
  std::map<int64_t, FinishedRequest> finished;
  int64_t preemptions = 0;
  uint64_t steps = 0;
};

// Runs a random workload on a small cache (preemptions, prefix hits, stop tokens, aborts),
// synchronously or async; the server keeps each request's outputs and samples NextToken.
RunResult RunWorkload(bool async_scheduling, uint32_t seed) {
  SchedulerConfig c = AsyncConfig(24, 64);
  c.async_scheduling = async_scheduling;
  auto s = Make(c);
  RunResult run;
  std::mt19937 rng(seed);
  for (int64_t id = 0; id < 24; ++id) {
    const int64_t len = 10 + static_cast<int64_t>(rng() % 60);
    const int32_t first = static_cast<int32_t>(rng() % 3) * 100;  // shared prefixes
    std::vector<int32_t> stop;
    if (id % 3 == 0) stop.push_back(NextToken(id, 5 + id % 7));  // stops after a few tokens
    EXPECT_TRUE(s->AddRequest(Req(id, Tokens(len, first), 4 + static_cast<int32_t>(id % 11),
                                  stop)).ok());
  }
  // What the server knows: outputs delivered. A sampled token counts unless the request is
  // gone (the scheduler says so through `finished` and finished_ids).
  std::map<int64_t, int64_t> sampled;  // tokens sampled per request (async: may run ahead)
  auto sample = [&](const SchedulerOutput& out) {
    ModelOutput m;
    m.sampled_offsets.push_back(0);
    for (const ScheduledRequest& r : out.requests) {
      if (r.samples) m.sampled_token_ids.push_back(NextToken(r.id.value, sampled[r.id.value]++));
      m.sampled_offsets.push_back(static_cast<int32_t>(m.sampled_token_ids.size()));
    }
    return m;
  };
  std::vector<std::pair<const SchedulerOutput*, ModelOutput>> in_flight;
  auto apply = [&]() {
    auto u = s->Update(*in_flight.front().first, in_flight.front().second);
    EXPECT_TRUE(u.ok()) << u.status();
    for (const FinishedRequest& f : u->finished) run.finished[f.id.value] = f;
    in_flight.erase(in_flight.begin());
    EXPECT_TRUE(s->CheckInvariants().ok()) << s->CheckInvariants();
  };
  for (int i = 0; i < 2000 && s->HasUnfinishedRequests(); ++i) {
    const SchedulerOutput& out = s->Schedule();
    in_flight.emplace_back(&out, sample(out));
    if (!async_scheduling || in_flight.size() == 2) apply();
  }
  while (!in_flight.empty()) apply();
  EXPECT_FALSE(s->HasUnfinishedRequests());
  run.preemptions = s->stats().preemptions;
  run.steps = s->stats().steps;
  return run;
}

// The same tokens and finish reasons with async scheduling on and off: a request's outputs
// are NextToken(id, 0 .. n − 1) either way, so comparing counts and reasons compares tokens.
TEST(AsyncSchedulingTest, SameOutputsAsSynchronousScheduling) {
  for (uint32_t seed : {1u, 2u, 3u}) {
    SCOPED_TRACE(seed);
    const RunResult sync = RunWorkload(false, seed);
    const RunResult async = RunWorkload(true, seed);
    ASSERT_EQ(sync.finished.size(), 24u);
    ASSERT_EQ(async.finished.size(), 24u);
    for (const auto& [id, f] : sync.finished) {
      const FinishedRequest& a = async.finished.at(id);
      EXPECT_EQ(a.reason, f.reason) << "request " << id;
      EXPECT_EQ(a.num_output_tokens, f.num_output_tokens) << "request " << id;
    }
    EXPECT_GT(sync.preemptions, 0);
    EXPECT_GT(async.preemptions, 0);
  }
}

}  // namespace
}  // namespace kvpage
