// A memory backing that refuses to map (a GPU out of memory) behind a real KvCacheManager and
// Scheduler: a refused map is a failed allocation, never a crash, and leaves nothing behind.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sys/resource.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/numbers.h"
#include "kvpage/catalog.h"
#include "kvpage/host_memory_backing.h"
#include "kvpage/kv_cache_manager.h"
#include "kvpage/memory_backing.h"
#include "kvpage/scheduler.h"
#include "testing/sanitizer.h"

namespace kvpage {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kMiB = int64_t{1} << 20;

// Checks every call the manager makes and refuses map attempt `refuse_at` (0-based; -1 =
// none), and every later one too when `permanent`.
class RefusingBacking final : public MemoryBacking {
 public:
  RefusingBacking(int64_t refuse_at, bool permanent)
      : refuse_at_(refuse_at), permanent_(permanent) {}

  absl::Status MapChunk(int32_t pool, int32_t chunk) override {
    const int64_t attempt = attempts_++;
    if (attempt == refuse_at_ || (permanent_ && refuse_at_ >= 0 && attempt > refuse_at_)) {
      ++refusals_;
      return absl::ResourceExhaustedError(
          absl::StrCat("out of device memory mapping chunk ", chunk, " of pool ", pool));
    }
    if (!mapped_.emplace(pool, chunk).second) Misuse("mapped twice", pool, chunk);
    return absl::OkStatus();
  }
  absl::Status UnmapChunk(int32_t pool, int32_t chunk) override {
    if (mapped_.erase({pool, chunk}) == 0) Misuse("unmapped while not mapped", pool, chunk);
    return absl::OkStatus();
  }

  // Refuses the next map attempt (once).
  void RefuseNext() { refuse_at_ = attempts_; }
  int64_t attempts() const { return attempts_; }
  int64_t refusals() const { return refusals_; }
  int64_t num_mapped() const { return static_cast<int64_t>(mapped_.size()); }
  const std::string& misuse() const { return misuse_; }

 private:
  void Misuse(const char* what, int32_t pool, int32_t chunk) {
    if (misuse_.empty()) misuse_ = absl::StrCat("chunk ", chunk, " of pool ", pool, " ", what);
  }

