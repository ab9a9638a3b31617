// Bounds on what KvCacheManager::Create and AddRequest accept, each named in its error: token
// counts that would overflow, map units, multimodal items, vLLM block sizes, and the memory
// CheckInvariants takes on a budget of INT64_MAX.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "block/manager_test_util.h"
#include "kvpage/catalog.h"
#include "kvpage/host_memory_backing.h"
#include "kvpage/kv_cache_manager.h"
#include "testing/sanitizer.h"

namespace kvpage {
namespace {

using ::testing::HasSubstr;
using testing::Tokens;

constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

KvCacheConfig TinyConfig() {
  KvCacheConfig config;
  config.kv_budget_bytes = int64_t{1} << 20;
  config.hash_seed = 1;
  return config;
}

TEST(InputBounds, MaxModelLenPastTwoToTheFortyIsRefused) {
  KvCacheConfig config = TinyConfig();
  config.max_model_len = kInt64Max;
  auto m = KvCacheManager::Create(testing::TinyModel(testing::kTinyFull), config);
  ASSERT_TRUE(absl::IsInvalidArgument(m.status())) << m.status();
  EXPECT_EQ(m.status().message(),
            "max_model_len must be in [0, 2^40] (0 = the model's), got 9223372036854775807");
}

// At the largest max_model_len taken, decode steps still allocate: 140 tokens in 9 blocks.
TEST(InputBounds, DecodeAtTheLargestMaxModelLenAllocates) {
  KvCacheConfig config = TinyConfig();
  config.max_model_len = kMaxManagerModelLen;
  auto m = *KvCacheManager::Create(testing::TinyModel(testing::kTinyFull), config);
  const RequestHandle h = *m->AddRequest({RequestId(1), Tokens(100)});
  ASSERT_TRUE(*m->AllocateSlots(h, {.num_new_tokens = 100}));
  for (int64_t c = 100; c < 140; ++c) {
    m->CompleteStep();
    ASSERT_TRUE(m->AppendTokens(h, {7}).ok());
    ASSERT_TRUE(*m->AllocateSlots(h, {.num_computed_tokens = c, .num_new_tokens = 1}));
  }
  EXPECT_EQ(m->BlockTable(h, GroupId(0))->size(), 9u);
  EXPECT_LE(*m->NextEvent(h), 145);
  EXPECT_TRUE(m->CheckInvariants().ok());
}

// ---- Computed-token counts between steps ----

// A request with 100 prompt tokens allocated, then 20 decode steps of one token: it holds
// 120 tokens with 120 computed and slots through its last step's end (120).
std::unique_ptr<KvCacheManager> DecodedRequest(const char* model, RequestHandle* h) {
  KvCacheConfig config = TinyConfig();
  config.kv_budget_bytes = int64_t{64} << 20;
  auto m = *KvCacheManager::Create(testing::TinyModel(model), config);
  *h = *m->AddRequest({RequestId(1), Tokens(100)});
  EXPECT_TRUE(*m->AllocateSlots(*h, {.num_new_tokens = 100}));
  for (int64_t c = 100; c < 120; ++c) {
    m->CompleteStep();
    EXPECT_TRUE(m->AppendTokens(*h, {7}).ok());
    EXPECT_TRUE(*m->AllocateSlots(*h, {.num_computed_tokens = c, .num_new_tokens = 1}));
  }
  m->CompleteStep();
  EXPECT_TRUE(m->AppendTokens(*h, {7}).ok());  // 121 tokens, 120 computed
  return m;
}

// Skipping ahead is what a caller that skips quiet steps does (NextEvent): taken while the
// held blocks reach, refused past them. 8 blocks of 16 hold 128 tokens.
TEST(InputBounds, ComputedTokensMayMoveAheadOnlyAsFarAsTheBlocksReach) {
  RequestHandle h;
  auto m = DecodedRequest(testing::kTinyFull, &h);
  ASSERT_TRUE(m->AppendTokens(h, std::vector<int32_t>(20, 7)).ok());  // 141 tokens
  EXPECT_TRUE(*m->AllocateSlots(h, {.num_computed_tokens = 125, .num_new_tokens = 1}));
  auto r = m->AllocateSlots(h, {.num_computed_tokens = 140, .num_new_tokens = 1});
  ASSERT_TRUE(absl::IsInvalidArgument(r.status())) << r.status();
  EXPECT_EQ(r.status().message(),
            "num_computed_tokens 140 exceeds the 128 tokens the request holds blocks for");
  EXPECT_TRUE(m->CheckInvariants().ok());
}

// Going back is a recompute, a rollback of computed tokens: fine for full attention alone,
// refused where a window or state cannot serve it.
TEST(InputBounds, ComputedTokensThatGoBackFollowTheRollbackRules) {
  {
    RequestHandle h;
    auto m = DecodedRequest(testing::kTinyFull, &h);
    ASSERT_TRUE(*m->AllocateSlots(h, {.num_computed_tokens = 64, .num_new_tokens = 57}));
    EXPECT_EQ(m->BlockTable(h, GroupId(0))->size(), 8u);
    EXPECT_TRUE(m->CheckInvariants().ok());
  }
  {
    // Window 32: the last step (token 119, window 88..119) freed blocks 0-4 (tokens 0..79),
    // so token 64's window (33..64) is gone; token 112's (81..112) starts in block 5, held.
    RequestHandle h;
    auto m = DecodedRequest(testing::kTinyHybridSwa, &h);
    auto r = m->AllocateSlots(h, {.num_computed_tokens = 64, .num_new_tokens = 57});
    ASSERT_TRUE(absl::IsFailedPrecondition(r.status())) << r.status();
    EXPECT_THAT(r.status().message(), HasSubstr("is already freed"));
    ASSERT_TRUE(*m->AllocateSlots(h, {.num_computed_tokens = 112, .num_new_tokens = 9}));
    EXPECT_TRUE(m->CheckInvariants().ok());
  }
  {
    // Every step of a state model reaches the manager (NextEvent is 0), so the last one began
    // at 119. A quiet step going back was taken before.
    RequestHandle h;
    auto m = DecodedRequest(testing::kTinyGdn, &h);
    auto r = m->AllocateSlots(h, {.num_computed_tokens = 118, .num_new_tokens = 3});
    ASSERT_TRUE(absl::IsFailedPrecondition(r.status())) << r.status();
    EXPECT_EQ(r.status().message(),
              "cannot roll back request 1: its linear-attention state already includes those "
              "tokens and has no checkpoint to return to");
    EXPECT_TRUE(m->CheckInvariants().ok());
  }
}

// ---- Map units ----

class UnitBacking final : public MemoryBacking {
 public:
  explicit UnitBacking(int64_t unit) : unit_(unit) {}
  absl::Status MapChunk(int32_t, int32_t) override { return absl::OkStatus(); }
  absl::Status UnmapChunk(int32_t, int32_t) override { return absl::OkStatus(); }
  int64_t map_unit_bytes() const override { return unit_; }

