// How fast the block pool and the KvCacheManager serve a scheduler's hot path.
//
// The scheduler calls AllocateSlots for every running request on every decode step, so the
// manager's cost is paid N times per step. Targets (from the issue): the pool hands out and
// takes back >= 100 M blocks/s on one core; a decode step of 1,024 requests costs <= 10 us
// when no request crosses a block boundary and <= 30 us when every request does.
//
// Reading the output:
//   * BM_BlockPool*: items_per_second = blocks/s, each block allocated and freed counted once.
//   * BM_AllocateSlots*: Time = one decode step over all N requests; items_per_second =
//     requests/s; `per_request` = seconds per request (Time / N). DecodeStep times
//     AppendTokens + AllocateSlots per request, Only times AllocateSlots alone; their difference
//     is AppendTokens.
//   * BM_PrefixHitLookup: Time = one GetComputedBlocks of a fully cached 32K-token prompt;
//     items_per_second = prompt blocks/s; `per_block` = seconds per block.
//
// Every timed iteration sees the same state: what a step changes (tokens, crossed blocks) is
// undone or advanced outside the timed region (PauseTiming), so the numbers do not drift with
// the iteration count. A PauseTiming/ResumeTiming pair itself adds about 0.5 us to each such
// step (measured on a 2-vCPU EPYC VM), which matters only for the 256-request cases.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "block/block_pool.h"
#include "block/memory_budget.h"
#include "kvpage/catalog.h"
#include "kvpage/kv_cache_manager.h"
#include "kvpage/kv_events.h"
#include "kvpage/model_spec.h"
#include "kvpage/types.h"

