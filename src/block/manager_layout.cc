// Groups and pools of a KvCacheManager, for kvpage and vllm accounting. vLLM's accounting is
// a different layout (groups sharing one pool) and parameters of the groups
// (GroupContext), not a different code path.
#include <algorithm>
#include <atomic>
#include <bit>
#include <limits>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "block/group_factory.h"
#include "block/manager_impl.h"
#include "block/memory_description.h"
#include "internal/status_macros.h"
#include "model/kv_sizing.h"
#include "model/vllm_layout.h"

namespace kvpage {
namespace {

using internal::GroupLayout;

// Largest id count a pool may have (ids are int32 and id 0 is the null block).
constexpr int64_t kMaxPoolBlocks = std::numeric_limits<int32_t>::max() - 1;
constexpr int64_t kMaxMapUnitBytes = int64_t{1} << 30;

absl::Status AddPool(ManagerImpl& m, int64_t block_bytes, int64_t blocks_per_chunk,
                     int64_t max_chunks, int64_t chunk_charge = 0) {
  BlockPoolConfig pc;
  pc.pool_index = static_cast<int32_t>(m.pools.size());
  pc.block_bytes = block_bytes;
  pc.blocks_per_chunk = static_cast<int32_t>(blocks_per_chunk);
  pc.max_chunks = static_cast<int32_t>(max_chunks);
  pc.chunk_charge_bytes = chunk_charge;
  pc.enable_caching = m.config.enable_prefix_caching;
  KVPAGE_RETURN_IF_ERROR(pc.Validate());
  m.pools.push_back(std::make_unique<BlockPool>(pc, m.budget.get(), &m.events));
  return absl::OkStatus();
}

// Bytes of whole units that one chunk's slice of a tensor can make the backing map: exactly
// its bytes when the slice is whole units (a backing starts block 1 of every tensor on a unit
// boundary), else every unit a span of that length can straddle.
int64_t SliceCharge(int64_t tensor_block_bytes, int64_t per_chunk, int64_t unit) {
  const int64_t bytes = tensor_block_bytes * per_chunk;
  if (bytes % unit == 0) return bytes;
  return (bytes + 2 * unit - 2) / unit * unit;
}

struct ChunkPlan {
  int64_t per_chunk = 1;   // blocks per chunk
  int64_t charge = 0;      // budget bytes per chunk
  int64_t max_chunks = 0;
};

// A pool's chunks: about `target_bytes`, a power of two of blocks (a block's chunk is a shift
// away) or, when one chunk would hold the whole budget, exactly that many blocks; raised to
// whole units of every tensor of the pool when the budget allows.
ChunkPlan PlanChunks(int64_t block_bytes, const std::vector<int64_t>& tensors, int64_t unit,
                     int64_t budget, int64_t target_bytes) {
  int64_t align = 1;  // blocks per chunk that make every slice whole units (a power of two)
  for (int64_t tb : tensors) align = std::max(align, unit / std::gcd(unit, tb));
  const int64_t fits = budget / block_bytes;
  const int64_t target = std::max<int64_t>(1, target_bytes / block_bytes);
  ChunkPlan plan;
  if (target >= fits) {
    plan.per_chunk = fits >= align ? fits / align * align : fits;
  } else {
    plan.per_chunk = static_cast<int64_t>(std::bit_floor(static_cast<uint64_t>(target)));
    if (align <= fits) plan.per_chunk = std::max(plan.per_chunk, align);
  }
  for (int64_t tb : tensors) plan.charge += SliceCharge(tb, plan.per_chunk, unit);
  plan.max_chunks = std::min(budget / plan.charge, kMaxPoolBlocks / plan.per_chunk);
  return plan;
}

// The backing's map unit must be a power of two small enough that a chunk's charge in units
// cannot overflow.
absl::Status CheckMapUnit(const MemoryBacking* backing) {
  if (backing == nullptr) return absl::OkStatus();
  const int64_t unit = backing->map_unit_bytes();
  if (unit < 1 || unit > kMaxMapUnitBytes || (unit & (unit - 1)) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the memory backing's map_unit_bytes() is ", unit, ", not a power of two in [1, 2^30]"));
  }
  return absl::OkStatus();
}

// kvpage: one pool per layer group, each drawing chunks of about config.chunk_bytes. With a
// backing, every tensor's null block is charged up front in whole units.
absl::Status BuildKvpageLayout(ManagerImpl& m, const ModelSpec& model, DType dtype,
                               std::vector<GroupLayout>& out) {
  m.block_size = m.config.block_size;
  const MemoryBacking* backing = m.config.backing;
  const int64_t unit = backing != nullptr ? backing->map_unit_bytes() : 1;  // (CheckMapUnit)
  std::vector<std::vector<int64_t>> tensors(model.groups.size());
  int64_t fixed = 0;
  for (size_t i = 0; i < model.groups.size(); ++i) {
    const LayerGroup& group = model.groups[i];
    KVPAGE_ASSIGN_OR_RETURN(const std::vector<CacheTensor> layer,
                            internal::LayerTensors(group.spec, m.block_size, dtype));
    for (int32_t l = 0; l < group.num_layers(); ++l) {
      for (const CacheTensor& t : layer) {
        tensors[i].push_back(t.block_bytes);
        if (backing != nullptr) fixed += internal::RoundUp(t.block_bytes, unit);
      }
    }
  }
  const int64_t budget = m.config.kv_budget_bytes - fixed;
  m.budget->set_fixed_bytes(std::min(fixed, m.config.kv_budget_bytes));
  for (size_t i = 0; i < model.groups.size(); ++i) {
    const LayerGroup& group = model.groups[i];
    GroupLayout g;
    g.id = GroupId(static_cast<int32_t>(i));
    g.kind = group.spec.kind;
    g.num_layers = group.num_layers();
    g.window = group.spec.sliding_window;
    g.chunk_size = group.spec.attention_chunk_size;
    g.pool = static_cast<int32_t>(i);
    g.block_size = internal::GroupBlockSize(group.spec, m.block_size);
    for (int64_t tb : tensors[i]) g.block_bytes += tb;
    if (g.block_bytes > budget) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "kv_budget_bytes ", m.config.kv_budget_bytes, " cannot hold one ",
          LayerKindName(g.kind), " block of ", g.block_bytes, " bytes",
          fixed > 0 ? absl::StrCat(" beside the backing's null blocks (", fixed, " bytes)") : ""));
    }
    const ChunkPlan plan = PlanChunks(g.block_bytes, tensors[i], unit, budget,
                                      m.config.chunk_bytes);
    if (plan.max_chunks < 1) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "kv_budget_bytes ", m.config.kv_budget_bytes, " cannot hold one chunk of ",
          LayerKindName(g.kind), " blocks as the backing maps it (", plan.charge,
          " bytes in units of ", unit, ")"));
    }
    KVPAGE_RETURN_IF_ERROR(
        AddPool(m, g.block_bytes, plan.per_chunk, plan.max_chunks, plan.charge));
    out.push_back(g);
  }
  return absl::OkStatus();
}