  int64_t refuse_at_;
  const bool permanent_;
  int64_t attempts_ = 0;
  int64_t refusals_ = 0;
  std::set<std::pair<int32_t, int32_t>> mapped_;
  std::string misuse_;
};

std::vector<int32_t> Prompt(int32_t seed, int32_t length) {
  std::vector<int32_t> prompt(length);
  for (int32_t j = 0; j < length; ++j) prompt[j] = (seed * 7919 + j) % 30000;
  return prompt;
}

ModelOutput OneTokenEach(const SchedulerOutput& out) {
  ModelOutput result;
  result.sampled_offsets.push_back(0);
  for (const ScheduledRequest& r : out.requests) {
    if (r.samples) result.sampled_token_ids.push_back(7);
    result.sampled_offsets.push_back(static_cast<int32_t>(result.sampled_token_ids.size()));
  }
  return result;
}

int64_t UsedBlocks(const KvCacheManager& m) {
  int64_t used = 0;
  for (const PoolUsage& p : m.Usage().pools) used += p.used_blocks;
  return used;
}

// One model's run: a budget of `budget_chunks` 2 MiB chunks' worth, requests that share
// prefixes, preempt and free, each step checked.
struct RunResult {
  absl::Status create;      // Scheduler::Create
  int64_t steps = 0;
  int64_t finished = 0;     // requests that ran to the end
  int64_t attempts = 0;     // map attempts
  int64_t refusals = 0;
  absl::Status backing_status;  // after the run
  std::string failure;          // the first broken check, empty if none
};

constexpr int kRequests = 10;

RunResult RunScheduler(const ModelSpec& model, int64_t budget_bytes, int64_t refuse_at,
                 bool permanent) {
  RefusingBacking backing(refuse_at, permanent);
  SchedulerConfig config;
  config.kv.kv_budget_bytes = budget_bytes;
  config.kv.backing = &backing;
  config.max_num_batched_tokens = 512;
  config.max_model_len = 2048;
  RunResult run;
  auto scheduler = Scheduler::Create(model, config);
  run.create = scheduler.status();
  auto fail = [&](std::string what) {
    if (run.failure.empty()) run.failure = absl::StrCat("step ", run.steps, ": ", what);
  };
  if (scheduler.ok()) {
    Scheduler& s = **scheduler;
    for (int i = 0; i < kRequests; ++i) {
      // Pairs of requests share their first 256 tokens.
      std::vector<int32_t> prompt = Prompt(i / 2, 256);
      const std::vector<int32_t> tail = Prompt(100 + i, 200 + 97 * i);
      prompt.insert(prompt.end(), tail.begin(), tail.end());
      if (!s.AddRequest({.id = RequestId(i), .prompt_token_ids = prompt, .max_new_tokens = 24})
               .ok()) {
        fail("AddRequest");
      }
    }
    // A permanent refusal can leave requests waiting for good: the run stops after a bound
    // and aborts what is left.
    while (s.HasUnfinishedRequests() && run.steps < 400 && run.failure.empty()) {
      const SchedulerOutput& out = s.Schedule();
      auto update = s.Update(out, OneTokenEach(out));
      ++run.steps;
      if (!update.ok()) fail(absl::StrCat("Update: ", update.status().ToString()));
      if (update.ok()) run.finished += static_cast<int64_t>(update->finished.size());
      if (absl::Status st = s.CheckInvariants(); !st.ok()) fail(st.ToString());
    }
    for (int i = 0; i < kRequests; ++i) (void)s.Abort(RequestId(i));
    if (UsedBlocks(s.kv_cache()) != 0) fail("blocks left in use");
    if (absl::Status st = s.CheckInvariants(); !st.ok()) fail(st.ToString());
    run.backing_status = s.kv_cache().backing_status();
    s.ReleaseIdleChunks();
    if (s.kv_cache().Usage().mapped_bytes != 0) fail("budget still charged");
  }
  // Everything the backing mapped was given back (the scheduler is gone or trimmed).
  if (backing.num_mapped() != 0 && scheduler.ok()) fail("chunks left mapped");
  if (!backing.misuse().empty()) fail(backing.misuse());
  run.attempts = backing.attempts();
  run.refusals = backing.refusals();
  return run;
}

struct Kind {
  const char* model;
  int64_t budget_bytes;
};

// Every bundled kind: full attention, sliding window, linear attention, MLA.
const Kind kKinds[] = {{"qwen3-8b", 700 * kMiB},
                       {"gemma-3-4b-it", 400 * kMiB},
                       {"qwen3.5-0.8b", 100 * kMiB},
                       {"deepseek-v2-lite", 200 * kMiB}};

// For every N, the one map attempt N of a whole run is refused: in Create's probe, Create
// returns the backing's error; later, the step is refused as for a full budget and the run
// still finishes every request, every block free and every chunk unmapped at the end.
TEST(BackingRefusal, OneRefusedMapAtEveryPointOfARun) {
  for (const Kind& kind : kKinds) {
    SCOPED_TRACE(kind.model);
    const ModelSpec model = *LoadModel(kind.model);
    const RunResult clean = RunScheduler(model, kind.budget_bytes, -1, false);
    ASSERT_TRUE(clean.create.ok()) << clean.create;
    ASSERT_EQ(clean.failure, "");
    ASSERT_EQ(clean.finished, kRequests);
    ASSERT_GT(clean.attempts, 20);
    int64_t refused_in_probe = 0;
    for (int64_t n = 0; n < clean.attempts; ++n) {
      SCOPED_TRACE(absl::StrCat("map ", n, " refused"));
      const RunResult run = RunScheduler(model, kind.budget_bytes, n, false);
      ASSERT_EQ(run.failure, "");
      ASSERT_EQ(run.refusals, 1);
      if (!run.create.ok()) {
        ++refused_in_probe;
        EXPECT_EQ(run.create.code(), absl::StatusCode::kResourceExhausted);
        EXPECT_THAT(run.create.message(), HasSubstr("probing max_model_len"));
        EXPECT_THAT(run.create.message(), HasSubstr("out of device memory mapping chunk"));
        continue;
      }
      EXPECT_EQ(run.finished, kRequests);
      EXPECT_EQ(run.backing_status.code(), absl::StatusCode::kResourceExhausted);
    }
    // The probe maps before the run does: the first attempts are the probe's.
    EXPECT_GT(refused_in_probe, 0);
    EXPECT_LT(refused_in_probe, clean.attempts);
  }
}

// From map N on, the backing refuses every map: requests wait or are aborted, nothing
// crashes, and aborting them all leaves every block free.
TEST(BackingRefusal, EveryMapRefusedFromEveryPointOfARun) {
  for (const Kind& kind : kKinds) {
    SCOPED_TRACE(kind.model);
    const ModelSpec model = *LoadModel(kind.model);
    const RunResult clean = RunScheduler(model, kind.budget_bytes, -1, false);
    ASSERT_TRUE(clean.create.ok()) << clean.create;
    for (int64_t n = 0; n < clean.attempts; n += 3) {
      SCOPED_TRACE(absl::StrCat("maps refused from ", n));
      const RunResult run = RunScheduler(model, kind.budget_bytes, n, true);
      ASSERT_EQ(run.failure, "");
      EXPECT_GE(run.refusals, 1);
    }
  }
}

std::vector<std::vector<int32_t>> Tables(const KvCacheManager& m, RequestHandle h) {
  std::vector<std::vector<int32_t>> tables;
  for (int32_t g = 0; g < m.num_groups(); ++g) {
    std::vector<int32_t>& ids = tables.emplace_back();
    if (auto table = m.BlockTable(h, GroupId(g)); table.ok()) {
      for (BlockId b : *table) ids.push_back(b.value);
    }
  }
  return tables;
}

std::vector<int32_t> UsedPerGroup(const KvCacheManager& m) {
  std::vector<int32_t> used;
  for (const PoolUsage& p : m.Usage().pools) used.push_back(p.used_blocks);
  return used;
}

// A refused map in the middle of an allocation that takes a prefix hit and needs chunks in
// every pool: AllocateSlots returns false, both requests' tables and every pool's used blocks
// are as before, the hit's blocks are back in the cache, and the same step then succeeds.
TEST(BackingRefusal, RefusedStepChangesNoRequest) {
  for (const char* name : {"qwen3-8b", "gemma-3-4b-it"}) {
    SCOPED_TRACE(name);
    RefusingBacking backing(-1, false);
    KvCacheConfig config;
    config.kv_budget_bytes = 2048 * kMiB;
    config.backing = &backing;
    config.max_model_len = 8192;
    auto m = *KvCacheManager::Create(*LoadModel(name), config);
    std::vector<int32_t> prompt = Prompt(1, 2000);
    const RequestHandle a = *m->AddRequest({.id = RequestId(1), .prompt_tokens = prompt});
    ASSERT_TRUE(*m->AllocateSlots(a, {.num_new_tokens = 2000}));
    m->CompleteStep();
    ASSERT_TRUE(m->backing_status().ok());
    const std::vector<int32_t> tail = Prompt(2, 3000);
    prompt.insert(prompt.end(), tail.begin(), tail.end());
    const RequestHandle b = *m->AddRequest({.id = RequestId(2), .prompt_tokens = prompt});
    const CacheHit hit = *m->GetComputedBlocks(b);
    EXPECT_EQ(hit.num_tokens, 2000);  // every block of the first request
    const auto tables_a = Tables(*m, a);
    const auto used = UsedPerGroup(*m);
    const int64_t attempts = backing.attempts();
    backing.RefuseNext();
    const AllocationRequest step{.num_computed_tokens = hit.num_tokens,
                                 .num_new_tokens = 5000 - hit.num_tokens,
                                 .hit = &hit};
    EXPECT_FALSE(*m->AllocateSlots(b, step));
    EXPECT_EQ(backing.attempts(), attempts + 1);  // refused at the first chunk asked
    EXPECT_EQ(m->backing_status().code(), absl::StatusCode::kResourceExhausted);
    EXPECT_THAT(m->backing_status().message(), HasSubstr("out of device memory"));
    EXPECT_EQ(Tables(*m, a), tables_a);
    EXPECT_EQ(Tables(*m, b), std::vector<std::vector<int32_t>>(m->num_groups()));
    EXPECT_EQ(UsedPerGroup(*m), used);
    EXPECT_TRUE(m->CheckInvariants().ok()) << m->CheckInvariants();
    EXPECT_EQ(m->GetComputedBlocks(b)->num_tokens, hit.num_tokens);  // still cached
    // The backing maps again: the same step goes through.
    const CacheHit again = *m->GetComputedBlocks(b);
    EXPECT_TRUE(*m->AllocateSlots(b, {.num_computed_tokens = again.num_tokens,
                                      .num_new_tokens = 5000 - again.num_tokens,
                                      .hit = &again}));
    EXPECT_TRUE(m->CheckInvariants().ok()) << m->CheckInvariants();
    ASSERT_TRUE(m->Free(a).ok());
    ASSERT_TRUE(m->Free(b).ok());
    m->CompleteStep();
    m->ReleaseIdleChunks();
    EXPECT_EQ(backing.num_mapped(), 0);
    EXPECT_EQ(backing.misuse(), "");
  }
}

// The process's private writable memory (VmData), in bytes; -1 if unreadable.
int64_t DataBytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    int64_t kib = 0;
    if (line.rfind("VmData:", 0) == 0 &&
        absl::SimpleAtoi(absl::StripAsciiWhitespace(line.substr(7, line.size() - 10)), &kib)) {
      return kib * 1024;
    }
  }
  return -1;
}