namespace {

using kvpage::AllocationRequest;
using kvpage::BlockHash;
using kvpage::BlockId;
using kvpage::BlockPool;
using kvpage::BlockPoolConfig;
using kvpage::GroupId;
using kvpage::KvCacheConfig;
using kvpage::KvCacheManager;
using kvpage::KvEventLog;
using kvpage::KvRequestSpec;
using kvpage::LayerKind;
using kvpage::MemoryBudget;
using kvpage::ModelSpec;
using kvpage::RequestId;

constexpr int32_t kBlockSize = 16;
constexpr int32_t kPoolBlocks = 1 << 16;
constexpr uint64_t kHashSeed = 42;
constexpr uint32_t kVocab = 150000;

// Seconds per unit of `per_iteration` (e.g. per request): Time / per_iteration.
benchmark::Counter PerUnit(int64_t per_iteration) {
  return benchmark::Counter(static_cast<double>(per_iteration),
                            benchmark::Counter::kIsIterationInvariantRate |
                                benchmark::Counter::kInvert);
}

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Token ids spread over a 150K vocabulary; `seed` makes each request's prompt distinct.
std::vector<int32_t> MakeTokens(uint32_t seed, int64_t count) {
  std::vector<int32_t> tokens(static_cast<size_t>(count));
  uint32_t x = 12345u + seed * 2654435761u;
  for (int32_t& token : tokens) {
    x = x * 1664525u + 1013904223u;
    token = static_cast<int32_t>(x % kVocab);
  }
  return tokens;
}

// ---- BlockPool ---------------------------------------------------------------------------

// One chunk of 64K blocks, one byte each: the budget never limits the pool.
BlockPoolConfig OneChunkPool(bool enable_caching) {
  BlockPoolConfig config;
  config.block_bytes = 1;
  config.blocks_per_chunk = kPoolBlocks;
  config.max_chunks = 1;
  config.enable_caching = enable_caching;
  return config;
}

// Allocate(batch) then Free of the same ids, no hashes: every free goes back to the clean
// stack. range(0) is the batch.
void BM_BlockPoolAllocFree(benchmark::State& state) {
  const int32_t batch = static_cast<int32_t>(state.range(0));
  MemoryBudget budget(kPoolBlocks);
  KvEventLog events;
  BlockPool pool(OneChunkPool(/*enable_caching=*/false), &budget, &events);
  std::vector<BlockId> ids;
  ids.reserve(static_cast<size_t>(batch));
  for (auto _ : state) {
    ids.clear();
    if (!pool.Allocate(batch, &ids)) state.SkipWithError("Allocate refused");
    pool.Free(ids);
    benchmark::DoNotOptimize(ids.data());
  }
  state.SetItemsProcessed(state.iterations() * batch);
  state.counters["per_block"] = PerUnit(batch);
}
BENCHMARK(BM_BlockPoolAllocFree)->Arg(1)->Arg(16)->Arg(256);

// Prefix caching on, memory full of cache: every block of the pool carries a unique hash and
// sits in the LRU list, so each Allocate evicts (drops a hash-map entry), each block is then
// cached under a new hash (inserts one) and freed back to the LRU tail. range(0) is the batch.
void BM_BlockPoolAllocFreeCached(benchmark::State& state) {
  const int32_t batch = static_cast<int32_t>(state.range(0));
  MemoryBudget budget(kPoolBlocks);
  KvEventLog events;
  BlockPool pool(OneChunkPool(/*enable_caching=*/true), &budget, &events);
  uint64_t next_hash = 0;
  auto cache_all = [&](const std::vector<BlockId>& blocks) {
    BlockHash parent;
    for (BlockId b : blocks) {
      const BlockHash hash{SplitMix64(next_hash), SplitMix64(next_hash ^ 0x5555)};
      ++next_hash;
      pool.CacheBlock(b, hash, GroupId(0), parent);
      parent = hash;
    }
  };
  std::vector<BlockId> ids;
  ids.reserve(kPoolBlocks);
  if (!pool.Allocate(kPoolBlocks, &ids)) state.SkipWithError("Allocate refused");
  cache_all(ids);
  pool.Free(ids);
  if (pool.num_cached_free_blocks() != kPoolBlocks) {
    state.SkipWithError("warm-up did not leave every block cached-free");
    return;
  }
  for (auto _ : state) {
    ids.clear();
    if (!pool.Allocate(batch, &ids)) state.SkipWithError("Allocate refused");
    cache_all(ids);
    pool.Free(ids);
    benchmark::DoNotOptimize(ids.data());
  }
  state.SetItemsProcessed(state.iterations() * batch);
  state.counters["per_block"] = PerUnit(batch);
}
BENCHMARK(BM_BlockPoolAllocFreeCached)->Arg(1)->Arg(16)->Arg(256);

// ---- KvCacheManager ----------------------------------------------------------------------

// A budget that holds `tokens_per_request` tokens for every request in every group, plus one
// chunk of slack per pool and 25%. Sliding-window groups are sized for the whole sequence too:
// a prefill takes every block of the prompt before the window releases them, and the blocks
// it releases stay mapped in that pool (as cached-free blocks in chunks that are not idle),
// so a budget sized for the windows alone runs out (AllocateSlots returns false).
int64_t BudgetFor(const ModelSpec& model, const std::vector<int64_t>& tokens_per_request) {
  KvCacheConfig probe_config;
  probe_config.kv_budget_bytes = int64_t{4} << 30;
  probe_config.hash_seed = kHashSeed;
  auto probe = KvCacheManager::Create(model, probe_config);
  if (!probe.ok()) return -1;
  const kvpage::KvCacheUsage usage = (*probe)->Usage();
  int64_t bytes = 0;
  for (size_t g = 0; g < model.groups.size(); ++g) {
    const bool recurrent = model.groups[g].spec.kind == LayerKind::kLinearAttention;
    int64_t blocks = 0;
    for (int64_t tokens : tokens_per_request) {
      blocks += recurrent ? 2 : (tokens + kBlockSize - 1) / kBlockSize;
    }
    bytes += blocks * usage.pools[g].block_bytes + probe_config.chunk_bytes;
  }
  return bytes + bytes / 4;
}

// N running requests of one model, prefilled and ready to decode.
//
// cross = false: request i has 1000 + i tokens, nudged off the block boundary (and off a
// block's last token), so the next token never needs a new block; a step is undone by
// RollbackTokens (the blocks stay).
// cross = true: request i has 1000 + i tokens rounded up to a whole block, so the next token
// needs a new block in every attention group. After a step each request is advanced by 15
// more tokens to the next boundary; every kGrowthSteps steps all requests are freed, the prefix
// cache is reset (every block clean again, chunks stay mapped) and they are prefilled afresh.
class DecodeBatch {
 public:
  static constexpr int32_t kGrowthSteps = 32;