// vllm: vLLM's equal-size groups sharing one block-id space; a block id costs
// group_size × page whichever group holds it.
absl::Status BuildVllmLayout(ManagerImpl& m, const ModelSpec& model, DType dtype,
                             std::vector<GroupLayout>& out) {
  KVPAGE_ASSIGN_OR_RETURN(internal::VllmLayout layout,
                          internal::BuildVllmLayout(model, m.config.block_size, dtype));
  const int64_t block_id_bytes = layout.uniform_single_group
                                     ? layout.uniform_block_bytes
                                     : layout.group_size * layout.page_bytes;
  int64_t attention_block = 0;
  for (const internal::VllmBucket& b : layout.buckets) {
    if (b.block_size == 0) continue;
    if (attention_block != 0 && attention_block != b.block_size) {
      return absl::UnimplementedError(
          "vllm accounting with different block sizes per group is not supported");
    }
    attention_block = b.block_size;
  }
  m.block_size = attention_block > 0 ? static_cast<int32_t>(attention_block) : m.config.block_size;
  // vLLM's num_gpu_blocks counts its null block (block 0 of the pool); kvpage's pools keep id 0
  // aside on their own, so the usable count drops by one where the release does that.
  const int64_t null_blocks = internal::RulesFor(m.config.vllm_version).null_block_in_pool ? 1 : 0;
  const int64_t num_blocks =
      std::min(m.config.kv_budget_bytes / block_id_bytes - null_blocks, kMaxPoolBlocks);
  if (num_blocks < 1) {
    return absl::ResourceExhaustedError(
        absl::StrCat("kv_budget_bytes ", m.config.kv_budget_bytes,
                     " cannot hold one vLLM block of ", block_id_bytes,
                     " bytes beside the null block"));
  }
  auto add_group = [&](const LayerSpec& layer_spec, int32_t layers, int32_t padding) {
    const LayerSpec spec = internal::VllmManagedSpec(model, layer_spec);
    GroupLayout g;
    g.id = GroupId(static_cast<int32_t>(out.size()));
    g.kind = spec.kind;
    g.num_layers = layers;
    g.padding_layers = padding;
    g.block_size = internal::GroupBlockSize(spec, m.block_size);
    g.window = spec.sliding_window;
    g.chunk_size = spec.attention_chunk_size;
    g.pool = 0;
    g.block_bytes = block_id_bytes;
    out.push_back(g);
  };
  if (layout.uniform_single_group) {
    add_group(model.groups[0].spec, model.num_layers(), 0);
  } else {
    for (const internal::VllmBucket& b : layout.buckets) {
      const int64_t n = b.group->num_layers();
      const int64_t num_groups = internal::CeilDiv(n, layout.group_size);
      for (int64_t i = 0; i < num_groups; ++i) {
        const int64_t real = n / num_groups + (i < n % num_groups ? 1 : 0);
        add_group(b.group->spec, static_cast<int32_t>(real),
                  static_cast<int32_t>(layout.group_size - real));
      }
    }
  }
  // One chunk holding every block: vLLM allocates the whole pool at start-up.
  return AddPool(m, block_id_bytes, num_blocks, 1);
}

}  // namespace