// In a child process: the host backing under a real RLIMIT_DATA, which makes the kernel refuse
// its commits once 96 MiB more are written. Exits 0 when every request finished, the backing
// refused at least once, and the end leaves no block used and the invariants holding.
[[noreturn]] void RunUnderDataLimit() {
  const ModelSpec model = *LoadModel("qwen3-8b");  // 2.25 MiB per 16-token block
  HostMemoryBacking backing;
  SchedulerConfig config;
  config.kv.kv_budget_bytes = 1024 * kMiB;
  config.kv.backing = &backing;
  config.max_num_batched_tokens = 512;
  config.max_model_len = 2048;
  auto scheduler = Scheduler::Create(model, config);
  if (!scheduler.ok()) std::_Exit(2);
  Scheduler& s = **scheduler;
  for (int i = 0; i < 8; ++i) {
    if (!s.AddRequest({.id = RequestId(i), .prompt_token_ids = Prompt(i, 300),
                       .max_new_tokens = 24}).ok()) {
      std::_Exit(3);
    }
  }
  const int64_t data = DataBytes();
  const rlimit limit{.rlim_cur = static_cast<rlim_t>(data + 96 * kMiB),
                     .rlim_max = static_cast<rlim_t>(data + 96 * kMiB)};
  if (data < 0 || setrlimit(RLIMIT_DATA, &limit) != 0) std::_Exit(4);
  int64_t finished = 0, steps = 0;
  bool refused = false;
  while (s.HasUnfinishedRequests() && steps++ < 2000) {
    const SchedulerOutput& out = s.Schedule();
    auto update = s.Update(out, OneTokenEach(out));
    if (!update.ok() || !s.CheckInvariants().ok()) std::_Exit(5);
    finished += static_cast<int64_t>(update->finished.size());
    refused |= !s.kv_cache().backing_status().ok();
  }
  if (finished != 8) std::_Exit(6);
  if (!refused || !absl::IsResourceExhausted(s.kv_cache().backing_status())) std::_Exit(7);
  if (UsedBlocks(s.kv_cache()) != 0) std::_Exit(8);
  std::_Exit(0);
}

TEST(BackingRefusalDeathTest, HostBackingUnderARealMemoryLimit) {
  if (KVPAGE_UNDER_SANITIZER) GTEST_SKIP() << "the sanitizer's mappings count against RLIMIT_DATA";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(RunUnderDataLimit(), ::testing::ExitedWithCode(0), "");
}

}  // namespace
}  // namespace kvpage