  DecodeBatch(const char* model_name, int32_t num_requests, bool cross,
              bool prefix_caching = true, int64_t chunk_bytes = 0)
      : num_requests_(num_requests), cross_(cross) {
    auto model = kvpage::LoadModel(model_name);
    if (!model.ok()) {
      error_ = std::string(model.status().message());
      return;
    }
    std::vector<int64_t> peak_tokens;
    for (int32_t i = 0; i < num_requests_; ++i) {
      int64_t len = 1000 + i;
      if (cross_) {
        len = (len + kBlockSize - 1) / kBlockSize * kBlockSize;
      } else {
        // Off the boundary, and off a block's last token: with a sliding window of whole
        // blocks (Gemma 3: 1,024 tokens) the prefill would have released the block that
        // undoing a step by RollbackTokens needs.
        while (len % kBlockSize == 0 || len % kBlockSize == kBlockSize - 1) ++len;
      }
      prompt_len_.push_back(len);
      prompts_.push_back(MakeTokens(static_cast<uint32_t>(i), len));
      peak_tokens.push_back(len + int64_t{kBlockSize} * (kGrowthSteps + 1));
    }
    KvCacheConfig config;
    config.block_size = kBlockSize;
    config.hash_seed = kHashSeed;
    config.enable_prefix_caching = prefix_caching;
    if (chunk_bytes > 0) config.chunk_bytes = chunk_bytes;
    config.kv_budget_bytes = BudgetFor(*model, peak_tokens);
    auto manager = KvCacheManager::Create(*model, config);
    if (!manager.ok()) {
      error_ = std::string(manager.status().message());
      return;
    }
    manager_ = *std::move(manager);
    Prefill();
    // Untimed warm-up, as on a server that has been running. cross = false: one step, so the
    // first offer of a newly full block to the prefix cache is not timed. cross = true: one
    // whole growth cycle, which maps every chunk the peak needs; timed steps then take clean
    // blocks from mapped chunks.
    const int32_t warm_steps = cross_ ? kGrowthSteps : 1;
    for (int32_t s = 0; s < warm_steps && ok(); ++s) {
      for (int32_t i = 0; i < num_requests_ && ok(); ++i) {
        const int32_t token = NextToken(i);
        Check(manager_->AppendTokens(id(i), {&token, 1}));
        CheckAllocated(manager_->AllocateSlots(
            id(i), {.num_computed_tokens = computed(i), .num_new_tokens = 1}));
        if (!cross_) Check(manager_->RollbackTokens(id(i), 1));
      }
      if (cross_) AdvanceToBoundary();
    }
  }

  const std::string& error() const { return error_; }
  bool ok() const { return error_.empty(); }
  int32_t num_requests() const { return num_requests_; }
  KvCacheManager& manager() { return *manager_; }
  kvpage::RequestHandle id(int32_t i) const { return handles_[static_cast<size_t>(i)]; }
  // Tokens request i has computed (its K/V is in the cache) before the next step.
  int64_t computed(int32_t i) const { return computed_[static_cast<size_t>(i)]; }
  int32_t NextToken(int32_t i) const {
    return static_cast<int32_t>((static_cast<uint32_t>(i) * 7919u + computed(i)) % kVocab);
  }

  // Adds every request and allocates its whole prompt; sliding windows keep only what the
  // first decode token can reach, as after a real prefill step.
  void Prefill() {
    computed_.assign(static_cast<size_t>(num_requests_), 0);
    handles_.assign(static_cast<size_t>(num_requests_), kvpage::RequestHandle());
    for (int32_t i = 0; i < num_requests_ && ok(); ++i) {
      const int64_t len = prompt_len_[static_cast<size_t>(i)];
      KvRequestSpec spec;
      spec.id = RequestId(i);
      // AddRequest moves the vector in, capacity included: room for every token this batch
      // will append, so no timed AppendTokens regrows it (copying the whole prompt).
      spec.prompt_tokens.reserve(static_cast<size_t>(len + kBlockSize * (kGrowthSteps + 2)));
      const std::vector<int32_t>& prompt = prompts_[static_cast<size_t>(i)];
      spec.prompt_tokens.assign(prompt.begin(), prompt.end());
      auto added = manager_->AddRequest(std::move(spec));
      Check(added.status());
      if (added.ok()) handles_[static_cast<size_t>(i)] = *added;
      CheckAllocated(manager_->AllocateSlots(id(i), {.num_computed_tokens = 0, .num_new_tokens = len}));
      Check(manager_->RemoveSkippedBlocks(id(i), len));
      computed_[static_cast<size_t>(i)] = len;
    }
    steps_since_prefill_ = 0;
  }