absl::Status KvCacheConfig::Validate() const {
  auto positive = [](const char* name, int64_t v) -> absl::Status {
    if (v > 0) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(name, " must be positive, got ", v));
  };
  KVPAGE_RETURN_IF_ERROR(positive("kv_budget_bytes", kv_budget_bytes));
  KVPAGE_RETURN_IF_ERROR(positive("block_size", block_size));
  KVPAGE_RETURN_IF_ERROR(positive("max_num_batched_tokens", max_num_batched_tokens));
  KVPAGE_RETURN_IF_ERROR(positive("chunk_bytes", chunk_bytes));
  // Enums may come from a cast integer: each must name one of its values.
  if (mode != AccountingMode::kKvpage && mode != AccountingMode::kVllm) {
    return absl::InvalidArgumentError(absl::StrCat("mode ", static_cast<int>(mode),
                                                   " is not an AccountingMode"));
  }
  KVPAGE_RETURN_IF_ERROR(ValidateVllmVersion(vllm_version));
  if (hash_algorithm != HashAlgorithm::kXxh3_128 && hash_algorithm != HashAlgorithm::kSha256) {
    return absl::InvalidArgumentError(absl::StrCat(
        "hash_algorithm ", static_cast<int>(hash_algorithm), " is not a HashAlgorithm"));
  }
  if (kv_cache_dtype.has_value() && *kv_cache_dtype > DType::kQ8_0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "kv_cache_dtype ", static_cast<int>(*kv_cache_dtype), " is not a DType"));
  }
  if (block_size > (1 << 16)) {
    return absl::InvalidArgumentError(absl::StrCat("block_size ", block_size, " is too large"));
  }
  if (max_model_len < 0 || max_model_len > kMaxManagerModelLen) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_model_len must be in [0, 2^40] (0 = the model's), got ", max_model_len));
  }
  if (mode == AccountingMode::kVllm) KVPAGE_RETURN_IF_ERROR(CheckVllmBlockSize(block_size));
  if (decode_snapshot_interval_blocks < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "decode_snapshot_interval_blocks must be >= 0, got ", decode_snapshot_interval_blocks));
  }
  if (host_cache.budget_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("host_cache.budget_bytes must be >= 0, got ", host_cache.budget_bytes));
  }
  if (host_cache.policy != HostTierPolicy::kWriteThrough &&
      host_cache.policy != HostTierPolicy::kWriteBack) {
    return absl::InvalidArgumentError(absl::StrCat(
        "host_cache.policy ", static_cast<int>(host_cache.policy), " is not a HostTierPolicy"));
  }
  if (host_cache.budget_bytes > 0 && mode != AccountingMode::kKvpage) {
    return absl::InvalidArgumentError(
        "host_cache needs kvpage accounting (vllm accounting models vLLM without offloading)");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<KvCacheManager::Impl>> KvCacheManager::Impl::Build(
    const ModelSpec& model, const KvCacheConfig& config) {
  KVPAGE_RETURN_IF_ERROR(config.Validate());
  if (model.groups.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("model ", model.name, " has no layers"));
  }
  for (const LayerGroup& g : model.groups) {
    // A hand-built spec may lack the chunk its kind divides by.
    if (g.spec.kind == LayerKind::kChunkedLocal && g.spec.attention_chunk_size <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model ", model.name, " has a chunked-local layer group with attention_chunk_size ",
          g.spec.attention_chunk_size, " (must be positive)"));
    }
  }
  auto m = std::make_unique<Impl>();
  // Numbers handles with their manager, so that one manager's handle names nothing in another.
  static std::atomic<uint32_t> next_id{1};
  m->id = next_id.fetch_add(1, std::memory_order_relaxed);
  if (m->id == 0) m->id = next_id.fetch_add(1, std::memory_order_relaxed);
  m->config = config;
  m->max_model_len = config.max_model_len > 0 ? config.max_model_len : model.max_position_embeddings;
  if (m->max_model_len > kMaxManagerModelLen) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model ", model.name, " has max_position_embeddings ", m->max_model_len,
        ", more than the 2^40 tokens a KV cache manager takes: set max_model_len"));
  }
  KVPAGE_RETURN_IF_ERROR(CheckMapUnit(config.backing));
  if (model.vocab_size > 0 && model.vocab_size < (int64_t{1} << 31)) {
    m->token_limit = static_cast<uint32_t>(model.vocab_size);
  }
  m->events.set_enabled(config.enable_kv_events);
  m->budget = std::make_unique<MemoryBudget>(config.kv_budget_bytes, config.backing);
  m->hasher = std::make_unique<BlockHasher>(config.hash_algorithm, config.hash_seed);
  const DType dtype = config.kv_cache_dtype.value_or(model.dtype);
  const bool vllm = config.mode == AccountingMode::kVllm;
  // The layouts are built first and the group managers once the pools exist.
  std::vector<GroupLayout> layouts;
  KVPAGE_RETURN_IF_ERROR(vllm ? BuildVllmLayout(*m, model, dtype, layouts)
                              : BuildKvpageLayout(*m, model, dtype, layouts));
  if (config.backing != nullptr) {  // before any chunk is mapped
    KVPAGE_ASSIGN_OR_RETURN(MemoryLayout memory,
                            internal::DescribeMemory(model, config, dtype, layouts, m->pools));
    KVPAGE_RETURN_IF_ERROR(config.backing->Reserve(memory));
  }
  KVPAGE_RETURN_IF_ERROR(m->BuildHostTiers(model, dtype, layouts));
  if ((m->block_size & (m->block_size - 1)) == 0) m->block_mask = m->block_size - 1;
  const internal::VllmRules rules = internal::RulesFor(config.vllm_version);
  m->context = internal::GroupContext{
      .enable_prefix_caching = config.enable_prefix_caching,
      .cache_at_allocation = vllm,
      .window_sequence_reserve = vllm,
      .extra_first_state_blocks = vllm ? rules.extra_first_state_blocks : 0,
      .align_state_blocks = vllm && config.enable_prefix_caching && rules.align_state_blocks,
      .hash_block_size = m->block_size,
      .max_model_len = m->max_model_len,
      .max_num_batched_tokens = config.max_num_batched_tokens,
      .async_scheduling = config.async_scheduling,
      .decode_snapshot_interval_blocks = config.decode_snapshot_interval_blocks};
  m->own_pool_steps = m->pools.size() == layouts.size();
  for (const GroupLayout& g : layouts) {
    m->groups.push_back(internal::MakeGroupManager(g, m->pools[g.pool].get(), &m->context));
    const internal::GroupManager& group = *m->groups.back();
    m->hit_order.push_back(&group);
    m->own_pool_steps &= group.grows_in_place();
    m->rolls_back &= group.rolls_back();
    m->frees_skipped |= group.SkippedTokens(std::numeric_limits<int64_t>::max()) > 0;
    m->prefill_alignment = std::max(m->prefill_alignment, group.prefill_alignment());
  }
  std::ranges::stable_sort(m->hit_order, {}, &internal::GroupManager::hit_rank);
  m->step_need.resize(m->pools.size());
  m->step_check.resize(m->pools.size());
  m->step_fresh.resize(m->groups.size());
  if (!vllm) {
    int64_t headroom = 0;
    for (const auto& pool : m->pools) headroom += pool->chunk_charge();
    m->budget->set_headroom_bytes(std::min(headroom, config.kv_budget_bytes / 4));
  }
  return m;
}

}  // namespace kvpage
