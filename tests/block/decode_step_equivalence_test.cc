// The batched decode calls (AppendDecodeTokens + AllocateDecodeStep, which skip the steps that
// end before their request's NextEvent) must leave the manager exactly as the per-request
// calls (AppendTokens + AllocateSlots) do: same block tables, same free orders, same usage,
// same number of requests served when memory runs out. Two managers are driven through the
// same seeded decode workload (shared prefixes for hits, sliding windows, recurrent state,
// finishing and new requests, a tight budget) and compared after every step, with
// CheckInvariants on both. A third manager skips every step that ends before the NextEvent it
// read after the request's last allocation (as a scheduler keeps it), and must match as well.
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "block/manager_test_util.h"
#include "kvpage/kv_cache_manager.h"

namespace kvpage {
namespace {

using testing::H;

struct Case {
  std::string name;
  const char* model;
  bool caching;
  int32_t budget_blocks;  // budget = budget_blocks × 1.5 KiB; small = decode steps fail
  // Steps of the 160 where every request was served, and where one ran out of memory. (A
  // linear-attention model hits only at a snapshot; these prompts end past the shared
  // prefixes, so gdn has none.)
  int64_t served_steps;
  int64_t failed_steps;
  int64_t hit_tokens;  // prompt tokens served from the prefix cache, over all admissions
  // Request steps the third manager skipped: in steady decode all but the one in 16 that
  // crosses into a block and, with caching, the one that fills a block (about 14 in 16).
  int64_t quiet_steps;
  // Chunks of one block each (blocks of 2 MiB and more on real models).
  bool one_block_chunks = false;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

struct Live {
  RequestId id;
  int64_t computed = 0;
  int64_t end = 0;  // finishes once it has this many tokens
  int64_t next_event = 0;  // manager q's NextEvent after the request's last allocation
};

class DecodeStepEquivalenceTest : public ::testing::TestWithParam<Case> {};

TEST_P(DecodeStepEquivalenceTest, BatchCallsMatchPerRequestCalls) {
  const Case& c = GetParam();
  const ModelSpec model = testing::TinyModel(c.model);
  KvCacheConfig config;
  config.block_size = 16;
  config.hash_seed = 11;
  config.enable_prefix_caching = c.caching;
  config.kv_budget_bytes = int64_t{c.budget_blocks} * 16 * 32 * 3;
  // Small chunks: pools trade memory through the budget. One byte: every chunk holds one block.
  config.chunk_bytes = c.one_block_chunks ? 1 : 4 * 16 * 32;
  auto made_a = KvCacheManager::Create(model, config);
  auto made_b = KvCacheManager::Create(model, config);
  auto made_q = KvCacheManager::Create(model, config);
  ASSERT_TRUE(made_a.ok()) << made_a.status();
  ASSERT_TRUE(made_b.ok()) << made_b.status();
  ASSERT_TRUE(made_q.ok()) << made_q.status();
  KvCacheManager& a = **made_a;  // per-request calls
  KvCacheManager& b = **made_b;  // batch calls
  KvCacheManager& q = **made_q;  // per-request calls, quiet steps skipped
  const std::vector<KvCacheManager*> all = {&a, &b, &q};
  std::vector<GroupId> attention;
  for (const PoolUsage& p : a.Usage().pools) {
    if (p.kind != LayerKind::kLinearAttention) attention.push_back(p.group);
  }

  std::mt19937_64 rng(7);
  auto uniform = [&](int64_t lo, int64_t hi) {  // portable across standard libraries
    return lo + static_cast<int64_t>(rng() % static_cast<uint64_t>(hi - lo + 1));
  };
  // Prompts start with one of three shared prefixes, so admissions hit each other's blocks.
  const std::vector<std::vector<int32_t>> prefixes = {
      testing::Tokens(40, 1), testing::Tokens(23, 300), testing::Tokens(64, 600)};
  std::vector<Live> live;
  int64_t next_id = 0;
  int64_t served_steps = 0, failed_steps = 0, quiet_steps = 0;

  auto expect_same = [&](const std::string& where) {
    SCOPED_TRACE(where);
    KVPAGE_EXPECT_INVARIANTS(a);
    for (KvCacheManager* m : {&b, &q}) {
      KVPAGE_EXPECT_INVARIANTS(*m);
      for (const Live& r : live) {
        for (GroupId g : attention) {
          auto ta = a.BlockTable(H(a, r.id), g);
          auto tm = m->BlockTable(H(*m, r.id), g);
          ASSERT_TRUE(ta.ok() && tm.ok());
          ASSERT_EQ(testing::Ids(*ta), testing::Ids(*tm)) << "request " << r.id.value;
        }
        ASSERT_EQ(a.Tokens(H(a, r.id))->size(), m->Tokens(H(*m, r.id))->size());
      }
      for (GroupId g : attention) {
        ASSERT_EQ(testing::Ids(a.FreeBlockOrder(g)), testing::Ids(m->FreeBlockOrder(g)));
      }
      ASSERT_EQ(a.Usage().used_bytes, m->Usage().used_bytes);
      ASSERT_EQ(a.Usage().mapped_bytes, m->Usage().mapped_bytes);
    }
  };
  auto next_event = [&](RequestId id) {
    auto h = q.NextEvent(H(q, id));
    EXPECT_TRUE(h.ok()) << h.status();
    return h.ok() ? *h : int64_t{-1};
  };

  // Admits a new request on both managers (same hit, same prefill); false if it does not fit.
  auto admit = [&]() {
    std::vector<int32_t> prompt = prefixes[uniform(0, 2)];
    const int64_t extra = uniform(1, 30);
    for (int64_t t = 0; t < extra; ++t) prompt.push_back(static_cast<int32_t>(uniform(0, 999)));
    const RequestId id(next_id++);
    const int64_t len = static_cast<int64_t>(prompt.size());
    for (KvCacheManager* m : all) ASSERT_TRUE(m->AddRequest({id, prompt}).ok());
    EXPECT_EQ(next_event(id), 0);  // nothing is quiet before the first allocation
    bool fits[3];
    int k = 0;
    for (KvCacheManager* m : all) {
      auto hit = m->GetComputedBlocks(H(*m, id));
      ASSERT_TRUE(hit.ok()) << hit.status();
      AllocationRequest req{.num_computed_tokens = hit->num_tokens,
                            .num_new_tokens = len - hit->num_tokens,
                            .hit = &*hit};
      auto ok = m->AllocateSlots(H(*m, id), req);
      ASSERT_TRUE(ok.ok()) << ok.status();
      fits[k++] = *ok;
    }
    ASSERT_EQ(fits[0], fits[1]);
    ASSERT_EQ(fits[0], fits[2]);
    if (!fits[0]) {
      for (KvCacheManager* m : all) ASSERT_TRUE(m->Free(H(*m, id)).ok());
      return;
    }
    // Each prefill is a step of its own that completes at once: its full blocks are hits for
    // the next admission.
    for (KvCacheManager* m : all) m->CompleteStep();
    live.push_back({id, len, len + uniform(1, 90), next_event(id)});
  };

  for (int step = 0; step < 160; ++step) {
    for (KvCacheManager* m : all) m->NewStep();
    while (live.size() < 24) {
      const size_t before = live.size();
      admit();
      if (HasFatalFailure()) return;
      if (live.size() == before) break;  // memory is short: decode what runs
    }
    // One sampled token each: per request on a and q, in one batch on b.
    std::vector<DecodeToken> tokens;
    std::vector<DecodeStep> steps;
    for (const Live& r : live) {
      const int32_t token = static_cast<int32_t>(uniform(0, 999));
      tokens.push_back({H(b, r.id), token});
      steps.push_back({H(b, r.id), r.computed, 1});
      ASSERT_TRUE(a.AppendTokens(H(a, r.id), {token}).ok());
      ASSERT_TRUE(q.AppendTokens(H(q, r.id), {token}).ok());
    }
    ASSERT_TRUE(b.AppendDecodeTokens(tokens).ok());
    // Per request, in order, up to the first that does not fit; the batch must agree.
    int64_t served_a = 0;
    for (const Live& r : live) {
      auto ok = a.AllocateSlots(H(a, r.id), {.num_computed_tokens = r.computed, .num_new_tokens = 1});
      ASSERT_TRUE(ok.ok()) << ok.status();
      if (!*ok) break;
      ++served_a;
    }
    auto served_b = b.AllocateDecodeStep(steps);
    ASSERT_TRUE(served_b.ok()) << served_b.status();
    ASSERT_EQ(*served_b, served_a) << "step " << step;
    // The rule is one: each served request's NextEvent is the same in both.
    for (int64_t i = 0; i < served_a; ++i) {
      ASSERT_EQ(*b.NextEvent(H(b, live[i].id)), *a.NextEvent(H(a, live[i].id)))
          << "step " << step << " request " << i;
    }
    int64_t served_q = 0;
    for (Live& r : live) {
      if (r.computed + 1 < r.next_event) {
        ++quiet_steps;
        ++served_q;
        continue;
      }
      auto ok = q.AllocateSlots(H(q, r.id), {.num_computed_tokens = r.computed, .num_new_tokens = 1});
      ASSERT_TRUE(ok.ok()) << ok.status();
      r.next_event = next_event(r.id);
      if (!*ok) break;
      ++served_q;
    }
    ASSERT_EQ(served_q, served_a) << "step " << step;
    expect_same("step " + std::to_string(step));
    if (HasFatalFailure()) return;
    // The step has run: what it filled joins the cache before requests leave.
    for (KvCacheManager* m : all) m->CompleteStep();
    // The served advance; the first unserved is preempted (rolled back and freed) on both.
    for (int64_t i = 0; i < served_a; ++i) ++live[i].computed;
    if (served_a < static_cast<int64_t>(live.size())) {
      ++failed_steps;
      for (KvCacheManager* m : all) ASSERT_TRUE(m->Free(H(*m, live[served_a].id)).ok());
      live.erase(live.begin() + served_a);
    } else {
      ++served_steps;
    }
    // Finished requests leave.
    for (size_t i = 0; i < live.size();) {
      if (live[i].computed + 1 < live[i].end) {
        ++i;
        continue;
      }
      for (KvCacheManager* m : all) ASSERT_TRUE(m->Free(H(*m, live[i].id)).ok());
      live.erase(live.begin() + static_cast<int64_t>(i));
    }
    expect_same("after frees, step " + std::to_string(step));
    if (HasFatalFailure()) return;
  }
  EXPECT_EQ(a.prefix_cache_stats().hit_tokens, c.hit_tokens);
  EXPECT_EQ(b.prefix_cache_stats().hit_tokens, c.hit_tokens);
  EXPECT_EQ(served_steps, c.served_steps);
  EXPECT_EQ(failed_steps, c.failed_steps);
  EXPECT_EQ(quiet_steps, c.quiet_steps);
}

// kTinyHybridSwa with a window of 33 tokens: a block leaves the window when a step starts a
// new block (p = (f + 1)·16 + 32), so crossings are also due a release. With a window that is
// a multiple of the block size (every model in data/models) releases fall one token earlier.
const std::string kTinySwa33 = [] {
  std::string json = testing::kTinyHybridSwa;
  const std::string from = "\"sliding_window\": 32";
  json.replace(json.find(from), from.size(), "\"sliding_window\": 33");
  return json;
}();

INSTANTIATE_TEST_SUITE_P(
    Models, DecodeStepEquivalenceTest,
    ::testing::Values(Case{"full", testing::kTinyFull, true, 600, 160, 0, 3664, 3365},
                      Case{"full_no_caching", testing::kTinyFull, false, 600, 160, 0, 0, 3604},
                      Case{"full_tight", testing::kTinyFull, true, 24, 92, 68, 5760, 2527},
                      Case{"swa", testing::kTinyHybridSwa, true, 600, 160, 0, 3664, 3319},
                      Case{"swa_tight", testing::kTinyHybridSwa, true, 40, 72, 88, 8688, 1462},
                      Case{"swa_no_caching", testing::kTinyHybridSwa, false, 600, 160, 0, 0, 3313},
                      Case{"gdn", testing::kTinyGdn, true, 600, 160, 0, 0, 0},
                      Case{"full_one_block", testing::kTinyFull, true, 600, 160, 0, 3664, 3365,
                           true},
                      Case{"full_one_block_tight", testing::kTinyFull, true, 24, 92, 68, 5760, 2527,
                           true},
                      Case{"full_one_block_no_caching", testing::kTinyFull, false, 600, 160, 0, 0,
                           3604, true},
                      Case{"swa_one_block", testing::kTinyHybridSwa, true, 600, 160, 0, 3664, 3319,
                           true},
                      Case{"swa_one_block_tight", testing::kTinyHybridSwa, true, 40, 115, 45, 3744,
                           1438, true},
                      Case{"swa33", kTinySwa33.c_str(), true, 600, 160, 0, 3664, 3319},
                      Case{"swa33_one_block", kTinySwa33.c_str(), true, 600, 160, 0, 3664, 3319,
                           true},
                      Case{"swa33_one_block_tight", kTinySwa33.c_str(), true, 40, 104, 56, 5312,
                           1558, true}),
    [](const ::testing::TestParamInfo<Case>& param) { return param.param.name; });

}  // namespace
}  // namespace kvpage
