// The scheduler with a host tier behind the prefix cache: a request whose prefix loads from
// host memory waits outside the queue until Scheduler::CompleteTransfers, counts as waiting,
// can be aborted meanwhile, and is counted in stats.host_hit_tokens once it runs. Invariants
// after every call.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <vector>

#include "block/manager_test_util.h"
#include "kvpage/scheduler.h"
#include "scheduler/scheduler_test_util.h"

namespace kvpage {
namespace {

using testing::Concat;
using testing::TinyModel;
using testing::Tokens;

// kTinyFull: 512-byte blocks of 16 tokens, one per chunk; 12 in device memory, 32 in host.
SchedulerConfig TieredConfig(HostTierPolicy policy) {
  SchedulerConfig c;
  c.kv.block_size = 16;
  c.kv.kv_budget_bytes = 12 * 512;
  c.kv.chunk_bytes = 512;
  c.kv.hash_seed = 7;
  c.kv.host_cache = {.budget_bytes = 32 * 512, .policy = policy};
  return c;
}

std::unique_ptr<Scheduler> MakeScheduler(const ModelSpec& model, const SchedulerConfig& c) {
  auto s = Scheduler::Create(model, c);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *std::move(s) : nullptr;
}

RequestSpec Req(int64_t id, std::vector<int32_t> prompt, int32_t max_new = 1) {
  return {.id = RequestId(id), .prompt_token_ids = std::move(prompt), .max_new_tokens = max_new};
}

ModelOutput SampleAll(const SchedulerOutput& out) {
  ModelOutput m;
  m.sampled_offsets.push_back(0);
  for (const ScheduledRequest& r : out.requests) {
    if (r.samples) m.sampled_token_ids.push_back(5);
    m.sampled_offsets.push_back(static_cast<int32_t>(m.sampled_token_ids.size()));
  }
  return m;
}

// One step: Schedule, Update; invariants after each. Returns the output's transfers and batch.
struct StepResult {
  TierTransfers transfers;
  std::vector<ScheduledRequest> requests;
  std::vector<RequestId> finished_ids;
};
StepResult Step(Scheduler& s) {
  const SchedulerOutput& out = s.Schedule();
  EXPECT_TRUE(s.CheckInvariants().ok()) << s.CheckInvariants();
  StepResult r{out.transfers, out.requests, out.finished_ids};
  EXPECT_TRUE(s.Update(out, SampleAll(out)).ok());
  EXPECT_TRUE(s.CheckInvariants().ok()) << s.CheckInvariants();
  return r;
}

// Reports a transfer as run (none when the id is 0).
void Report(Scheduler& s, const TierTransfers& t) {
  if (t.id == 0) return;
  const absl::Status done = s.CompleteTransfers(t.id);
  EXPECT_TRUE(done.ok()) << done;
}

// Steps until nothing is left to run, reporting every transfer at once.
void RunAndComplete(Scheduler& s) {
  for (int i = 0; i < 100 && s.HasUnfinishedRequests(); ++i) {
    const StepResult r = Step(s);
    Report(s, r.transfers);
  }
  ASSERT_FALSE(s.HasUnfinishedRequests());
}

const std::vector<int32_t> kCommon = Tokens(48);

// r1 caches a 48-token prefix (3 blocks) and finishes; r2, 176 other tokens, needs 11 of the 12
// device blocks and evicts the prefix from device memory. The host tier holds its 3 blocks.
void CacheThenEvictPrefix(Scheduler& s) {
  ASSERT_TRUE(s.AddRequest(Req(1, Concat(kCommon, Tokens(7, 1000)))).ok());
  RunAndComplete(s);
  ASSERT_TRUE(s.AddRequest(Req(2, Tokens(176, 5000))).ok());
  RunAndComplete(s);
  // Write-through: the saves of r2's blocks, queued by its last step, come with the next output.
  const StepResult idle = Step(s);
  Report(s, idle.transfers);
  ASSERT_EQ(s.kv_cache().Usage().used_bytes, 0);
}

class HostTierSchedulerTest : public ::testing::TestWithParam<HostTierPolicy> {};

INSTANTIATE_TEST_SUITE_P(Policies, HostTierSchedulerTest,
                         ::testing::Values(HostTierPolicy::kWriteThrough,
                                           HostTierPolicy::kWriteBack));

TEST_P(HostTierSchedulerTest, LoadingRequestWaitsUntilCompleteTransfers) {
  auto s = MakeScheduler(TinyModel(testing::kTinyFull), TieredConfig(GetParam()));
  CacheThenEvictPrefix(*s);
  ASSERT_TRUE(s->AddRequest(Req(3, Concat(kCommon, Tokens(5, 4000)), 2)).ok());
  const StepResult first = Step(*s);
  EXPECT_TRUE(first.requests.empty());
  ASSERT_NE(first.transfers.id, 0u);
  EXPECT_EQ(first.transfers.loads.size(), 3u);
  EXPECT_EQ(s->num_waiting(), 1);
  EXPECT_EQ(s->num_running(), 0);
  EXPECT_TRUE(s->HasUnfinishedRequests());
  // However many steps pass, it is not scheduled before its transfer is reported.
  for (int i = 0; i < 3; ++i) {
    const StepResult idle = Step(*s);
    EXPECT_TRUE(idle.requests.empty());
    EXPECT_EQ(idle.transfers.id, 0u);
    EXPECT_EQ(s->num_waiting(), 1);
  }
  ASSERT_TRUE(s->CompleteTransfers(first.transfers.id).ok());
  EXPECT_SCHED_INVARIANTS(*s);
  EXPECT_EQ(s->num_waiting(), 1);
  EXPECT_EQ(s->CompleteTransfers(first.transfers.id).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s->CompleteTransfers(999).code(), absl::StatusCode::kNotFound);
  const StepResult run = Step(*s);
  ASSERT_EQ(run.requests.size(), 1u);
  EXPECT_EQ(run.requests[0].id, RequestId(3));
  EXPECT_EQ(run.requests[0].num_computed_tokens, 48);
  EXPECT_EQ(run.requests[0].num_scheduled_tokens, 5);
  EXPECT_TRUE(run.requests[0].is_new);
  EXPECT_EQ(s->num_waiting(), 0);
  EXPECT_EQ(s->stats().prefix_hit_tokens, 48);
  EXPECT_EQ(s->stats().host_hit_tokens, 48);
  EXPECT_EQ(s->kv_cache().host_cache_stats().loads, 3);
  EXPECT_EQ(s->kv_cache().host_cache_stats().loaded_tokens, 48);
  RunAndComplete(*s);
  EXPECT_EQ(s->stats().host_hit_tokens, 48);  // counted once
  EXPECT_EQ(s->stats().finished, 3);
}

TEST_P(HostTierSchedulerTest, FailedLoadComputesThePrefixAndIsNotRetried) {
  auto s = MakeScheduler(TinyModel(testing::kTinyFull), TieredConfig(GetParam()));
  CacheThenEvictPrefix(*s);
  ASSERT_TRUE(s->AddRequest(Req(3, Concat(kCommon, Tokens(5, 4000)), 2)).ok());
  const StepResult first = Step(*s);
  ASSERT_EQ(first.transfers.loads.size(), 3u);
  ASSERT_TRUE(s->CompleteTransfers(first.transfers.id, /*succeeded=*/false).ok());
  EXPECT_SCHED_INVARIANTS(*s);
  const StepResult run = Step(*s);
  ASSERT_EQ(run.requests.size(), 1u);
  EXPECT_EQ(run.requests[0].num_computed_tokens, 0);
  EXPECT_EQ(run.requests[0].num_scheduled_tokens, 53);
  EXPECT_TRUE(run.transfers.loads.empty());  // no second load
  EXPECT_EQ(s->stats().prefix_hit_tokens, 0);
  EXPECT_EQ(s->stats().host_hit_tokens, 0);
  // Write-back: the transfer also carried the saves of the 3 blocks the loads evicted, and
  // failing it fails them too.
  EXPECT_EQ(s->kv_cache().host_cache_stats().failed_transfers,
            GetParam() == HostTierPolicy::kWriteThrough ? 3 : 6);
  Report(*s, run.transfers);
  RunAndComplete(*s);
  EXPECT_EQ(s->stats().host_hit_tokens, 0);
}

TEST_P(HostTierSchedulerTest, AbortWhileLoadingFreesEverythingOnceTheTransferCompletes) {
  auto s = MakeScheduler(TinyModel(testing::kTinyFull), TieredConfig(GetParam()));
  CacheThenEvictPrefix(*s);
  ASSERT_TRUE(s->AddRequest(Req(3, Concat(kCommon, Tokens(5, 4000)), 2)).ok());
  const StepResult first = Step(*s);
  ASSERT_EQ(first.transfers.loads.size(), 3u);
  ASSERT_TRUE(s->Abort(RequestId(3)).ok());
  EXPECT_SCHED_INVARIANTS(*s);
  EXPECT_EQ(s->num_waiting(), 0);
  EXPECT_FALSE(s->HasUnfinishedRequests());
  EXPECT_EQ(s->stats().aborted, 1);
  EXPECT_EQ(s->Abort(RequestId(3)).code(), absl::StatusCode::kNotFound);
  // The copy may still be running: its three target blocks stay held until it is reported.
  EXPECT_EQ(s->kv_cache().Usage().used_bytes, 3 * 512);
  const StepResult next = Step(*s);
  EXPECT_THAT(next.finished_ids, ::testing::ElementsAre(RequestId(3)));
  EXPECT_EQ(s->kv_cache().Usage().used_bytes, 3 * 512);
  ASSERT_TRUE(s->CompleteTransfers(first.transfers.id).ok());
  EXPECT_SCHED_INVARIANTS(*s);
  EXPECT_EQ(s->kv_cache().Usage().used_bytes, 0);
  EXPECT_EQ(s->stats().host_hit_tokens, 0);
  // The id is free again. The aborted request's loaded blocks went back uncached, so a new
  // request with the prefix loads it again.
  ASSERT_TRUE(s->AddRequest(Req(3, Concat(kCommon, Tokens(5, 4000)), 2)).ok());
  const StepResult again = Step(*s);
  EXPECT_TRUE(again.requests.empty());
  EXPECT_EQ(again.transfers.loads.size(), 3u);
  Report(*s, again.transfers);
  RunAndComplete(*s);
  EXPECT_EQ(s->stats().host_hit_tokens, 48);
  EXPECT_EQ(s->kv_cache().host_cache_stats().loads, 6);
}

// A loaded request goes back to its place in the queue: ahead of requests that arrived after
// it, even though one of them ran while it loaded.
TEST_P(HostTierSchedulerTest, LoadedRequestKeepsItsPlaceInTheQueue) {
  SchedulerConfig c = TieredConfig(GetParam());
  c.max_num_seqs = 1;
  auto s = MakeScheduler(TinyModel(testing::kTinyFull), c);
  CacheThenEvictPrefix(*s);
  ASSERT_TRUE(s->AddRequest(Req(3, Concat(kCommon, Tokens(5, 4000)), 2)).ok());
  ASSERT_TRUE(s->AddRequest(Req(4, Tokens(20, 7000), 2)).ok());
  ASSERT_TRUE(s->AddRequest(Req(5, Tokens(20, 8000), 2)).ok());
  const StepResult first = Step(*s);
  ASSERT_EQ(first.transfers.loads.size(), 3u);
  ASSERT_EQ(first.requests.size(), 1u);
  EXPECT_EQ(first.requests[0].id, RequestId(4));  // r3 loads; the next request runs
  EXPECT_EQ(s->num_waiting(), 2);
  ASSERT_TRUE(s->CompleteTransfers(first.transfers.id).ok());
  std::vector<int64_t> order;
  for (int i = 0; i < 20 && s->HasUnfinishedRequests(); ++i) {
    const StepResult r = Step(*s);
    for (const ScheduledRequest& q : r.requests) {
      if (q.is_new) order.push_back(q.id.value);
    }
    Report(*s, r.transfers);
  }
  EXPECT_THAT(order, ::testing::ElementsAre(3, 5));
  EXPECT_EQ(s->stats().host_hit_tokens, 48);
}

// Three requests with the same evicted prefix, admitted in one step: none finds it on the
// device while the others' loads are in flight, so each loads its own copy (9 blocks).
TEST_P(HostTierSchedulerTest, RequestsAdmittedTogetherEachLoadTheirPrefix) {
  auto s = MakeScheduler(TinyModel(testing::kTinyFull), TieredConfig(GetParam()));
  CacheThenEvictPrefix(*s);
  for (int64_t id = 3; id < 6; ++id) {
    ASSERT_TRUE(s->AddRequest(Req(id, Concat(kCommon, Tokens(5, 1000 * id)), 2)).ok());
  }
  const StepResult first = Step(*s);
  EXPECT_TRUE(first.requests.empty());
  EXPECT_EQ(first.transfers.loads.size(), 9u);
  EXPECT_EQ(s->num_waiting(), 3);
  EXPECT_EQ(s->kv_cache().Usage().used_bytes, 9 * 512);
  Report(*s, first.transfers);
  RunAndComplete(*s);
  EXPECT_EQ(s->stats().finished, 5);
  EXPECT_EQ(s->stats().prefix_hit_tokens, 3 * 48);
  EXPECT_EQ(s->stats().host_hit_tokens, 3 * 48);
  EXPECT_EQ(s->kv_cache().host_cache_stats().loads, 9);
  EXPECT_EQ(s->kv_cache().Usage().used_bytes, 0);
}

// Write-through saves queued by a step's completion (Update) come with the next output: an
// idle server schedules one more (empty) step to hand them over; until they are reported their
// device blocks stay held.
TEST(HostTierSchedulerIdleTest, LastStepSavesComeWithTheNextOutput) {
  auto s = MakeScheduler(TinyModel(testing::kTinyFull),
                         TieredConfig(HostTierPolicy::kWriteThrough));
  ASSERT_TRUE(s->AddRequest(Req(1, Concat(kCommon, Tokens(7, 1000)))).ok());
  const StepResult only = Step(*s);
  EXPECT_EQ(only.transfers.id, 0u);
  EXPECT_FALSE(s->HasUnfinishedRequests());
  EXPECT_EQ(s->kv_cache().Usage().used_bytes, 3 * 512);  // pinned for their saves
  const StepResult idle = Step(*s);
  EXPECT_TRUE(idle.requests.empty());
  EXPECT_EQ(idle.transfers.saves.size(), 3u);
  ASSERT_TRUE(s->CompleteTransfers(idle.transfers.id).ok());
  EXPECT_EQ(s->kv_cache().Usage().used_bytes, 0);
  EXPECT_EQ(s->kv_cache().host_cache_stats().ready_blocks, 3);
}

// Scheduler::Create probes the longest request through the real allocator, with a made-up
// prompt. Its steps cache blocks and state snapshots (a hybrid model commits each chunk as the
// next one is allocated): write-through pins them for saves, write-back saves what the probe
// evicts. None of that may outlive Create: no block held, no save queued, and the same
// max_model_len as without a tier. (On 3bdad51, write-through: 253,536 bytes held, 285 saves
// in flight, max_model_len 64 instead of 4096.)
TEST_P(HostTierSchedulerTest, ProbeLeavesNothingBehind) {
  SchedulerConfig c;
  c.kv.kv_budget_bytes = 256 << 10;
  c.kv.chunk_bytes = 4096;
  c.kv.hash_seed = 7;
  c.kv.host_cache = {.budget_bytes = 1 << 20, .policy = GetParam()};
  c.max_num_batched_tokens = 64;
  auto s = MakeScheduler(TinyModel(testing::kTinyGdn), c);
  ASSERT_NE(s, nullptr);
  EXPECT_SCHED_INVARIANTS(*s);
  EXPECT_EQ(s->kv_cache().Usage().used_bytes, 0);
  EXPECT_EQ(s->kv_cache().host_cache_stats().saving_blocks, 0);
  const StepResult idle = Step(*s);
  EXPECT_TRUE(idle.transfers.empty());
  SchedulerConfig plain = c;
  plain.kv.host_cache = {};
  auto reference = MakeScheduler(TinyModel(testing::kTinyGdn), plain);
  ASSERT_NE(reference, nullptr);
  EXPECT_EQ(s->max_model_len(), reference->max_model_len());
}

}  // namespace
}  // namespace kvpage
