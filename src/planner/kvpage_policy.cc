// kvpage's own reservation, measured by a dry run of the real block manager.
//
// One request of context L is driven through a KvCacheManager the way the scheduler drives
// it: its prompt (L − 1 tokens) prefilled in chunks of max_num_batched_tokens, then one decode
// step that computes token L. What the pools hold for it at that point is `reserved_bytes`;
// what the sliding-window pools held on top of that at the peak of the prefill — blocks for a
// chunk in flight beyond the window — is the pool-wide allowance `shared_bytes`. A
// chunked-local group reserves a whole attention chunk (or the context, if shorter), which the
// request reaches by the end of its chunk, and shares what the prefill held beyond that.

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "internal/status_macros.h"
#include "kvpage/kv_cache_manager.h"
#include "planner/policies.h"

namespace kvpage::internal {
namespace {

// Large enough for every real context; bounds the dry run's memory (a few MiB of tables).
constexpr int64_t kMaxDryRunContext = int64_t{1} << 24;
// Blocks per chunk of the smallest pool. A pool keeps a 32-byte record per chunk it maps, so
// one-block chunks cost 32 bytes per block held: 537 MiB of records at a 16M-token context
// with 1-token blocks. Every pool's chunk is then a power of two of at most this many blocks,
// which divides it, so a budget of whole multiples of it per group never runs short.
constexpr int64_t kDryRunChunkBlocks = 64;

struct DryRun {
  std::vector<int64_t> held_blocks;  // per group, after the decode step
  std::vector<int64_t> peak_blocks;  // per group, the most held at any point
  std::vector<int64_t> block_bytes;  // per group
};

absl::StatusOr<DryRun> RunOneRequest(const ModelSpec& model, const PlanOptions& options,
                                     int64_t context) {
  KvCacheConfig config;
  config.mode = AccountingMode::kKvpage;
  config.block_size = options.block_size;
  config.kv_cache_dtype = options.ResolvedKvDtype(model.dtype);
  config.enable_prefix_caching = false;  // snapshots are cache, not reservation
  config.max_num_batched_tokens = options.max_num_batched_tokens;
  config.max_model_len = context;
  // Room for the whole context plus one step in flight in every pool, rounded up to whole
  // chunks (the counts below are of blocks held, whatever the chunk size).
  const int64_t bs = options.block_size;
  int64_t budget = 0, smallest_block = 0;
  for (const LayerGroup& g : model.groups) {
    int64_t block_bytes = g.spec.linear.NativeBytes() * g.num_layers();
    if (g.spec.IsAttention()) {
      KVPAGE_ASSIGN_OR_RETURN(int64_t token_bytes,
                              CacheTokenBytes(g.spec.attention, *config.kv_cache_dtype));
      block_bytes = bs * token_bytes * g.num_layers();
    }
    const int64_t blocks = CeilDiv(context + options.max_num_batched_tokens, bs) + 4;
    budget += CeilDiv(blocks, kDryRunChunkBlocks) * kDryRunChunkBlocks * block_bytes;
    smallest_block = smallest_block == 0 ? block_bytes : std::min(smallest_block, block_bytes);
  }
  config.kv_budget_bytes = budget;
  config.chunk_bytes = kDryRunChunkBlocks * smallest_block;
  KVPAGE_ASSIGN_OR_RETURN(std::unique_ptr<KvCacheManager> manager,
                          KvCacheManager::Create(model, config));

  DryRun run;
  const int32_t groups = manager->num_groups();
  run.peak_blocks.assign(groups, 0);
  // Records the blocks each pool holds now into *held and keeps the peaks.
  auto observe = [&](std::vector<int64_t>* held) {
    const KvCacheUsage usage = manager->Usage();
    held->resize(groups);
    for (int32_t g = 0; g < groups; ++g) {
      (*held)[g] = usage.pools[g].used_blocks;
      run.peak_blocks[g] = std::max<int64_t>(run.peak_blocks[g], usage.pools[g].used_blocks);
    }
  };
  const int64_t prompt = std::max<int64_t>(1, context - 1);
  KVPAGE_ASSIGN_OR_RETURN(const RequestHandle id,
                          manager->AddRequest({RequestId(0), std::vector<int32_t>(prompt, 0)}));
  for (int64_t done = 0; done < prompt;) {
    const int64_t chunk = std::min<int64_t>(options.max_num_batched_tokens, prompt - done);
    KVPAGE_ASSIGN_OR_RETURN(bool ok, manager->AllocateSlots(
                                         id, {.num_computed_tokens = done, .num_new_tokens = chunk}));
    if (!ok) return absl::InternalError("dry run ran out of memory during prefill");
    observe(&run.held_blocks);
    done += chunk;
    manager->NewStep();
  }
  if (context > prompt) {
    KVPAGE_RETURN_IF_ERROR(manager->AppendTokens(id, {0}));
    KVPAGE_ASSIGN_OR_RETURN(bool ok, manager->AllocateSlots(
                                         id, {.num_computed_tokens = prompt, .num_new_tokens = 1}));
    if (!ok) return absl::InternalError("dry run ran out of memory during decode");
    observe(&run.held_blocks);
  }
  for (const PoolUsage& pool : manager->Usage().pools) run.block_bytes.push_back(pool.block_bytes);
  return run;
}

}  // namespace

absl::StatusOr<PlanRow> PlanKvpageRow(const ModelSpec& model, const PlanOptions& options,
                                      int64_t context, std::optional<int64_t> budget) {
  if (context > kMaxDryRunContext) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the kvpage policy dry-runs the block manager for contexts up to ", kMaxDryRunContext,
        " tokens, got ", context));
  }
  KVPAGE_ASSIGN_OR_RETURN(DryRun run, RunOneRequest(model, options, context));
  PlanRow row;
  row.context = context;
  for (size_t i = 0; i < model.groups.size(); ++i) {
    const LayerGroup& group = model.groups[i];
    GroupReservation g;
    g.kind = group.spec.kind;
    g.num_layers = group.num_layers();
    g.block_size = group.spec.IsAttention() ? options.block_size : 0;
    g.blocks = run.held_blocks[i];
    if (g.kind == LayerKind::kChunkedLocal) {
      // The decode step may end early in a chunk; the request holds a whole chunk by the
      // chunk's end, so it reserves that (at most the context's blocks).
      g.blocks = std::max(g.blocks, std::min(CeilDiv(context, options.block_size),
                                             CeilDiv(group.spec.attention_chunk_size,
                                                     options.block_size)));
    }
    g.reserved_bytes = g.blocks * run.block_bytes[i];
    if (g.kind == LayerKind::kLinearAttention) {
      row.state_bytes += g.reserved_bytes;
      // A prefix-cache snapshot is one more slot, held by the cache rather than the request.
      if (options.enable_prefix_caching) row.snapshot_bytes += run.block_bytes[i];
    }
    if (g.kind == LayerKind::kSlidingWindow || g.kind == LayerKind::kChunkedLocal) {
      row.shared_bytes +=
          std::max<int64_t>(0, run.peak_blocks[i] - g.blocks) * run.block_bytes[i];
    }
    row.reserved_bytes += g.reserved_bytes;
    row.groups.push_back(g);
  }
  if (budget.has_value()) {
    const int64_t room = *budget - row.shared_bytes;
    row.max_concurrency = (room <= 0 || row.reserved_bytes == 0) ? 0 : room / row.reserved_bytes;
  }
  return row;
}

}  // namespace kvpage::internal
