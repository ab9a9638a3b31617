// What the two device layouts would commit with 2 MiB CUDA granules, counted on real runs of
// the scheduler: one range per layer tensor (HostMemoryBacking's and CudaVmmBacking's shape)
// against one range per pool with every layer of a block side by side. docs/design.md §3
// quotes these numbers.
#include <gtest/gtest.h>

#include <cstdio>
#include <vector>

#include "kvpage/catalog.h"
#include "kvpage/planner.h"
#include "kvpage/scheduler.h"
#include "memory/chunk_units.h"

namespace kvpage {
namespace {

constexpr int64_t kMiB = 1024 * 1024, kGranule = 2 * kMiB;

// Counts the granules a layout keeps mapped as chunks come and go (no memory).
class GranuleCounter final : public MemoryBacking {
 public:
  explicit GranuleCounter(bool per_group) : per_group_(per_group) {}
  absl::Status Reserve(const MemoryLayout& layout) override {
    layout_ = layout;
    for (const PoolLayout& p : layout.pools) {
      mapped_.emplace_back(static_cast<size_t>(p.max_chunks), false);
      tensors_.emplace_back();
    }
    for (const CacheTensor& t : layout.tensors) {
      if (!per_group_) tensors_[t.pool].push_back(t.block_bytes);
    }
    for (size_t p = 0; p < layout.pools.size(); ++p) {
      if (per_group_) tensors_[p].push_back(layout.pools[p].block_bytes);
      for (int64_t tb : tensors_[p]) committed_ += internal::RoundUpTo(tb, kGranule);  // null
    }
    peak_ = committed_;
    return absl::OkStatus();
  }
  absl::Status MapChunk(int32_t pool, int32_t chunk) override {
    committed_ += OwnBytes(pool, chunk);
    mapped_[pool][chunk] = true;
    chunk_bytes_ += layout_.pools[pool].chunk_bytes();
    peak_ = std::max(peak_, committed_);
    peak_chunks_ = std::max(peak_chunks_, chunk_bytes_);
    return absl::OkStatus();
  }
  absl::Status UnmapChunk(int32_t pool, int32_t chunk) override {
    mapped_[pool][chunk] = false;
    committed_ -= OwnBytes(pool, chunk);
    chunk_bytes_ -= layout_.pools[pool].chunk_bytes();
    return absl::OkStatus();
  }
  int64_t peak() const { return peak_; }
  int64_t peak_chunks() const { return peak_chunks_; }

 private:
  int64_t OwnBytes(int32_t pool, int32_t chunk) const {
    int64_t bytes = 0;
    const PoolLayout& p = layout_.pools[pool];
    for (int64_t tb : tensors_[pool]) {
      bytes += internal::OwnUnits(p, mapped_[pool], tb, internal::RangeBytes(p, tb, kGranule),
                                  chunk, kGranule).size() * kGranule;
    }
    return bytes;
  }
  bool per_group_;
  MemoryLayout layout_;
  std::vector<std::vector<bool>> mapped_;
  std::vector<std::vector<int64_t>> tensors_;  // per pool, bytes per block of each range
  int64_t committed_ = 0, peak_ = 0, chunk_bytes_ = 0, peak_chunks_ = 0;
};

// Forwards to both counters.
class Both final : public MemoryBacking {
 public:
  Both(MemoryBacking* a, MemoryBacking* b) : a_(a), b_(b) {}
  absl::Status Reserve(const MemoryLayout& l) override {
    a_->Reserve(l).IgnoreError();
    return b_->Reserve(l);
  }
  absl::Status MapChunk(int32_t p, int32_t c) override {
    a_->MapChunk(p, c).IgnoreError();
    return b_->MapChunk(p, c);
  }
  absl::Status UnmapChunk(int32_t p, int32_t c) override {
    a_->UnmapChunk(p, c).IgnoreError();
    return b_->UnmapChunk(p, c);
  }

