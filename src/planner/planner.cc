#include "kvpage/planner.h"

#include <cmath>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "internal/status_macros.h"
#include "kvpage/tensor_parallel.h"
#include "planner/policies.h"

namespace kvpage {

absl::string_view PolicyName(Policy policy) {
  switch (policy) {
    case Policy::kKvpage: return "kvpage";
    case Policy::kVllm: return "vllm";
    case Policy::kLlamaCpp: return "llamacpp";
  }
  return "unknown";
}

absl::StatusOr<Policy> ParsePolicy(absl::string_view text) {
  const std::string t = absl::AsciiStrToLower(text);
  if (t == "kvpage") return Policy::kKvpage;
  if (t == "vllm") return Policy::kVllm;
  if (t == "llamacpp" || t == "llama.cpp" || t == "llama-cpp") return Policy::kLlamaCpp;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown policy '", text, "' (expected kvpage, vllm or llamacpp)"));
}

absl::Status PlanOptions::Validate() const {
  auto positive = [](absl::string_view name, int64_t v) -> absl::Status {
    if (v > 0) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(name, " must be positive, got ", v));
  };
  KVPAGE_RETURN_IF_ERROR(positive("block_size", block_size));
  KVPAGE_RETURN_IF_ERROR(positive("max_num_batched_tokens", max_num_batched_tokens));
  KVPAGE_RETURN_IF_ERROR(positive("ubatch", ubatch));
  KVPAGE_RETURN_IF_ERROR(positive("batch", batch));
  KVPAGE_RETURN_IF_ERROR(positive("parallel", parallel));
  KVPAGE_RETURN_IF_ERROR(positive("max_num_seqs", max_num_seqs));
  if (block_size > (1 << 20)) {
    return absl::InvalidArgumentError(absl::StrCat("block_size ", block_size, " is too large"));
  }
  if (policy == Policy::kVllm) KVPAGE_RETURN_IF_ERROR(CheckVllmBlockSize(block_size));
  KVPAGE_RETURN_IF_ERROR(ValidateVllmVersion(vllm_version));
  if (tp < 1 || tp > kMaxTensorParallel) {
    return absl::InvalidArgumentError(
        absl::StrCat("tp must be in [1, ", kMaxTensorParallel, "], got ", tp));
  }
  if (gpu_memory_bytes.has_value() && *gpu_memory_bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("gpu_memory_bytes must be positive, got ", *gpu_memory_bytes));
  }
  if (!(gpu_memory_utilization > 0.0 && gpu_memory_utilization <= 1.0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gpu_memory_utilization must be in (0, 1], got ", gpu_memory_utilization));
  }
  if (parallel > 65536) {
    return absl::InvalidArgumentError(absl::StrCat("parallel ", parallel, " is too large"));
  }
  return absl::OkStatus();
}

DType PlanOptions::ResolvedKvDtype(DType model) const {
  if (kv_cache_dtype.has_value()) return *kv_cache_dtype;
  return policy == Policy::kLlamaCpp ? DType::kF16 : model;
}

absl::StatusOr<Plan> MakePlan(const ModelSpec& whole_model, const PlanOptions& options,
                              absl::Span<const int64_t> contexts,
                              std::optional<int64_t> kv_budget_bytes) {
  KVPAGE_RETURN_IF_ERROR(options.Validate());
  KVPAGE_ASSIGN_OR_RETURN(const ModelSpec model, ShardForTensorParallel(whole_model, options.tp));
  if (kv_budget_bytes.has_value() && *kv_budget_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV budget must be >= 0 bytes, got ", *kv_budget_bytes));
  }
  if (contexts.empty()) return absl::InvalidArgumentError("no context length given");
  Plan plan;
  plan.model = model.name;
  plan.policy = options.policy;
  plan.kv_cache_dtype = options.ResolvedKvDtype(model.dtype);
  plan.tp = options.tp;
  plan.kv_budget_bytes = kv_budget_bytes;
  for (int64_t context : contexts) {
    // 2^40 tokens keeps every byte count below 2^63 for any real model.
    if (context <= 0 || context > (int64_t{1} << 40)) {
      return absl::InvalidArgumentError(
          absl::StrCat("context length must be in [1, 2^40], got ", context));
    }
    absl::StatusOr<PlanRow> row;
    switch (options.policy) {
      case Policy::kKvpage: row = internal::PlanKvpageRow(model, options, context, kv_budget_bytes); break;
      case Policy::kVllm: row = internal::PlanVllmRow(model, options, context, kv_budget_bytes); break;
      case Policy::kLlamaCpp: row = internal::PlanLlamaCppRow(model, options, context, kv_budget_bytes); break;
    }
    if (!row.ok()) return row.status();
    if (options.policy == Policy::kVllm) {
      KVPAGE_RETURN_IF_ERROR(
          internal::CheckVllmStart(whole_model, model, options, kv_budget_bytes, *row));
    }
    row->kv_bytes = row->reserved_bytes - row->state_bytes;
    row->bytes_per_token = static_cast<double>(row->reserved_bytes) / static_cast<double>(context);
    plan.rows.push_back(*std::move(row));
  }
  return plan;
}

absl::StatusOr<int64_t> KvBudgetFromGpu(const ModelSpec& model, int64_t gpu_memory_bytes,
                                        double gpu_memory_utilization) {
  if (!(gpu_memory_utilization > 0.0 && gpu_memory_utilization <= 1.0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gpu_memory_utilization must be in (0, 1], got ", gpu_memory_utilization));
  }
  const auto usable = static_cast<int64_t>(
      std::floor(static_cast<double>(gpu_memory_bytes) * gpu_memory_utilization));
  const int64_t weights = model.WeightBytes();
  if (weights >= usable) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the weights of ", model.name, " (", weights, " bytes) do not fit in ", usable,
        " bytes (gpu memory ", gpu_memory_bytes, " x utilization ", gpu_memory_utilization, ")"));
  }
  return usable - weights;
}

absl::StatusOr<int64_t> TensorParallelKvBudget(const ModelSpec& model, int32_t tp,
                                               int64_t gpu_memory_bytes,
                                               double gpu_memory_utilization) {
  KVPAGE_ASSIGN_OR_RETURN(const ModelSpec shard, ShardForTensorParallel(model, tp));
  KVPAGE_ASSIGN_OR_RETURN(const int64_t per_gpu,
                          KvBudgetFromGpu(shard, gpu_memory_bytes, gpu_memory_utilization));
  return per_gpu * TensorParallelCacheFactor(model, tp);
}

}  // namespace kvpage