  // Appends each request's next token (the one the coming step computes).
  void AppendStepTokens() {
    for (int32_t i = 0; i < num_requests_ && ok(); ++i) {
      const int32_t token = NextToken(i);
      Check(manager_->AppendTokens(id(i), {&token, 1}));
    }
  }

  // cross = true, after a step that appended and allocated one token: appends and allocates
  // 15 more so the next token starts a block again; every kGrowthSteps steps, starts over.
  void AdvanceToBoundary() {
    if (++steps_since_prefill_ == kGrowthSteps) {
      for (int32_t i = 0; i < num_requests_; ++i) Check(manager_->Free(id(i)));
      Check(manager_->ResetPrefixCache());
      Prefill();
      return;
    }
    std::vector<int32_t> tokens(kBlockSize - 1);
    for (int32_t i = 0; i < num_requests_ && ok(); ++i) {
      const int64_t c = ++computed_[static_cast<size_t>(i)];  // the step's token
      for (int32_t& t : tokens) t = static_cast<int32_t>((c + i) % kVocab);
      Check(manager_->AppendTokens(id(i), tokens));
      CheckAllocated(manager_->AllocateSlots(
          id(i), {.num_computed_tokens = c, .num_new_tokens = kBlockSize - 1}));
      computed_[static_cast<size_t>(i)] = c + kBlockSize - 1;
    }
  }

  void Check(const absl::Status& status) {
    if (!status.ok() && error_.empty()) error_ = std::string(status.message());
  }
  void CheckAllocated(const absl::StatusOr<bool>& allocated) {
    if (!allocated.ok()) {
      Check(allocated.status());
    } else if (!*allocated && error_.empty()) {
      error_ = "AllocateSlots ran out of memory; the budget is too small";
    }
  }