 private:
  MemoryBacking *a_, *b_;
};

struct Peaks {
  int64_t budget = 0, chunks = 0, per_layer = 0, per_group = 0;
};

// 48 requests of 20,000 prompt tokens through the scheduler with the budget of an H100 at
// 0.9 utilization (or 16 GiB when the weights leave less), 2 MiB chunks.
Peaks RunModel(const char* name, int64_t chunk_bytes) {
  const ModelSpec model = *LoadModel(name);
  absl::StatusOr<int64_t> h100 = KvBudgetFromGpu(model, (*LoadGpu("h100")).memory_bytes, 0.9);
  GranuleCounter per_layer(false), per_group(true);
  Both both(&per_layer, &per_group);
  SchedulerConfig config;
  config.kv.kv_budget_bytes = h100.ok() && *h100 > (int64_t{16} << 30) ? *h100 : int64_t{16} << 30;
  config.kv.chunk_bytes = chunk_bytes;
  config.kv.backing = &both;
  config.max_num_batched_tokens = 32768;
  auto scheduler = *Scheduler::Create(model, config);
  for (int i = 0; i < 48; ++i) {
    std::vector<int32_t> prompt(20000);
    for (int j = 0; j < 20000; ++j) prompt[j] = (i * 7919 + j) % 30000;
    EXPECT_TRUE(scheduler->AddRequest({.id = RequestId(i), .prompt_token_ids = prompt,
                                       .max_new_tokens = 64}).ok());
  }
  while (scheduler->HasUnfinishedRequests()) {
    const SchedulerOutput& out = scheduler->Schedule();
    ModelOutput result;
    for (const ScheduledRequest& r : out.requests) {
      if (r.samples) result.sampled_token_ids.push_back(1);
    }
    result.sampled_offsets.push_back(0);
    for (const ScheduledRequest& r : out.requests) {
      result.sampled_offsets.push_back(result.sampled_offsets.back() + (r.samples ? 1 : 0));
    }
    EXPECT_TRUE(scheduler->Update(out, result).ok());
  }
  return Peaks{config.kv.kv_budget_bytes, per_layer.peak_chunks(), per_layer.peak(),
               per_group.peak()};
}

// Gemma 3 4B, 2 MiB chunks: one range per layer (34 tensors) strands 945,553,408 bytes
// above the chunks at the peak, one range per pool 29,097,984 (the null blocks' granules and
// each pool's last, partly used granule); both exceed the budget by that much.
TEST(LayoutGranules, Gemma3OnH100) {
  const Peaks p = RunModel("gemma-3-4b-it", 2 * kMiB);
  EXPECT_EQ(p.budget, 69208550809);
  EXPECT_EQ(p.chunks, 69206278144);
  EXPECT_EQ(p.per_layer - p.chunks, 945553408);
  EXPECT_EQ(p.per_group - p.chunks, 29097984);
}

// Qwen3.5 9B (Gated DeltaNet + full attention): 131,465,216 against 55,967,744 bytes.
TEST(LayoutGranules, Qwen35OnH100) {
  const Peaks p = RunModel("qwen3.5-9b", 2 * kMiB);
  EXPECT_EQ(p.chunks, 37986369536);
  EXPECT_EQ(p.per_layer - p.chunks, 131465216);
  EXPECT_EQ(p.per_group - p.chunks, 55967744);
}

// The table in docs/design.md §3:
//   layout_granules_test --gtest_also_run_disabled_tests --gtest_filter=*PrintTable
TEST(LayoutGranules, DISABLED_PrintTable) {
  std::printf("| model | chunk | budget | peak chunks | per-layer stranded | per-pool stranded |\n");
  for (const char* name : {"gemma-3-4b-it", "llama-3.1-8b", "qwen3-8b", "qwen3.5-9b",
                           "deepseek-v2-lite", "gpt-oss-20b"}) {
    for (int64_t chunk : {2 * kMiB, 64 * kMiB}) {
      const Peaks p = RunModel(name, chunk);
      std::printf("| %s | %ld MiB | %.2f GiB | %.2f GiB | %.1f MiB | %.1f MiB |\n", name,
                  chunk / kMiB, p.budget / 1073741824.0, p.chunks / 1073741824.0,
                  (p.per_layer - p.chunks) / 1048576.0, (p.per_group - p.chunks) / 1048576.0);
    }
  }
}

}  // namespace
}  // namespace kvpage
