// Blocks become prefix hits only once the step that writes them has completed: Update
// completes the step (KvCacheManager::CompleteStep) before anything else, and a request that
// leaves the step before that (aborted between Schedule and Update, or preempted later in the
// step that scheduled it) caches nothing of it.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>

#include "block/manager_test_util.h"
#include "scheduler/scheduler_test_util.h"
#include "kvpage/scheduler.h"

namespace kvpage {
namespace {

using ::testing::ElementsAre;
using testing::H;
using testing::TinyModel;
using testing::Tokens;

// kTinyFull costs 512 bytes per 16-token block: `blocks` blocks in one chunk, events on.
SchedulerConfig Config(int32_t blocks) {
  SchedulerConfig c;
  c.kv.kv_budget_bytes = int64_t{blocks} * 512;
  c.kv.chunk_bytes = c.kv.kv_budget_bytes;
  c.kv.hash_seed = 7;
  c.kv.enable_kv_events = true;
  return c;
}

std::unique_ptr<Scheduler> Make(const ModelSpec& model, const SchedulerConfig& c) {
  auto s = Scheduler::Create(model, c);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *std::move(s) : nullptr;
}

RequestSpec Req(int64_t id, std::vector<int32_t> prompt, int32_t max_new, int32_t priority = 0,
                double arrival = 0) {
  return RequestSpec{.id = RequestId(id), .prompt_token_ids = std::move(prompt),
                     .max_new_tokens = max_new, .priority = priority, .arrival_time = arrival};
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

std::map<int64_t, int32_t> Scheduled(const SchedulerOutput& out) {
  std::map<int64_t, int32_t> m;
  for (const ScheduledRequest& r : out.requests) m[r.id.value] = r.num_scheduled_tokens;
  return m;
}

const ScheduledRequest* Find(const SchedulerOutput& out, int64_t id) {
  for (const ScheduledRequest& r : out.requests) {
    if (r.id.value == id) return &r;
  }
  return nullptr;
}

int64_t CountStored(const std::vector<KvEvent>& events) {
  int64_t n = 0;
  for (const KvEvent& e : events) n += e.type == KvEvent::Type::kStored ? 1 : 0;
  return n;
}

// Runs steps until no request is left (at most `max_steps`), checking invariants after each.
void RunToEnd(Scheduler& s, int max_steps = 100) {
  for (int i = 0; i < max_steps && s.HasUnfinishedRequests(); ++i) {
    const SchedulerOutput& out = s.Schedule();
    EXPECT_SCHED_INVARIANTS(s);
    ASSERT_TRUE(s.Update(out, SampleAll(out)).ok());
    EXPECT_SCHED_INVARIANTS(s);
  }
  EXPECT_FALSE(s.HasUnfinishedRequests());
}

// The reproduction: A (1,000 prompt tokens) is scheduled, aborted before the forward
// pass, and the server skips its compute. B with the same prompt must compute all of it.
TEST(StepCompletionTest, AbortBeforeTheForwardPassLeavesNoHit) {
  auto s = Make(TinyModel(testing::kTinyFull), Config(200));
  ASSERT_TRUE(s->AddRequest(Req(1, Tokens(1000), 4)).ok());
  const SchedulerOutput& a = s->Schedule();
  EXPECT_EQ(Scheduled(a), (std::map<int64_t, int32_t>{{1, 1000}}));
  ASSERT_TRUE(s->Abort(RequestId(1)).ok());
  EXPECT_SCHED_INVARIANTS(*s);
  ModelOutput none;  // the server skipped A: no sample
  none.sampled_offsets = {0, 0};
  ASSERT_TRUE(s->Update(a, none).ok());
  EXPECT_SCHED_INVARIANTS(*s);
  EXPECT_TRUE(s->DrainKvEvents().empty());  // nothing stored
  KvCacheUsage u = s->kv_cache().Usage();
  EXPECT_EQ(u.used_bytes, 0);
  EXPECT_EQ(u.pools[0].cached_free_blocks, 0);

  ASSERT_TRUE(s->AddRequest(Req(2, Tokens(1000), 4)).ok());
  const SchedulerOutput& b = s->Schedule();
  ASSERT_NE(Find(b, 2), nullptr);
  EXPECT_EQ(Find(b, 2)->num_computed_tokens, 0);
  EXPECT_EQ(Find(b, 2)->num_scheduled_tokens, 1000);
  EXPECT_EQ(s->stats().prefix_hit_tokens, 0);
  ASSERT_TRUE(s->Update(b, SampleAll(b)).ok());
  EXPECT_EQ(CountStored(s->DrainKvEvents()), 62);  // B's 62 full blocks, once B's step ran
  RunToEnd(*s);
  u = s->kv_cache().Usage();
  EXPECT_EQ(u.used_bytes, 0);
  EXPECT_EQ(u.pools[0].used_blocks, 0);
  EXPECT_EQ(u.pools[0].cached_free_blocks + u.pools[0].clean_blocks, 200);

  // B's blocks were written: C hits all but the last block.
  ASSERT_TRUE(s->AddRequest(Req(3, Tokens(1000), 4)).ok());
  const SchedulerOutput& c = s->Schedule();
  ASSERT_NE(Find(c, 3), nullptr);
  EXPECT_EQ(Find(c, 3)->num_computed_tokens, 992);
  EXPECT_EQ(s->stats().prefix_hit_tokens, 992);
  ASSERT_TRUE(s->Update(c, SampleAll(c)).ok());
  RunToEnd(*s);
  EXPECT_EQ(s->kv_cache().Usage().used_bytes, 0);
}

// Two requests with the same prompt admitted in one step: the second cannot hit blocks the
// first writes in that step; a third, one step later, hits them.
TEST(StepCompletionTest, SameStepTwinsBothCompute) {
  auto s = Make(TinyModel(testing::kTinyFull), Config(40));
  ASSERT_TRUE(s->AddRequest(Req(1, Tokens(100), 2)).ok());
  ASSERT_TRUE(s->AddRequest(Req(2, Tokens(100), 2)).ok());
  const SchedulerOutput& o1 = s->Schedule();
  EXPECT_EQ(Scheduled(o1), (std::map<int64_t, int32_t>{{1, 100}, {2, 100}}));
  ASSERT_TRUE(s->Update(o1, SampleAll(o1)).ok());
  // Six blocks each under the same six hashes: a router hears of each hash once.
  EXPECT_EQ(CountStored(s->DrainKvEvents()), 6);
  EXPECT_EQ(s->kv_cache().Usage().pools[0].used_blocks, 14);  // 7 each: nothing shared
  ASSERT_TRUE(s->AddRequest(Req(3, Tokens(100), 2)).ok());
  const SchedulerOutput& o2 = s->Schedule();
  ASSERT_NE(Find(o2, 3), nullptr);
  EXPECT_EQ(Find(o2, 3)->num_computed_tokens, 96);
  ASSERT_TRUE(s->Update(o2, SampleAll(o2)).ok());
  RunToEnd(*s);
  EXPECT_EQ(s->kv_cache().Usage().used_bytes, 0);
}

// Priority preemption of a request scheduled earlier in the same step: the prompt chunk it
// was given never runs, so its blocks go back uncached; the resumed request hits only the
// chunks that ran.
TEST(StepCompletionTest, SameStepPreemptionCachesNothingOfTheStep) {
  SchedulerConfig c = Config(7);
  c.policy = SchedulingPolicy::kPriority;
  c.reserve_full_prompt = false;
  c.long_prefill_token_threshold = 32;
  auto s = Make(TinyModel(testing::kTinyFull), c);
  ASSERT_TRUE(s->AddRequest(Req(0, Tokens(100), 4, /*priority=*/5)).ok());
  const SchedulerOutput& o1 = s->Schedule();
  EXPECT_EQ(Scheduled(o1), (std::map<int64_t, int32_t>{{0, 32}}));
  ASSERT_TRUE(s->Update(o1, SampleAll(o1)).ok());
  ASSERT_TRUE(s->AddRequest(Req(1, Tokens(16, 1000), 3, /*priority=*/0, 1.0)).ok());
  const SchedulerOutput& o2 = s->Schedule();
  EXPECT_EQ(Scheduled(o2), (std::map<int64_t, int32_t>{{0, 32}, {1, 16}}));
  ASSERT_TRUE(s->Update(o2, SampleAll(o2)).ok());
  EXPECT_EQ(CountStored(s->DrainKvEvents()), 5);  // low's 4 blocks, high's 1
  // Low takes two blocks for tokens 64–95 (6 of 7 used); high's token 16 needs a block, and
  // the worst running request, low, gives back its blocks, this step's chunk included.
  const SchedulerOutput& o3 = s->Schedule();
  EXPECT_THAT(o3.preempted_ids, ElementsAre(RequestId(0)));
  EXPECT_EQ(Scheduled(o3), (std::map<int64_t, int32_t>{{1, 1}}));
  EXPECT_SCHED_INVARIANTS(*s);
  const KvCacheUsage u = s->kv_cache().Usage();
  EXPECT_EQ(u.pools[0].used_blocks, 2);
  EXPECT_EQ(u.pools[0].cached_free_blocks, 4);  // low's first two chunks
  EXPECT_EQ(u.pools[0].clean_blocks, 1);        // one of the unwritten chunk's blocks
  ASSERT_TRUE(s->Update(o3, SampleAll(o3)).ok());
  EXPECT_TRUE(s->DrainKvEvents().empty());
  // Low resumes once high is done, from the 64 tokens that were computed.
  bool resumed = false;
  for (int i = 0; i < 20 && s->HasUnfinishedRequests(); ++i) {
    const SchedulerOutput& out = s->Schedule();
    if (const ScheduledRequest* low = Find(out, 0); low != nullptr && low->resumed) {
      EXPECT_EQ(low->num_computed_tokens, 64);
      resumed = true;
    }
    ASSERT_TRUE(s->Update(out, SampleAll(out)).ok());
    EXPECT_SCHED_INVARIANTS(*s);
  }
  EXPECT_TRUE(resumed);
  EXPECT_FALSE(s->HasUnfinishedRequests());
  EXPECT_EQ(s->kv_cache().Usage().used_bytes, 0);
}

// The same reproduction on a hybrid model: the recurrent-state snapshot of the aborted step is
// not registered either.
TEST(StepCompletionTest, HybridAbortBeforeTheForwardPassLeavesNoSnapshot) {
  SchedulerConfig c = Config(0);
  c.kv.kv_budget_bytes = 1 << 20;
  c.kv.chunk_bytes = 64 << 10;
  auto s = Make(TinyModel(testing::kTinyGdn), c);
  ASSERT_TRUE(s->AddRequest(Req(1, Tokens(1000), 4)).ok());
  const SchedulerOutput& a = s->Schedule();
  EXPECT_EQ(Scheduled(a), (std::map<int64_t, int32_t>{{1, 992}}));  // ends on a block boundary
  ASSERT_TRUE(s->Abort(RequestId(1)).ok());
  ModelOutput none;
  none.sampled_offsets = {0, 0};
  ASSERT_TRUE(s->Update(a, none).ok());
  EXPECT_SCHED_INVARIANTS(*s);
  EXPECT_TRUE(s->DrainKvEvents().empty());
  for (const PoolUsage& p : s->kv_cache().Usage().pools) {
    EXPECT_EQ(p.used_blocks, 0);
    EXPECT_EQ(p.cached_free_blocks, 0);
  }
  ASSERT_TRUE(s->AddRequest(Req(2, Tokens(1000), 4)).ok());
  const SchedulerOutput& b = s->Schedule();
  ASSERT_NE(Find(b, 2), nullptr);
  EXPECT_EQ(Find(b, 2)->num_computed_tokens, 0);
  ASSERT_TRUE(s->Update(b, SampleAll(b)).ok());
  RunToEnd(*s);
  EXPECT_EQ(s->kv_cache().Usage().used_bytes, 0);
  // B ran: its snapshot at 992 tokens serves C.
  ASSERT_TRUE(s->AddRequest(Req(3, Tokens(1000), 4)).ok());
  const SchedulerOutput& c3 = s->Schedule();
  ASSERT_NE(Find(c3, 3), nullptr);
  EXPECT_EQ(Find(c3, 3)->num_computed_tokens, 992);
  ASSERT_TRUE(s->Update(c3, SampleAll(c3)).ok());
  RunToEnd(*s);
  EXPECT_EQ(s->kv_cache().Usage().used_bytes, 0);
}

}  // namespace
}  // namespace kvpage
