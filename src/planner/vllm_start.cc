// Whether vLLM 0.33 would start with --max-model-len = a plan row's context, as its start-up
// checks decide, and which settings would let it.
//
// 0. The architecture: MiniMax-Text-01 and MiniMax-M1 are no longer served (CheckArchitecture).
// 1. The length (vllm/config/model.py, _get_and_verify_max_len): above the model's derived
//    limit and its config's model_max_length, vLLM refuses unless
//    VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 is set.
// 2. The memory (vllm/v1/core/kv_cache_planning.py, get_kv_cache_configs and
//    _check_enough_kv_cache_memory): the budget less one block (the null block the pool holds
//    back) must be positive and hold one request of max_model_len, counted as the sum of each
//    group's blocks times the bytes of one block id. Otherwise it binary-searches the longest
//    length that would fit (_estimate_max_model_len_from_groups) and refuses.

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "internal/status_macros.h"
#include "kvpage/tensor_parallel.h"
#include "kvpage/vllm_runtime_memory.h"
#include "planner/policies.h"

namespace kvpage::internal {
namespace {

// Bytes in GiB as vLLM prints them (format_gib: Python's str(round(x, 2))): "4.5", "18.0".
std::string FormatGib(int64_t bytes) {
  std::string s = absl::StrFormat("%.2f", static_cast<double>(bytes) / 1073741824.0);
  if (s.back() == '0') s.pop_back();
  return s;
}

// What vLLM compares at start-up for one request of `len` tokens.
struct MemoryCheck {
  int64_t needed = 0;     // bytes of one request of `len`, all groups
  int64_t available = 0;  // the budget less the null block
  bool fits() const { return available > 0 && needed <= available; }
};

absl::StatusOr<MemoryCheck> CheckMemory(const ModelSpec& shard, const PlanOptions& options,
                                        int64_t len, int64_t budget) {
  KVPAGE_ASSIGN_OR_RETURN(const PlanRow row, PlanVllmRow(shard, options, len, budget));
  KVPAGE_ASSIGN_OR_RETURN(const int64_t block, VllmBlockIdBytes(shard, options));
  return MemoryCheck{.needed = row.reserved_bytes, .available = budget - block};
}

// The longest length in [1, context) whose one request fits, 0 if none (vLLM's estimate).
absl::StatusOr<int64_t> LongestFitting(const ModelSpec& shard, const PlanOptions& options,
                                       int64_t context, int64_t budget) {
  int64_t lo = 0, hi = context - 1;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo + 1) / 2;
    KVPAGE_ASSIGN_OR_RETURN(const MemoryCheck m, CheckMemory(shard, options, mid, budget));
    if (m.fits()) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

// The least --gpu-memory-utilization, in hundredths, under which one request of `context`
// fits on options.gpu_memory_bytes; 0 if even 1.0 is too little.
absl::StatusOr<int32_t> UtilizationThatFits(const ModelSpec& shard, const PlanOptions& options,
                                            int64_t context) {
  for (int32_t h = 1; h <= 100; ++h) {
    if (h / 100.0 <= options.gpu_memory_utilization) continue;
    const absl::StatusOr<int64_t> budget =
        VllmKvBudgetFromGpu(shard, *options.gpu_memory_bytes, h / 100.0, options);
    if (!budget.ok()) continue;  // the weights and runtime memory do not fit yet
    KVPAGE_ASSIGN_OR_RETURN(const MemoryCheck m, CheckMemory(shard, options, context, *budget));
    if (m.fits()) return h;
  }
  return 0;
}

// The least tensor-parallel degree above options.tp (doubling, up to 8 GPUs) at which one
// request of `context` fits each GPU: its budget from the GPU when known, else `budget`.
absl::StatusOr<int32_t> TensorParallelThatFits(const ModelSpec& whole, const PlanOptions& options,
                                               int64_t context, int64_t budget) {
  for (int32_t tp = options.tp * 2; tp <= 8; tp *= 2) {
    if (!CheckTensorParallel(whole, tp).ok()) continue;
    KVPAGE_ASSIGN_OR_RETURN(const ModelSpec shard, ShardForTensorParallel(whole, tp));
    PlanOptions at_tp = options;
    at_tp.tp = tp;
    int64_t per_gpu = budget;
    if (options.gpu_memory_bytes.has_value()) {
      const absl::StatusOr<int64_t> b = VllmKvBudgetFromGpu(
          shard, *options.gpu_memory_bytes, options.gpu_memory_utilization, at_tp);
      if (!b.ok()) continue;
      per_gpu = *b;
    }
    KVPAGE_ASSIGN_OR_RETURN(const MemoryCheck m, CheckMemory(shard, at_tp, context, per_gpu));
    if (m.fits()) return tp;
  }
  return 0;
}

// Settings that would let one request of row.context fit: a shorter --max-model-len, an fp8
// KV cache, a higher --gpu-memory-utilization, more GPUs.
absl::StatusOr<std::vector<std::string>> MemoryFixes(const ModelSpec& whole, const ModelSpec& shard,
                                                     const PlanOptions& options, int64_t context,
                                                     int64_t budget) {
  std::vector<std::string> fixes;
  KVPAGE_ASSIGN_OR_RETURN(const int64_t longest, LongestFitting(shard, options, context, budget));
  if (longest > 0) fixes.push_back(absl::StrCat("--max-model-len ", longest));
  if (BytesPerValue(options.ResolvedKvDtype(shard.dtype)) > 1) {
    PlanOptions fp8 = options;
    fp8.kv_cache_dtype = DType::kFP8;
    KVPAGE_ASSIGN_OR_RETURN(const MemoryCheck m, CheckMemory(shard, fp8, context, budget));
    if (m.fits()) fixes.push_back("--kv-cache-dtype fp8");
  }
  if (options.gpu_memory_bytes.has_value()) {
    KVPAGE_ASSIGN_OR_RETURN(const int32_t h, UtilizationThatFits(shard, options, context));
    if (h > 0) fixes.push_back(absl::StrFormat("--gpu-memory-utilization %.2f", h / 100.0));
  }
  KVPAGE_ASSIGN_OR_RETURN(const int32_t tp,
                          TensorParallelThatFits(whole, options, context, budget));
  if (tp > 0) fixes.push_back(absl::StrCat("--tp ", tp));
  if (fixes.empty()) fixes.push_back("a GPU with more memory");
  return fixes;
}

// Refusal 0: the architecture. vLLM 0.33 lists MiniMax-Text-01 and MiniMax-M1 among the
// architectures it no longer serves (vllm/model_executor/models/registry.py:861-863,
// _PREVIOUSLY_SUPPORTED_MODELS) and refuses them with this reason (registry.py:1231-1238).
// Nothing is allocated then. Returns whether it refused.
bool CheckArchitecture(const ModelSpec& shard, PlanRow& row) {
  constexpr std::pair<absl::string_view, absl::string_view> kDropped[] = {
      {"minimax", "MiniMaxText01ForCausalLM"}, {"minimax_m1", "MiniMaxM1ForCausalLM"}};
  for (const auto& [type, architecture] : kDropped) {
    if (shard.model_type != type) continue;
    row.refusal = absl::StrCat("model architecture ", architecture,
                               " was supported in vLLM until v0.23.0, and is not supported "
                               "anymore");
    row.fixes = {"vLLM 0.23.0 or older (not modelled by --policy vllm)"};
    row.reserved_bytes = row.state_bytes = 0;
    row.groups.clear();
    if (row.max_concurrency.has_value()) row.max_concurrency = 0;
    return true;
  }
  return false;
}

// Refusal 1: the length. Returns whether it refused.
bool CheckLength(const ModelSpec& shard, const PlanOptions& options, PlanRow& row) {
  const int64_t limit = VllmDerivedMaxModelLen(shard);
  if (row.context <= limit || row.context <= shard.model_max_length ||
      options.allow_long_max_model_len) {
    return false;
  }
  const bool scaled = limit != shard.max_position_embeddings;
  row.refusal = absl::StrCat("max_model_len ", row.context,
                             " is greater than the derived max_model_len ", limit,
                             " (max_position_embeddings=", shard.max_position_embeddings,
                             scaled ? absl::StrCat(" x rope factor ", shard.rope_factor) : "",
                             " in config.json)");
  row.fixes = {absl::StrCat("--max-model-len ", limit),
               "RoPE scaling the model supports (--hf-overrides)",
               "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 (kvpage plan --allow-long-max-model-len), "
               "though positions past the trained range give NaN under RoPE"};
  return true;
}

}  // namespace

absl::Status CheckVllmStart(const ModelSpec& whole, const ModelSpec& shard,
                            const PlanOptions& options, std::optional<int64_t> budget,
                            PlanRow& row) {
  if (CheckArchitecture(shard, row) || CheckLength(shard, options, row) || !budget.has_value()) {
    return absl::OkStatus();
  }
  KVPAGE_ASSIGN_OR_RETURN(const MemoryCheck m, CheckMemory(shard, options, row.context, *budget));
  if (m.fits()) return absl::OkStatus();
  if (m.available <= 0) {
    row.refusal = absl::StrCat("no memory is available for the cache blocks: the KV budget of ",
                               *budget, " bytes does not exceed one block (",
                               *budget - m.available, " bytes)");
  } else {
    row.refusal = absl::StrCat("one request of max_model_len ", row.context, " needs ",
                               FormatGib(m.needed), " GiB of KV cache, more than the ",
                               FormatGib(m.available), " GiB available");
  }
  KVPAGE_ASSIGN_OR_RETURN(row.fixes, MemoryFixes(whole, shard, options, row.context, *budget));
  return absl::OkStatus();
}

}  // namespace kvpage::internal