 private:
  int32_t num_requests_;
  bool cross_;
  std::string error_;
  std::unique_ptr<KvCacheManager> manager_;
  std::vector<int64_t> prompt_len_;
  std::vector<std::vector<int32_t>> prompts_;
  std::vector<int64_t> computed_;
  std::vector<kvpage::RequestHandle> handles_;  // by request index, set by Prefill
  int32_t steps_since_prefill_ = 0;
};

void ReportStep(benchmark::State& state, const DecodeBatch& batch) {
  state.SetItemsProcessed(state.iterations() * batch.num_requests());
  state.counters["per_request"] = PerUnit(batch.num_requests());
}

// One decode step as a server runs it: for every request AppendTokens(1 sampled token), then
// AllocateSlots for that token. range(0) = running requests, range(1) = 1 if every request
// crosses a block boundary this step (needs one new block per attention group), 0 if none does.
void BM_AllocateSlotsDecodeStep(benchmark::State& state, const char* model_name) {
  const bool cross = state.range(1) != 0;
  DecodeBatch batch(model_name, static_cast<int32_t>(state.range(0)), cross);
  if (!batch.ok()) {
    state.SkipWithError(batch.error().c_str());
    return;
  }
  KvCacheManager& manager = batch.manager();
  const int32_t n = batch.num_requests();
  bool ok = true;
  for (auto _ : state) {
    if (!ok) break;
    for (int32_t i = 0; i < n; ++i) {
      const int32_t token = batch.NextToken(i);
      ok &= manager.AppendTokens(batch.id(i), {&token, 1}).ok();
      auto allocated = manager.AllocateSlots(
          batch.id(i), {.num_computed_tokens = batch.computed(i), .num_new_tokens = 1});
      ok &= allocated.ok() && *allocated;
    }
    state.PauseTiming();
    if (cross) {
      batch.AdvanceToBoundary();
    } else {
      for (int32_t i = 0; i < n; ++i) batch.Check(manager.RollbackTokens(batch.id(i), 1));
    }
    ok &= batch.ok();
    state.ResumeTiming();
  }
  if (!ok) {
    state.SkipWithError(batch.ok() ? "AppendTokens or AllocateSlots failed" : batch.error().c_str());
    return;
  }
  ReportStep(state, batch);
}

// AllocateSlots alone: the step's token is appended before the timed region, so this is the
// manager's per-step allocation cost without the token bookkeeping and hashing of
// AppendTokens. With cross = 0 the call finds every block in place (the common decode step).
void BM_AllocateSlotsOnly(benchmark::State& state, const char* model_name) {
  const bool cross = state.range(1) != 0;
  DecodeBatch batch(model_name, static_cast<int32_t>(state.range(0)), cross);
  if (!batch.ok()) {
    state.SkipWithError(batch.error().c_str());
    return;
  }
  KvCacheManager& manager = batch.manager();
  const int32_t n = batch.num_requests();
  batch.AppendStepTokens();
  bool ok = batch.ok();
  for (auto _ : state) {
    if (!ok) break;
    for (int32_t i = 0; i < n; ++i) {
      auto allocated = manager.AllocateSlots(
          batch.id(i), {.num_computed_tokens = batch.computed(i), .num_new_tokens = 1});
      ok &= allocated.ok() && *allocated;
    }
    if (cross) {
      // Without cross the same call is repeated: every block it needs is already held.
      state.PauseTiming();
      batch.AdvanceToBoundary();
      batch.AppendStepTokens();
      ok &= batch.ok();
      state.ResumeTiming();
    }
  }
  if (!ok) {
    state.SkipWithError(batch.ok() ? "AllocateSlots failed" : batch.error().c_str());
    return;
  }
  ReportStep(state, batch);
}

void DecodeArgs(benchmark::internal::Benchmark* b) {
  b->ArgNames({"requests", "cross"});
  b->ArgsProduct({{256, 1024, 4096}, {0, 1}});
  b->Unit(benchmark::kMicrosecond);
}
BENCHMARK_CAPTURE(BM_AllocateSlotsDecodeStep, qwen3_8b, "qwen3-8b")->Apply(DecodeArgs);
BENCHMARK_CAPTURE(BM_AllocateSlotsDecodeStep, gemma3_4b, "gemma-3-4b-it")->Apply(DecodeArgs);
// The same step through the batch call a scheduler makes: AllocateDecodeStep over all requests.
void RunDecodeStep(benchmark::State& state, const char* model_name, bool prefix_caching,
                   int64_t chunk_bytes = 0) {
  const bool cross = state.range(1) != 0;
  DecodeBatch batch(model_name, static_cast<int32_t>(state.range(0)), cross, prefix_caching,
                    chunk_bytes);
  if (!batch.ok()) {
    state.SkipWithError(batch.error().c_str());
    return;
  }
  KvCacheManager& manager = batch.manager();
  const int32_t n = batch.num_requests();
  std::vector<kvpage::DecodeStep> steps(n);
  auto fill_steps = [&] {
    for (int32_t i = 0; i < n; ++i) {
      steps[i] = {batch.id(i), batch.computed(i), 1};
    }
  };
  batch.AppendStepTokens();
  fill_steps();
  bool ok = batch.ok();
  for (auto _ : state) {
    if (!ok) break;
    auto served = manager.AllocateDecodeStep(steps);
    ok &= served.ok() && *served == n;
    if (cross) {
      state.PauseTiming();
      batch.AdvanceToBoundary();
      batch.AppendStepTokens();
      fill_steps();
      ok &= batch.ok();
      state.ResumeTiming();
    }
  }
  if (!ok) {
    state.SkipWithError(batch.ok() ? "AllocateDecodeStep failed" : batch.error().c_str());
    return;
  }
  ReportStep(state, batch);
}
void BM_AllocateDecodeStep(benchmark::State& state, const char* model_name) {
  RunDecodeStep(state, model_name, /*prefix_caching=*/true);
}
// The same with prefix caching off: separates the cost of offering newly full blocks to the
// prefix cache from the rest of the step.
void BM_AllocateDecodeStepNoPrefixCache(benchmark::State& state, const char* model_name) {
  RunDecodeStep(state, model_name, /*prefix_caching=*/false);
}
BENCHMARK_CAPTURE(BM_AllocateDecodeStep, qwen3_8b, "qwen3-8b")->Apply(DecodeArgs);
BENCHMARK_CAPTURE(BM_AllocateDecodeStepNoPrefixCache, qwen3_8b, "qwen3-8b")
    ->ArgNames({"requests", "cross"})
    ->ArgsProduct({{1024}, {0, 1}})
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_AllocateDecodeStep, gemma3_4b, "gemma-3-4b-it")->Apply(DecodeArgs);
// The same step with chunks of 2, 8 and 64 MiB (third argument): small chunks strand less
// memory across pools but cost a chunk-record miss or two per block taken.
void BM_AllocateDecodeStepChunkMiB(benchmark::State& state, const char* model_name) {
  RunDecodeStep(state, model_name, /*prefix_caching=*/true, state.range(2) << 20);
}
BENCHMARK_CAPTURE(BM_AllocateDecodeStepChunkMiB, qwen3_8b, "qwen3-8b")
    ->ArgNames({"requests", "cross", "chunk_mib"})
    ->ArgsProduct({{1024}, {1}, {2, 8, 64}})
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_AllocateDecodeStepChunkMiB, gemma3_4b, "gemma-3-4b-it")
    ->ArgNames({"requests", "cross", "chunk_mib"})
    ->ArgsProduct({{1024}, {1}, {2, 8, 64}})
    ->Unit(benchmark::kMicrosecond);