 private:
  int64_t unit_;
};

TEST(InputBounds, MapUnitsThatAreNotPowersOfTwoUpToAGibibyteAreRefused) {
  for (const int64_t unit : {int64_t{1} << 62, int64_t{0}, int64_t{-1}, int64_t{3},
                             int64_t{1} << 31}) {
    SCOPED_TRACE(unit);
    UnitBacking backing(unit);
    KvCacheConfig config = TinyConfig();
    config.backing = &backing;
    auto m = KvCacheManager::Create(testing::TinyModel(testing::kTinyFull), config);
    ASSERT_TRUE(absl::IsInvalidArgument(m.status())) << m.status();
    EXPECT_EQ(m.status().message(),
              absl::StrCat("the memory backing's map_unit_bytes() is ", unit,
                           ", not a power of two in [1, 2^30]"));
  }
  for (const int64_t unit : {int64_t{1}, int64_t{4096}, int64_t{1} << 21}) {
    UnitBacking backing(unit);
    KvCacheConfig config = TinyConfig();
    config.kv_budget_bytes = int64_t{64} << 20;
    config.backing = &backing;
    EXPECT_TRUE(KvCacheManager::Create(testing::TinyModel(testing::kTinyFull), config).ok())
        << unit;
  }
}

TEST(InputBounds, HostBackingWithANegativeUnitIsRefused) {
  HostMemoryBacking backing(-4096);
  EXPECT_EQ(backing.map_unit_bytes(), -4096);
  KvCacheConfig config = TinyConfig();
  config.backing = &backing;
  auto m = KvCacheManager::Create(testing::TinyModel(testing::kTinyFull), config);
  ASSERT_TRUE(absl::IsInvalidArgument(m.status())) << m.status();
  EXPECT_THAT(m.status().message(), HasSubstr("map_unit_bytes() is -4096"));
}

// ---- vLLM block sizes ----

TEST(InputBounds, VllmModeTakesOnlyTheBlockSizesVllmDoes) {
  KvCacheConfig config = TinyConfig();
  config.mode = AccountingMode::kVllm;
  config.block_size = 7;
  auto m = KvCacheManager::Create(testing::TinyModel(testing::kTinyFull), config);
  ASSERT_TRUE(absl::IsInvalidArgument(m.status())) << m.status();
  EXPECT_EQ(m.status().message(), "block_size 7 is not one vLLM accepts (1, 8, 16, 32, 64 or 128)");
  config.block_size = 32;
  EXPECT_TRUE(KvCacheManager::Create(testing::TinyModel(testing::kTinyFull), config).ok());
  config.mode = AccountingMode::kKvpage;
  config.block_size = 7;  // kvpage accounting takes any block size
  EXPECT_TRUE(KvCacheManager::Create(testing::TinyModel(testing::kTinyFull), config).ok());
}

// ---- Multimodal items ----

KvRequestSpec WithItem(int64_t id, MultimodalItem item) {
  KvRequestSpec spec{RequestId(id), Tokens(256)};
  spec.extras.mm_items.push_back(std::move(item));
  return spec;
}

TEST(InputBounds, MultimodalItemsOutsideThePromptAreRefused) {
  auto m = *KvCacheManager::Create(testing::TinyModel(testing::kTinyFull), TinyConfig());
  struct Case {
    MultimodalItem item;
    std::string message;
  };
  const Case cases[] = {
      {{"img-a", 10, kInt64Max},
       "request 1: multimodal item 0 ('img-a') length 9223372036854775807 at offset 10 does not "
       "fit in the prompt of 256 tokens (it must be positive and end by the prompt's end)"},
      {{"img-a", 10, -192},
       "request 1: multimodal item 0 ('img-a') length -192 at offset 10 does not fit in the "
       "prompt of 256 tokens (it must be positive and end by the prompt's end)"},
      {{"img-a", 10, 0},
       "request 1: multimodal item 0 ('img-a') length 0 at offset 10 does not fit in the "
       "prompt of 256 tokens (it must be positive and end by the prompt's end)"},
      {{"img-a", -5, 20},
       "request 1: multimodal item 0 ('img-a') offset -5 is outside the prompt of 256 tokens"},
      {{"img-a", 256, 1},
       "request 1: multimodal item 0 ('img-a') offset 256 is outside the prompt of 256 tokens"},
      {{"", 0, 16}, "request 1: multimodal item 0 has an empty identifier"},
  };
  for (const Case& c : cases) {
    auto h = m->AddRequest(WithItem(1, c.item));
    ASSERT_TRUE(absl::IsInvalidArgument(h.status())) << c.message;
    EXPECT_EQ(h.status().message(), c.message);
    BlockHashExtras extras;
    extras.mm_items.push_back(c.item);
    EXPECT_EQ(m->CachedPrefixTokens(Tokens(256), extras), 0);
  }
  KvRequestSpec unsorted{RequestId(1), Tokens(256)};
  unsorted.extras.mm_items = {{"img-a", 100, 10}, {"img-b", 20, 10}};
  EXPECT_EQ(m->AddRequest(unsorted).status().message(),
            "request 1: multimodal items are not sorted by offset: item 1 at 20 follows one at 100");
  EXPECT_EQ(m->num_requests(), 0);
}

// Two requests with the same tokens but different images share no block the images cover.
TEST(InputBounds, DifferentImagesShareNoBlock) {
  auto m = *KvCacheManager::Create(testing::TinyModel(testing::kTinyFull), TinyConfig());
  const RequestHandle a = *m->AddRequest(WithItem(1, {"img-a", 32, 192}));
  ASSERT_TRUE(*m->AllocateSlots(a, {.num_new_tokens = 256}));
  m->CompleteStep();
  const RequestHandle b = *m->AddRequest(WithItem(2, {"img-b", 32, 192}));
  EXPECT_EQ(m->GetComputedBlocks(b)->num_tokens, 32);  // the two blocks before the image
  BlockHashExtras same;
  same.mm_items.push_back({"img-a", 32, 192});
  EXPECT_EQ(m->CachedPrefixTokens(Tokens(256), same), 240);
}

// ---- CheckInvariants on a budget of INT64_MAX ----

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

// In a child limited to 256 MiB more private memory: exits 0 when CheckInvariants passes.
[[noreturn]] void CheckInvariantsOfAnUnlimitedBudget() {
  KvCacheConfig config;
  config.kv_budget_bytes = kInt64Max;
  auto m = *KvCacheManager::Create(LoadModel("qwen3-8b").value(), config);
  const RequestHandle h = *m->AddRequest({RequestId(1), Tokens(1000)});
  if (!*m->AllocateSlots(h, {.num_new_tokens = 1000})) std::_Exit(2);
  const int64_t data = DataBytes();
  const rlimit limit{.rlim_cur = static_cast<rlim_t>(data + (int64_t{256} << 20)),
                     .rlim_max = static_cast<rlim_t>(data + (int64_t{256} << 20))};
  if (data < 0 || setrlimit(RLIMIT_DATA, &limit) != 0) std::_Exit(3);
  std::_Exit(m->CheckInvariants().ok() ? 0 : 4);
}

TEST(InputBoundsDeathTest, CheckInvariantsOfAnUnlimitedBudgetTakesLittleMemory) {
  if (KVPAGE_UNDER_SANITIZER) GTEST_SKIP() << "the sanitizer's mappings count against RLIMIT_DATA";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(CheckInvariantsOfAnUnlimitedBudget(), ::testing::ExitedWithCode(0), "");
}

// ---- Computed-token counts ----

}  // namespace
}  // namespace kvpage
