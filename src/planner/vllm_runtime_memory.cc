// The vllm policy's estimate of vLLM's runtime memory (kvpage/vllm_runtime_memory.h). Each
// constant is either read from vLLM 0.33's source (cited) or fitted to the 20 published
// start-up profiles of vLLM 0.19 on an H100 listed in docs/capacity_planning.md §1.1.
#include "kvpage/vllm_runtime_memory.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "internal/status_macros.h"
#include "kvpage/planner.h"

namespace kvpage {
namespace {

constexpr double kGiB = 1073741824.0;
constexpr double kMiB = 1048576.0;

// The sampler's live bytes per logit besides the logits themselves (model dtype): their fp32
// copy (vllm/v1/sample/sampler.py:158), the fp32 probabilities and the fp32 exponential noise
// of its seeded warm-up pass (vllm/v1/sample/ops/topk_topp_sampler.py:309, 590-628).
constexpr double kSamplerFp32BytesPerLogit = 12;
// Copies of the [tokens, hidden] hidden states alive under the sampler, in the model dtype
// (the run's hidden states and the random ones the sampler pass draws; fitted: 2.5).
constexpr double kHiddenCopies = 2.5;
// Model-dtype values per token and MLP column at the forward pass's peak (the gate and up
// projections' output, their activated product and one more column-wide buffer; fitted: 4).
constexpr double kMlpValuesPerColumn = 4;
// CUDA graphs at vLLM's defaults (FULL_AND_PIECEWISE, 51 capture sizes up to 512): a fixed
// pool plus a per-layer part (fitted to 22 captures).
constexpr double kGraphBaseBytes = 0.34 * kGiB;
constexpr double kGraphBytesPerLayer = 18 * kMiB;
// Memory outside torch that appears after the start-up snapshot: 0.24-0.27 GiB on one GPU,
// 2.06-2.21 GiB per GPU with tensor parallelism (NCCL and custom all-reduce buffers).
constexpr double kNonTorchBytes = 0.25 * kGiB;
constexpr double kNonTorchTensorParallelBytes = 2.1 * kGiB;

// The profiling run's transient peak: the sampler over one token per request (plus the fused
// MoE workspace, which is still held then), or the forward pass's widest MLP, whichever is
// larger.
double ActivationBytes(const ModelSpec& model, const PlanOptions& options) {
  const double d = BytesPerValue(model.dtype);
  const double tokens = options.max_num_batched_tokens;
  const double requests = std::min(options.max_num_batched_tokens, options.max_num_seqs);
  const double tp = options.tp;
  double sampler = (d + kSamplerFp32BytesPerLogit) * requests * static_cast<double>(model.vocab_size) +
                   kHiddenCopies * d * tokens * model.hidden_size;
  double mlp_width = static_cast<double>(model.intermediate_size);
  if (model.experts_per_token > 0) {
    const double expert = static_cast<double>(model.moe_intermediate_size) / tp;
    // [T, topk, 2I/tp], [T·topk, I/tp] and [T, topk, hidden] (vLLM's fused-MoE caches).
    sampler += tokens * model.experts_per_token * (3 * expert + model.hidden_size) * d;
    mlp_width = std::max(mlp_width, static_cast<double>(model.experts_per_token) *
                                        static_cast<double>(model.moe_intermediate_size));
  }
  const double forward = kMlpValuesPerColumn * d * tokens * mlp_width / tp;
  return std::max(sampler, forward);
}

}  // namespace

absl::StatusOr<VllmRuntimeMemory> EstimateVllmRuntimeMemory(const ModelSpec& model,
                                                            const PlanOptions& options) {
  KVPAGE_RETURN_IF_ERROR(options.Validate());
  const double activation = ActivationBytes(model, options);
  if (!(activation < 0x1p62)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "vLLM's activation estimate for ", model.name, " overflows at max_num_batched_tokens ",
        options.max_num_batched_tokens));
  }
  VllmRuntimeMemory m;
  m.activation_bytes = static_cast<int64_t>(std::ceil(activation));
  if (!options.enforce_eager) {
    m.cuda_graph_bytes = static_cast<int64_t>(
        std::ceil(kGraphBaseBytes + kGraphBytesPerLayer * model.num_layers()));
  }
  m.non_torch_bytes = static_cast<int64_t>(
      options.tp > 1 ? kNonTorchTensorParallelBytes : kNonTorchBytes);
  return m;
}

absl::StatusOr<int64_t> VllmKvBudgetFromGpu(const ModelSpec& shard, int64_t gpu_memory_bytes,
                                            double gpu_memory_utilization,
                                            const PlanOptions& options) {
  KVPAGE_ASSIGN_OR_RETURN(const int64_t budget,
                          KvBudgetFromGpu(shard, gpu_memory_bytes, gpu_memory_utilization));
  KVPAGE_ASSIGN_OR_RETURN(const VllmRuntimeMemory runtime,
                          EstimateVllmRuntimeMemory(shard, options));
  if (runtime.total() >= budget) {
    return absl::InvalidArgumentError(absl::StrCat(
        "vLLM's runtime memory for ", shard.name, " (", runtime.total(),
        " bytes: activations, CUDA graphs, non-torch) leaves no KV cache in the ", budget,
        " bytes beside the weights (gpu memory ", gpu_memory_bytes, " x utilization ",
        gpu_memory_utilization, ")"));
  }
  return budget - runtime.total();
}

}  // namespace kvpage