BENCHMARK_CAPTURE(BM_AllocateSlotsOnly, qwen3_8b, "qwen3-8b")->Apply(DecodeArgs);
BENCHMARK_CAPTURE(BM_AllocateSlotsOnly, gemma3_4b, "gemma-3-4b-it")->Apply(DecodeArgs);

// GetComputedBlocks for a 32K-token prompt whose 2,048 blocks are all in the prefix cache
// (left there by an earlier request with the same prompt, now finished). One extra token makes
// every one of the 2,048 blocks part of the hit (the last token is always recomputed).
void BM_PrefixHitLookup(benchmark::State& state, const char* model_name) {
  constexpr int64_t kHitBlocks = 2048;
  const int64_t prompt_len = kHitBlocks * kBlockSize + 1;
  auto model = kvpage::LoadModel(model_name);
  if (!model.ok()) {
    state.SkipWithError(std::string(model.status().message()).c_str());
    return;
  }
  KvCacheConfig config;
  config.block_size = kBlockSize;
  config.hash_seed = kHashSeed;
  config.kv_budget_bytes = BudgetFor(*model, {prompt_len, prompt_len});
  auto created = KvCacheManager::Create(*model, config);
  if (!created.ok()) {
    state.SkipWithError(std::string(created.status().message()).c_str());
    return;
  }
  KvCacheManager& manager = **created;
  const std::vector<int32_t> prompt = MakeTokens(7, prompt_len);
  auto first = manager.AddRequest({RequestId(0), prompt, {}});
  bool ok = first.ok();
  auto allocated = ok ? manager.AllocateSlots(
                            *first, {.num_computed_tokens = 0, .num_new_tokens = prompt_len})
                      : absl::StatusOr<bool>(false);
  manager.CompleteStep();  // the prompt's blocks join the prefix cache once computed
  ok &= allocated.ok() && *allocated && manager.Free(*first).ok();
  auto second = manager.AddRequest({RequestId(1), prompt, {}});
  ok &= second.ok();
  if (!ok) {
    state.SkipWithError("setting up the cached prompt failed");
    return;
  }
  for (auto _ : state) {
    auto hit = manager.GetComputedBlocks(*second);
    if (!hit.ok() || hit->num_tokens != kHitBlocks * kBlockSize) {
      state.SkipWithError("the prompt is not fully cached");
      return;
    }
    benchmark::DoNotOptimize(hit->blocks.data());
  }
  state.SetItemsProcessed(state.iterations() * kHitBlocks);
  state.counters["per_block"] = PerUnit(kHitBlocks);
}
BENCHMARK_CAPTURE(BM_PrefixHitLookup, qwen3_8b, "qwen3-8b")->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_PrefixHitLookup, gemma3_4b, "gemma-3-4b-it")->Unit(benchmark::kMicrosecond);

}  // namespace
